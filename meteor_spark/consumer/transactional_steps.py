"""A transactional publisher's work as steps: the threaded ``TransactionalPublisher`` and the
``AsyncTransactionalPublisher`` share it.

``TransactionalSteps`` is the base of both. Staging a subscriber's offsets, committing (flush, the one decision, the
staged offsets applied), aborting (the subscribers rewound, or a transaction found committed completed) and ending a
transaction are generators yielding each call they make on the grid, the transaction's publisher, the subscribers
and their group members (``meteor_spark.grid.steps``): the threaded publisher runs them with ``drive``, the asyncio
one with ``drive_async``, so the two follow one protocol (``meteor_spark.consumer.transactional``'s module docs).

A step is a zero-argument callable returning a value or an awaitable of it: a method of the publisher, a
subscriber or a member, or one of the hooks a shell defines (``begin``, deciding the transaction committed or
aborted through ``meteor_spark.grid.transactions`` or ``meteor_spark.aio.txn_grid``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Any

from meteor_spark.errors import (
    ConfigError,
    FencedError,
    GridError,
    MeteorError,
    NotAssignedError,
    TransactionAbortedError,
)
from meteor_spark.grid import transactions
from meteor_spark.grid.steps import Steps
from meteor_spark.groups.store import lane_key
from meteor_spark.validate import check_int

__all__ = ["TransactionalSteps"]

logger = logging.getLogger(__name__)

_MAX_TIMEOUT_MS = 24 * 3600 * 1000


class TransactionalSteps:
    """The state and steps of a transactional publisher (see the module docs); the shell adds its lifecycle.

    Attributes:
        committed: transactions committed since creation.
        aborted: transactions aborted since creation.
    """

    #: The shell's name with its article, for the errors ("a TransactionalPublisher").
    _A_NAME = "a TransactionalPublisher"
    #: Where a failed record's error is found, for the commit's error.
    _ERRORS_AT = "the publish futures' errors"

    def __init__(self, stream: Any, timeout_ms: int, publisher_options: dict[str, Any]) -> None:
        check_int("timeout_ms", timeout_ms, 1, _MAX_TIMEOUT_MS)
        if "transactional" in publisher_options:
            raise ConfigError(f"transactional is always True for {self._A_NAME}; leave it out")
        self._stream = stream
        self._timeout_ms = timeout_ms
        self._options = publisher_options
        self._publisher: Any = None
        self._key: str | None = None
        self._staged: dict[int, tuple[Any, dict[int, int]]] = {}  # id(subscriber) -> it, lane -> position
        self._doomed: str | None = None
        self._closed = False
        self.committed = 0
        self.aborted = 0

    @property
    def transaction(self) -> str | None:
        """The key of the open transaction (``meteor.txns``), None between transactions."""
        return self._key

    def _check_open(self) -> None:
        if self._closed:
            raise MeteorError(f"the {self._A_NAME.split()[-1]} is closed")

    # -- the shell's hooks ----------------------------------------------------------------------------------------

    def begin(self) -> Any:
        """Open a transaction; its key (or an awaitable of it)."""
        raise NotImplementedError

    def _decide_commit(self, key: str, producer_id: int, offsets: list[str]) -> Any:
        """Decide ``key`` committed (``transactions.commit``)."""
        raise NotImplementedError

    def _decide_abort(self, key: str, reason: str) -> Any:
        """Decide ``key`` aborted (``transactions.abort``): the final state."""
        raise NotImplementedError

    # -- steps ------------------------------------------------------------------------------------------------------

    def _send_offsets_steps(self, subscriber: Any) -> Steps[dict[int, int]]:
        """Stage the grouped ``subscriber``'s delivered positions in the transaction (``send_offsets``); a fenced
        lane dooms the transaction (``commit`` then aborts it) and the subscriber is rewound by the abort."""
        try:
            todo = subscriber.delivered_unconfirmed()
            if not todo:
                return {}
            key = yield self.begin
            member = subscriber.member
            assert member is not None
            staged = self._staged.setdefault(id(subscriber), (subscriber, {}))[1]
            for lane, position, epoch, mark in todo:
                yield partial(member.stage, lane, position, key, epoch=epoch, mark=mark)
                staged[lane] = position
        except (FencedError, NotAssignedError) as exc:
            self._doomed = str(exc)
            if self._key is not None:
                self._staged.setdefault(id(subscriber), (subscriber, {}))  # rewound by abort()
            raise
        return {lane: position for lane, position, _, _ in todo}

    def _commit_steps(self) -> Steps[None]:
        """Flush, commit (records visible to ``read_committed`` readers and staged offsets in force: one decision),
        then apply the staged offsets; a doomed transaction, failed records or a transaction found aborted are
        aborted (subscribers rewound) and raise ``TransactionAbortedError``."""
        if self._key is None:
            return
        key, publisher = self._key, self._publisher
        assert publisher is not None
        if self._doomed is not None:
            reason = self._doomed
            yield from self._abort_steps(f"a lane was fenced: {reason}")
            raise TransactionAbortedError(f"transaction {key!r} aborted: {reason}")
        try:
            yield publisher.flush
            failed = publisher.metrics()["failed_records"]
            if failed:
                yield from self._abort_steps(f"{failed} of its records could not be stored")
                raise TransactionAbortedError(
                    f"transaction {key!r} aborted: {failed} of its records could not be stored in stream "
                    f"{publisher.stream!r} (see {self._ERRORS_AT}); the subscribers were rewound: read on"
                )
            offsets = [
                lane_key(subscriber.stream, subscriber.group or "", lane)
                for subscriber, lanes in self._staged.values()
                for lane in lanes
            ]
            yield partial(self._decide_commit, key, publisher.producer_id, offsets)
        except TransactionAbortedError:
            yield from self._abort_steps("the commit found it aborted")
            raise
        yield from self._apply_steps(key)
        self.committed += 1
        yield from self._end_steps()

    def _abort_steps(self, reason: str) -> Steps[None]:
        """Abort the open transaction and rewind the subscribers given to ``send_offsets`` in it; one found
        committed already (a commit whose answer was lost) is completed instead. A grid error propagates with the
        transaction kept: calling ``abort()`` again finds out how it ended."""
        if self._key is None:
            return
        key = self._key
        state = yield partial(self._decide_abort, key, reason)
        if state is not None and state.state == transactions.COMMITTED:
            logger.info("transaction %r was committed already: its offsets are applied, not rewound", key)
            yield from self._apply_steps(key)
            self.committed += 1
            yield from self._end_steps()
            return
        yield from self._each_staged_steps(
            lambda member, lane: member.settle_staged(lane, key),
            lambda subscriber, _lanes: subscriber.rewind(),
            logging.DEBUG,
            key,
            "offset staged by aborted transaction %r left to be settled: %s",
        )
        self.aborted += 1
        yield from self._end_steps()

    def _apply_steps(self, key: str) -> Steps[None]:
        """Move the group's offsets to those the committed transaction staged. A failure loses nothing: whoever
        meets the staged offset next (the lane's next holder, the next ``send_offsets``) rolls it forward."""
        yield from self._each_staged_steps(
            lambda member, lane: member.apply_staged(lane, key),
            lambda subscriber, lanes: subscriber.mark_confirmed(lanes),
            logging.INFO,
            key,
            "offset of committed transaction %r left to be rolled forward: %s",
        )

    def _each_staged_steps(
        self,
        settle: Callable[[Any, int], Any],
        then: Callable[[Any, dict[int, int]], Any],
        level: int,
        key: str,
        left: str,
    ) -> Steps[None]:
        """``settle(member, lane)`` for every lane staged in the transaction, then ``then(subscriber, lanes)`` per
        subscriber; a lane that cannot be settled (taken over, or a grid error) is logged at ``level`` with ``left``
        (formatted with the transaction ``key`` and the error) and left to whoever meets its staged offset next."""
        for subscriber, lanes in self._staged.values():
            member = subscriber.member
            for lane in lanes:
                try:
                    if member is not None:
                        yield partial(settle, member, lane)
                except (FencedError, NotAssignedError, GridError) as exc:
                    logger.log(level, left, key, exc)
            yield partial(then, subscriber, lanes)

    def _end_steps(self) -> Steps[None]:
        publisher, self._publisher = self._publisher, None
        self._key, self._doomed = None, None
        self._staged = {}
        if publisher is not None:
            try:
                yield publisher.close
            except MeteorError as exc:
                logger.warning("closing a transaction's publisher failed: %s", exc)
