"""Shared groups from asyncio (``meteor_spark.aio.AsyncSharedSubscriber``) against the real client and real TCP:
records split between members with no duplicates, a group shared with threaded members, delayed nacks,
max_deliveries and the dead-letter stream, acquisition timeouts, a member process SIGKILLed while it holds records,
and the option checks (the threaded ``SharedSubscriber``'s errors, word for word).

Each test runs its coroutine with ``asyncio.run`` (no pytest-asyncio needed).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from typing import Any, cast

import prometheus_client
import pytest

from meteor_spark.aio import AsyncPublisher, AsyncSharedSubscriber, AsyncSubscriber
from meteor_spark.consumer.shared_groups import SharedRecord
from meteor_spark.consumer.shared_subscriber import SharedSubscriber
from meteor_spark.errors import ArgumentTypeError, ConfigError, FencedError
from meteor_spark.format.corrupt import HEADER_DELIVERY_COUNT, HEADER_SOURCE_GROUP, HEADER_SOURCE_STREAM
from meteor_spark.format.records import Record, encode_batch
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.schemas import register_schema
from meteor_spark.grid.streams import StreamConfig, StreamInfo, open_stream
from meteor_spark.producer.publisher import Publisher
from tests.core.processes import Child

FOREIGN = b"this is not a meteor ring item"


def _run(coroutine: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coroutine, 60))


def _deliveries(records: Any) -> list[int]:
    """The delivery counts of records a shared member handed out (``SharedRecord``s)."""
    assert all(isinstance(r, SharedRecord) for r in records)
    return [r.delivery_count for r in records]


def _publish(grid: Grid, name: str, count: int, lanes: int = 4) -> tuple[StreamInfo, list[str]]:
    info = open_stream(grid, StreamConfig(name, lanes=lanes, capacity=1000))
    values = [f"r{i}" for i in range(count)]
    with Publisher(grid, info.name, max_batch_records=8) as publisher:
        publisher.publish_many([Record(v.encode(), lane=i % lanes) for i, v in enumerate(values)]).result(30)
    return info, values


async def _drain(member: AsyncSharedSubscriber, acked: Counter[str], total: int, deadline: float) -> None:
    """Poll and acknowledge until the group acknowledged ``total`` records (``acked`` is shared by the members)."""
    while sum(acked.values()) < total:
        assert time.monotonic() < deadline, f"acknowledged {sum(acked.values())} of {total}"
        batch = await member.poll(100)
        await member.ack(batch)
        acked.update(r.value.decode() for r in batch)


def test_two_asyncio_members_split_the_records_and_ack_each_once(
    grid: Grid, grid_settings: GridSettings, unique_name: str
) -> None:
    info, values = _publish(grid, unique_name, 400)

    async def scenario() -> None:
        first = AsyncSharedSubscriber(grid_settings, info.name, group="q", max_poll_records=20)
        second = AsyncSubscriber(grid_settings, info.name, group="q", shared=True, max_poll_records=20)
        assert isinstance(second, AsyncSharedSubscriber)
        async with first, second:
            by_member: list[Counter[str]] = [Counter(), Counter()]
            total: Counter[str] = Counter()
            deadline = time.monotonic() + 30

            async def work(member: AsyncSharedSubscriber, mine: Counter[str]) -> None:
                while sum(total.values()) < len(values):
                    assert time.monotonic() < deadline
                    batch = await member.poll(50)
                    assert all(r.delivery_count == 1 for r in batch)
                    await member.ack(batch)
                    got = [r.value.decode() for r in batch]
                    mine.update(got)
                    total.update(got)

            await asyncio.gather(work(first, by_member[0]), work(second, by_member[1]))
            assert sorted(total) == sorted(values) and max(total.values()) == 1  # no duplicate, nothing lost
            assert all(sum(c.values()) > 0 for c in by_member), by_member  # both got work
            assert first.metrics()["acked_records"] + second.metrics()["acked_records"] == len(values)
            assert first.held() == second.held() == 0
            print(f"asyncio members: {[sum(c.values()) for c in by_member]} records each, duplicates 0")

    _run(scenario())


def test_a_group_shared_by_asyncio_and_threaded_members_delivers_each_record_once(
    grid: Grid, grid_settings: GridSettings, unique_name: str
) -> None:
    info, values = _publish(grid, unique_name, 300)
    acked: Counter[str] = Counter()
    lock = threading.Lock()
    threaded_got: list[str] = []

    def threaded_member(deadline: float) -> None:
        with SharedSubscriber(grid, info.name, group="q", max_poll_records=10) as member:
            assert member.acquisition_timeout_ms == 4000  # the group's, stored by the asyncio member
            while True:
                with lock:
                    if sum(acked.values()) >= len(values):
                        return
                assert time.monotonic() < deadline
                batch = member.poll(50)
                member.ack(batch)
                with lock:
                    acked.update(r.value.decode() for r in batch)
                threaded_got.extend(r.value.decode() for r in batch)

    async def scenario() -> None:
        deadline = time.monotonic() + 30
        async with AsyncSharedSubscriber(
            grid_settings, info.name, group="q", max_poll_records=10, acquisition_timeout_ms=4000
        ) as member:
            thread = asyncio.create_task(asyncio.to_thread(threaded_member, deadline))
            asyncio_got: list[str] = []
            while sum(acked.values()) < len(values):
                assert time.monotonic() < deadline
                batch = await member.poll(50)
                await member.ack(batch)
                with lock:
                    acked.update(r.value.decode() for r in batch)
                asyncio_got.extend(r.value.decode() for r in batch)
            await thread
            assert sorted(acked) == sorted(values) and max(acked.values()) == 1
            assert asyncio_got and threaded_got, (len(asyncio_got), len(threaded_got))
            print(f"mixed group: asyncio {len(asyncio_got)}, threaded {len(threaded_got)}, duplicates 0, lost 0")

    _run(scenario())


def test_nack_with_a_delay_is_redelivered_after_it_not_before(
    grid: Grid, grid_settings: GridSettings, unique_name: str
) -> None:
    info, _ = _publish(grid, unique_name, 1, lanes=1)

    async def scenario() -> None:
        async with AsyncSharedSubscriber(grid_settings, info.name, group="q") as member:
            (record,) = await member.poll(2000)
            with pytest.raises(ConfigError, match="nack delay_ms must be >= 0"):
                await member.nack(record, delay_ms=-1)
            nacked_at = time.monotonic()
            await member.nack(record, delay_ms=800)
            assert member.metrics()["delayed_records"] == 1
            assert not await member.poll(300)  # still inside the delay
            again = await member.poll(3000)
            elapsed = time.monotonic() - nacked_at
            assert [r.offset for r in again] == [record.offset] and _deliveries(again) == [2]
            assert elapsed >= 0.8, elapsed
            await member.ack(again)
            print(f"delayed nack: redelivered after {elapsed:.2f} s (delay 0.8 s)")

    _run(scenario())


def test_max_deliveries_and_reject_go_to_the_dead_letter_stream(
    grid: Grid, grid_settings: GridSettings, unique_name: str
) -> None:
    info, _ = _publish(grid, unique_name, 2, lanes=1)
    dlq = unique_name + "-dlq"

    async def scenario() -> None:
        async with AsyncSharedSubscriber(
            grid_settings, info.name, group="q", max_deliveries=2, dead_letter_stream=dlq, max_poll_records=1
        ) as member:
            for delivery in (1, 2):
                (record,) = await member.poll(2000)
                assert record.value == b"r0" and _deliveries([record]) == [delivery]
                await member.nack(record)
            (other,) = await member.poll(2000)  # r0 was archived on the way: delivered twice
            assert other.value == b"r1"
            await member.reject(other)
            assert not await member.poll(200)
            counts = member.metrics()
            assert counts["dead_lettered_records"] == 2 and counts["rejected_records"] == 1
        async with AsyncSubscriber(grid_settings, dlq, initial_offset_scheme="EARLIEST") as reader:
            letters: list[Record] = []
            while len(letters) < 2:
                letters.extend(await reader.poll(2000))
        by_value = {r.value: dict(r.headers) for r in letters}
        assert by_value[b"r0"][HEADER_DELIVERY_COUNT] == b"2" and by_value[b"r0"][HEADER_SOURCE_GROUP] == b"q"
        assert by_value[b"r1"][HEADER_DELIVERY_COUNT] == b"1"

    _run(scenario())


def test_an_acquisition_that_times_out_goes_to_another_member_and_close_releases(
    grid: Grid, grid_settings: GridSettings, unique_name: str
) -> None:
    info, values = _publish(grid, unique_name, 6, lanes=1)

    async def scenario() -> None:
        async with (
            AsyncSharedSubscriber(grid_settings, info.name, group="q", acquisition_timeout_ms=600) as stuck,
            AsyncSharedSubscriber(grid_settings, info.name, group="q") as other,
        ):
            held = await stuck.poll(2000)
            assert [r.value.decode() for r in held] == values
            acquired_at = time.monotonic()
            again = await other.poll(5000)
            waited = time.monotonic() - acquired_at
            assert [r.value.decode() for r in again] == values and set(_deliveries(again)) == {2}
            assert waited >= 0.6 * 0.9, waited
            with pytest.raises(FencedError, match="no longer holds them"):
                await stuck.ack(held)
            await other.close()  # releases what it holds: available at once, no timeout to wait for
            t0 = time.monotonic()
            third = await stuck.poll(3000)
            assert [r.value.decode() for r in third] == values and set(_deliveries(third)) == {3}
            assert time.monotonic() - t0 < 0.5
            await stuck.ack(third)
            print(f"acquisition timeout: redelivered to another member after {waited:.2f} s (lock 0.6 s)")

    _run(scenario())


def test_undecodable_items_and_refused_records_follow_on_corrupt(
    grid: Grid, grid_settings: GridSettings, unique_name: str
) -> None:
    info = open_stream(grid, StreamConfig(unique_name, lanes=1))
    ring = grid.ring(info.ring_names[0])
    ring.add(encode_batch([b'{"n": 1}'], producer_id=1, producer_seq=0))
    ring.add(FOREIGN)
    ring.add(encode_batch([b"not json", b'{"n": 3}'], producer_id=1, producer_seq=1))
    dlq = unique_name + "-dlq"

    async def scenario() -> None:
        async with AsyncSharedSubscriber(
            grid_settings,
            info.name,
            group="q",
            on_corrupt="dead_letter",
            dead_letter_stream=dlq,
            value_deserializer="json",
        ) as member:
            got: list[Record] = []
            while len(got) < 2:
                got.extend(await member.poll(2000))
            assert [cast(Any, r.value) for r in got] == [{"n": 1}, {"n": 3}]  # json: dicts
            await member.ack(got)
            counts = member.metrics()
            assert counts["corrupt_items"] == 1 and counts["undecodable_records"] == 1 and counts["held_records"] == 0
        async with AsyncSubscriber(grid_settings, dlq, initial_offset_scheme="EARLIEST") as reader:
            letters: list[Record] = []
            while len(letters) < 2:
                letters.extend(await reader.poll(2000))
        assert sorted(r.value for r in letters) == sorted([FOREIGN, b"not json"])
        assert all(dict(r.headers)[HEADER_SOURCE_STREAM] == info.name.encode() for r in letters)

    _run(scenario())


# A member process: acknowledges its first batch, reports it, then acquires a second batch and holds it (reported)
# until it is killed.
ASYNC_SHARED_CHILD = r"""
import asyncio, json, sys
from meteor_spark.aio import AsyncSharedSubscriber
from meteor_spark.grid.client import GridSettings

address, cluster, stream = sys.argv[1:4]

async def main():
    settings = GridSettings(members=(address,), cluster_name=cluster)
    async with AsyncSharedSubscriber(settings, stream, group="q", member_id="child", max_poll_records=25,
                                     acquisition_timeout_ms=1500) as member:
        first = []
        while not first:
            first = await member.poll(100)
        await member.ack(first)
        print(json.dumps(["A", [r.value.decode() for r in first]]), flush=True)
        held = []
        while not held:
            held = await member.poll(100)
        print(json.dumps(["H", [r.value.decode() for r in held]]), flush=True)
        await asyncio.Event().wait()

asyncio.run(main())
"""


@pytest.mark.fault
def test_a_sigkilled_asyncio_member_process_loses_nothing_and_its_records_are_taken_over(
    grid: Grid, grid_settings: GridSettings, unique_name: str, children: list[Child]
) -> None:
    info, values = _publish(grid, unique_name, 200, lanes=2)
    child = Child(ASYNC_SHARED_CHILD, grid_settings.members[0], grid_settings.cluster_name, info.name)
    children.append(child)
    kind, acked_by_child = json.loads(child.read_line(30))
    assert kind == "A"
    kind, held_by_child = json.loads(child.read_line(30))
    assert kind == "H" and held_by_child
    child.kill()
    killed_at = time.monotonic()

    async def scenario() -> tuple[Counter[str], float | None]:
        acked: Counter[str] = Counter()
        took_over: float | None = None
        held = set(held_by_child)
        async with AsyncSharedSubscriber(grid_settings, info.name, group="q", max_poll_records=50) as survivor:
            assert survivor.acquisition_timeout_ms == 1500  # the group's
            while sum(acked.values()) < len(values) - len(acked_by_child):
                assert time.monotonic() - killed_at < 30, f"acknowledged {sum(acked.values())}"
                batch = await survivor.poll(100)
                got = {r.value.decode() for r in batch}
                if took_over is None and got & held:
                    took_over = time.monotonic() - killed_at
                await survivor.ack(batch)
                acked.update(got)
        return acked, took_over

    acked, took_over = _run(scenario())
    everything = Counter(acked_by_child) + acked
    lost = len(set(values) - set(everything))
    duplicated = sum(n - 1 for n in everything.values() if n > 1)
    print(
        f"asyncio member SIGKILLed holding {len(held_by_child)} records: lost {lost}, duplicated-after-ack "
        f"{duplicated}, takeover {took_over:.2f} s after the kill (lock 1.5 s)"
    )
    assert lost == 0 and duplicated == 0
    assert took_over is not None and took_over < 1.5 + 2.0


def _error_of(make: Any) -> tuple[type[BaseException], str]:
    try:
        make()
    except (ConfigError, ArgumentTypeError, TypeError) as exc:
        return type(exc), str(exc).replace("AsyncSharedSubscriber", "SharedSubscriber")
    raise AssertionError("no error")


def test_bad_options_give_the_threaded_members_errors(
    grid: Grid, grid_settings: GridSettings, unique_name: str
) -> None:
    open_stream(grid, StreamConfig(unique_name, lanes=1))
    cases: list[dict[str, Any]] = [
        {},
        {"group": "q", "lease_ms": 5000},
        {"group": "q", "acquisition_timeout_ms": 0},
        {"group": "q", "max_deliveries": 0, "dead_letter_stream": "d"},
        {"group": "q", "on_corrupt": "bogus"},
        {"group": "q", "skip_data_loss": "yes"},
        {"group": "q", "max_poll_records": 0},
        {"group": "q", "initial_offset_scheme": "sideways"},
        {"group": "q", "dead_letter_stream": ""},
        {"group": "q", "bogus_option": 1},
    ]
    for options in cases:
        threaded = _error_of(lambda options=options: SharedSubscriber(grid, unique_name, **options))
        asyncio_ = _error_of(lambda options=options: AsyncSharedSubscriber(grid_settings, unique_name, **options))
        assert asyncio_ == threaded, options

    async def at_start() -> None:  # the checks that need the stream or the group: when the member starts
        for options in (
            {"group": "q", "max_deliveries": 3},
            {"group": "q", "dead_letter_stream": unique_name},
            {"group": "q", "dead_letter_after": 0, "dead_letter_stream": "d"},
        ):
            threaded = _error_of(lambda options=options: SharedSubscriber(grid, unique_name, **options))
            with pytest.raises(ConfigError) as caught:
                await AsyncSharedSubscriber(grid_settings, unique_name, **options).start()
            assert str(caught.value) == threaded[1], options
        async with AsyncSharedSubscriber(grid_settings, unique_name, group="g2", acquisition_timeout_ms=300):
            pass
        with pytest.raises(ConfigError, match=r"acquisition_timeout_ms=30000 \(the group has 300\)"):
            await AsyncSharedSubscriber(grid_settings, unique_name, group="g2", acquisition_timeout_ms=30000).start()

    _run(at_start())
    with pytest.raises(ConfigError, match="not a prometheus_client CollectorRegistry"):
        AsyncSharedSubscriber(grid_settings, unique_name, group="q", metrics="yes")
    with pytest.raises(ConfigError, match="only for shared groups; use AsyncSharedSubscriber"):
        AsyncSubscriber(grid_settings, unique_name, group="q", max_deliveries=3)
    with pytest.raises(ConfigError, match="poll_timeout_ms"):
        AsyncSubscriber(grid_settings, unique_name, group="q", shared=True, poll_timeout_ms=0)


def test_a_typed_stream_decodes_its_metrics_are_exported_and_an_ephemeral_one_is_refused(
    grid: Grid, grid_settings: GridSettings, unique_name: str
) -> None:
    """As the threaded member: Avro values decoded with the stream's schemas (a version registered after the member
    started included), the counters in a registry's text exposition (kept after close), an ephemeral stream refused
    (its records are not acknowledged)."""
    order = {"type": "record", "name": "Order", "fields": [{"name": "id", "type": "long"}]}
    order_v2 = {**order, "fields": [*order["fields"], {"name": "note", "type": "string", "default": ""}]}
    register_schema(grid, unique_name, order)
    registry = prometheus_client.CollectorRegistry()

    async def scenario() -> list[Any]:
        async with (
            AsyncPublisher(grid_settings, StreamConfig(unique_name, lanes=2, value_format="avro")) as publisher,
            AsyncSharedSubscriber(grid_settings, unique_name, group="typed", metrics=registry) as member,
        ):
            await publisher.publish_many([{"id": n} for n in range(3)])
            values: list[Any] = []
            deadline = time.monotonic() + 10
            while len(values) < 3:
                assert time.monotonic() < deadline, values
                batch = await member.poll(100)
                values.extend(record.value for record in batch)
                await member.ack(batch)
            register_schema(grid, unique_name, order_v2)
            with Publisher(grid, unique_name) as threaded:
                threaded.publish({"id": 3, "note": "v2"})
            while len(values) < 4:
                assert time.monotonic() < deadline, values
                batch = await member.poll(100)
                values.extend(record.value for record in batch)
                await member.ack(batch)
            text = prometheus_client.generate_latest(registry).decode()
            assert f'meteor_shared_acked_records_total{{group="typed",stream="{unique_name}"}} 4.0' in text
        text = prometheus_client.generate_latest(registry).decode()
        assert f'meteor_shared_acked_records_total{{group="typed",stream="{unique_name}"}} 4.0' in text
        with pytest.raises(ConfigError, match="ephemeral"):
            await AsyncSharedSubscriber(
                grid_settings, StreamConfig(unique_name + "-eph", ephemeral=True), group="q"
            ).start()
        return values

    values = _run(scenario())
    assert sorted(values, key=lambda v: v["id"]) == [{"id": n} for n in range(4)]  # v2's record read as v1, the
    # reader's version (the latest when it started), not refused though v2 was registered after the member read
