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

import logging
import uuid
from collections.abc import Iterable
from typing import Any

from meteor_spark.aio import txn_grid
from meteor_spark.aio.publisher import AsyncPublisher
from meteor_spark.aio.record_future import OffsetFuture
from meteor_spark.aio.subscriber import AsyncSubscriber
from meteor_spark.errors import (
    ConfigError,
    FencedError,
    GridError,
    MeteorError,
    NotAssignedError,
    TransactionAbortedError,
)
from meteor_spark.grid import transactions
from meteor_spark.grid.aio_client import AsyncGrid, connect_async
from meteor_spark.groups.store import lane_key
from meteor_spark.validate import check_int

__all__ = ["AsyncTransactionalPublisher"]

logger = logging.getLogger(__name__)

_MAX_TIMEOUT_MS = 24 * 3600 * 1000


class AsyncTransactionalPublisher:
    """Publishes records to one stream in transactions that can also confirm a grouped ``AsyncSubscriber``'s
    offsets (``TransactionalPublisher``'s twin: same arguments, errors and semantics).

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

    def __init__(
        self,
        members_or_grid: object,
        stream: Any,
        *,
        timeout_ms: int = transactions.DEFAULT_TIMEOUT_MS,
        **publisher_options: Any,
    ) -> None:
        check_int("timeout_ms", timeout_ms, 1, _MAX_TIMEOUT_MS)
        if "transactional" in publisher_options:
            raise ConfigError("transactional is always True for an AsyncTransactionalPublisher; leave it out")
        self._target = members_or_grid
        self._grid: AsyncGrid | None = None
        self._owns_grid = False
        self._stream = stream
        self._timeout_ms = timeout_ms
        self._options = publisher_options
        self._publisher: AsyncPublisher | None = None
        self._key: str | None = None
        self._staged: dict[int, tuple[AsyncSubscriber, dict[int, int]]] = {}  # id(subscriber) -> it, lanes
        self._doomed: str | None = None
        self._closed = False
        self.committed = 0
        self.aborted = 0

    async def __aenter__(self) -> AsyncTransactionalPublisher:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def transaction(self) -> str | None:
        """The key of the open transaction (``meteor.txns``), None between transactions."""
        return self._key

    async def _connection(self) -> AsyncGrid:
        if self._grid is None:
            self._grid, self._owns_grid = await connect_async(self._target)
        return self._grid

    async def begin(self) -> str:
        """Open a transaction (done by the first ``publish`` or ``send_offsets`` when not called); returns its key."""
        if self._closed:
            raise MeteorError("the AsyncTransactionalPublisher is closed")
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
        try:
            todo = subscriber.delivered_unconfirmed()
            if not todo:
                return {}
            key = await self.begin()
            member = subscriber.member
            assert member is not None
            staged = self._staged.setdefault(id(subscriber), (subscriber, {}))[1]
            for lane, position, epoch, mark in todo:
                await member.stage(lane, position, key, epoch=epoch, mark=mark)
                staged[lane] = position
        except (FencedError, NotAssignedError) as exc:
            self._doomed = str(exc)
            if self._key is not None:
                self._staged.setdefault(id(subscriber), (subscriber, {}))  # rewound by abort()
            raise
        return {lane: position for lane, position, _, _ in todo}

    async def commit(self) -> None:
        """Flush, commit (records visible to ``read_committed`` readers and staged offsets in force: one decision),
        then apply the staged offsets to the group.

        Raises:
            TransactionAbortedError: the transaction was aborted first (fenced by a lane's new holder, timed out, or
                a ``send_offsets`` was fenced); it is aborted and the subscribers rewound: read on.
        """
        if self._key is None:
            return
        key, publisher, grid = self._key, self._publisher, self._grid
        assert publisher is not None and grid is not None
        if self._doomed is not None:
            reason = self._doomed
            await self.abort(f"a lane was fenced: {reason}")
            raise TransactionAbortedError(f"transaction {key!r} aborted: {reason}")
        try:
            await publisher.flush()
            failed = publisher.metrics()["failed_records"]
            if failed:
                await self.abort(f"{failed} of its records could not be stored")
                raise TransactionAbortedError(
                    f"transaction {key!r} aborted: {failed} of its records could not be stored in stream "
                    f"{publisher.stream!r} (see the publish errors); the subscribers were rewound: read on"
                )
            offsets = [
                lane_key(subscriber.stream, subscriber.group or "", lane)
                for subscriber, lanes in self._staged.values()
                for lane in lanes
            ]
            await txn_grid.commit(grid, key, [publisher.producer_id], offsets=offsets)
        except TransactionAbortedError:
            await self.abort("the commit found it aborted")
            raise
        await self._apply(key)
        self.committed += 1
        await self._end()

    async def abort(self, reason: str = "aborted by the application") -> None:
        """Abort the open transaction: its records are never delivered to ``read_committed`` readers, its staged
        offsets never applied, and the subscribers given to ``send_offsets`` in it are rewound to the group's
        offsets. A transaction found committed already is completed instead. A no-op between transactions.

        Raises:
            GridError: the abort could not be written; the transaction stays this publisher's: call ``abort()``
                again (it times out meanwhile if the process dies).
        """
        if self._key is None:
            return
        key, grid = self._key, self._grid
        assert grid is not None
        state = await txn_grid.abort(grid, key, reason)
        if state is not None and state.state == transactions.COMMITTED:
            logger.info("transaction %r was committed already: its offsets are applied, not rewound", key)
            await self._apply(key)
            self.committed += 1
            await self._end()
            return
        for subscriber, lanes in self._staged.values():
            member = subscriber.member
            for lane in lanes:
                try:
                    if member is not None:
                        await member.settle_staged(lane, key)
                except (FencedError, NotAssignedError, GridError) as exc:
                    logger.debug("offset staged by aborted transaction %r left to be settled: %s", key, exc)
            await subscriber.rewind()
        self.aborted += 1
        await self._end()

    async def _apply(self, key: str) -> None:
        """Move the group's offsets to those the committed transaction staged; a failure loses nothing (whoever
        meets the staged offset next rolls it forward)."""
        for subscriber, lanes in self._staged.values():
            member = subscriber.member
            for lane in lanes:
                try:
                    if member is not None:
                        await member.apply_staged(lane, key)
                except (FencedError, NotAssignedError, GridError) as exc:
                    logger.info("offset of committed transaction %r left to be rolled forward: %s", key, exc)
            subscriber.mark_confirmed(lanes)

    async def _end(self) -> None:
        publisher, self._publisher = self._publisher, None
        self._key, self._doomed = None, None
        self._staged = {}
        if publisher is not None:
            try:
                await publisher.close()
            except MeteorError as exc:
                logger.warning("closing a transaction's publisher failed: %s", exc)

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
