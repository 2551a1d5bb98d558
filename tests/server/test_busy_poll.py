"""Busy polling (``--busy-poll-us``, ``EmbeddedGrid(busy_poll_us=...)``): the loop keeps polling for the window
after each request and then sleeps again; it stops for a while when another thread wants the core or windows go
unused; a member process polls by default, a member thread never; the member serves as before; bad windows are
refused."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from meteor_spark.grid.client import Grid, GridSettings, Ring
from meteor_spark.server import EmbeddedGrid, busy_poll
from meteor_spark.server.busy_poll import (
    BACKOFF_S,
    DEFAULT_WINDOW_US,
    LATE_YIELD_S,
    MAX_MISSES,
    MAX_WINDOW_US,
    BusyPoll,
)
from meteor_spark.server.member import MemberOptions

pytestmark = pytest.mark.embedded_only


@pytest.fixture
def never_late(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the real clock a loaded test machine may make any yield late; these tests are about the loop, not that."""
    monkeypatch.setattr(busy_poll, "LATE_YIELD_S", 3600.0)


@pytest.mark.usefixtures("never_late")
def test_the_window_opens_on_a_request_and_closes_after_it() -> None:
    async def scenario() -> tuple[int, float]:
        loop = asyncio.get_running_loop()
        busy = BusyPoll(2000)
        assert not busy.polling
        turns = 0

        def count() -> None:  # runs once per loop iteration while the loop is kept polling
            nonlocal turns
            turns += 1
            if busy.polling:
                loop.call_soon(count)

        opened = time.monotonic()
        busy.request_arrived(opened)
        assert busy.polling
        loop.call_soon(count)
        deadline = opened + 10
        while busy.polling and time.monotonic() < deadline:
            await asyncio.sleep(0)
        assert not busy.polling, "the window never closed"
        return turns, time.monotonic() - opened

    turns, elapsed = asyncio.run(scenario())
    assert elapsed >= 0.002  # not before the window passed
    assert turns > 1  # the loop kept turning (polling) meanwhile instead of sleeping


@pytest.mark.usefixtures("never_late")
def test_a_later_request_extends_the_window() -> None:
    async def scenario() -> None:
        busy = BusyPoll(MAX_WINDOW_US)
        busy.request_arrived(time.monotonic() - 1)  # a window already over: closes at its first poll
        busy.request_arrived(time.monotonic())  # ... unless a request extends it
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert busy.polling
        deadline = time.monotonic() + 10
        while busy.polling and time.monotonic() < deadline:
            await asyncio.sleep(0)
        assert not busy.polling

    asyncio.run(scenario())


class Scripted:
    """A clock, a yield that takes as long as told, and a queue of scheduled polls, driven by hand."""

    def __init__(self, window_us: int = 100) -> None:
        self.time = 1000.0
        self.yield_s = 1e-6  # nobody else runnable: the yield returns at once
        self.scheduled: list[Callable[[], None]] = []
        self.yields = 0
        self.poll = BusyPoll(window_us, now=lambda: self.time, yield_cpu=self._yield, call_soon=self.scheduled.append)

    def _yield(self) -> None:
        self.yields += 1
        self.time += self.yield_s

    def turn(self, elapsed_s: float = 0.0) -> None:
        """One loop iteration: ``elapsed_s`` pass, then the scheduled poll (if any) runs."""
        self.time += elapsed_s
        if self.scheduled:
            self.scheduled.pop(0)()

    def spin_until_closed(self, limit: int = 10_000) -> int:
        turns = 0
        while self.poll.polling and turns < limit:
            self.turn(10e-6)
            turns += 1
        assert not self.poll.polling
        return turns


def test_a_free_core_polls_for_the_window_and_then_sleeps() -> None:
    script = Scripted(100)
    script.poll.request_arrived(script.time)
    assert script.poll.polling and len(script.scheduled) == 1
    turns = script.spin_until_closed()
    assert 8 <= turns <= 11  # about 100 us of 10 us turns, yielding at each
    assert script.yields >= 8 and not script.scheduled


def test_a_late_yield_stops_polling_for_the_backoff() -> None:
    script = Scripted(100)
    script.poll.request_arrived(script.time)
    script.turn()
    script.yield_s = LATE_YIELD_S * 2  # another thread ran on this core during the yield
    script.turn()
    assert not script.poll.polling and not script.scheduled
    assert script.poll.backing_off(script.time) and script.poll.backoffs == 1
    script.poll.request_arrived(script.time + BACKOFF_S / 2)  # served asleep: no window
    assert not script.poll.polling and not script.scheduled
    script.yield_s = 1e-6
    script.time += BACKOFF_S
    script.poll.request_arrived(script.time)  # the backoff is over: polling is tried again
    assert script.poll.polling and script.scheduled


def test_windows_that_go_unused_stop_polling_and_used_ones_keep_it() -> None:
    script = Scripted(100)
    for _ in range(MAX_MISSES - 1):  # a trickle of requests slower than the window
        script.poll.request_arrived(script.time)
        script.spin_until_closed()
        script.time += 200e-6
    assert not script.poll.backing_off(script.time)
    script.poll.request_arrived(script.time)  # a waiting client: its next request comes within the window ...
    script.turn(50e-6)
    script.poll.request_arrived(script.time)
    script.spin_until_closed()  # ... which resets the count of misses
    for _ in range(MAX_MISSES - 1):
        script.time += 200e-6
        script.poll.request_arrived(script.time)
        script.spin_until_closed()
    assert not script.poll.backing_off(script.time)
    script.time += 200e-6
    script.poll.request_arrived(script.time)
    script.spin_until_closed()
    assert script.poll.backing_off(script.time) and script.poll.backoffs == 1
    windows = script.poll.windows
    script.poll.request_arrived(script.time)
    assert script.poll.windows == windows and not script.scheduled


def test_a_window_of_zero_never_polls() -> None:
    script = Scripted(0)
    script.poll.request_arrived(script.time)
    assert not script.poll.polling and not script.scheduled


def test_a_member_process_polls_by_default_and_a_member_thread_does_not() -> None:
    assert EmbeddedGrid(process=True).options.busy_poll_us == DEFAULT_WINDOW_US
    assert EmbeddedGrid().options.busy_poll_us == 0
    assert EmbeddedGrid(process=True, busy_poll_us=0).options.busy_poll_us == 0
    assert MemberOptions().busy_poll_us == DEFAULT_WINDOW_US  # the command line's member: a process


@pytest.mark.parametrize("window_us", [-1, MAX_WINDOW_US + 1])
def test_a_window_out_of_range_is_refused(window_us: int) -> None:
    with pytest.raises(ValueError, match=rf"busy poll window must be 0..{MAX_WINDOW_US} us \(0 = off\), got"):
        BusyPoll(window_us)
    with pytest.raises(ValueError, match=rf"busy poll window must be 0..{MAX_WINDOW_US} us \(0 = off\), got"):
        EmbeddedGrid(process=True, busy_poll_us=window_us)


def test_a_member_thread_does_not_busy_poll() -> None:
    with pytest.raises(ValueError, match="busy_poll_us needs process=True"):
        EmbeddedGrid(busy_poll_us=100)


def test_a_busy_polling_member_serves_rings_and_maps() -> None:
    with (
        EmbeddedGrid(process=True, busy_poll_us=200) as member,
        Grid(GridSettings(members=(member.address,), cluster_name=member.cluster_name)) as grid,
    ):
        ring = grid.ring("busy-poll")
        future = ring.read_many_async(0, 1, 10)  # parked until the add below
        assert ring.add(b"x" * 100_000) == 0
        assert [bytes(item) for item in Ring.to_batch(future.result()).items] == [b"x" * 100_000]
        grid_map = grid.map("busy-poll")
        for index in range(200):
            grid_map.put(f"k{index}", str(index))
        assert [grid_map.get(f"k{index}") for index in range(200)] == [str(index) for index in range(200)]
