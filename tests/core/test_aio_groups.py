"""Exclusive groups in the asyncio API (``AsyncSubscriber(group=...)``) against the real client and real TCP: lanes
balanced over asyncio members, a joiner served promptly, fencing of a member that stalled past its lease, a member
process SIGKILLed mid-stream and taken over, and threaded and asyncio members sharing one group.

Each test runs its coroutine with ``asyncio.run``. Waiting is polling with a deadline: the members' own ``poll``
(which waits on their reads) until a condition holds.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from meteor_spark.aio import AsyncSubscriber
from meteor_spark.aio.group_member import AsyncGroupMember
from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.errors import ConfigError, FencedError, LaneTruncatedError
from meteor_spark.format.records import Record
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.streams import StreamConfig, open_stream
from meteor_spark.groups.exclusive import GroupMember
from meteor_spark.producer.publisher import Publisher
from meteor_spark.testing import wait_until
from tests.core.processes import Child


def _run(coroutine: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coroutine, 60))


def _publish(grid: Grid, stream: str, count: int, lanes: int) -> list[str]:
    values = [f"r{i}" for i in range(count)]
    with Publisher(grid, stream, max_batch_records=2) as publisher:
        publisher.publish_many([Record(v.encode(), lane=i % lanes) for i, v in enumerate(values)]).result(30)
    return values


async def _poll_until(
    subs: list[AsyncSubscriber], done: Callable[[], bool], timeout_s: float, message: str, got: list[str] | None = None
) -> float:
    """Poll every member (100 ms at most each) until ``done()``; returns the seconds it took. Records delivered
    meanwhile are appended to ``got``."""
    start = time.monotonic()
    while not done():
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"not within {timeout_s} s: {message}")
        for sub in subs:
            batch = await sub.poll(100 // len(subs))
            if got is not None:
                got.extend(r.value.decode() for r in batch)
    return time.monotonic() - start


def _held(sub: AsyncSubscriber) -> set[int]:
    assert sub.member is not None
    return set(sub.member.assignment())


def _figures(name: str, **figures: object) -> None:
    print(f"[fault] {name}: " + ", ".join(f"{key}={value}" for key, value in figures.items()), flush=True)


def test_group_options_are_checked_before_connecting(grid_settings: GridSettings, unique_name: str) -> None:
    with pytest.raises(ConfigError, match="lease_ms=5 is invalid"):
        AsyncSubscriber(grid_settings, unique_name, group="g", lease_ms=5)
    with pytest.raises(ConfigError, match="auto_confirm_interval_ms and member_id are for a group member"):
        AsyncSubscriber(grid_settings, unique_name, auto_confirm_interval_ms=100)
    with pytest.raises(ConfigError, match="group '' is not a group name"):
        AsyncSubscriber(grid_settings, unique_name, group="")


def test_two_async_members_balance_the_lanes_and_a_third_gets_lanes_promptly(
    grid: Grid, grid_settings: GridSettings, unique_name: str
) -> None:
    info = open_stream(grid, StreamConfig(unique_name, lanes=4, capacity=200))

    async def scenario() -> None:
        options: dict[str, Any] = {"group": "g", "initial_offset_scheme": "earliest", "lease_ms": 3000}
        async with (
            AsyncSubscriber(grid_settings, info.name, member_id="a", **options) as a,
            AsyncSubscriber(grid_settings, info.name, member_id="b", **options) as b,
        ):
            await _poll_until([a, b], lambda: _held(a) == {0, 2} and _held(b) == {1, 3}, 10, "a: 0,2 and b: 1,3")
            published = _publish(grid, info.name, 40, 4)
            got: list[str] = []
            await _poll_until([a, b], lambda: len(got) >= len(published), 20, "every record read", got)
            assert sorted(got) == sorted(published)  # each record once, across the two members
            await a.confirm()
            await b.confirm()
            async with AsyncSubscriber(grid_settings, info.name, member_id="c", **options) as c:
                took = await _poll_until(
                    [a, b, c],
                    lambda: _held(a) == {0, 3} and _held(b) == {1} and _held(c) == {2},
                    10,
                    "lanes rebalanced to a:0,3 b:1 c:2",
                )
                # each subscriber follows its member's assignment at its next poll
                await _poll_until([a, b, c], lambda: (a.lanes, b.lanes, c.lanes) == ([0, 3], [1], [2]), 5, "read")
                assert len(await c.poll(200)) == 0  # the lane it took resumes at the group's confirmed offset
                print(f"[groups] asyncio joiner served in {took:.2f} s (lease 3 s)")
                assert took < 2.0  # by the membership generation, not a lease period

    _run(scenario())


def test_a_member_stalled_past_its_lease_is_fenced_as_in_the_threaded_api(
    grid: Grid, grid_settings: GridSettings, unique_name: str
) -> None:
    info = open_stream(grid, StreamConfig(unique_name, lanes=2, capacity=200))
    _publish(grid, info.name, 10, 2)

    async def scenario() -> None:
        async with AsyncSubscriber(
            grid_settings, info.name, group="g", lease_ms=600, initial_offset_scheme="earliest"
        ) as sub:
            got: list[Record] = []
            start = time.monotonic()
            while len(got) < 10 and time.monotonic() - start < 20:
                got.extend(await sub.poll(100))
            assert len(got) == 10
            standby = GroupMember(grid, info, "g", member_id="standby", lease_ms=600, want="all")
            standby.start()
            try:
                # Blocks the event loop (a stalled process: no renewals) until the standby took both lanes over.
                wait_until(lambda: len(standby.assignment()) == 2, 20, message="standby took both lanes")
                with pytest.raises(FencedError, match="refused"):
                    await sub.confirm(got[-1])
                with pytest.raises(FencedError, match=r"lost them|refused"):
                    await sub.confirm()
                assert standby.known_offsets() == {0: 0, 1: 0}  # nothing of the stalled member was written
                assert sub.metrics()["fencing_refusals"] >= 1
                again: list[str] = []
                await _poll_until([sub], lambda: sub.lanes == [], 10, "the stalled member dropped its lanes", again)
                assert again == []  # nothing is delivered twice
            finally:
                standby.close()

    _run(scenario())


def test_threaded_and_async_members_share_one_group(grid: Grid, grid_settings: GridSettings, unique_name: str) -> None:
    info = open_stream(grid, StreamConfig(unique_name, lanes=4, capacity=200))

    async def scenario() -> None:
        threaded = Subscriber(
            grid, info.name, group="g", member_id="t", lease_ms=3000, initial_offset_scheme="earliest"
        )
        try:
            async with AsyncSubscriber(
                grid_settings, info.name, group="g", member_id="z", lease_ms=3000, initial_offset_scheme="earliest"
            ) as aio:
                got: list[str] = []

                def balanced() -> bool:
                    got.extend(r.value.decode() for r in threaded.poll(0))
                    return _held(aio) == {1, 3} and set(threaded.lanes) == {0, 2}

                await _poll_until([aio], balanced, 10, "t holds 0,2 and z 1,3", got)
                published = _publish(grid, info.name, 40, 4)

                def read_all() -> bool:
                    got.extend(r.value.decode() for r in threaded.poll(0))
                    return len(got) >= len(published)

                await _poll_until([aio], read_all, 20, "every record read", got)
                assert sorted(got) == sorted(published)
                threaded.confirm()
                await aio.confirm()
                confirmed = GroupMember(grid, info, "g", member_id="reader").known_offsets()
                assert {lane: offset is not None and offset > 0 for lane, offset in confirmed.items()} == {
                    lane: True for lane in range(4)
                }
        finally:
            threaded.close()
        assert isinstance(aio.member, AsyncGroupMember)

    _run(scenario())


# The child joins group "g" first (so it reads both lanes), confirms what its first polls delivered, reads more
# WITHOUT confirming, reports both, then idles on its loop (the renewal task running) until it is killed.
ASYNC_CHILD = r"""
import asyncio, json, sys
from meteor_spark.aio import AsyncSubscriber

address, cluster, stream = sys.argv[1:4]

async def main():
    from meteor_spark.grid.client import GridSettings
    settings = GridSettings(members=(address,), cluster_name=cluster)
    async with AsyncSubscriber(settings, stream, group="g", member_id="child", lease_ms=600,
                               initial_offset_scheme="earliest", max_poll_records=3) as sub:
        confirmed, unconfirmed = [], []
        while len(confirmed) < 4:
            confirmed.extend(r.value.decode() for r in await sub.poll(100))
        await sub.confirm()
        while len(unconfirmed) < 2:
            unconfirmed.extend(r.value.decode() for r in await sub.poll(100))
        print(json.dumps({"confirmed": confirmed, "unconfirmed": unconfirmed}), flush=True)
        await asyncio.Event().wait()

asyncio.run(main())
"""


@pytest.mark.fault
def test_sigkilled_async_member_process_is_taken_over_by_an_async_member(
    grid: Grid, grid_settings: GridSettings, unique_name: str, children: list[Child]
) -> None:
    info = open_stream(grid, StreamConfig(unique_name, lanes=2, capacity=100))
    published = _publish(grid, info.name, 12, 2)
    child = Child(ASYNC_CHILD, grid_settings.members[0], grid_settings.cluster_name, info.name)
    children.append(child)
    report = json.loads(child.read_line())
    confirmed, unconfirmed = report["confirmed"], report["unconfirmed"]
    child.kill()
    killed_at = time.monotonic()
    lease_ms = 600

    async def scenario() -> None:
        async with AsyncSubscriber(grid_settings, info.name, group="g", member_id="survivor", lease_ms=lease_ms) as s:
            received: list[str] = []
            await _poll_until([s], lambda: _held(s) == {0, 1}, 20, "survivor holds both lanes", received)
            takeover_s = time.monotonic() - killed_at
            expected = len(published) - len(confirmed)
            await _poll_until([s], lambda: len(received) >= expected, 20, f"{expected} records", received)
            assert len(await s.poll(200)) == 0  # and nothing more
            lost = sorted(set(published) - set(confirmed) - set(received))
            duplicated = len(received) - len(set(received)) + len(set(confirmed) & set(received))
            _figures(
                "sigkill asyncio group member",
                lost=len(lost),
                duplicated=duplicated,
                takeover_s=f"{takeover_s:.2f}",
                lease_s=lease_ms / 1000,
                redelivered_unconfirmed=len(set(unconfirmed) & set(received)),
            )
            assert lost == [] and duplicated == 0
            assert set(unconfirmed) <= set(received)  # read, not confirmed: delivered again (at least once)
            assert takeover_s <= lease_ms / 1000 + 1.5
            await s.confirm()

    _run(scenario())


def test_auto_confirm_confirms_what_earlier_polls_handed_out_and_close_confirms_the_rest(
    grid: Grid, grid_settings: GridSettings, unique_name: str
) -> None:
    info = open_stream(grid, StreamConfig(unique_name, lanes=1, capacity=100))
    _publish(grid, info.name, 6, 1)

    async def scenario() -> None:
        async with AsyncSubscriber(
            grid_settings,
            info.name,
            group="g",
            auto_confirm_interval_ms=0,
            initial_offset_scheme="earliest",
            max_poll_records=3,
        ) as sub:
            first = await sub.poll(2000)
            assert len(first) == 3
            after_first = sub.position(0)
            assert GroupMember(grid, info, "g", member_id="reader").known_offsets() == {0: 0}  # nothing confirmed yet
            second = await sub.poll(2000)  # confirms what the first poll handed out, before taking more
            assert len(second) == 3
            assert GroupMember(grid, info, "g", member_id="reader").known_offsets() == {0: after_first}
        ends = GroupMember(grid, info, "g", member_id="reader").known_offsets()[0]
        assert ends == sub.position(0)  # close confirmed the second poll's records

    _run(scenario())


@pytest.mark.parametrize("skip", [False, True])
def test_an_async_member_resuming_on_a_refilled_lane_checks_the_item_mark(
    grid: Grid, grid_settings: GridSettings, unique_name: str, skip: bool
) -> None:
    config = StreamConfig(unique_name, lanes=1, max_batch_records=1, linger_ms=0)
    info = open_stream(grid, config)
    _publish(grid, info.name, 5, 1)
    with Subscriber(grid, config, group="g", lease_ms=1500, initial_offset_scheme="earliest") as threaded:
        read: list[Record] = []
        wait_until(lambda: read.extend(threaded.poll(50)) or len(read) >= 5, 10, message="the first records")
        threaded.confirm()  # stores the mark of the last item read
    grid.ring(info.ring_names[0]).destroy()  # the lane comes back empty at sequence 0 (no store)
    _publish(grid, info.name, 8, 1)  # the lane ends past the group's offset, with other items under it

    async def scenario() -> None:
        async with AsyncSubscriber(grid_settings, info.name, group="g", lease_ms=1500, skip_data_loss=skip) as sub:
            if not skip:
                with pytest.raises(LaneTruncatedError, match=r"lane 0 was truncated and refilled under group 'g'"):
                    await sub.poll(1000)
                return
            got: list[str] = []
            await _poll_until([sub], lambda: len(got) >= 8, 10, "the refilled lane read again", got)
            assert got == [f"r{i}" for i in range(8)] and sub.truncated_lanes == 1

    _run(scenario())
