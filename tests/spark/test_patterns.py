"""streamPattern (Kafka's subscribePattern) against the real grid and a real local[2] Spark: streams created while a
query runs are read at the next micro-batch, deleted ones drop out of the offsets (or fail the query when they still
held unread items), and a batch read takes every matching stream."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import AnalysisException, StreamingQueryException
from spark_helpers import grid_options, make_stream, put_items, values_items

from meteor_spark.format.offsets import first_offset_of
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.groups.admin import delete_stream
from meteor_spark.groups.store import OFFSETS_MAP, lane_key
from meteor_spark.testing import wait_until

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _pattern_reader(spark: Any, settings: GridSettings, pattern: str, **options: str) -> Any:
    return (
        spark.readStream.format("meteor")
        .options(**grid_options(settings))
        .option("streamPattern", pattern)
        .options(**options)
        .load()
    )


def _end_streams(query: Any) -> set[str]:
    """Streams in the end offset of the query's last batch that read rows or moved its offsets."""
    progress = query.lastProgress
    if not progress or not progress["sources"]:
        return set()
    end = progress["sources"][0]["endOffset"]
    document = json.loads(end) if isinstance(end, str) else end
    return {name for name in (document or {}) if not name.startswith("@")}


def test_pattern_query_picks_up_a_new_stream_and_drops_a_deleted_one(
    spark: Any, grid: Grid, grid_settings: GridSettings, unique_name: str, tmp_path: Path
) -> None:
    first, second, other = f"{unique_name}-a", f"{unique_name}-b", f"{unique_name}x-c"
    info = make_stream(grid, first, lanes=2)
    put_items(grid, make_stream(grid, other), 0, values_items("other", items=1, per_item=1))  # does not match
    rows: list[tuple[str, bytes]] = []

    def on_batch(df: Any, batch_id: int) -> None:
        rows.extend((r.stream, r.value) for r in df.select("stream", "value").collect())

    query = (
        _pattern_reader(spark, grid_settings, re.escape(unique_name) + r"-[a-z]", startingOffsets="earliest")
        .writeStream.foreachBatch(on_batch)
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        put_items(grid, info, 1, values_items("a", items=2, per_item=3))
        wait_until(lambda: len(rows) == 6, timeout_s=60, message="the rows of the stream matching at start")

        # Created while the query runs, with items already in it: read from its oldest item at the next batch.
        created = make_stream(grid, second, lanes=1)
        put_items(grid, created, 0, values_items("b", items=2, per_item=2))
        wait_until(lambda: len(rows) == 10, timeout_s=60, message="the rows of the stream created mid-query")
        assert sorted(v for s, v in rows if s == second) == sorted(
            f"b-{i}-{j}".encode() for i in range(2) for j in range(2)
        )

        # Deleted once read: the query goes on, and the stream drops out of its offsets.
        delete_stream(grid, first)
        put_items(grid, created, 0, values_items("c", items=1, per_item=1))
        wait_until(lambda: len(rows) == 11, timeout_s=60, message="rows after the deletion")
        wait_until(lambda: _end_streams(query) == {second}, timeout_s=60, message="the deleted stream to drop out")
        assert query.exception() is None
    finally:
        query.stop()
    assert sorted(s for s, _ in rows).count(first) == 6
    assert len(rows) == len(set(rows)) == 11  # exactly once; the non-matching stream never read


def test_deleting_a_stream_with_unread_items_fails_the_query(
    spark: Any, grid: Grid, grid_settings: GridSettings, unique_name: str, tmp_path: Path
) -> None:
    name = f"{unique_name}-a"
    put_items(grid, make_stream(grid, name), 0, values_items("a", items=5, per_item=1))
    query = (
        _pattern_reader(
            spark, grid_settings, re.escape(unique_name) + "-.*", startingOffsets="earliest", maxOffsetsPerTrigger="1"
        )
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(processingTime="4 seconds")
        .start()
    )
    try:
        wait_until(
            lambda: query.lastProgress and query.lastProgress["numInputRows"] == 1,
            timeout_s=60,
            message="the first batch (one of five items)",
        )
        delete_stream(grid, name)
        with pytest.raises(
            StreamingQueryException,
            match=rf"data loss on stream '{re.escape(name)}' lane 0: the stream was deleted while the "
            r"query read it, with ring sequences 1\.\.[1-4] unread",
        ):
            query.awaitTermination(60)
    finally:
        query.stop()


def test_a_pattern_matching_nothing_waits_for_a_stream(
    spark: Any, grid: Grid, grid_settings: GridSettings, unique_name: str, tmp_path: Path
) -> None:
    name = f"{unique_name}-late"
    seen: list[bytes] = []
    query = (
        _pattern_reader(spark, grid_settings, re.escape(unique_name) + "-.*", startingOffsets="earliest")
        .writeStream.foreachBatch(lambda df, _: seen.extend(r.value for r in df.select("value").collect()))
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        wait_until(lambda: "Waiting" in query.status["message"], timeout_s=60, message="a trigger without streams")
        assert seen == [] and all(p["numInputRows"] == 0 for p in query.recentProgress)  # no batch ran
        put_items(grid, make_stream(grid, name), 0, values_items("late", items=1, per_item=2))
        wait_until(lambda: sorted(seen) == [b"late-0-0", b"late-0-1"], timeout_s=60, message="the late stream's rows")
    finally:
        query.stop()
    assert query.exception() is None


def test_batch_read_with_a_pattern_reads_every_matching_stream(
    spark: Any, grid: Grid, grid_settings: GridSettings, unique_name: str
) -> None:
    for suffix in ("a", "b", "zz"):
        put_items(grid, make_stream(grid, f"{unique_name}-{suffix}"), 0, values_items(suffix, items=1, per_item=2))
    df = (
        spark.read.format("meteor")
        .options(**grid_options(grid_settings))
        .option("streamPattern", re.escape(unique_name) + "-[ab]")
        .load()
    )
    assert sorted((r.stream, r.value) for r in df.collect()) == [
        (f"{unique_name}-a", b"a-0-0"),
        (f"{unique_name}-a", b"a-0-1"),
        (f"{unique_name}-b", b"b-0-0"),
        (f"{unique_name}-b", b"b-0-1"),
    ]


def test_bad_pattern_values_are_rejected_at_load(spark: Any, grid_settings: GridSettings) -> None:
    def reader() -> Any:
        return spark.readStream.format("meteor").options(**grid_options(grid_settings))

    with pytest.raises(AnalysisException, match=r"option 'streamPattern': 'orders-\(' is not a valid regular"):
        reader().option("streamPattern", "orders-(").load()
    with pytest.raises(AnalysisException, match=r"options 'stream' .* and 'streamPattern' exclude each other"):
        reader().option("streamPattern", "orders-.*").option("stream", "orders-1").load()
    with pytest.raises(AnalysisException, match=r"option 'maxBytesPerTrigger': expected a size like 64m"):
        reader().option("stream", "s").option("maxBytesPerTrigger", "much").load()
    with pytest.raises(AnalysisException, match=r"option 'maxBytesPerLanePerTrigger': expected a size > 0"):
        reader().option("stream", "s").option("maxBytesPerLanePerTrigger", "0").load()
    with pytest.raises(AnalysisException, match=r"option 'headersAsMap' shapes the headers column"):
        reader().option("stream", "s").option("headersAsMap", "true").load()


def test_pattern_query_in_a_group_confirms_offsets_of_a_stream_created_mid_query(
    spark: Any, grid: Grid, grid_settings: GridSettings, unique_name: str, tmp_path: Path
) -> None:
    first, second = f"{unique_name}-a", f"{unique_name}-b"
    put_items(grid, make_stream(grid, first), 0, values_items("a", items=2, per_item=1))
    offsets = grid.map(OFFSETS_MAP)

    def confirmed(stream: str) -> int | None:
        text = offsets.get(lane_key(stream, "g", 0))
        return None if text is None else json.loads(text)["offset"]

    seen: list[bytes] = []
    query = (
        _pattern_reader(
            spark,
            grid_settings,
            re.escape(unique_name) + "-.*",
            startingOffsets="earliest",
            group="g",
            groupLeaseMs="2000",
        )
        .writeStream.foreachBatch(lambda df, _: seen.extend(r.value for r in df.select("value").collect()))
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        wait_until(lambda: confirmed(first) == first_offset_of(2), timeout_s=60, message="the first stream confirmed")
        put_items(grid, make_stream(grid, second), 0, values_items("b", items=3, per_item=1))
        wait_until(
            lambda: confirmed(second) == first_offset_of(3),
            timeout_s=60,
            message="the group's offset of the stream created mid-query",
        )
    finally:
        query.stop()
    assert sorted(seen) == [b"a-0-0", b"a-1-0", b"b-0-0", b"b-1-0", b"b-2-0"]
