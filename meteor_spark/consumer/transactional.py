"""Consume-transform-produce with exactly-once: a transactional publisher that confirms a grouped subscriber's
offsets inside its transaction (Kafka's ``beginTransaction`` / ``sendOffsetsToTransaction`` /
``commitTransaction`` / ``abortTransaction``).

One ``TransactionalPublisher`` runs one transaction at a time on one target stream::

    with TransactionalPublisher(grid, "b") as txn:
        while running:
            batch = subscriber.poll(500)          # a grouped Subscriber of "a"
            for record in batch:
                txn.publish(transform(record))
            txn.send_offsets(subscriber)          # the offsets ride in the transaction
            txn.commit()                          # records visible and offsets moved: one decision

Each transaction publishes through a fresh transactional ``Publisher`` registered under it
(``meteor_spark.grid.transactions.begin``). ``send_offsets`` stages every lane's delivered position in the group's
offsets entry under the transaction (``GroupMember.stage``: fenced by the lane's lease epoch). ``commit`` flushes,
decides the transaction committed (one compare-and-set: the atomic point, which also makes the records visible to
``read_committed`` readers), then applies the staged offsets. A crash anywhere loses and duplicates nothing:

* before the commit: the transaction is aborted (by the group member that takes the lanes over, or by its timeout),
  its records are never delivered, and the new holder reads the input again from the last committed offsets;
* after the commit, before the offsets are applied: the new holder finds the staged offsets of a committed
  transaction and rolls them forward before it reads (``meteor_spark.groups.txn_offsets``).

A zombie (a process that lost its lanes but still runs) cannot commit input its successor reads again: staging is
refused once a newer epoch fenced the lane (``FencedError``), and a successor that finds the zombie's transaction
open with staged offsets aborts it, so the zombie's ``commit`` raises ``TransactionAbortedError``. Either way the
application calls ``abort()``, which rewinds the subscriber to the group's offsets.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from typing import Any

from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.errors import (
    ConfigError,
    FencedError,
    GridError,
    MeteorError,
    NotAssignedError,
    TransactionAbortedError,
)
from meteor_spark.grid import transactions
from meteor_spark.grid.client import Grid
from meteor_spark.groups.store import lane_key
from meteor_spark.producer.publisher import Publisher
from meteor_spark.validate import check_int

__all__ = ["TransactionalPublisher"]

logger = logging.getLogger(__name__)

_MAX_TIMEOUT_MS = 24 * 3600 * 1000


class TransactionalPublisher:
    """Publishes records to one stream in transactions that can also confirm a grouped subscriber's offsets.

    Args:
        grid: the grid connection.
        stream: the target stream (name or ``StreamConfig``).
        timeout_ms: a transaction open longer than this is aborted by readers (Kafka's ``transaction.timeout.ms``);
            keep it above the time one transaction takes.
        publisher_options: passed to each transaction's ``Publisher`` (serializers, batching, ...).

    Attributes:
        committed: transactions committed since creation.
        aborted: transactions aborted since creation.
    """

    def __init__(
        self,
        grid: Grid,
        stream: Any,
        *,
        timeout_ms: int = transactions.DEFAULT_TIMEOUT_MS,
        **publisher_options: Any,
    ) -> None:
        check_int("timeout_ms", timeout_ms, 1, _MAX_TIMEOUT_MS)
        if "transactional" in publisher_options:
            raise ConfigError("transactional is always True for a TransactionalPublisher; leave it out")
        self._grid = grid
        self._stream = stream
        self._timeout_ms = timeout_ms
        self._options = publisher_options
        self._publisher: Publisher | None = None
        self._key: str | None = None
        self._staged: dict[int, tuple[Subscriber, dict[int, int]]] = {}  # id(subscriber) -> it, lane -> position
        self._doomed: str | None = None
        self._closed = False
        self.committed = 0
        self.aborted = 0

    @property
    def transaction(self) -> str | None:
        """The key of the open transaction (``meteor.txns``), None between transactions."""
        return self._key

    def begin(self) -> str:
        """Open a transaction (done by the first ``publish`` or ``send_offsets`` when not called); returns its key."""
        if self._closed:
            raise MeteorError("the TransactionalPublisher is closed")
        if self._key is not None:
            return self._key
        key = f"ctp/{uuid.uuid4()}"
        publisher = Publisher(self._grid, self._stream, transactional=True, **self._options)
        try:
            transactions.begin(self._grid, key, publisher.producer_id, self._timeout_ms, stream=publisher.stream)
        except BaseException:
            publisher.close()
            raise
        self._key, self._publisher = key, publisher
        return key

    def publish(self, record: Any, **options: Any) -> Any:
        """Queue one record in the transaction (``Publisher.publish_async``; stored for good only by ``commit``)."""
        self.begin()
        assert self._publisher is not None
        return self._publisher.publish_async(record, **options)

    def publish_many(self, records: Iterable[Any]) -> Any:
        """Queue records in the transaction (``Publisher.publish_many``)."""
        self.begin()
        assert self._publisher is not None
        return self._publisher.publish_many(records)

    def send_offsets(self, subscriber: Subscriber) -> dict[int, int]:
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
            key = self.begin()
            member = subscriber.member
            staged = self._staged.setdefault(id(subscriber), (subscriber, {}))[1]
            for lane, position, epoch, mark in todo:
                member.stage(lane, position, key, epoch=epoch, mark=mark)
                staged[lane] = position
        except (FencedError, NotAssignedError) as exc:
            self._doomed = str(exc)
            if self._key is not None:
                self._staged.setdefault(id(subscriber), (subscriber, {}))  # rewound by abort()
            raise
        return {lane: position for lane, position, _, _ in todo}

    def commit(self) -> None:
        """Flush, commit (records visible to ``read_committed`` readers and staged offsets in force: one
        decision), then apply the staged offsets to the group.

        Raises:
            TransactionAbortedError: the transaction was aborted first (fenced by a lane's new holder, timed out, or
                a ``send_offsets`` was fenced); it is aborted and the subscribers rewound: read on.
        """
        if self._key is None:
            return
        key, publisher = self._key, self._publisher
        assert publisher is not None
        if self._doomed is not None:
            reason = self._doomed
            self.abort(f"a lane was fenced: {reason}")
            raise TransactionAbortedError(f"transaction {key!r} aborted: {reason}")
        try:
            publisher.flush()
            failed = publisher.metrics()["failed_records"]
            if failed:
                self.abort(f"{failed} of its records could not be stored")
                raise TransactionAbortedError(
                    f"transaction {key!r} aborted: {failed} of its records could not be stored in stream "
                    f"{publisher.stream!r} (see the publish futures' errors); the subscribers were rewound: read on"
                )
            offsets = [
                lane_key(subscriber.stream, subscriber.group or "", lane)
                for subscriber, lanes in self._staged.values()
                for lane in lanes
            ]
            transactions.commit(self._grid, key, [publisher.producer_id], offsets=offsets)
        except TransactionAbortedError:
            self.abort("the commit found it aborted")
            raise
        self._apply(key)
        self.committed += 1
        self._end()

    def abort(self, reason: str = "aborted by the application") -> None:
        """Abort the open transaction: its records are never delivered to ``read_committed`` readers, its staged
        offsets never applied, and the subscribers given to ``send_offsets`` in it are rewound to the group's
        offsets (their records are delivered again). Records of a subscriber whose offsets were not sent yet:
        call its ``rewind()``. A transaction found committed already (a ``commit`` whose answer was lost) is
        completed instead. A no-op between transactions.

        Raises:
            GridError: the abort could not be written; the transaction stays this publisher's: call ``abort()``
                again (it times out meanwhile if the process dies).
        """
        if self._key is None:
            return
        key = self._key
        # A grid error here propagates with the transaction kept: calling abort() again finds out how it ended.
        state = transactions.abort(self._grid, key, reason)
        if state is not None and state.state == transactions.COMMITTED:
            logger.info("transaction %r was committed already: its offsets are applied, not rewound", key)
            self._apply(key)
            self.committed += 1
            self._end()
            return
        for subscriber, lanes in self._staged.values():
            for lane in lanes:
                try:
                    subscriber.member.settle_staged(lane, key)
                except (FencedError, NotAssignedError, GridError) as exc:
                    logger.debug("offset staged by aborted transaction %r left to be settled: %s", key, exc)
            subscriber.rewind()
        self.aborted += 1
        self._end()

    def _apply(self, key: str) -> None:
        """Move the group's offsets to those the committed transaction staged. A failure loses nothing: whoever
        meets the staged offset next (the lane's next holder, the next ``send_offsets``) rolls it forward."""
        for subscriber, lanes in self._staged.values():
            for lane in lanes:
                try:
                    subscriber.member.apply_staged(lane, key)
                except (FencedError, NotAssignedError, GridError) as exc:
                    logger.info("offset of committed transaction %r left to be rolled forward: %s", key, exc)
            subscriber.mark_confirmed(lanes)

    def _end(self) -> None:
        publisher, self._publisher = self._publisher, None
        self._key, self._doomed = None, None
        self._staged = {}
        if publisher is not None:
            try:
                publisher.close()
            except MeteorError as exc:
                logger.warning("closing a transaction's publisher failed: %s", exc)

    def close(self) -> None:
        """Abort an open transaction, then close. Idempotent."""
        if self._closed:
            return
        try:
            self.abort("the TransactionalPublisher was closed")
        finally:
            self._closed = True

    def __enter__(self) -> TransactionalPublisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
