"""Busy polling: after a request, the member keeps polling its sockets without sleeping for a while (opt-in).

Why. A member that waits for the next request asleep in ``epoll_wait`` has to be scheduled back in when it arrives;
on an idle virtual machine that wake-up (an idle vCPU brought back, the thread switched in) is a large part of a
small request's round trip. Measured on the 2-vCPU test VM (load 2-4) with a client waiting for each answer (map
get / put): get p50 about 65-100 us asleep against about 52 us polling, where a real Hazelcast 5.7 member answered in
64-118 us (``docs/benchmarks.md``, "mem: the embedded member's map round trip").

What it costs. The member's thread stays on a CPU for up to ``window_us`` after every request: with a client that
sends the next request within the window, the member never sleeps, and its CPU per request becomes the time between
requests (57 instead of 20 us a map request in the measurement above). On a machine whose cores are shared with busy
clients that CPU is taken from them; each poll yields the CPU (``sched_yield``) so a runnable thread on that core
gets it at once, but the member still competes: with the 2 cores busy (load 5-7) the map get p50 was worse with
polling (60-83 us) than without (56-61 us). Hence off by default, like Hazelcast's own
``hazelcast.io.selectorMode=selectnow`` (its I/O threads spin on ``selectNow``; by default they sleep in ``select``).

How. A callback that reschedules itself with ``call_soon`` makes the event loop (uvloop or asyncio) poll with a zero
timeout until the window after the last request has passed; then it stops and the loop sleeps as before. An idle
member costs nothing: the window only opens when a request arrives.
"""

from __future__ import annotations

import asyncio
import os
import time

#: Upper bound of ``--busy-poll-us``: a longer window spins through pauses of the clients, not their round trips.
MAX_WINDOW_US = 10_000

_YIELD = getattr(os, "sched_yield", None)  # None on Windows: the polls then only go through the loop


class BusyPoll:
    """Keeps the running event loop polling for ``window_us`` after each ``request_arrived``; 0 disables it.

    Raises:
        ValueError: ``window_us`` outside 0..``MAX_WINDOW_US``.
    """

    def __init__(self, window_us: int) -> None:
        if not 0 <= window_us <= MAX_WINDOW_US:
            raise ValueError(f"busy poll window must be 0..{MAX_WINDOW_US} us (0 = off), got {window_us}")
        self.window_s = window_us / 1e6
        self._until = 0.0
        self._polling = False

    @property
    def polling(self) -> bool:
        """True while the loop is kept polling (a window is open)."""
        return self._polling

    def request_arrived(self, now: float) -> None:
        """Open (or extend) the window: ``now`` is ``time.monotonic()`` when the request was read."""
        self._until = now + self.window_s
        if not self._polling:
            self._polling = True
            asyncio.get_running_loop().call_soon(self._poll)

    def _poll(self) -> None:
        if time.monotonic() >= self._until:
            self._polling = False
            return
        if _YIELD is not None:
            _YIELD()
        asyncio.get_running_loop().call_soon(self._poll)
