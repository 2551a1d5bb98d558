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
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable
from spark_helpers import grid_options, make_stream, put_items, values_items

from meteor_spark.bench.jobs.pattern import CountingGrid
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.streams import StreamInfo
from meteor_spark.groups.admin import delete_stream
from meteor_spark.spark.datasource import SOURCE_SCHEMA
from meteor_spark.spark.lane_watch import idle_budget
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
