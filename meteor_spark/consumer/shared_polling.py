"""A shared member's poll loop and its parked reads, written once for the threaded and the asyncio member.

``SharedPolling`` (a base of ``SharedSubscriber`` and ``AsyncSharedSubscriber``, over ``SharedAcquire``) holds the
loop a poll runs until it has records or its deadline passes (one acquire round, then a wait woken by a parked
one-item read per lane at the first offset never acquired, rechecked every ``RECHECK_S`` for timeouts and
releases) as steps (``meteor_spark.grid.steps``). What waiting is belongs to each shell: a thread blocked on an
``Event`` woken by a future's callback, or a task on the loop awaiting an ``asyncio.Event`` set by a parked read's
task (``_wait`` and ``_park``).
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any

from meteor_spark.consumer.shared_acquire import SharedAcquire
from meteor_spark.consumer.shared_groups import RECHECK_S
from meteor_spark.format.records import RecordBatch
from meteor_spark.grid.steps import Steps

__all__ = ["SharedPolling"]


class SharedPolling(SharedAcquire):
    """The poll loop of a shared member (see the module docs); the shell sets ``_wakeup`` and ``_wakers``."""

    _wakeup: Any  # threading.Event or asyncio.Event: set when a parked read ends (or on close)
    _wakers: dict[int, Any]  # lane -> its parked read (a future or a task)
    #: Whether ``close`` ends a poll that is waiting (the asyncio member's ``async for`` ends with it).
    _CLOSE_ENDS_POLL = False

    def _wait(self, seconds: float) -> Any:
        """Wait up to ``seconds`` for ``_wakeup`` (or an awaitable doing so)."""
        raise NotImplementedError

    def _park(self, lane: int, sequence: int) -> Any:
        """A one-item read parked on ``lane`` at ``sequence`` that sets ``_wakeup`` when it ends; it has ``done()``."""
        raise NotImplementedError

    def _poll_steps(self, deadline: float) -> Steps[RecordBatch]:
        """Acquire rounds until one hands records out or the monotonic ``deadline`` passes, waiting in between."""
        while True:
            self._wakeup.clear()
            batch = yield from self._acquire_round()
            remaining = deadline - time.monotonic()
            if batch or remaining <= 0 or (self._CLOSE_ENDS_POLL and self._closed):
                return batch
            self._arm_wakers()
            yield partial(self._wait, min(remaining, RECHECK_S))

    def _arm_wakers(self) -> None:
        """One parked read per lane at the first offset never acquired (``_waker_sequence``): wakes ``poll`` when
        new items arrive; a lane whose read is still parked keeps it."""
        for lane in range(self.info.lanes):
            waker = self._wakers.get(lane)
            if waker is not None and not waker.done():
                continue
            nxt = self._waker_sequence(lane)
            if nxt is not None:
                self._wakers[lane] = self._park(lane, nxt)
