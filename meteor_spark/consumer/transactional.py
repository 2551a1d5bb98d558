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

import uuid
from collections.abc import Iterable
from typing import Any

from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.consumer.transactional_steps import TransactionalSteps
from meteor_spark.grid import transactions
from meteor_spark.grid.client import Grid
from meteor_spark.grid.steps import drive
from meteor_spark.grid.transaction_state import TxnState
from meteor_spark.producer.publisher import Publisher

__all__ = ["TransactionalPublisher"]


class TransactionalPublisher(TransactionalSteps):
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

    _publisher: Publisher | None

    def __init__(
        self,
        grid: Grid,
        stream: Any,
        *,
        timeout_ms: int = transactions.DEFAULT_TIMEOUT_MS,
        **publisher_options: Any,
    ) -> None:
        super().__init__(stream, timeout_ms, publisher_options)
        self._grid = grid

    def begin(self) -> str:
        """Open a transaction (done by the first ``publish`` or ``send_offsets`` when not called); returns its key."""
        self._check_open()
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
        return drive(self._send_offsets_steps(subscriber))

    def commit(self) -> None:
        """Flush, commit (records visible to ``read_committed`` readers and staged offsets in force: one
        decision), then apply the staged offsets to the group.

        Raises:
            TransactionAbortedError: the transaction was aborted first (fenced by a lane's new holder, timed out, or
                a ``send_offsets`` was fenced); it is aborted and the subscribers rewound: read on.
        """
        drive(self._commit_steps())

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
        drive(self._abort_steps(reason))

    def _decide_commit(self, key: str, producer_id: int, offsets: list[str]) -> TxnState:
        return transactions.commit(self._grid, key, [producer_id], offsets=offsets)

    def _decide_abort(self, key: str, reason: str) -> TxnState | None:
        return transactions.abort(self._grid, key, reason)

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
