"""Consume-transform-produce exactly once from asyncio code: ``AsyncTransactionalPublisher``, the twin of the
threaded ``meteor_spark.consumer.transactional.TransactionalPublisher`` (read its module docs for the protocol and
what a crash at each step does)::

    async with AsyncTransactionalPublisher(grid, "b") as txn:
        while running:
            batch = await subscriber.poll(500)            # a grouped AsyncSubscriber of "a"
            for record in batch:
                await txn.publish(transform(record))
            await txn.send_offsets(subscriber)            # the offsets ride in the transaction
            await txn.commit()                            # records visible and offsets moved: one decision

Each transaction publishes through a fresh transactional ``AsyncPublisher`` registered under it before its first
record; ``send_offsets`` stages every lane's delivered position in the group's offsets entry under the transaction
(``AsyncGroupMember.stage``, fenced by the lane's lease epoch); ``commit`` flushes, decides the transaction committed
(one compare-and-set: the atomic point, which makes the records visible to ``read_committed`` readers), then applies
the staged offsets; ``abort`` decides it aborted and rewinds the subscribers to the group's offsets. The grid steps
are ``meteor_spark.aio.txn_grid``'s (the threaded steps' decisions, awaited), the offsets' ``AsyncGroupMember``'s,
so threaded and asyncio transactions, members and readers settle each other's work: a member (threaded or asyncio)
taking over the lanes of a member that died mid-transaction aborts that transaction, and one that died after the
commit has its staged offsets rolled forward.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from meteor_spark.aio import txn_grid
from meteor_spark.aio.publisher import AsyncPublisher
from meteor_spark.aio.record_future import OffsetFuture
from meteor_spark.aio.subscriber import AsyncSubscriber
from meteor_spark.consumer.transactional_steps import TransactionalSteps
from meteor_spark.grid import transactions
from meteor_spark.grid.aio_client import AsyncGrid, connect_async
from meteor_spark.grid.steps import drive_async
from meteor_spark.grid.transaction_state import TxnState

__all__ = ["AsyncTransactionalPublisher"]


class AsyncTransactionalPublisher(TransactionalSteps):
    """Publishes records to one stream in transactions that can also confirm a grouped ``AsyncSubscriber``'s
    offsets (``TransactionalPublisher``'s twin: same arguments, errors and semantics, its steps driven on the loop).

    Args:
        members_or_grid: ``"host:port[,host:port]"``, a ``GridSettings`` (a connection of its own) or an
            ``AsyncGrid`` (shared, left open).
        stream: the target stream (name or ``StreamConfig``).
        timeout_ms: a transaction open longer than this is aborted by readers (Kafka's ``transaction.timeout.ms``).
        publisher_options: passed to each transaction's ``AsyncPublisher`` (serializers, batching, ...).

    Attributes:
        committed: transactions committed since creation.
        aborted: transactions aborted since creation.
    """

    _A_NAME = "an AsyncTransactionalPublisher"
    _ERRORS_AT = "the publish errors"
    _publisher: AsyncPublisher | None

    def __init__(
        self,
        members_or_grid: object,
        stream: Any,
        *,
        timeout_ms: int = transactions.DEFAULT_TIMEOUT_MS,
        **publisher_options: Any,
    ) -> None:
        super().__init__(stream, timeout_ms, publisher_options)
        self._target = members_or_grid
        self._grid: AsyncGrid | None = None
        self._owns_grid = False

    async def __aenter__(self) -> AsyncTransactionalPublisher:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _connection(self) -> AsyncGrid:
        if self._grid is None:
            self._grid, self._owns_grid = await connect_async(self._target)
        return self._grid

    async def begin(self) -> str:
        """Open a transaction (done by the first ``publish`` or ``send_offsets`` when not called); returns its key."""
        self._check_open()
        if self._key is not None:
            return self._key
        grid = await self._connection()
        key = f"ctp/{uuid.uuid4()}"
        publisher = await AsyncPublisher(grid, self._stream, transactional=True, **self._options).start()
        try:
            await txn_grid.begin(grid, key, publisher.producer_id, self._timeout_ms, stream=publisher.stream)
        except BaseException:
            await publisher.close()
            raise
        self._key, self._publisher = key, publisher
        return key

    async def publish(self, record: Any, **options: Any) -> int:
        """Publish one record in the transaction and wait until it is stored (``AsyncPublisher.publish``; visible
        to ``read_committed`` readers only once committed); returns its offset."""
        await self.begin()
        assert self._publisher is not None
        return await self._publisher.publish(record, **options)

    async def publish_async(self, record: Any, **options: Any) -> OffsetFuture:
        """Queue one record in the transaction (``AsyncPublisher.publish_async``: the threaded
        ``TransactionalPublisher.publish``'s queueing, many records in few calls); ``commit`` flushes them."""
        await self.begin()
        assert self._publisher is not None
        return await self._publisher.publish_async(record, **options)

    async def publish_many(self, records: Iterable[Any]) -> list[int]:
        """Publish records in the transaction (``AsyncPublisher.publish_many``)."""
        await self.begin()
        assert self._publisher is not None
        return await self._publisher.publish_many(records)

    async def send_offsets(self, subscriber: AsyncSubscriber) -> dict[int, int]:
        """Make the grouped ``subscriber``'s delivered positions part of the transaction: the group's offsets move
        to them exactly when it commits. Returns lane -> staged position.

        Raises:
            GroupError: an ungrouped subscriber. FencedError / NotAssignedError: a lane was taken over since its
            records were delivered; the transaction can then only abort (``commit`` refuses it).
        """
        return await drive_async(self._send_offsets_steps(subscriber))

    async def commit(self) -> None:
        """Flush, commit (records visible to ``read_committed`` readers and staged offsets in force: one decision),
        then apply the staged offsets to the group.

        Raises:
            TransactionAbortedError: the transaction was aborted first (fenced by a lane's new holder, timed out, or
                a ``send_offsets`` was fenced); it is aborted and the subscribers rewound: read on.
        """
        await drive_async(self._commit_steps())

    async def abort(self, reason: str = "aborted by the application") -> None:
        """Abort the open transaction: its records are never delivered to ``read_committed`` readers, its staged
        offsets never applied, and the subscribers given to ``send_offsets`` in it are rewound to the group's
        offsets. A transaction found committed already is completed instead. A no-op between transactions.

        Raises:
            GridError: the abort could not be written; the transaction stays this publisher's: call ``abort()``
                again (it times out meanwhile if the process dies).
        """
        await drive_async(self._abort_steps(reason))

    async def _decide_commit(self, key: str, producer_id: int, offsets: list[str]) -> TxnState:
        assert self._grid is not None
        return await txn_grid.commit(self._grid, key, [producer_id], offsets=offsets)

    async def _decide_abort(self, key: str, reason: str) -> TxnState | None:
        assert self._grid is not None
        return await txn_grid.abort(self._grid, key, reason)

    async def close(self) -> None:
        """Abort an open transaction, then close (an owned connection too). Idempotent."""
        if self._closed:
            return
        try:
            await self.abort("the AsyncTransactionalPublisher was closed")
        finally:
            self._closed = True
            if self._owns_grid and self._grid is not None:
                await self._grid.close()
