"""Publisher behaviour against the real client over TCP (Meteor's checklist 6.3, corrected and extended)."""

from __future__ import annotations

import concurrent.futures
import threading
from concurrent.futures import Future
from typing import cast

import pyarrow as pa
import pytest

from meteor_spark.errors import ConfigError, PublisherClosedError, PublishTimeoutError, StreamNotFoundError
from meteor_spark.format.arrow_columns import items_to_arrow
from meteor_spark.format.offsets import index_of, make_offset, sequence_of
from meteor_spark.format.partitioning import lane_for_key
from meteor_spark.format.records import Record, decode_batch
from meteor_spark.grid.client import Grid
from meteor_spark.grid.reading import read_range
from meteor_spark.grid.streams import STREAMS_MAP, StreamConfig, StreamInfo, lane_bounds, open_stream
from meteor_spark.producer.publisher import Publisher
from meteor_spark.testing import wait_until


def _read_all(grid: Grid, info: StreamInfo) -> dict[int, list[Record]]:
    out: dict[int, list[Record]] = {}
    for lane, (head, end) in lane_bounds(grid, info).items():
        records: list[Record] = []
        for items, seqs in read_range(grid, info, lane, head, end):
            for item, seq in zip(items, seqs, strict=True):
                records.extend(decode_batch(item, stream=info.name, lane=lane, sequence=seq))
        out[lane] = records
    return out


def test_publish_returns_offsets_and_the_ring_keeps_capacity_items(grid: Grid, unique_name: str) -> None:
    config = StreamConfig(unique_name, capacity=10)
    with Publisher(grid, config) as pub:
        offsets = [pub.publish(f"m{i}".encode()) for i in range(5)]
        assert offsets == [make_offset(i, 0) for i in range(5)]  # blocking: one record per ring item
        seen: list[tuple[int | None, BaseException | None]] = []
        futures = [pub.publish_async(b"x", callback=lambda o, e: seen.append((o, e))) for _ in range(20)]
        got = [f.result(10) for f in futures]
    assert got == sorted(got) and len(set(got)) == 20
    assert all(error is None for _, error in seen) and sorted(o for o, _ in seen) == got  # type: ignore[type-var]
    ring = grid.ring(open_stream(grid, unique_name).ring_names[0])
    assert ring.capacity() == 10
    assert ring.size() == min(10, ring.tail() + 1)


def test_records_round_trip_with_keys_headers_and_timestamps(grid: Grid, unique_name: str) -> None:
    config = StreamConfig(unique_name, lanes=3)
    sent = [
        Record(f"v{i}".encode(), key=f"k{i % 7}".encode(), headers=(("n", str(i).encode()),), timestamp_ms=1000 + i)
        for i in range(200)
    ]
    with Publisher(grid, config) as pub:
        offsets = pub.publish_many(sent).result(10)
    by_lane = _read_all(grid, open_stream(grid, unique_name))
    assert sum(len(records) for records in by_lane.values()) == 200
    for lane, records in by_lane.items():
        expected = [r for r in sent if lane_for_key(r.key, 3) == lane]  # type: ignore[arg-type]
        assert [(r.value, r.key, r.headers, r.timestamp_ms) for r in records] == [
            (r.value, r.key, r.headers, r.timestamp_ms) for r in expected
        ]
    # the offsets returned are exactly where the records landed
    landed = {(r.lane, r.offset): r.value for records in by_lane.values() for r in records}
    for record, offset in zip(sent, offsets, strict=True):
        assert landed[(lane_for_key(record.key, 3), offset)] == record.value  # type: ignore[arg-type]


def test_order_is_kept_per_lane_with_many_threads_and_lanes(grid: Grid, unique_name: str) -> None:
    config = StreamConfig(unique_name, lanes=4, max_batch_records=7)
    with Publisher(grid, config, max_items_per_call=3) as pub:

        def produce(thread: int) -> None:
            for i in range(300):
                pub.publish_async(Record(f"{thread}:{i}".encode(), key=f"key-{thread}".encode()))

        threads = [threading.Thread(target=produce, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        pub.flush()
        assert pub.metrics()["outstanding"] == 0
    by_lane = _read_all(grid, open_stream(grid, unique_name))
    for records in by_lane.values():
        per_thread: dict[str, list[int]] = {}
        for r in records:
            thread, i = r.value.decode().split(":")
            per_thread.setdefault(thread, []).append(int(i))
        for sequence in per_thread.values():
            assert sequence == list(range(300))
        assert all(index_of(r.offset) < 7 for r in records)
        assert [r.offset for r in records] == sorted(r.offset for r in records)


def test_explicit_lane_wins_and_bad_lanes_are_rejected(grid: Grid, unique_name: str) -> None:
    with Publisher(grid, StreamConfig(unique_name, lanes=2)) as pub:
        offset = pub.publish(Record(b"x", key=b"a", lane=1))
        assert sequence_of(offset) == 0
        with pytest.raises(ConfigError, match="lane 2 does not exist"):
            pub.publish_async(Record(b"x", lane=2))
        with pytest.raises(ConfigError, match="value must be bytes"):
            pub.publish_async(Record("text"))  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="cannot publish a int"):
            pub.publish_async(5)
    assert [r.value for r in _read_all(grid, open_stream(grid, unique_name))[1]] == [b"x"]


def test_close_with_records_queued_loses_none(grid: Grid, unique_name: str) -> None:
    # A long linger keeps everything queued until close() has to send it.
    pub = Publisher(grid, StreamConfig(unique_name, lanes=2), linger_ms=60_000, max_batch_records=10_000)
    futures = [pub.publish_async(f"q{i}".encode()) for i in range(1000)]
    assert not any(f.done() for f in futures)
    pub.close()
    assert all(f.done() and f.exception() is None for f in futures)
    stored = _read_all(grid, open_stream(grid, unique_name))
    stored_values = sorted(r.value for records in stored.values() for r in records)
    assert stored_values == sorted(f"q{i}".encode() for i in range(1000))
    with pytest.raises(PublisherClosedError):
        pub.publish(b"late")


def test_a_throwing_callback_is_isolated(grid: Grid, unique_name: str) -> None:
    calls: list[int] = []

    def explode(offset: int | None, error: BaseException | None) -> None:
        calls.append(offset)  # type: ignore[arg-type]
        raise RuntimeError("callback bug")

    with Publisher(grid, StreamConfig(unique_name)) as pub:
        first = pub.publish_async(b"a", callback=explode)
        assert first.result(10) == 0
        assert pub.publish(b"b") == make_offset(1, 0)  # the publisher still works
    assert calls == [0]


def test_back_pressure_blocks_then_times_out(grid: Grid, unique_name: str) -> None:
    pub = Publisher(grid, StreamConfig(unique_name), linger_ms=60_000, max_buffered_records=3, max_block_ms=50)
    try:
        for i in range(3):
            pub.publish_async(f"b{i}".encode())
        with pytest.raises(PublishTimeoutError, match="max_buffered_records=3"):
            pub.publish_async(b"one too many")
        pub.flush(10)
        room_again = pub.publish_async(b"room again")  # flushed: there is room again
        pub.flush(10)
        assert room_again.result(0) == make_offset(1, 0)
    finally:
        pub.close()


def test_publish_arrow_bulk_with_keys_lanes_and_timestamps(grid: Grid, unique_name: str) -> None:
    table = pa.table(
        {
            "value": pa.array([f"v{i}" for i in range(100)], pa.string()),
            "key": pa.array([None if i % 5 == 0 else f"k{i % 3}".encode() for i in range(100)], pa.binary()),
            "lane": pa.array([0 if i == 50 else None for i in range(100)], pa.int32()),
            "timestamp": pa.array([1_000_000 + i for i in range(100)], pa.timestamp("ms", tz="UTC")),
            "headers": pa.array([[{"key": "i", "value": str(i).encode()}] for i in range(100)]),
            "ignored": pa.array(range(100)),
        }
    )
    with Publisher(grid, StreamConfig(unique_name, lanes=3)) as pub:
        assert pub.publish_arrow(table).result(10) == 100
        assert pub.publish_arrow(table.slice(0, 0)).result(10) == 0
        with pytest.raises(ConfigError, match="needs a 'value' column"):
            pub.publish_arrow(table.drop_columns(["value"]))
        with pytest.raises(ConfigError, match=r"lanes 0\.\.2"):
            pub.publish_arrow(pa.table({"value": [b"x"], "lane": [7]}))
    by_lane = _read_all(grid, open_stream(grid, unique_name))
    records = {r.value: r for rs in by_lane.values() for r in rs}
    assert len(records) == 100
    for i in range(100):
        record = records[f"v{i}".encode()]
        assert record.timestamp_ms == 1_000_000 + i
        assert record.headers == (("i", str(i).encode()),)
        if i == 50:
            assert record.lane == 0
        elif i % 5:
            assert record.key == f"k{i % 3}".encode() and record.lane == lane_for_key(record.key, 3)
    # rows of one key stay in table order within their lane
    lane_of_k1 = lane_for_key(b"k1", 3)
    k1 = [int(r.value[1:]) for r in by_lane[lane_of_k1] if r.key == b"k1"]
    assert k1 == sorted(k1)


def test_publish_arrow_spreads_keyless_rows_over_the_lanes_in_runs_of_a_whole_call(
    grid: Grid, unique_name: str
) -> None:
    """Keyless rows go to the lanes in contiguous runs of at least one call's worth (``max_call_bytes``): a bulk
    smaller than a call lands in one lane whole and the next bulk in the next lane, so no lane gets a call of its
    own for a sliver of each bulk."""
    rows = [b"%09d" % i for i in range(100)]  # 100 rows of 9 bytes; calls of 300 bytes hold 34 of them

    def bulk(lo: int, hi: int) -> pa.Table:
        return pa.table({"value": pa.array(rows[lo:hi], pa.binary())})

    with Publisher(grid, StreamConfig(unique_name, lanes=4), max_call_bytes=300) as pub:
        # One at a time: a lane claimed while the sticky lane points at it moves the sticky lane on.
        small = [pub.publish_arrow(bulk(lo, lo + 10)).lanes_written() for lo in (0, 10, 20, 30)]
        assert [[(w.lane, w.records) for w in written] for written in small] == [
            [(0, 10)],
            [(1, 10)],
            [(2, 10)],
            [(3, 10)],
        ]
        large = pub.publish_arrow(bulk(40, 100))
        assert [(w.lane, w.records) for w in large.lanes_written()] == [(0, 34), (1, 26)]
    by_lane = _read_all(grid, open_stream(grid, unique_name))
    assert {lane: [r.value for r in records] for lane, records in by_lane.items()} == {
        0: rows[0:10] + rows[40:74],
        1: rows[10:20] + rows[74:100],
        2: rows[20:30],
        3: rows[30:40],
    }


def test_publish_futures_work_with_concurrent_futures_helpers(grid: Grid, unique_name: str) -> None:
    with Publisher(grid, StreamConfig(unique_name), linger_ms=20) as pub:
        futures = [pub.publish_async(b"x") for _ in range(50)]
        # RecordFuture duck-types concurrent.futures.Future (meteor_spark.producer.futures); typeshed wants the class
        done, not_done = concurrent.futures.wait(cast("list[Future[int]]", futures), timeout=10)
        assert not not_done and len(done) == 50
        late = pub.publish_async(b"y")
        got: list[int] = []
        late.add_done_callback(lambda f: got.append(f.result()))
        assert [f.result() for f in concurrent.futures.as_completed(cast("list[Future[int]]", [late]), timeout=10)] == [
            late.result()
        ]
        wait_until(lambda: got == [late.result()], message="done callback")
        assert not late.cancel()


def test_arrow_round_trip_through_items_to_arrow(grid: Grid, unique_name: str) -> None:
    values = [bytes([i % 256]) * (i % 50) for i in range(5000)]
    with Publisher(grid, StreamConfig(unique_name, max_batch_records=600)) as pub:
        pub.publish_many(values).result(10)
    info = open_stream(grid, unique_name)
    head, end = lane_bounds(grid, info)[0]
    items, seqs = [], []
    for chunk, sequences in read_range(grid, info, 0, head, end):
        items += chunk
        seqs += sequences
    batch = items_to_arrow(items, seqs, stream=unique_name, lane=0, include_headers=False)
    assert batch.column("value").to_pylist() == values
    assert len(items) == 9  # 5000 records / 600 per item


def test_a_publisher_given_an_opened_stream_does_not_open_it_again(grid: Grid, unique_name: str) -> None:
    info = open_stream(grid, StreamConfig(unique_name, lanes=2))
    grid.map(STREAMS_MAP).remove(unique_name)  # opening it by name fails from here on
    with Publisher(grid, info) as pub:
        assert sequence_of(pub.publish(b"x")) == 0
    with pytest.raises(StreamNotFoundError):
        Publisher(grid, unique_name)
