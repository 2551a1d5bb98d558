"""Asyncio members of an exclusive group on an ephemeral (at-most-once) stream, against the real client and real TCP:
the group is one consuming entity beside a threaded ungrouped one, each record delivered once to the group (split
between its two asyncio members, the lanes' positions stored in the group before a poll hands records out) and once
to the other entity; a group whose members all left starts again at the lanes' ends when one comes back (asyncio,
then threaded after the asyncio member left); what an ephemeral stream refuses (confirm, auto-confirm).
``shared=False`` is accepted as the threaded Subscriber takes it.

Each test runs its coroutine with ``asyncio.run``; waiting is the members' own polls with a deadline.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from meteor_spark.aio import AsyncPublisher, AsyncSubscriber
from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.errors import ConfigError
from meteor_spark.format.records import Record
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.streams import StreamConfig
from meteor_spark.grid.subscriptions import live_subscriptions
from meteor_spark.groups.store import OFFSETS_MAP, read_offset
from meteor_spark.producer.publisher import Publisher
from meteor_spark.testing import wait_until


def _run(coroutine: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coroutine, 60))


@pytest.fixture
def ephemeral(grid: Grid, unique_name: str) -> Iterator[StreamConfig]:
    yield StreamConfig(unique_name, lanes=4, capacity=1000, ephemeral=True)
    grid.map(f"meteor.subscriptions::{unique_name}").clear()


def _id(sub: AsyncSubscriber) -> str:
    assert sub.member is not None, "a started group member"
    return sub.member.member_id


async def _poll(subs: list[AsyncSubscriber], count: int, timeout_s: float = 20.0) -> dict[str, list[bytes]]:
    """Poll every member until ``count`` records came in all, then once more (nothing further may come); the values
    by member id."""
    got: dict[str, list[bytes]] = {_id(sub): [] for sub in subs}
    deadline = time.monotonic() + timeout_s
    while sum(map(len, got.values())) < count:
        assert time.monotonic() < deadline, f"{sum(map(len, got.values()))} of {count} records"
        for sub, values in zip(subs, got.values(), strict=True):
            values.extend(bytes(r.value) for r in await sub.poll(50))
    for sub, values in zip(subs, got.values(), strict=True):
        values.extend(bytes(r.value) for r in await sub.poll(200))
    return got


def test_two_asyncio_members_share_the_group_beside_a_threaded_entity(
    grid: Grid, grid_settings: GridSettings, ephemeral: StreamConfig
) -> None:
    stream = ephemeral.name
    entity = Subscriber(grid, ephemeral)

    async def scenario() -> dict[str, list[bytes]]:
        async with (
            AsyncSubscriber(grid_settings, stream, group="g", member_id="a", lease_ms=1000, shared=False) as a,
            AsyncSubscriber(grid_settings, stream, group="g", member_id="b", lease_ms=1000) as b,
            AsyncPublisher(grid_settings, stream) as pub,
        ):
            deadline = time.monotonic() + 20
            while not (len(a.lanes) == 2 and len(b.lanes) == 2):
                assert time.monotonic() < deadline, f"lanes not split 2/2: a {a.lanes}, b {b.lanes}"
                await a.poll(50)
                await b.poll(50)
            entities = Counter(s.entity for s in live_subscriptions(grid, stream))
            assert entities == {"group/g": 2, f"subscriber/{entity._member_id}": 1}
            await pub.publish_many([Record(b"r%d" % i, lane=i % 4) for i in range(40)])
            got = await _poll([a, b], 40)
            for sub in (a, b):  # saved in the group before the poll handed them out: nothing left to confirm
                for lane in sub.lanes:
                    stored = read_offset(grid.map(OFFSETS_MAP), stream, "g", lane)
                    assert stored is not None and stored.offset == sub.position(lane)
            assert a.delivered_unconfirmed() == [] and b.delivered_unconfirmed() == []
            with pytest.raises(ConfigError, match=r"confirm: stream .* is ephemeral"):
                await a.confirm()
            return got

    try:
        got = _run(scenario())
        group = got["a"] + got["b"]
        print(f"\n[ephemeral] asyncio group split a={len(got['a'])} b={len(got['b'])}")
        assert sorted(group) == sorted(b"r%d" % i for i in range(40)) and got["a"] and got["b"]
        seen: list[Record] = []
        wait_until(lambda: seen.extend(entity.poll(50)) or len(seen) >= 40, 20, message="40 records to the entity")
        assert sorted(bytes(r.value) for r in seen) == sorted(group) and not entity.poll(200)
    finally:
        entity.close()


def test_an_asyncio_group_that_was_gone_starts_again_at_the_end(
    grid: Grid, grid_settings: GridSettings, ephemeral: StreamConfig
) -> None:
    stream = ephemeral.name
    other = Subscriber(grid, ephemeral)

    async def scenario() -> None:
        async with AsyncPublisher(grid_settings, stream) as pub:
            async with AsyncSubscriber(grid_settings, stream, group="g", lease_ms=1000) as member:
                await pub.publish(b"while g lived")
                assert (await _poll([member], 1))[_id(member)] == [b"while g lived"]
            await pub.publish_many([b"while g was gone"] * 3)  # stored for `other` only
            async with AsyncSubscriber(grid_settings, stream, group="g", lease_ms=1000) as revived:
                await pub.publish(b"after g came back")
                got = await _poll([revived], 1)
                assert got[_id(revived)] == [b"after g came back"]

    try:
        _run(scenario())
        with Publisher(grid, stream) as pub:
            pub.publish_many([b"while g was gone again"] * 2).result(10)
            with Subscriber(grid, stream, group="g", lease_ms=1000) as threaded:  # the same rules, threaded
                pub.publish(b"threaded g")
                got: list[Record] = []
                wait_until(lambda: got.extend(threaded.poll(50)) or len(got) >= 1, 20, message="1 record")
                assert [r.value for r in got] == [b"threaded g"] and not threaded.poll(200)
        seen: list[Record] = []
        wait_until(lambda: seen.extend(other.poll(50)) or len(seen) >= 8, 20, message="8 records to the other entity")
        assert len(seen) == 8 and not other.poll(200)
    finally:
        other.close()


def test_acknowledgement_is_refused_on_an_ephemeral_stream(
    grid_settings: GridSettings, ephemeral: StreamConfig
) -> None:
    async def scenario() -> None:
        with pytest.raises(ConfigError, match=r"auto_confirm_interval_ms: stream .* is ephemeral"):
            await AsyncSubscriber(grid_settings, ephemeral, group="g", auto_confirm_interval_ms=100).start()
        with pytest.raises(ConfigError, match=r"initial_offset_scheme EARLIEST: stream .* is ephemeral"):
            await AsyncSubscriber(grid_settings, ephemeral, group="g", initial_offset_scheme="earliest").start()

    _run(scenario())
