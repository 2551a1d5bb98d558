"""Positions by time: the binary search over ring items, ``Subscriber.seek_to_timestamp``, history below the head."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import pytest

from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.errors import ConfigError
from meteor_spark.format.item_encoding import ItemFraming, encode_item_v1, encode_items, prepare_columns
from meteor_spark.format.item_header import NO_TIMESTAMP
from meteor_spark.format.offsets import make_offset
from meteor_spark.format.records import Record
from meteor_spark.format.wire import decode_item, lane_max_after
from meteor_spark.grid.client import Grid, Ring
from meteor_spark.grid.streams import StreamConfig, StreamInfo, lane_bounds, open_stream
from meteor_spark.grid.timestamps import offset_for_timestamp
from meteor_spark.producer.publisher import Publisher


def _items(grid: Grid, info: StreamInfo, stamps: Sequence[Sequence[int]], lane: int = 0) -> None:
    """One ring item per entry of ``stamps``, its records' values ``"<sequence>.<index>"``, each item's running
    maximum continued from the lane's last item as a publisher continues it."""
    ring = grid.ring(info.ring_names[lane])
    tail = ring.tail()
    first = tail + 1
    lane_max = NO_TIMESTAMP
    if tail >= 0:
        lane_max = lane_max_after(ring.read_many(tail, 0, 1).items[0], stream=info.name, lane=lane, sequence=tail)
    pieces = [
        [prepare_columns([f"{first + n}.{i}".encode() for i in range(len(item))], timestamps=list(item))]
        for n, item in enumerate(stamps)
    ]
    items = encode_items(pieces, ItemFraming(producer_id=1, producer_seq=first, lane_max_timestamp=lane_max))
    for chunk in range(0, len(items), 500):
        ring.add_all(items[chunk : chunk + 500])


def _linear(stamps: Sequence[Sequence[int]], ts: int) -> int | None:
    """Kafka's answer by a full scan: the first record in lane order whose timestamp is >= ts."""
    for sequence, item in enumerate(stamps):
        for index, stamp in enumerate(item):
            if stamp >= ts:
                return make_offset(sequence, index)
    return None


@pytest.fixture
def read_counter(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = Ring.read_many

    def counting(self: Ring, start: int, min_count: int, max_count: int):
        calls.append(max_count)
        return real(self, start, min_count, max_count)

    monkeypatch.setattr(Ring, "read_many", counting)
    return calls


def test_in_order_timestamps_give_kafkas_answer_exactly(grid: Grid, unique_name: str) -> None:
    info = open_stream(grid, StreamConfig(unique_name, capacity=1000))
    # Items of three records 10 ms apart, each item starting 5 ms after the previous one ended.
    stamps = [[1000 + 35 * n + 10 * i for i in range(3)] for n in range(40)]
    _items(grid, info, stamps)
    for ts in [0, 999, 1000, 1001, 1010, 1011, 1025, 1030, 1034, 1035, 1500, 1000 + 35 * 39 + 20, 99_999]:
        assert offset_for_timestamp(grid, info, 0, ts) == _linear(stamps, ts), ts


def test_the_search_reads_log_n_items_never_all(grid: Grid, unique_name: str, read_counter: list[int]) -> None:
    info = open_stream(grid, StreamConfig(unique_name, capacity=2000))
    stamps = [[10 * n, 10 * n + 5] for n in range(1024)]
    _items(grid, info, stamps)
    read_counter.clear()
    assert offset_for_timestamp(grid, info, 0, 10 * 700 + 3) == make_offset(700, 1)
    # One read for the oldest item, one per probe (log2 1024 = 10), at most one to look inside: single items each.
    assert len(read_counter) <= 1 + math.ceil(math.log2(1024)) + 1
    assert set(read_counter) == {1}


def test_out_of_order_timestamps_give_kafkas_answer_exactly(grid: Grid, unique_name: str) -> None:
    info = open_stream(grid, StreamConfig(unique_name, capacity=100))
    # Publishers set timestamps: item 1 holds a late record (900) and item 2 early ones (50, 60).
    stamps = [[100, 200], [300, 900, 310], [50, 60], [400, 410], [500]]
    _items(grid, info, stamps)
    for ts in (0, 40, 55, 100, 150, 201, 350, 600, 900, 901):
        assert offset_for_timestamp(grid, info, 0, ts) == _linear(stamps, ts), ts
    assert offset_for_timestamp(grid, info, 0, 600) == make_offset(1, 1)


@pytest.mark.parametrize("where", ["start", "middle", "end"])
def test_a_late_record_anywhere_in_a_lane_is_not_skipped(grid: Grid, unique_name: str, where: str) -> None:
    """Five records published one item each with ``timestamp_ms``; one of them is late (older than the others).
    The issue's case is ``end``: the lane's last record carries an older timestamp and the search used to move the
    lane to its end, skipping 4 of the 5 records at or after the time."""
    info = open_stream(grid, StreamConfig(unique_name, capacity=100))
    stamps = {"start": [50, 100, 200, 300, 400], "middle": [100, 200, 50, 300, 400], "end": [100, 200, 300, 400, 50]}[
        where
    ]
    with Publisher(grid, unique_name, max_batch_records=1, linger_ms=0) as pub:
        for n, stamp in enumerate(stamps):
            pub.publish(Record(f"r{n}".encode(), timestamp_ms=stamp))
    per_item = [[stamp] for stamp in stamps]
    for ts in (0, 60, 100, 150, 250, 400, 401):
        assert offset_for_timestamp(grid, info, 0, ts) == _linear(per_item, ts), (where, ts)
    with Subscriber(grid, unique_name, initial_offset_scheme="earliest") as sub:
        sub.seek_to_timestamp(60)
        expected = [f"r{n}" for n in range(stamps.index(100), len(stamps))]
        got = _values(sub, len(expected))
    print(f"late record at the {where}: seek_to_timestamp(60) delivered {got}")
    assert got == expected


def test_late_records_inside_and_across_items(grid: Grid, unique_name: str) -> None:
    """Records of one item out of order, and late records across item boundaries: Kafka's answer for every time."""
    info = open_stream(grid, StreamConfig(unique_name, capacity=1000))
    rng = random.Random(19)
    stamps = [[rng.randrange(0, 10_000) for _ in range(rng.randrange(1, 5))] for _ in range(300)]
    _items(grid, info, stamps)
    for ts in [0, 1, 5000, 9990, 9999, 10_000, *(rng.randrange(0, 10_001) for _ in range(60))]:
        assert offset_for_timestamp(grid, info, 0, ts) == _linear(stamps, ts), ts


def test_the_running_maximum_survives_a_publisher_restart(grid: Grid, unique_name: str) -> None:
    """A new publisher continues the lane's running maximum from its last item: a late record written by an earlier
    publisher is still found after a later publisher wrote older timestamps."""
    info = open_stream(grid, StreamConfig(unique_name, capacity=100))
    with Publisher(grid, unique_name, max_batch_records=1, linger_ms=0) as first:
        first.publish(Record(b"a", timestamp_ms=100))
        first.publish(Record(b"late", timestamp_ms=900))
    for n in range(5):
        with Publisher(grid, unique_name, max_batch_records=1, linger_ms=0, idempotent=n % 2 == 0) as again:
            again.publish(Record(f"b{n}".encode(), timestamp_ms=200 + n))
    ring = grid.ring(info.ring_names[0])
    maxima = [
        decode_item(item, stream=unique_name, lane=0, sequence=0).lane_max_timestamp_ms
        for item in ring.read_many(0, 0, 10).items
    ]
    assert maxima == [100, 900, 900, 900, 900, 900, 900]
    assert offset_for_timestamp(grid, info, 0, 500) == make_offset(1, 0)


def test_items_of_format_version_1_are_still_searched(grid: Grid, unique_name: str) -> None:
    """Version 1 items (no running maximum) stand in the search by their base timestamps, as before; a publisher
    writing after them continues from the largest timestamp of the last one."""
    info = open_stream(grid, StreamConfig(unique_name, capacity=100))
    ring = grid.ring(info.ring_names[0])
    ring.add_all([encode_item_v1([b"0.0", b"0.1"], timestamps=[10, 20]), encode_item_v1([b"1.0"], timestamps=30)])
    view = decode_item(ring.read_many(0, 0, 1).items[0], stream=unique_name, lane=0, sequence=0)
    stamps = view.timestamps(0, None)
    assert stamps is not None
    assert (view.version, view.lane_max_timestamp_ms, list(stamps)) == (1, None, [10, 20])
    with Publisher(grid, unique_name, linger_ms=0) as pub:
        pub.publish(Record(b"2.0", timestamp_ms=25))
        pub.publish(Record(b"3.0", timestamp_ms=40))
    maxima = [
        decode_item(item, stream=unique_name, lane=0, sequence=0).lane_max_timestamp_ms
        for item in ring.read_many(0, 0, 10).items
    ]
    assert maxima == [None, None, 30, 40]
    assert offset_for_timestamp(grid, info, 0, 15) == make_offset(0, 1)
    assert offset_for_timestamp(grid, info, 0, 30) == make_offset(1, 0)
    assert offset_for_timestamp(grid, info, 0, 35) == make_offset(3, 0)
    assert offset_for_timestamp(grid, info, 0, 41) is None


def test_empty_lane_and_bad_arguments(grid: Grid, unique_name: str) -> None:
    info = open_stream(grid, StreamConfig(unique_name, lanes=2))
    assert offset_for_timestamp(grid, info, 1, 0) is None
    with pytest.raises(ConfigError, match="lane 2 does not exist"):
        offset_for_timestamp(grid, info, 2, 0)
    with pytest.raises(ConfigError, match="timestamp"):
        offset_for_timestamp(grid, info, 0, -1)


def test_the_search_starts_at_the_oldest_item_on_a_plain_grid(grid: Grid, unique_name: str) -> None:
    info = open_stream(grid, StreamConfig(unique_name, capacity=4))
    _items(grid, info, [[10 * n] for n in range(10)])  # items 0..5 overwritten
    assert lane_bounds(grid, info)[0] == (6, 10)
    assert offset_for_timestamp(grid, info, 0, 0) == make_offset(6, 0)
    assert offset_for_timestamp(grid, info, 0, 75) == make_offset(8, 0)


def _values(sub: Subscriber, count: int) -> list[str]:
    from meteor_spark.testing import wait_until

    got: list[str] = []
    wait_until(
        lambda: got.extend(r.value.decode() for r in sub.poll(50)) or len(got) >= count, message=f"{count} records"
    )
    return got


def test_seek_to_timestamp_on_every_lane(grid: Grid, unique_name: str) -> None:
    info = open_stream(grid, StreamConfig(unique_name, lanes=3))
    _items(grid, info, [[100, 200], [300]], lane=0)
    _items(grid, info, [[150], [250, 260]], lane=1)
    _items(grid, info, [[50]], lane=2)  # nothing at or after 240: moved to its end
    with Subscriber(grid, unique_name, initial_offset_scheme="earliest") as sub:
        found = sub.seek_to_timestamp(240)
        assert found == {0: make_offset(1, 0), 1: make_offset(1, 0), 2: None}
        assert sub.positions() == {0: make_offset(1, 0), 1: make_offset(1, 0), 2: make_offset(1, 0)}
        assert sorted(_values(sub, 3)) == ["1.0", "1.0", "1.1"]
        _items(grid, info, [[10]], lane=2)  # a later record on the lane moved to its end is read
        assert _values(sub, 1) == ["1.0"]
        assert sub.seek_to_timestamp(150, lane=0) == {0: make_offset(0, 1)}
        assert _values(sub, 2) == ["0.1", "1.0"]
        with pytest.raises(ConfigError, match="ts_ms"):
            sub.seek_to_timestamp(-5)


@pytest.mark.embedded_only
def test_below_the_head_where_the_grid_serves_history(persistent_grid: Grid, unique_name: str) -> None:
    grid = persistent_grid
    info = open_stream(grid, StreamConfig(unique_name, capacity=4))
    stamps = [[10 * n, 10 * n + 5] for n in range(20)]
    _items(grid, info, stamps)
    assert lane_bounds(grid, info)[0][0] == 16
    for ts in (0, 33, 35, 36, 150, 195, 196):
        assert offset_for_timestamp(grid, info, 0, ts) == _linear(stamps, ts), ts
    with Subscriber(grid, unique_name) as sub:
        assert sub.seek_to_timestamp(42) == {0: make_offset(4, 1)}
        assert _values(sub, 3)[:3] == ["4.1", "5.0", "5.1"]
