"""The grid client's reactor polls until its next timer once idle (``meteor_spark.compat_reactor``): an idle client
costs a fraction of the CPU, and what the 10 ms poll did by the way still happens on time (timers added from other
threads, new connections, shutdown)."""

from __future__ import annotations

import collections
import os
import statistics
import subprocess
import sys
import threading
import time
import types
from collections.abc import Sequence
from typing import Any

from meteor_spark import compat_reactor
from meteor_spark.compat_reactor import LONGEST_POLL_S, poll_timeout_s
from meteor_spark.grid.client import Grid, GridSettings

#: A fresh process holding one connected, idle client: its CPU a second over two idle seconds.
_IDLE = """
import sys, time
from meteor_spark.grid.client import Grid, GridSettings
with Grid(GridSettings(members=tuple(sys.argv[1].split(",")), cluster_name=sys.argv[2])) as grid:
    grid.map("meteor-idle-probe").put("k", "v")
    time.sleep(1.0)  # the client settles (heartbeats, its first clean-ups)
    cpu = time.process_time()
    time.sleep(2.0)
    print((time.process_time() - cpu) / 2.0 * 1e3)
"""


def _loop(timers: Sequence[float], queued: Sequence[float] = ()) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        _timers=[(end, None) for end in sorted(timers)],
        _new_timers=collections.deque((end, None) for end in queued),
    )


def test_the_poll_lasts_until_the_earliest_timer_in_whole_milliseconds() -> None:
    now = 1000.0
    assert poll_timeout_s(_loop([]), now) == LONGEST_POLL_S  # nothing due: the longest poll
    assert poll_timeout_s(_loop([now + 60]), now) == LONGEST_POLL_S
    assert poll_timeout_s(_loop([now - 0.001]), now) == 0.0  # due already: poll and go on
    # poll() counts whole milliseconds and asyncore truncates: 57.3 ms must become 58, never 57 (a spin after).
    assert int(poll_timeout_s(_loop([now + 0.0573]), now) * 1000) == 58
    assert int(poll_timeout_s(_loop([now + 0.057]), now) * 1000) == 57
    # A timer another thread queued since the last check counts too.
    assert int(poll_timeout_s(_loop([now + 0.5], queued=[now + 0.02, now + 0.3]), now) * 1000) == 20


def test_an_idle_client_costs_a_fraction_of_the_cpu(grid_settings: GridSettings) -> None:
    env = {k: v for k, v in os.environ.items() if k != "COVERAGE_PROCESS_START"}
    done = subprocess.run(
        [sys.executable, "-c", _IDLE, ",".join(grid_settings.members), grid_settings.cluster_name],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=True,
    )
    per_s = float(done.stdout.strip().splitlines()[-1])
    print(f"an idle client: {per_s:.2f} ms of CPU a second (hazelcast-python-client's own loop: ~11.7)")
    assert per_s < 6.0


def _idle(grid: Grid) -> None:
    """Wait until the client's loop polls until its next timer (no event for ``ACTIVE_S``)."""
    loop: Any = grid.client._reactor._loop
    deadline = time.monotonic() + 10
    while time.monotonic() - loop._meteor_last_event < compat_reactor.ACTIVE_S:
        assert time.monotonic() < deadline, "the client never went idle"
        time.sleep(0.02)


def test_a_timer_added_from_another_thread_fires_on_time(grid_settings: GridSettings) -> None:
    with Grid(grid_settings) as grid:
        late = []
        for _ in range(5):
            _idle(grid)
            fired = threading.Event()
            due = time.monotonic() + 0.02
            grid.client._reactor.add_timer(0.02, fired.set)
            assert fired.wait(5)
            late.append(time.monotonic() - due)
    print(f"timers added while idle fired {statistics.median(late) * 1e3:.1f} ms late (median of 5)")
    # Without the wake-up they waited for the loop's next timer: up to 100 ms, 50 in the median.
    assert statistics.median(late) < 0.03


def test_a_client_connects_and_closes_promptly_from_idle(grid_settings: GridSettings) -> None:
    connects, closes = [], []
    for _ in range(5):
        started = time.monotonic()
        grid = Grid(grid_settings)  # a new loop starts idle: its first connection must wake it
        connects.append(time.monotonic() - started)
        _idle(grid)
        started = time.monotonic()
        grid.close()
        closes.append(time.monotonic() - started)
    print(f"connect {statistics.median(connects) * 1e3:.1f} ms, close {statistics.median(closes) * 1e3:.1f} ms")
    assert statistics.median(connects) < 0.5
    assert statistics.median(closes) < 0.05
