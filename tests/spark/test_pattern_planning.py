"""A ``streamPattern`` query over 1,000 streams, driven at the driver level (no SparkSession): a micro-batch sends
a bounded number of grid calls however many streams match (``lane_watch``: idle lanes are read a budget at a time),
items published to idle streams still enter a micro-batch, a stream created meanwhile is read at the next one and
a deleted one drops out.

Spark calls ``latestOffset``, ``partitions`` and ``commit`` on the source runner; these tests make the same calls
on a ``MeteorStreamReader`` whose grid client counts what the planning thread sends.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, cast

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable
from spark_helpers import grid_options, make_stream, put_items, values_items

from meteor_spark.bench.jobs.pattern import CountingGrid
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.streams import StreamConfig, StreamInfo
from meteor_spark.groups.admin import delete_stream
from meteor_spark.spark.datasource import SOURCE_SCHEMA
from meteor_spark.spark.lane_watch import LaneWatch, idle_budget
from meteor_spark.spark.options import SourceOptions
from meteor_spark.spark.reader import MeteorStreamReader
from meteor_spark.testing import wait_until

pytestmark = [pytest.mark.spark, pytest.mark.slow]

STREAMS = 1000


@pytest.fixture
def thousand_streams(grid: Grid, unique_name: str) -> Iterator[list[StreamInfo]]:
    names = [f"{unique_name}-{i:04d}" for i in range(STREAMS)]
    with ThreadPoolExecutor(8) as pool:
        infos = list(pool.map(lambda name: make_stream(grid, name, capacity=100), names))
    yield infos
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda name: delete_stream(grid, name), names))


def _batch(reader: MeteorStreamReader, counting: CountingGrid, start: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """One micro-batch as Spark's source runner makes it; its end and the grid calls its planning sent."""
    counting.calls.clear()
    end = reader.latestOffset(start, ReadAllAvailable())
    reader.partitions(start, end)
    calls = counting.total()
    reader.commit(end)
    return end, calls


def test_a_thousand_stream_pattern_plans_with_a_bounded_number_of_grid_calls(
    grid: Grid, grid_settings: GridSettings, unique_name: str, thousand_streams: list[StreamInfo]
) -> None:
    options = SourceOptions.parse(
        {
            **grid_options(grid_settings),
            "streamPattern": re.escape(unique_name) + "-.*",
            "startingOffsets": "earliest",
        }
    )
    reader = MeteorStreamReader(options, SOURCE_SCHEMA)
    try:
        state = reader._driver()
        counting = CountingGrid(state.grid)
        state.grid = cast(Grid, counting)
        start = reader.initialOffset()
        assert len(start) == STREAMS

        # Nothing new: one listing of the stream names, and the idle lanes a budget at a time.
        bound = 1 + idle_budget(STREAMS)
        for _ in range(3):
            end, calls = _batch(reader, counting, start)
            print(f"idle micro-batch over {STREAMS} streams: {calls} grid calls {dict(counting.calls)}")
            assert end == start
            assert calls <= bound, dict(counting.calls)
            assert counting.calls["map meteor.streams.keys"] == 1

        # Items published to idle streams enter a micro-batch; every micro-batch stays within the bound (plus the
        # moved lanes: read again while hot, and the item before each new end for its mark).
        moved = [thousand_streams[i] for i in (3, 500, 999)]
        for info in moved:
            put_items(grid, info, 0, values_items(info.name, items=1, per_item=2))
        most = 0
        batches = 0
        began = time.monotonic()

        def all_seen() -> bool:
            nonlocal start, most, batches
            start, calls = _batch(reader, counting, start)
            most, batches = max(most, calls), batches + 1
            return all(start[info.name]["0"] == 1 for info in moved)

        wait_until(all_seen, timeout_s=60, message="the items published to idle streams in a micro-batch")
        print(
            f"items in 3 idle streams of {STREAMS} seen after {batches} micro-batch(es), "
            f"{(time.monotonic() - began) * 1000:.0f} ms; most grid calls in one: {most}"
        )
        assert most <= bound + 2 * len(moved)

        # A stream created meanwhile is read at the next micro-batch, from its oldest item; a deleted one drops out.
        created = make_stream(grid, f"{unique_name}-new")
        put_items(grid, created, 0, values_items("new", items=2, per_item=1))
        delete_stream(grid, thousand_streams[0].name)
        end, _ = _batch(reader, counting, start)
        assert end[created.name] == {"0": 2}
        assert thousand_streams[0].name not in end
        assert len([name for name in end if not name.startswith("@")]) == STREAMS
        delete_stream(grid, created.name)
    finally:
        reader.stop()


class _Ring:
    def __init__(self, rings: _Rings, name: str) -> None:
        self.rings, self.name = rings, name

    def head_async(self) -> Future[int]:
        self.rings.reads.append(("head", self.name))
        return _done(self.rings.heads.get(self.name, 0))

    def tail_async(self) -> Future[int]:
        self.rings.reads.append(("tail", self.name))
        return _done(self.rings.tails.get(self.name, -1))


class _Rings:
    """Rings with set heads and tails that record what was read."""

    def __init__(self) -> None:
        self.heads: dict[str, int] = {}
        self.tails: dict[str, int] = {}
        self.reads: list[tuple[str, str]] = []

    def ring(self, name: str) -> _Ring:
        return _Ring(self, name)


def _done(value: int) -> Future[int]:
    future: Future[int] = Future()
    future.set_result(value)
    return future


def test_the_lane_watch_reads_new_hot_and_due_lanes_and_derives_heads() -> None:
    rings = _Rings()
    plain = StreamInfo(StreamConfig("plain", lanes=1, capacity=10), 0, 2, ("r-plain",))
    expiring = StreamInfo(StreamConfig("expiring", lanes=1, capacity=10, ttl_s=60), 0, 2, ("r-expiring",))
    watch = LaneWatch(refresh_ms=1000, hot_ms=100)
    grid = cast(Grid, rings)
    rings.heads["r-expiring"], rings.tails["r-expiring"] = 3, 4
    assert watch.bounds(grid, [plain, expiring], now=0.0) == {("plain", 0): (0, 0), ("expiring", 0): (3, 5)}
    assert sorted(rings.reads) == [
        ("head", "r-expiring"),
        ("head", "r-plain"),
        ("tail", "r-expiring"),
        ("tail", "r-plain"),
    ]

    # Not due, not hot: nothing is read, the last bounds stand.
    rings.reads.clear()
    rings.tails["r-plain"] = 14
    assert watch.bounds(grid, [plain, expiring], now=0.0001) == {("plain", 0): (0, 0), ("expiring", 0): (3, 5)}
    assert rings.reads == []

    # Due: the tail only where the head follows from it (no TTL: the ring wrapped, head = tail + 1 - capacity).
    assert watch.bounds(grid, [plain, expiring], now=1.0)[("plain", 0)] == (5, 15)
    assert ("head", "r-plain") not in rings.reads and ("head", "r-expiring") in rings.reads
    # Moved: read at every micro-batch while hot, then again only when due.
    rings.reads.clear()
    watch.bounds(grid, [plain], now=1.05)
    assert rings.reads == [("tail", "r-plain")]
    rings.reads.clear()
    watch.bounds(grid, [plain], now=1.5)
    assert rings.reads == []

    # A lane read ending below its last end (its ring destroyed): the driver lists the streams again.
    rings.tails["r-plain"] = -1
    watch.bounds(grid, [plain], now=3.0)
    assert watch.went_back == {"plain"}


def test_the_lane_watch_reads_idle_lanes_a_budget_at_a_time() -> None:
    rings = _Rings()
    infos = [StreamInfo(StreamConfig(f"s{i}", lanes=1, capacity=10), 0, 2, (f"r{i}",)) for i in range(STREAMS)]
    watch = LaneWatch(refresh_ms=1000)
    grid = cast(Grid, rings)
    watch.bounds(grid, infos, everything=True, now=0.0)
    seen: set[str] = set()
    for batch in range(-(-STREAMS // idle_budget(STREAMS))):
        rings.reads.clear()
        watch.bounds(grid, infos, now=10.0 + batch)
        assert len(rings.reads) == idle_budget(STREAMS) or batch == STREAMS // idle_budget(STREAMS)
        seen.update(name for _, name in rings.reads)
    assert len(seen) == STREAMS  # every idle lane read within ceil(lanes / budget) micro-batches
