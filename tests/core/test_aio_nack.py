"""An asyncio member of an exclusive group, the rest of the threaded member's API, against the real client and real
TCP: ``nack`` with a delay (not before it, after it; another member taking the lane over waits for the same
instant), ``dead_letter_after``, ``deactivate`` / ``reactivate``, and an ``AsyncGroupMember(want="all")`` standing
by for lanes held by another.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from meteor_spark.aio import AsyncSubscriber
from meteor_spark.aio.group_member import AsyncGroupMember
from meteor_spark.aio.streams import open_stream_async
from meteor_spark.errors import ConfigError, GroupError
from meteor_spark.format.corrupt import HEADER_SOURCE_GROUP
from meteor_spark.format.records import Record
from meteor_spark.grid.aio_client import AsyncGrid
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.streams import StreamConfig, open_stream
from meteor_spark.groups.redelivery import now_ms
from meteor_spark.groups.store import OFFSETS_MAP, read_offset
from meteor_spark.producer.publisher import Publisher


def _run(coroutine: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coroutine, 60))


def _publish(grid: Grid, stream: str, count: int, lanes: int = 1) -> None:
    open_stream(grid, StreamConfig(stream, lanes=lanes, capacity=200))
    with Publisher(grid, stream, max_batch_records=2, linger_ms=0) as publisher:
        publisher.publish_many([Record(f"r{i}".encode(), lane=i % lanes) for i in range(count)]).result(30)


async def _until(sub: AsyncSubscriber, got: list[Record], count: int, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while len(got) < count:
        assert time.monotonic() < deadline, f"{len(got)} of {count} records within {timeout_s} s"
        got.extend(await sub.poll(100))


def test_nack_and_dead_letter_after_options_are_the_threaded_ones(
    grid_settings: GridSettings, unique_name: str
) -> None:
    with pytest.raises(ConfigError, match="dead_letter_after needs a group"):
        AsyncSubscriber(grid_settings, unique_name, dead_letter_after=3)
    with pytest.raises(ConfigError, match="needs a dead_letter_stream"):
        AsyncSubscriber(grid_settings, unique_name, group="g", dead_letter_after=3)
    with pytest.raises(ConfigError, match=r"dead_letter_after must be an integer in \[1, "):
        AsyncSubscriber(grid_settings, unique_name, group="g", dead_letter_after=0, dead_letter_stream="d")

    async def ungrouped() -> None:
        async with AsyncSubscriber(grid_settings, StreamConfig(unique_name)) as sub:
            with pytest.raises(GroupError, match="nack needs a subscriber group"):
                await sub.nack([])
            with pytest.raises(GroupError, match="deactivate needs a subscriber group"):
                await sub.deactivate()

    _run(ungrouped())


def test_a_delayed_nack_pauses_the_lane_for_the_group_and_the_next_holder_waits_too(
    grid: Grid, grid_settings: GridSettings, unique_name: str
) -> None:
    _publish(grid, unique_name, 5)
    delay_ms = 1200

    async def scenario() -> None:
        first = AsyncSubscriber(grid_settings, unique_name, group="g", member_id="a", initial_offset_scheme="earliest")
        async with first:
            got: list[Record] = []
            await _until(first, got, 5)
            with pytest.raises(ConfigError, match="delay_ms must be >= 0"):
                await first.nack(got[2], delay_ms=-1)
            await first.confirm(got[1])
            with pytest.raises(ConfigError, match="were not all delivered and unconfirmed"):
                await first.nack(got[0])
            await first.nack(got[3:], delay_ms=delay_ms)
            until = now_ms() + delay_ms
            stored = read_offset(grid.map(OFFSETS_MAP), unique_name, "g", 0)
            assert stored is not None and stored.offset == got[3].offset and stored.not_before_ms >= until - 100
            assert len(await first.poll(300)) == 0  # not before the instant
            assert first.metrics()["nacked_records"] == 2 and first.metrics()["delayed_records"] == 2
        # the nacking member left: another member takes the lane over and waits for the same instant
        async with AsyncSubscriber(grid_settings, unique_name, group="g", member_id="b") as second:
            again: list[Record] = []
            await _until(second, again, 2)
            early_ms = stored.not_before_ms - now_ms()
            print(f"\n[nack] redelivered to another member {-early_ms} ms after the instant", flush=True)
            assert early_ms <= 0
            assert [r.value for r in again] == [b"r3", b"r4"]

    _run(scenario())


def test_a_record_nacked_too_far_behind_is_dead_lettered_and_the_lane_moves_on(
    grid: Grid, grid_settings: GridSettings, unique_name: str
) -> None:
    _publish(grid, unique_name, 10)
    dlq = unique_name + "-dlq"

    async def scenario() -> list[Record]:
        async with AsyncSubscriber(
            grid_settings,
            unique_name,
            group="g",
            initial_offset_scheme="earliest",
            dead_letter_stream=dlq,
            dead_letter_after=3,
        ) as sub:
            got: list[Record] = []
            await _until(sub, got, 10)
            await sub.nack(got[1], delay_ms=60_000)  # 8 records behind r9: dead-lettered, the lane goes on at once
            again: list[Record] = []
            await _until(sub, again, 8)
            assert [r.value for r in again] == [f"r{i}".encode() for i in range(2, 10)]
            await sub.nack(again[-2], delay_ms=1)  # r8, one behind: rewound to, not dead-lettered
            assert sub.metrics()["dead_lettered_records"] == 1 and sub.metrics()["nacked_records"] == 1
        async with AsyncSubscriber(grid_settings, dlq, initial_offset_scheme="earliest") as letters:
            out: list[Record] = []
            await _until(letters, out, 1)
            return out

    (letter,) = _run(scenario())
    assert letter.value == b"r1" and dict(letter.headers)[HEADER_SOURCE_GROUP] == b"g"


def test_deactivate_hands_the_lanes_over_and_reactivate_takes_a_share_back(
    grid: Grid, grid_settings: GridSettings, unique_name: str
) -> None:
    _publish(grid, unique_name, 8, lanes=2)

    async def held_by(sub: AsyncSubscriber, other: AsyncSubscriber, lanes: set[int]) -> None:
        deadline = time.monotonic() + 20
        while sub.member is None or set(sub.member.assignment()) != lanes:
            assert time.monotonic() < deadline, f"lanes {lanes} not held within 20 s"
            await sub.poll(50)
            await other.poll(50)

    async def scenario() -> None:
        async with (
            AsyncSubscriber(grid_settings, unique_name, group="g", member_id="a", auto_confirm_interval_ms=10) as a,
            AsyncSubscriber(grid_settings, unique_name, group="g", member_id="b") as b,
        ):
            await held_by(a, b, {0})
            await a.deactivate()
            started = time.monotonic()
            assert a.member is None and a.lanes == [] and len(await a.poll(100)) == 0
            assert time.monotonic() - started >= 0.09  # poll waits its timeout while deactivated
            await held_by(b, a, {0, 1})
            await a.reactivate()
            await held_by(a, b, {0})
            await held_by(b, a, {1})

    _run(scenario())


def test_a_want_all_member_stands_by_for_lanes_another_holds(grid_settings: GridSettings, unique_name: str) -> None:
    async def scenario() -> None:
        grid = await AsyncGrid.start(grid_settings)
        try:
            info = await open_stream_async(grid, StreamConfig(unique_name, lanes=3))
            active = AsyncGroupMember(grid, info, "spark", member_id="driver-1", want="all", lease_ms=1000)
            standby = AsyncGroupMember(grid, info, "spark", member_id="driver-2", want="all", lease_ms=1000)
            await active.start()
            await standby.start()
            assert set(active.assignment()) == {0, 1, 2} and set(standby.assignment()) == set()
            await active.close()
            deadline = time.monotonic() + 10
            while set(standby.assignment()) != {0, 1, 2}:
                assert time.monotonic() < deadline, "the standby took the lanes"
                await asyncio.sleep(0.05)
            await standby.close()
        finally:
            await grid.close()
        with pytest.raises(ConfigError, match="want"):
            AsyncGroupMember.check("g", None, 1000, want="some")

    _run(scenario())
