"""hazelcast-python-client's reactor loop (the threaded client's): two private couplings, apart from ``compat.py``
for its size; their checks run with the others (``compat.COUPLINGS``, ``tests/test_compat.py``).

* ``fix_reactor_waker_race``: a lost wake-up in the loop's waker.
* ``sleep_until_next_timer``: the loop polls its sockets with a 10 ms timeout and checks its timers after every
  poll, so an idle client wakes a hundred times a second: 11.7 ms of CPU a second, measured on a connected idle
  ``Grid``. Once nothing but timeouts has ended its polls for ``ACTIVE_S``, the replacement polls until the earliest
  timer is due (the client keeps one every 100 ms, its invocation service's clean-up; never longer than
  ``LONGEST_POLL_S``), in poll's whole milliseconds rounded up: 2.1-2.5 ms of CPU a second idle. While traffic
  flows it polls every 10 ms as upstream does: polling only until the next timer there too cost request/reply
  about 0.05 ms at p50 in ``meteor bench pubsub`` on the project's 2-core VMs (three alternating runs each; the
  cause was not pinned down). What the 10 ms timeout did by the way is done on purpose: a timer added from another
  thread, a new connection (which queues its protocol bytes without waking the loop) and shutdown wake the loop
  through its own waker. Everything else wakes it already: a queued write, a socket's answer.

Both apply to the versions they were written for only (another version may have fixed or reshaped the loop; the
client then runs as it is, and a warning says so). Importing this module imports no ``hazelcast``.
"""

from __future__ import annotations

import inspect
import logging
import math
import os
import time
from importlib.metadata import version
from typing import Any

from meteor_spark.compat_frames import CLIENT, written_for

logger = logging.getLogger(__name__)

#: hazelcast-python-client versions the waker work-around was written for (``check_waker``).
WAKER_WRITTEN_FOR = ((5, 7), (5, 8))
#: hazelcast-python-client versions the timer-aware poll was written for (``check_timer_wait``).
TIMERS_WRITTEN_FOR = ((5, 7), (5, 8))
#: The longest the loop polls when no timer is due sooner.
LONGEST_POLL_S = 1.0
#: While traffic flows (a socket or the waker woke the loop less than ``ACTIVE_S`` ago) it polls as upstream does.
BUSY_POLL_S = 0.01
ACTIVE_S = 0.2
#: The poll of a loop being shut down, until it sees that it is (poll's shortest that is not a spin).
_STOPPING_POLL_S = 0.001


def _unpatched(what: str) -> bool:
    logger.warning(
        "hazelcast-python-client %s is outside the versions meteor-spark's %s was written for; running the client "
        "unpatched",
        version(CLIENT),
        what,
    )
    return False


def fix_reactor_waker_race() -> bool:
    """Work around a lost-wakeup race in hazelcast-python-client 5.7's reactor; returns whether it is applied.

    ``_PipedWaker.handle_read`` clears its ``awake`` flag *before* draining the wake pipe. A ``wake()`` from
    another thread in between writes its byte, which the drain then swallows, leaving ``awake`` set with an empty
    pipe: no thread can wake the reactor again, so every request sent from a non-reactor thread waits for the
    loop's poll timeout (request/reply latency jumps from ~1 ms to ~20 ms, at random per client). Draining first
    and clearing the flag afterwards cannot lose a wakeup: a ``wake()`` that sees the flag still set finds its
    write queued when the reactor builds its next poll set.
    """
    from hazelcast import reactor

    waker_class = getattr(reactor, "_PipedWaker", None)
    if waker_class is None or getattr(waker_class, "_meteor_fixed", False):
        return waker_class is not None
    if not written_for(WAKER_WRITTEN_FOR):
        return _unpatched("reactor waker work-around")

    def handle_read(self: Any) -> None:
        try:
            while len(os.read(self._read_fd, 4096)) == 4096:
                pass
        except OSError:
            pass
        self.awake = False

    waker_class._meteor_original_handle_read = waker_class.handle_read
    waker_class.handle_read = handle_read
    waker_class._meteor_fixed = True
    return True


def check_waker() -> None:
    from hazelcast import reactor

    waker_class = getattr(reactor, "_PipedWaker", None)
    assert waker_class is not None, "hazelcast.reactor._PipedWaker is gone"
    original = getattr(waker_class, "_meteor_original_handle_read", waker_class.handle_read)
    source = inspect.getsource(original)
    assert "self.awake = False" in source and "os.read(self._read_fd" in source, (
        "_PipedWaker.handle_read no longer clears `awake` and drains `_read_fd`: the race may be fixed or moved"
    )
    assert source.index("self.awake = False") < source.index("os.read("), (
        "_PipedWaker.handle_read now drains before clearing `awake`: the race is fixed upstream, drop the patch"
    )
    assert "self.awake = True" in inspect.getsource(waker_class.wake), "_PipedWaker.wake no longer sets `awake`"


def sleep_until_next_timer() -> bool:
    """Have the client's reactor poll until its next timer instead of every 10 ms; returns whether it does."""
    from hazelcast import reactor

    loop_class = getattr(reactor, "_WakeableLoop", None)
    connection_class = getattr(reactor, "AsyncoreConnection", None)
    if loop_class is None or connection_class is None:
        return False
    if getattr(loop_class, "_meteor_timed", False):
        return True
    if not written_for(TIMERS_WRITTEN_FOR):
        return _unpatched("timer-aware reactor poll")
    asyncore = reactor.asyncore
    add_timer, shutdown, connection_init = loop_class.add_timer, loop_class.shutdown, connection_class.__init__

    def run_loop(self: Any) -> None:
        started = time.monotonic()
        if self._meteor_stopping:
            timeout = _STOPPING_POLL_S
        elif started - self._meteor_last_event < ACTIVE_S:
            timeout = BUSY_POLL_S
        else:
            timeout = poll_timeout_s(self, time.time())
        asyncore.loop(timeout=timeout, use_poll=True, map=self._map, count=1)
        ended = time.monotonic()
        if ended - started < int(timeout * 1000) / 1000:  # woken by a socket or the waker (poll counts whole ms)
            self._meteor_last_event = ended

    def add_timer_waking(self: Any, delay: float, callback: Any) -> Any:
        timer = add_timer(self, delay, callback)
        self.wake_loop()  # from another thread; the reactor thread takes its new timers in before it polls
        return timer

    def shutdown_waking(self: Any) -> None:
        self._meteor_stopping = True
        self.wake_loop()
        shutdown(self)

    def connection_init_waking(self: Any, reactor_: Any, *args: Any, **kwargs: Any) -> None:
        connection_init(self, reactor_, *args, **kwargs)
        reactor_.wake_loop()  # its protocol bytes are queued: the loop must poll the new socket for writing

    loop_class.run_loop = run_loop
    loop_class._meteor_last_event = 0.0
    loop_class._meteor_stopping = False
    loop_class.add_timer = add_timer_waking
    loop_class.shutdown = shutdown_waking
    connection_class.__init__ = connection_init_waking
    loop_class._meteor_timed = True
    return True


def poll_timeout_s(loop: Any, now: float) -> float:
    """Seconds the loop may poll at ``now``: until its earliest timer (queued ones included) is due, at most
    ``LONGEST_POLL_S``; a whole number of milliseconds with half a millisecond over, as poll truncates to
    milliseconds (rounding down would wake the loop just before the timer, to spin out the rest)."""
    ends = [loop._timers[0][0]] if loop._timers else []
    queued = list(loop._new_timers)  # a copy: other threads append while this reads
    if queued:
        ends.append(min(end for end, _timer in queued))
    if not ends:
        return LONGEST_POLL_S
    wait = min(ends) - now
    if wait <= 0:
        return 0.0
    return min(LONGEST_POLL_S, (math.ceil(wait * 1000 - 1e-6) + 0.5) / 1000)  # 1e-6: float noise is no ms


def check_timer_wait() -> None:
    from hazelcast import reactor

    loop_class = getattr(reactor, "_WakeableLoop", None)
    assert loop_class is not None, "hazelcast.reactor._WakeableLoop is gone"
    loop = inspect.getsource(loop_class)  # the module's text: what was patched reads as it was
    assert "asyncore.loop(timeout=0.01, use_poll=True, map=self._map, count=1)" in loop, (
        "_WakeableLoop.run_loop no longer polls with a 10 ms timeout: the replacement would drop what changed"
    )
    assert "self._is_live = False" in loop, "_WakeableLoop.shutdown no longer clears `_is_live`"
    timers = inspect.getsource(reactor._AbstractLoop)
    for needed in ("self._new_timers.append((timer.end, timer))", "heappush(timers", "self.run_loop()"):
        assert needed in timers, f"the reactor loop's timers no longer do `{needed}`"
    assert timers.index("self.run_loop()") < timers.index("self._check_timers()"), (
        "the loop no longer checks its timers right after each poll"
    )
    assert 'self._write_queue.append(b"CP2")' in inspect.getsource(reactor.AsyncoreConnection), (
        "a new connection no longer queues its protocol bytes in __init__: re-check what wakes the loop for them"
    )
