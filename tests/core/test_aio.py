"""The asyncio API (``meteor_spark.aio``) against the real client and real TCP: round trips, ``async for``, the
threaded API's semantics (idempotent retries through cut connections, ``read_committed``, ``on_corrupt``), its
option checks and errors, and records crossing between the asyncio and the threaded clients both ways.

Each test runs its coroutine with ``asyncio.run`` (no pytest-asyncio needed).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from meteor_spark import compat_asyncio
from meteor_spark.aio import AsyncGrid, AsyncPublisher, AsyncSubscriber
from meteor_spark.aio.record_future import OffsetFuture
from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.errors import (
    ArgumentTypeError,
    ConfigError,
    FormatError,
    GridOperationError,
    GroupError,
    SizeLimitError,
    StreamNotFoundError,
)
from meteor_spark.format.corrupt import HEADER_SOURCE_STREAM
from meteor_spark.format.item_header import item_producer
from meteor_spark.format.partitioning import lane_for_key
from meteor_spark.format.records import Record, decode_batch, encode_batch
from meteor_spark.grid import transactions
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.streams import StreamConfig, open_stream
from meteor_spark.producer.publisher import Publisher
from meteor_spark.testing import TcpProxy

FOREIGN = b"this is not a meteor ring item"


def _run(coroutine: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coroutine, 60))


async def _collect(sub: AsyncSubscriber, count: int, timeout_s: float = 15.0) -> list[Any]:
    """``count`` records through ``async for`` (the test fails after ``timeout_s``)."""
    got: list[Any] = []

    async def read() -> None:
        async for record in sub:
            got.append(record)
            if len(got) >= count:
                return

    await asyncio.wait_for(read(), timeout_s)
    return got


def test_the_asyncio_clients_private_couplings_hold() -> None:
    assert compat_asyncio.problems() == []
    assert len(compat_asyncio.COUPLINGS) == 3


def test_a_rings_appends_and_parked_reads_through_the_invocation_futures(
    grid_settings: GridSettings, unique_name: str
) -> None:
    """``AsyncRing.add_all`` (the append path of byte items; other buffers take the public one) and ``read_soon``
    store and read what the public calls would, and a read parked before the append is answered by it."""

    async def scenario() -> None:
        async with await AsyncGrid.start(grid_settings) as grid:
            ring = await grid.ring(unique_name)
            parked = ring.read_soon(0, 1, 10)
            buffers: list[Any] = [bytearray(b"cd"), memoryview(b"ef")]  # bytes-like, as callers pass them
            assert await ring.add_all([b"ab", buffers[0]]) == 1
            assert await ring.add_all([buffers[1], b"x" * 5000]) == 3
            await asyncio.wait_for(asyncio.shield(parked), 10)
            first = ring.batch_of(parked, 0)
            assert [bytes(i) for i in first.items][:1] == [b"ab"] and first.sequences[0] == 0
            batch = await ring.read_many(0, 4, 10)
            assert [bytes(i) for i in batch.items] == [b"ab", b"cd", b"ef", b"x" * 5000]
            with pytest.raises(GridOperationError, match="min 2 and max 1"):
                ring.read_soon(0, 2, 1)
            await ring.destroy()

    _run(scenario())


def test_publish_and_async_for_round_trip_with_keys_headers_and_serializers(
    grid_settings: GridSettings, unique_name: str
) -> None:
    async def scenario() -> None:
        async with (
            AsyncPublisher(grid_settings, StreamConfig(unique_name, lanes=3), value_serializer="json") as pub,
            AsyncSubscriber(
                grid_settings, unique_name, initial_offset_scheme="EARLIEST", value_deserializer="json"
            ) as sub,
        ):
            offset = await pub.publish({"n": 0}, key=b"k-0", headers=[("trace", b"t0")])
            offsets = await pub.publish_many([{"n": n} for n in range(1, 50)])
            futures = [await pub.publish_async({"n": n}, key=f"k-{n}".encode()) for n in range(50, 100)]
            offsets += list(await asyncio.gather(*futures))
            got = await _collect(sub, 100)
            assert sorted(r.value["n"] for r in got) == list(range(100))
            first = next(r for r in got if r.value == {"n": 0})
            assert (first.offset, first.key, first.headers) == (offset, b"k-0", (("trace", b"t0"),))
            assert sorted(r.offset for r in got) == sorted([offset, *offsets])  # offsets are per lane
            assert pub.metrics()["records_sent"] == 100 and pub.metrics()["outstanding"] == 0
            assert sub.metrics()["delivered_records"] == 100
            assert await sub.lag() == {0: 0, 1: 0, 2: 0}

    _run(scenario())


def test_mixed_records_are_cut_by_the_batching_limits_and_routed_to_their_lanes(
    grid_settings: GridSettings, unique_name: str
) -> None:
    def record(n: int) -> Record | bytes:
        if n % 3 == 0:
            return Record(b"keyed-%d" % n, key=b"k%d" % (n % 5))
        if n % 3 == 1:
            return Record(b"x" * 150 + b"-%d" % n, lane=n % 3, headers=(("n", str(n).encode()),))
        return b"plain-%d" % n

    async def scenario() -> None:
        async with AsyncPublisher(
            grid_settings, StreamConfig(unique_name, lanes=3), max_batch_records=7, max_batch_bytes=400
        ) as pub:
            offsets = await pub.publish_many([record(n) for n in range(60)])
            big = await pub.publish(b"B" * 1000)  # larger than max_batch_bytes: an item of its own
            routed_offset = await pub.publish(b"routed", topic="orders.eu")
            assert pub.metrics()["items_sent"] >= 60 * 50 // 400
        async with AsyncSubscriber(grid_settings, unique_name, initial_offset_scheme="EARLIEST") as sub:
            got = {r.value: r for r in await _collect(sub, 62)}
        for n, offset in enumerate(offsets):
            sent = record(n)
            value = sent if isinstance(sent, bytes) else sent.value
            read = got[value]
            assert read.offset == offset, n
            if isinstance(sent, Record) and sent.key is not None:
                assert (read.key, read.lane) == (sent.key, lane_for_key(sent.key, 3))
            elif isinstance(sent, Record):
                assert (read.lane, read.headers) == (n % 3, (("n", str(n).encode()),))
        assert got[b"B" * 1000].offset == big
        assert (got[b"routed"].offset, got[b"routed"].topic) == (routed_offset, "orders.eu")
        assert len(got[b"routed"].headers) == 1  # its routing header, written once

    _run(scenario())


def test_one_record_calls_share_runs_and_each_future_gets_its_own_offset(
    grid_settings: GridSettings, unique_name: str
) -> None:
    """Plain values of ``publish_async`` queue onto their lane's run of one-record calls while it is the queue's
    last (a burst costs per record what ``publish_many`` does): each future still gets its own record's offset,
    interleaved keyed records and bulks keep their places, and a call that fails fails only its own records."""

    async def scenario() -> None:
        async with AsyncPublisher(
            grid_settings, StreamConfig(unique_name, lanes=2), max_batch_records=50, max_items_per_call=3
        ) as pub:
            futures: dict[bytes, OffsetFuture] = {}
            for n in range(700):  # more than a call holds: the drain cuts runs that are still growing
                futures[b"p%d" % n] = await pub.publish_async(b"p%d" % n)
                if n % 97 == 0:
                    futures[b"k%d" % n] = await pub.publish_async(Record(b"k%d" % n, key=b"key"))
                if n % 250 == 0:
                    await asyncio.sleep(0)  # the lane's task runs: the run it was filling is cut
            bulk = await pub.publish_many([b"b%d" % n for n in range(30)])
            offsets = {value: await future for value, future in futures.items()}
            offsets.update({b"b%d" % n: offset for n, offset in enumerate(bulk)})
            assert pub.metrics()["calls"] > 5
        async with AsyncSubscriber(grid_settings, unique_name, initial_offset_scheme="EARLIEST") as sub:
            got = {r.value: r.offset for r in await _collect(sub, len(offsets))}
        assert got == offsets

    async def one_call_fails() -> None:
        async with AsyncPublisher(
            grid_settings, StreamConfig(unique_name + "-1", lanes=1), max_batch_records=10, max_items_per_call=1
        ) as pub:
            lane = pub._lanes[0]
            original, calls = lane.ring.add_all, [0]

            async def second_refused(items: Any, overflow_policy: int = 0) -> int:
                calls[0] += 1
                if calls[0] == 2:
                    raise GridOperationError("refused by the test")
                return await original(items, overflow_policy)

            lane.ring.add_all = second_refused  # type: ignore[method-assign]
            futures = [await pub.publish_async(b"v%d" % n) for n in range(30)]  # one run, three calls of 10
            await asyncio.gather(*futures, return_exceptions=True)  # a PublishFuture is a future to asyncio
        failed = [n for n, f in enumerate(futures) if f.exception() is not None]
        assert failed == list(range(10, 20)) and calls[0] == 3
        assert all(isinstance(futures[n].exception(), GridOperationError) for n in failed)
        assert [futures[n].result() for n in (0, 29)] == [
            0,
            (1 << 16) | 9,
        ]  # the refused call stored nothing: the third is item 1

    _run(scenario())
    _run(one_call_fails())


def test_a_run_of_one_record_calls_stops_growing_once_cut_and_a_cancelled_future_spares_the_others(
    grid_settings: GridSettings, unique_name: str
) -> None:
    """Records published after a call took some of a lane's run of one-record calls go into a new run (a run that
    kept growing while calls are cut from it would hold every value it ever carried), and a caller's cancelled
    future does not keep the run's other records from their offsets."""

    async def scenario() -> None:
        async with AsyncPublisher(
            grid_settings, StreamConfig(unique_name), max_batch_records=5, max_items_per_call=1
        ) as pub:
            lane = pub._lanes[0]
            first = [await pub.publish_async(b"a%d" % n) for n in range(7)]
            run = lane.singles
            first[2].cancel()
            await asyncio.sleep(0)  # the lane's task sends 5 of the run's 7 records
            later = [await pub.publish_async(b"b%d" % n) for n in range(5)]
            assert lane.singles is not run and lane.queue[-1] is not run
            await pub.flush()
            offsets = [f.result() for n, f in enumerate(first) if n != 2] + [await f for f in later]
            assert len(set(offsets)) == 11 and lane.task is None and not lane.queue
        async with AsyncSubscriber(grid_settings, unique_name, initial_offset_scheme="EARLIEST") as sub:
            got = {r.value: r.offset for r in await _collect(sub, 12)}
        kept = [b"a%d" % n for n in range(7) if n != 2] + [b"b%d" % n for n in range(5)]
        assert [got[value] for value in kept] == offsets

    _run(scenario())


def test_async_and_threaded_clients_read_each_other(grid: Grid, grid_settings: GridSettings, unique_name: str) -> None:
    with Publisher(grid, StreamConfig(unique_name, lanes=2)) as threaded:
        threaded.publish_many([f"t{n}".encode() for n in range(20)]).result(10)

    async def scenario() -> None:
        async with await AsyncGrid.start(grid_settings) as shared:
            async with AsyncSubscriber(shared, unique_name, initial_offset_scheme="EARLIEST") as sub:
                assert sorted(r.value for r in await _collect(sub, 20)) == sorted(f"t{n}".encode() for n in range(20))
            async with AsyncPublisher(shared, unique_name) as pub:
                await pub.publish_many([f"a{n}".encode() for n in range(20)])

    _run(scenario())
    with Subscriber(grid, unique_name, initial_offset_scheme="EARLIEST") as sub:
        values: list[bytes] = []
        for _ in range(20):
            values += [r.value for r in sub.poll(200)]
            if len(values) >= 40:
                break
        assert sorted(v for v in values if v.startswith(b"a")) == sorted(f"a{n}".encode() for n in range(20))


def test_bad_options_are_config_errors_naming_them(grid_settings: GridSettings, unique_name: str) -> None:
    with pytest.raises(ConfigError, match="max_poll_records"):
        AsyncSubscriber(grid_settings, unique_name, max_poll_records=0)
    with pytest.raises(ConfigError, match="isolation 'serializable'"):
        AsyncSubscriber(grid_settings, unique_name, isolation="serializable")
    with pytest.raises(ConfigError, match="unknown option 'max_pol_records'"):
        AsyncSubscriber(grid_settings, unique_name, max_pol_records=5)
    with pytest.raises(ConfigError, match="on_corrupt=dead_letter needs dead_letter_stream"):
        AsyncSubscriber(grid_settings, unique_name, on_corrupt="dead_letter")
    with pytest.raises(ConfigError, match=r"AsyncSubscriber\(max_deliveries=...\): only for shared groups"):
        AsyncSubscriber(grid_settings, unique_name, group="g", max_deliveries=3)
    with pytest.raises(ConfigError, match="is not a prometheus_client CollectorRegistry"):
        AsyncPublisher(grid_settings, unique_name, metrics="yes")
    with pytest.raises(ConfigError, match="unknown option 'lingerms'"):
        AsyncPublisher(grid_settings, unique_name, lingerms=5)
    with pytest.raises(ArgumentTypeError, match="members_or_grid"):
        _run(AsyncPublisher(42, unique_name).start())

    async def checked_against_the_stream() -> None:
        with pytest.raises(ConfigError, match="linger_ms"):
            await AsyncPublisher(grid_settings, StreamConfig(unique_name), linger_ms=-1).start()
        with pytest.raises(StreamNotFoundError, match="does not exist"):
            await AsyncSubscriber(grid_settings, f"{unique_name}-missing").start()
        async with AsyncPublisher(grid_settings, unique_name) as pub:
            with pytest.raises(SizeLimitError, match="more than the"):
                await pub.publish(b"x" * (grid_settings.max_record_bytes + 1))
        async with AsyncSubscriber(grid_settings, unique_name) as sub:
            with pytest.raises(GroupError, match="needs a subscriber group"):
                await sub.confirm()

    _run(checked_against_the_stream())


@pytest.fixture
def proxy(grid_settings: GridSettings) -> Iterator[TcpProxy]:
    with TcpProxy(grid_settings.members[0]) as running:
        yield running


@pytest.mark.fault
def test_idempotent_retries_through_cut_connections_lose_and_duplicate_nothing(
    grid: Grid, grid_settings: GridSettings, proxy: TcpProxy, unique_name: str
) -> None:
    """Every 5th ``add_all`` has its connection cut right after it was sent: the answer is lost, the publisher
    looks the call up in its lane and sends it again only when it is not there."""
    records = 1500

    async def scenario() -> dict[str, int]:
        through = await proxy.connect_async(grid_settings)
        async with (
            through,
            AsyncPublisher(
                through,
                StreamConfig(unique_name, lanes=2, capacity=100_000),
                max_batch_records=20,
                max_items_per_call=2,
            ) as pub,
        ):
            calls = [0]
            for lane in pub._lanes:
                original = lane.ring.add_all

                async def cutting(items: Any, overflow_policy: int = 0, original: Any = original) -> int:
                    calls[0] += 1
                    sent = asyncio.ensure_future(original(items, overflow_policy))
                    if calls[0] % 5 == 0:
                        await asyncio.sleep(0.001)  # the request leaves; its answer is cut off
                        proxy.drop()
                    return await sent

                lane.ring.add_all = cutting  # type: ignore[method-assign]
            bulks = [pub.publish_many([f"{n}".encode() for n in range(i, i + 100)]) for i in range(0, records, 100)]
            results = await asyncio.gather(*bulks, return_exceptions=True)
            failed = [r for r in results if isinstance(r, BaseException)]
            assert not failed, failed
            return {**pub.metrics(), "add_all": calls[0]}

    figures = _run(scenario())
    values: Counter[bytes] = Counter()
    seen: Counter[tuple[int, int]] = Counter()
    info = open_stream(grid, unique_name)
    for lane, name in enumerate(info.ring_names):
        ring = grid.ring(name)
        batch = ring.read_many(0, 0, 999)
        for item, sequence in zip(batch.items, batch.sequences, strict=True):
            producer = item_producer(item, stream=unique_name, lane=lane, sequence=sequence)
            seen[(producer.producer_id, producer.producer_seq)] += 1
            values.update(decode_batch(item, stream=unique_name, lane=lane, sequence=sequence).values())
    lost = sum(1 for n in range(records) if values[f"{n}".encode()] == 0)
    repeated = sum(count - 1 for count in values.values() if count > 1)
    duplicate_items = sum(count - 1 for count in seen.values() if count > 1)
    print(
        f"\nasyncio idempotent publish through a cut connection: {records} records, {figures['add_all']} add_all "
        f"attempts, {proxy.dropped} connections dropped, {figures['unknown_outcomes']} answers lost, "
        f"{figures['recovered_calls']} calls found stored, {figures['resent_calls']} resent; lost {lost}, "
        f"duplicated records {repeated}, duplicate items {duplicate_items}"
    )
    assert proxy.dropped >= 5 and figures["unknown_outcomes"] >= 3
    assert (lost, repeated, duplicate_items) == (0, 0, 0)
    assert figures["records_sent"] == records and figures["failed_records"] == 0


def test_read_committed_hides_an_open_transaction_until_it_commits(
    grid: Grid, grid_settings: GridSettings, unique_name: str
) -> None:
    key = f"{unique_name}/txn"

    async def scenario() -> None:
        async with (
            AsyncPublisher(grid_settings, StreamConfig(unique_name, lanes=1)) as plain,
            AsyncPublisher(grid_settings, unique_name, transactional=True) as txn,
            AsyncSubscriber(
                grid_settings, unique_name, initial_offset_scheme="EARLIEST", isolation="read_committed"
            ) as committed,
            AsyncSubscriber(grid_settings, unique_name, initial_offset_scheme="EARLIEST") as uncommitted,
        ):
            await plain.publish(b"before")
            transactions.begin(grid, key, txn.producer_id, 60_000, stream=unique_name)
            await txn.publish_many([b"t1", b"t2"])
            await plain.publish(b"after")
            assert [r.value for r in await _collect(uncommitted, 4)] == [b"before", b"t1", b"t2", b"after"]
            assert [r.value for r in await committed.poll(2000)] == [b"before"]
            assert [r.value for r in await committed.poll(300)] == []  # the lane waits at the open transaction
            transactions.commit(grid, key, [txn.producer_id])
            assert [r.value for r in await _collect(committed, 3)] == [b"t1", b"t2", b"after"]

    _run(scenario())


def test_read_committed_drops_an_aborted_transaction(grid: Grid, grid_settings: GridSettings, unique_name: str) -> None:
    key = f"{unique_name}/txn"

    async def scenario() -> None:
        async with (
            AsyncPublisher(grid_settings, StreamConfig(unique_name, lanes=1)) as plain,
            AsyncPublisher(grid_settings, unique_name, transactional=True) as txn,
            AsyncSubscriber(
                grid_settings, unique_name, initial_offset_scheme="EARLIEST", isolation="read_committed"
            ) as sub,
        ):
            transactions.begin(grid, key, txn.producer_id, 60_000, stream=unique_name)
            await txn.publish(b"never")
            transactions.abort(grid, key, "test")
            await plain.publish(b"kept")
            assert [r.value for r in await _collect(sub, 1)] == [b"kept"]
            assert sub.metrics()["aborted_records"] == 1

    _run(scenario())


@pytest.fixture
def with_foreign_item(grid: Grid, unique_name: str) -> str:
    """Lane 0: good item "a", a foreign item, good item "b" (sequences 0, 1, 2)."""
    info = open_stream(grid, StreamConfig(unique_name))
    ring = grid.ring(info.ring_names[0])
    ring.add(encode_batch([b"a"], producer_id=1, producer_seq=0))
    ring.add(FOREIGN)
    ring.add(encode_batch([b"b"], producer_id=1, producer_seq=1))
    return info.name


def test_on_corrupt_error_skip_and_dead_letter(grid_settings: GridSettings, with_foreign_item: str) -> None:
    stream = with_foreign_item
    letters = f"{stream}-dlq"

    async def scenario() -> None:
        async with AsyncSubscriber(grid_settings, stream, initial_offset_scheme="EARLIEST") as sub:
            assert [r.value for r in await sub.poll(5000)] == [b"a"]  # the good record before the bad item first
            with pytest.raises(FormatError, match="sequence 1"):
                await sub.poll(1000)
            await sub.seek(2 << 16, lane=0)
            assert [r.value for r in await sub.poll(5000)] == [b"b"]
        async with AsyncSubscriber(grid_settings, stream, initial_offset_scheme="EARLIEST", on_corrupt="skip") as sub:
            assert [r.value for r in await _collect(sub, 2)] == [b"a", b"b"]
            assert sub.corrupt_items == 1
        async with (
            AsyncSubscriber(grid_settings, stream, initial_offset_scheme="EARLIEST", dead_letter_stream=letters) as sub,
            AsyncSubscriber(grid_settings, letters, initial_offset_scheme="EARLIEST") as dlq,
        ):
            assert [r.value for r in await _collect(sub, 2)] == [b"a", b"b"]
            (letter,) = await _collect(dlq, 1)
            assert letter.value == FOREIGN and dict(letter.headers)[HEADER_SOURCE_STREAM] == stream.encode()

    _run(scenario())


def test_a_record_the_deserializer_refuses_goes_through_on_corrupt(
    grid_settings: GridSettings, unique_name: str
) -> None:
    async def scenario() -> None:
        async with AsyncPublisher(grid_settings, StreamConfig(unique_name, lanes=1)) as pub:
            await pub.publish_many([b'{"n": 1}', b"not json", b'{"n": 3}'])
        async with AsyncSubscriber(
            grid_settings, unique_name, initial_offset_scheme="EARLIEST", value_deserializer="json", on_corrupt="skip"
        ) as sub:
            assert [r.value for r in await _collect(sub, 2)] == [{"n": 1}, {"n": 3}]
            assert sub.undecodable_records == 1

    _run(scenario())
