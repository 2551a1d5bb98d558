"""The futures a publisher hands out.

Like kafka-python's ``FutureRecordMetadata``, a record's future is not a future of its own but a position in a
batch whose outcome the batch holds: ``RecordFuture`` is a segment (the records queued together for one lane) plus
the record's index in it. ``publish_async`` is meant to cost about a microsecond, so a record future is two
attributes and no completion work of its own: storing an ``add_all`` records one outcome per piece of a segment,
and every record future reads its offset or error from there. Only futures somebody waits on or attached a
callback to are told individually.

Bulk publishes (``publish_many``, ``publish_arrow``) get a ``BulkFuture``, a plain ``concurrent.futures.Future``.
"""

from __future__ import annotations

import logging
import threading
from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np

logger = logging.getLogger("meteor_spark.producer.publisher")

#: ``callback(offset, error)``: exactly one of them is None.
PublishCallback = Callable[[int | None, BaseException | None], None]

#: ``Publisher.publish_async``'s signature: ``(record, callback=None, *, topic=None, message_id=None)``.
PublishAsync = Callable[..., "RecordFuture"]

# The states ``concurrent.futures.wait`` and ``as_completed`` compare ``_state`` with (their values in CPython's
# concurrent.futures); a test waits on record futures with both helpers, so a change there fails loudly.
_RUNNING = "RUNNING"
_FINISHED = "FINISHED"

_AFTER_ANY = float("inf")


@dataclass(frozen=True)
class LaneWritten:
    """What one bulk publish stored in one lane.

    Attributes:
        lane: the lane.
        records: records of the publish stored in it.
        first_offset: offset of the first of them.
        last_offset: offset of the last of them (records of other publishes may lie in between).
    """

    lane: int
    records: int
    first_offset: int
    last_offset: int


class BulkFuture(Future[Any]):
    """The future of one bulk publish, and where its offsets go: a list of records ("list", the offsets in order)
    or an Arrow bulk ("count", the number of records stored)."""

    def __init__(self, kind: str, size: int) -> None:
        super().__init__()
        self.set_running_or_notify_cancel()  # an accepted record cannot be cancelled
        self.kind = kind
        self.size = size
        self.offsets: np.ndarray | None = np.empty(size, dtype=np.int64) if kind == "list" else None
        self.remaining = size
        self.failed = False
        # lane -> [records, first offset, last offset]; updated once per stored piece (never per record), by the
        # completion thread only, and complete before the future's result is set.
        self.lanes: dict[int, list[int]] = {}

    def deliver(self, position: int | np.ndarray, first_offset: int, count: int, lane: int) -> None:
        """Records ``[position, position + count)`` of this publish (or those at the ``position`` array) were
        stored in ``lane`` from ``first_offset``."""
        if self.failed:
            return
        written = self.lanes.get(lane)
        if written is None:
            self.lanes[lane] = [count, first_offset, first_offset + count - 1]
        else:
            written[0] += count
            written[1] = min(written[1], first_offset)
            written[2] = max(written[2], first_offset + count - 1)
        if self.offsets is not None:
            if isinstance(position, np.ndarray):
                self.offsets[position] = np.arange(first_offset, first_offset + count)
            elif count == 1:
                self.offsets[position] = first_offset
            else:
                self.offsets[position : position + count] = np.arange(first_offset, first_offset + count)
        self.remaining -= count
        if self.remaining == 0 and not self.done():
            self.set_result(self.offsets.tolist() if self.offsets is not None else self.size)

    def fail(self, error: BaseException) -> None:
        """Some of this publish's records failed: the whole publish fails with that error (once)."""
        if self.failed:
            return
        self.failed = True
        if not self.done():
            self.set_exception(error)


class ArrowPublishFuture(BulkFuture):
    """The future of ``Publisher.publish_arrow``: completes with the number of records stored (an ``int``, as
    ever) and then tells, per lane, how many records went there and their first and last offsets."""

    def __init__(self, size: int) -> None:
        super().__init__("count", size)
        #: Rows left out because their message id was a duplicate (``publish_arrow(duplicates="skip")``).
        self.duplicates_skipped = 0

    def lanes_written(self) -> tuple[LaneWritten, ...]:
        """Per lane (sorted), what this publish stored; waits for the publish like ``result()``.

        Raises:
            the publish's error, like ``result()``.
        """
        self.result()
        return tuple(LaneWritten(lane, n, first, last) for lane, (n, first, last) in sorted(self.lanes.items()))


class Outcomes:
    """The outcomes of a batch's records, which its record futures read (an accumulator ``Segment`` is one).

    ``outcomes``: one ``(start, stop, base, error)`` per stored (or failed) piece, sorted by start; record ``i`` of a
    stored piece has offset ``base + i``. ``watched`` are the record futures, sorted by index, that must be told of
    their outcome. ``singles``: the batch holds records of ``publish_async`` (with record futures); a batch without
    any keeps no outcomes. ``lock`` is the publisher's (the accumulator's), under which outcomes are settled.
    """

    __slots__ = ("lock", "outcomes", "singles", "watched")

    def __init__(self, lock: Any) -> None:
        self.lock = lock
        self.singles = False
        # Only appended to, or replaced, so futures read it without the lock.
        self.outcomes: list[tuple[int, int, int, BaseException | None]] = []
        self.watched: list[RecordFuture] = []

    def outcome(self, index: int) -> tuple[int | None, BaseException | None] | None:
        """``(offset, None)`` or ``(None, error)`` once record ``index`` was stored or failed, else None."""
        outcomes = self.outcomes
        # Tuples compare by start first: no Python key function on this path.
        k = bisect_right(outcomes, (index, _AFTER_ANY)) - 1
        if k < 0:
            return None
        _, stop, base, error = outcomes[k]
        if index >= stop:
            return None
        return (None, error) if error is not None else (base + index, None)

    def watch(self, future: RecordFuture, done_callback: Callable[[Any], object] | None = None) -> bool:
        """Give ``future`` its synchronisation objects and have it told of its outcome; False when already done."""
        with self.lock:
            state = future.__dict__
            if "_condition" not in state:
                state["_condition"] = threading.Condition()
                state["_waiters"] = []
                state["_done_callbacks"] = []
            if self.outcome(future._index) is not None:
                return False
            if done_callback is not None:
                state["_done_callbacks"].append(done_callback)
            self.watch_locked(future)
            return True

    def call_back_on(self, future: RecordFuture, callback: PublishCallback) -> None:
        """Have ``callback(offset, error)`` called once ``future`` completes (lock held; the future is new)."""
        future.__dict__["callback"] = callback
        self.watch_locked(future)

    def watch_locked(self, future: RecordFuture) -> None:
        watched = self.watched
        if not watched or watched[-1]._index < future._index:
            watched.append(future)
        elif future not in watched:
            insort(watched, future, key=_index_of)

    def settle(self, start: int, stop: int, base: int, error: BaseException | None) -> list[RecordFuture]:
        """Record the outcome of records ``[start, stop)`` (lock held); returns the watched futures among them."""
        if not self.singles:
            return []
        outcome = (start, stop, base, error)
        if not self.outcomes or self.outcomes[-1][0] < start:
            self.outcomes.append(outcome)  # in order (the usual case): readers see a consistent prefix
        else:
            outcomes = list(self.outcomes)  # out of order (close failing queued records): copy, then swap
            insort(outcomes, outcome, key=_start_of)
            self.outcomes = outcomes
        watched = self.watched
        if not watched:
            return []
        lo = bisect_left(watched, start, key=_index_of)
        hi = bisect_left(watched, stop, lo, key=_index_of)
        told = watched[lo:hi]
        del watched[lo:hi]
        return told


def _start_of(outcome: tuple[int, int, int, BaseException | None]) -> int:
    return outcome[0]


def _index_of(future: RecordFuture) -> int:
    return future._index


class RecordFuture:
    """The future of one ``publish_async``: record ``index`` of ``segment``, whose outcome the segment holds.

    It answers what a ``concurrent.futures.Future`` answers (``result``, ``exception``, ``done``,
    ``add_done_callback``...). ``concurrent.futures.wait`` and ``as_completed`` work too: they read ``_state`` and
    lock ``_condition`` and register in ``_waiters``, which this class provides. The condition, waiter list and
    callback list are created on first use, under the publisher's lock (``Outcomes.watch``), which is also the lock
    the outcome is settled under, so no completion is ever missed.

    ``_segment`` and ``_index`` are slots (a million futures a second are made: slots are cheaper to fill than a
    fresh instance dictionary); the ``__dict__`` slot holds what ``Outcomes.watch`` adds, made only when it does.
    """

    __slots__ = ("__dict__", "__weakref__", "_index", "_segment")

    def __init__(self, segment: Outcomes, index: int) -> None:
        self._segment = segment
        self._index = index

    # ------------------------------------------------------------------------------------------------ the protocol

    @property
    def _state(self) -> str:
        return _FINISHED if self._segment.outcome(self._index) is not None else _RUNNING

    @property
    def _condition(self) -> threading.Condition:
        state = self.__dict__
        if "_condition" not in state:
            self._segment.watch(self)
        return state["_condition"]

    @property
    def _waiters(self) -> list[Any]:
        state = self.__dict__
        if "_waiters" not in state:
            self._segment.watch(self)
        return state["_waiters"]

    def done(self) -> bool:
        return self._segment.outcome(self._index) is not None

    def running(self) -> bool:
        return not self.done()

    def cancelled(self) -> bool:
        return False

    def cancel(self) -> bool:
        return False  # an accepted record cannot be taken back

    def _outcome(self, timeout: float | None) -> tuple[int | None, BaseException | None]:
        outcome = self._segment.outcome(self._index)
        if outcome is None:
            condition = self._condition
            with condition:
                condition.wait_for(lambda: self._segment.outcome(self._index) is not None, timeout)
            outcome = self._segment.outcome(self._index)
            if outcome is None:
                raise TimeoutError()
        return outcome

    def result(self, timeout: float | None = None) -> int:
        offset, error = self._outcome(timeout)
        if error is not None:
            raise error
        return offset  # type: ignore[return-value]

    def exception(self, timeout: float | None = None) -> BaseException | None:
        return self._outcome(timeout)[1]

    def add_done_callback(self, fn: Callable[[RecordFuture], object]) -> None:
        if not self._segment.watch(self, fn):
            run_done_callback(fn, self)

    def __repr__(self) -> str:
        outcome = self._segment.outcome(self._index)
        if outcome is None:
            return f"<publish future at {id(self):#x} state=running>"
        offset, error = outcome
        shown = f"raised {type(error).__name__}" if error is not None else f"offset={offset}"
        return f"<publish future at {id(self):#x} state=finished {shown}>"

    def set_running_or_notify_cancel(self) -> bool:
        raise RuntimeError("publish futures are completed by their publisher")

    def set_result(self, result: object) -> None:
        raise RuntimeError("publish futures are completed by their publisher")

    def set_exception(self, exception: BaseException | None) -> None:
        raise RuntimeError("publish futures are completed by their publisher")

    # ------------------------------------------------------------------------------------------------ completion

    def wake(self, error: BaseException | None) -> None:
        """Tell the waiters, once the segment holds this record's outcome (any thread: no user code runs)."""
        condition = self.__dict__.get("_condition")
        if condition is not None:
            with condition:
                for waiter in self.__dict__["_waiters"]:
                    if error is None:
                        waiter.add_result(self)
                    else:
                        waiter.add_exception(self)
                condition.notify_all()

    def has_callbacks(self) -> bool:
        return bool(self.__dict__.get("_done_callbacks")) or "callback" in self.__dict__

    def call_back(self) -> None:
        """Run the done-callbacks and the publish callback (completion thread only: user code)."""
        offset, error = self._segment.outcome(self._index)  # type: ignore[misc]
        for fn in self.__dict__.get("_done_callbacks", ()):
            run_done_callback(fn, self)
        callback = self.__dict__.get("callback")
        if callback is not None:
            call_back(callback, offset, error)


class BareRecordFuture(RecordFuture):
    """A ``RecordFuture`` made without its fields, which its maker sets at once (``Accumulator.plain_publisher``).

    Why a subclass: calling a class whose ``__init__`` is ``object``'s is the cheapest way CPython 3.11 has to make
    an instance, 13 ns less than ``object.__new__(RecordFuture)`` (which builds an argument tuple and checks it),
    on a path that makes a million futures a second. It is a ``RecordFuture`` in every other respect.
    """

    __slots__ = ()
    __init__ = object.__init__


def run_done_callback(fn: Callable[[Any], object], future: Any) -> None:
    try:
        fn(future)
    except Exception:
        logger.exception("a done callback of a publish future raised")


def call_back(callback: PublishCallback, offset: int | None, error: BaseException | None) -> None:
    try:
        callback(offset, error)
    except Exception:
        logger.exception("a publish callback raised; the publisher goes on")
