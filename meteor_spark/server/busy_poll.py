"""Adaptive busy polling: after a request, a member process keeps polling its sockets for a window, while it pays.

Why. A member that waits for the next request asleep in ``epoll_wait`` has to be scheduled back in when it arrives;
on an idle virtual machine that wake-up (an idle vCPU brought back, the thread switched in) is a large part of a
small request's round trip. Measured on the 2-vCPU test VM, quiet, with a client waiting for each answer: map get p50
92-100 us asleep against 51-54 us polling for 100 us after each request, where a real Hazelcast 5.7 member answered
in 85-92 us (``docs/benchmarks.md``, "mem: the embedded member's map round trip"). The window must cover the
client's turn between an answer and its next request (about 70 us there): 60 us gave 76 us, 30 us nothing.

What it costs, and the policy that bounds it. A polling member stays on a CPU; that CPU is taken from the clients
when they share the cores, and spent for nothing when no request comes. A fixed window made the map p50 worse with
both cores busy (60-83 us against 56-61 asleep). So polling stops where it costs:

- **Another thread wants this core.** Each poll yields the CPU (``sched_yield``) and times the yield: one that comes
  back later than ``LATE_YIELD_S`` means a runnable thread kept this core meanwhile (a busy client, a CPU-bound
  job, another vCPU's steal). Polling then stops for ``BACKOFF_S`` and the member sleeps between requests, as
  without polling, before it tries again. The load average cannot tell this: the spinner raises it itself.
- **No request comes within the window.** A window that expires without a request was spent for nothing; after
  ``MAX_MISSES`` such windows in a row (a trickle of requests slower than the window, or clients that stopped)
  polling also stops for ``BACKOFF_S``. A client waiting for each answer hits nearly every window.

With this policy (``docs/benchmarks.md``, "poll: adaptive busy polling"): quiet, map get p50 56-66 us against
100-104 asleep; with both cores taken by CPU-bound jobs, the same as asleep. An idle member costs nothing: a window
only opens when a request arrives. Polling runs in a member process only
(``EmbeddedGrid(process=False)`` refuses it): a member thread would spin against the application's threads for the
GIL. Like Hazelcast's ``hazelcast.io.selectorMode=selectnow`` (its I/O threads spin on ``selectNow``), but adaptive.

How. A callback that reschedules itself with ``call_soon`` makes the event loop (uvloop or asyncio) poll with a zero
timeout until the window after the last request has passed; then it stops and the loop sleeps as before. The clock,
the yield and the scheduling are injectable so the policy is tested without sleeping.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable

#: ``os.sched_yield``, or None (Windows): polls then only go through the loop.
_SCHED_YIELD = getattr(os, "sched_yield", None)
#: Window of a member process unless told otherwise (``--busy-poll-us``); covers a Python client's turn (~70 us).
#: Off where there is no ``sched_yield``: without timing a yield, polling cannot tell that another thread waits.
DEFAULT_WINDOW_US = 100 if _SCHED_YIELD is not None else 0
#: Upper bound of ``--busy-poll-us``: a longer window spins through pauses of the clients, not their round trips.
MAX_WINDOW_US = 10_000
#: A yield that takes longer than this gave the CPU to a thread that kept it (a CPU-bound one gets a slice of
#: milliseconds): the core is wanted, stop polling. A client's thread that runs its short turn (tens of microseconds
#: of Python) and blocks again must not count: at 50 us the waiting map client alone made the member back off.
LATE_YIELD_S = 500e-6
#: Windows in a row that expire without a request before polling stops.
MAX_MISSES = 4
#: How long polling stays off after it stopped (contention or misses) before the next request may open a window.
BACKOFF_S = 0.1


def check_window(window_us: int) -> None:
    """Refuse a window outside 0..``MAX_WINDOW_US`` (``--busy-poll-us``, ``MemberOptions``, ``BusyPoll``).

    Raises:
        ValueError: naming the range and the value given.
    """
    if not 0 <= window_us <= MAX_WINDOW_US:
        raise ValueError(f"busy poll window must be 0..{MAX_WINDOW_US} us (0 = off), got {window_us}")


def _no_yield() -> None:
    pass


def _call_soon(callback: Callable[[], None]) -> None:
    asyncio.get_running_loop().call_soon(callback)


class BusyPoll:
    """Keeps the running event loop polling for ``window_us`` after each ``request_arrived``, while that pays.

    Args:
        window_us: the window after each request; 0 disables polling.
        now: the monotonic clock, in seconds.
        yield_cpu: gives the CPU to another runnable thread, if any (``os.sched_yield``).
        call_soon: schedules the next poll on the running loop.

    Raises:
        ValueError: ``window_us`` outside 0..``MAX_WINDOW_US``.
    """

    def __init__(
        self,
        window_us: int,
        now: Callable[[], float] = time.monotonic,
        yield_cpu: Callable[[], None] = _SCHED_YIELD or _no_yield,
        call_soon: Callable[[Callable[[], None]], None] = _call_soon,
    ) -> None:
        check_window(window_us)
        self.window_s = window_us / 1e6
        self._now = now
        self._yield = yield_cpu
        self._call_soon = call_soon
        self._until = 0.0
        self._polling = False
        self._used = False  # a request arrived during the open window
        self._misses = 0  # windows in a row that expired without a request
        self._resume_at = 0.0  # no window opens before this (backing off)
        self.windows = 0  # windows opened
        self.backoffs = 0  # times polling stopped for BACKOFF_S

    @property
    def polling(self) -> bool:
        """True while the loop is kept polling (a window is open)."""
        return self._polling

    def backing_off(self, now: float) -> bool:
        """True while polling stays off after contention or idle windows (requests are then served asleep)."""
        return now < self._resume_at

    def request_arrived(self, now: float) -> None:
        """Open (or extend) the window: ``now`` is ``time.monotonic()`` when the request was read."""
        if self._polling:
            self._used = True  # the window paid: this request was read without a wake-up
            self._until = now + self.window_s
            return
        if self.window_s <= 0 or now < self._resume_at:
            return
        self._until = now + self.window_s
        self._polling = True
        self._used = False
        self.windows += 1
        self._call_soon(self._poll)

    def _poll(self) -> None:
        before = self._now()
        if before >= self._until:
            self._polling = False
            self._misses = 0 if self._used else self._misses + 1
            if self._misses >= MAX_MISSES:
                self._back_off(before)
            return
        self._yield()
        after = self._now()
        if after - before > LATE_YIELD_S:
            self._polling = False
            self._back_off(after)
            return
        self._call_soon(self._poll)

    def _back_off(self, now: float) -> None:
        self._misses = 0
        self._resume_at = now + BACKOFF_S
        self.backoffs += 1
