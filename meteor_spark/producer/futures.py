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
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from meteor_spark.producer.accumulator import Segment
logger = logging.getLogger("meteor_spark.producer.publisher")

#: ``callback(offset, error)``: exactly one of them is None.
PublishCallback = Callable[[int | None, BaseException | None], None]

# The states ``concurrent.futures.wait`` and ``as_completed`` compare ``_state`` with (their values in CPython's
# concurrent.futures); a test waits on record futures with both helpers, so a change there fails loudly.
_RUNNING = "RUNNING"
_FINISHED = "FINISHED"


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

    def deliver(self, position: int, first_offset: int, count: int, lane: int) -> None:
        """Records ``[position, position + count)`` of this publish were stored in ``lane`` from ``first_offset``."""
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
            if count == 1:
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

    def lanes_written(self) -> tuple[LaneWritten, ...]:
        """Per lane (sorted), what this publish stored; waits for the publish like ``result()``.

        Raises:
            the publish's error, like ``result()``.
        """
        self.result()
        return tuple(LaneWritten(lane, n, first, last) for lane, (n, first, last) in sorted(self.lanes.items()))


class RecordFuture:
    """The future of one ``publish_async``: record ``index`` of ``segment``, whose outcome the segment holds.

    It answers what a ``concurrent.futures.Future`` answers (``result``, ``exception``, ``done``,
    ``add_done_callback``...). ``concurrent.futures.wait`` and ``as_completed`` work too: they read ``_state`` and
    lock ``_condition`` and register in ``_waiters``, which this class provides. The condition, waiter list and
    callback list are created on first use, under the publisher's lock (``Segment.watch``), which is also the lock
    the outcome is settled under, so no completion is ever missed.
    """

    def __init__(self, segment: Segment, index: int) -> None:
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
