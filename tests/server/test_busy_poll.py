"""Busy polling (``--busy-poll-us``, ``EmbeddedGrid(busy_poll_us=...)``): the loop keeps polling for the window
after each request and then sleeps again; the member serves as before; bad windows are refused."""

from __future__ import annotations

import asyncio
import time

import pytest

from meteor_spark.grid.client import Grid, GridSettings, Ring
from meteor_spark.server import EmbeddedGrid
from meteor_spark.server.busy_poll import MAX_WINDOW_US, BusyPoll

pytestmark = pytest.mark.embedded_only


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
