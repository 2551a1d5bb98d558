"""Positions by time: the binary search over ring items, ``Subscriber.seek_to_timestamp``, history below the head."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest

from meteor_spark.errors import ConfigError
from meteor_spark.grid import Grid, Ring
from meteor_spark.offsets import make_offset
from meteor_spark.streams import StreamConfig, StreamInfo, lane_bounds, open_stream
from meteor_spark.subscriber import Subscriber
from meteor_spark.timestamps import offset_for_timestamp
from meteor_spark.wire import encode_columns


def _items(grid: Grid, info: StreamInfo, stamps: Sequence[Sequence[int]], lane: int = 0) -> None:
    """One ring item per entry of ``stamps``, its records' values ``"<sequence>.<index>"``."""
    ring = grid.ring(info.ring_names[lane])
    first = ring.tail() + 1
    items = [
        encode_columns([f"{first + n}.{i}".encode() for i in range(len(item))], timestamps=list(item),
                       producer_id=1, producer_seq=first + n)
        for n, item in enumerate(stamps)
    ]
    for chunk in range(0, len(items), 500):
        ring.add_all(items[chunk:chunk + 500])


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

    def counting(self: Ring, start: int, min_count: int, max_count: int):  # type: ignore[no-untyped-def]
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


def test_out_of_order_timestamps_return_a_record_at_or_after_the_time(grid: Grid, unique_name: str) -> None:
    info = open_stream(grid, StreamConfig(unique_name, capacity=100))
    # Publishers set timestamps: item 1 holds a late record (900) and item 2 an early one (50).
    stamps = [[100, 200], [300, 900, 310], [50, 60], [400, 410], [500]]
    _items(grid, info, stamps)
    # Item bases 100, 300, 50, 400, 500: the search's boundary for 350 is item 3 (base 400), and item 2 holds
    # nothing >= 350, so the answer is item 3's first record; the 900 in item 1 is before it and is not found.
    assert offset_for_timestamp(grid, info, 0, 350) == make_offset(3, 0)
    # For 600 the boundary is the end; item 4 (the last) holds nothing >= 600: None, although item 1 holds 900.
    assert offset_for_timestamp(grid, info, 0, 600) is None
    # The first probe (item 2, base 50) sends the search above item 2 for any time over 50: for 150 the answer is
    # item 3's first record, although items 0 and 1 hold records >= 150 (finding those would take a scan).
    assert offset_for_timestamp(grid, info, 0, 150) == make_offset(3, 0)
    # Inside the item before the boundary: for 55 the boundary is item 3 and item 2 holds 60 at index 1.
    assert offset_for_timestamp(grid, info, 0, 55) == make_offset(2, 1)
    # Below every base: the lane's first record.
    assert offset_for_timestamp(grid, info, 0, 40) == make_offset(0, 0)


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
    wait_until(lambda: got.extend(r.value.decode() for r in sub.poll(50)) or len(got) >= count,
               message=f"{count} records")
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
