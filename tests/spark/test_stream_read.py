"""spark.readStream / spark.read .format("meteor") against the real grid and a real local[2] Spark.

No test calls ``register()``: every ``format("meteor")`` here goes through Spark's auto-registration of the
installed ``pyspark_meteor`` package.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from chispa import assert_df_equality
from pyspark.errors import AnalysisException, StreamingQueryException
from spark_helpers import grid_options, make_stream, put_items, values_items

from meteor_spark.format.offsets import first_offset_of
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.groups.store import OFFSETS_MAP, lane_key
from meteor_spark.spark.lag import lag_from_progress

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _reader(spark: Any, settings: GridSettings, stream: str, **options: str) -> Any:
    return (
        spark.readStream.format("meteor")
        .options(**grid_options(settings))
        .option("stream", stream)
        .options(**options)
        .load()
    )


def _collect_batches(batches: list[list[tuple[Any, ...]]]) -> Any:
    def on_batch(df: Any, batch_id: int) -> None:
        batches.append([tuple(r) for r in df.select("lane", "offset", "value").collect()])

    return on_batch


def test_stream_read_equals_published_in_lane_order(
    spark: Any, grid: Grid, grid_settings: GridSettings, unique_name: str
) -> None:
    info = make_stream(grid, unique_name, lanes=2)
    published = {lane: put_items(grid, info, lane, values_items(f"l{lane}", items=3, per_item=4)) for lane in (0, 1)}

    df = _reader(spark, grid_settings, unique_name, startingOffsets="earliest", includeHeaders="true")
    query = df.writeStream.format("memory").queryName(unique_name.replace("-", "_")).trigger(availableNow=True).start()
    query.awaitTermination()
    got = spark.table(unique_name.replace("-", "_"))

    expected = spark.createDataFrame(
        [
            (r.key, r.value, unique_name, lane, first_offset_of(i // 4) + i % 4, [(k, v) for k, v in r.headers])
            for lane, records in published.items()
            for i, r in enumerate(records)
        ],
        "key binary, value binary, stream string, lane int, offset long, "
        "headers array<struct<key:string,value:binary>>",
    )
    assert_df_equality(got.drop("timestamp"), expected, ignore_row_order=True)
    assert got.where("timestamp IS NULL").count() == 0
    # Lane order: within each lane, offsets follow the publishing order of the values.
    for lane, records in published.items():
        rows = got.where(f"lane = {lane}").orderBy("offset").select("value").collect()
        assert [row.value for row in rows] == [r.value for r in records]


def test_available_now_respects_max_offsets_per_trigger_and_reads_everything(
    spark: Any, grid: Grid, grid_settings: GridSettings, unique_name: str, tmp_path: Path
) -> None:
    info = make_stream(grid, unique_name, lanes=2)
    put_items(grid, info, 0, values_items("a", items=4, per_item=2))
    put_items(grid, info, 1, values_items("b", items=2, per_item=2))
    batches: list[list[tuple[Any, ...]]] = []

    query = (
        _reader(spark, grid_settings, unique_name, startingOffsets="earliest", maxOffsetsPerTrigger="2")
        .writeStream.foreachBatch(_collect_batches(batches))
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()

    assert len(batches) >= 3, batches
    assert all(len(rows) <= 2 * 2 for rows in batches)  # at most 2 ring items of 2 records each per batch
    everything = sorted(row for rows in batches for row in rows)
    assert len(everything) == 12 and len(set(everything)) == 12
    first, second = (lag_from_progress(p) for p in query.recentProgress[:2])
    assert first.items_behind == 6 - 2
    # Batch 0 has no start offset in its progress; its end offset carries the items it read.
    assert first.records_per_item == pytest.approx(2.0) and first.records_behind_estimate == pytest.approx(4 * 2.0)
    assert second.items_behind == 6 - 4 and second.records_behind_estimate == pytest.approx(2 * 2.0)
    assert lag_from_progress(query.lastProgress).items_behind == 0


def test_restart_from_checkpoint_neither_loses_nor_repeats_and_group_offsets_advance(
    spark: Any, grid: Grid, grid_settings: GridSettings, unique_name: str, tmp_path: Path
) -> None:
    info = make_stream(grid, unique_name, lanes=1)
    put_items(grid, info, 0, values_items("first", items=3, per_item=2))
    batches: list[list[tuple[Any, ...]]] = []
    offsets = grid.map(OFFSETS_MAP)
    confirmed_after_batch: list[int | None] = []

    def on_batch(df: Any, batch_id: int) -> None:
        # The previous batch's end is confirmed by the time Spark plans this one.
        text = offsets.get(lane_key(unique_name, "g1", 0))
        confirmed_after_batch.append(None if text is None else json.loads(text)["offset"])
        batches.append([tuple(r) for r in df.select("value").collect()])

    def run() -> None:
        query = (
            _reader(
                spark,
                grid_settings,
                unique_name,
                startingOffsets="earliest",
                maxOffsetsPerTrigger="1",
                group="g1",
                groupLeaseMs="2000",
            )
            .writeStream.foreachBatch(on_batch)
            .option("checkpointLocation", str(tmp_path / "cp"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()

    run()
    assert [len(b) for b in batches] == [2, 2, 2]
    # An AvailableNow run confirms its last batch before it stops (latestOffset finds nothing more).
    stored = offsets.get(lane_key(unique_name, "g1", 0))
    assert stored is not None
    assert json.loads(stored)["offset"] == first_offset_of(3)
    assert confirmed_after_batch[1:] == [first_offset_of(1), first_offset_of(2)]

    put_items(grid, info, 0, values_items("second", items=2, per_item=2))
    run()
    values = [row[0] for rows in batches for row in rows]
    assert len(values) == 10 and len(set(values)) == 10
    assert [v.decode().split("-")[0] for v in values[6:]] == ["second"] * 4
    stored = offsets.get(lane_key(unique_name, "g1", 0))
    assert stored is not None
    assert json.loads(stored)["offset"] == first_offset_of(5)


def test_overwritten_data_fails_with_the_data_loss_error_or_is_skipped(
    spark: Any, grid: Grid, grid_settings: GridSettings, unique_name: str, tmp_path: Path
) -> None:
    info = make_stream(grid, unique_name, lanes=1, capacity=4)
    put_items(grid, info, 0, values_items("x", items=10, per_item=1))  # sequences 0..9; the ring keeps 6..9
    from_zero = json.dumps({unique_name: {"0": 0}})

    query = (
        _reader(spark, grid_settings, unique_name, startingOffsets=from_zero)
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "a"))
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(
        StreamingQueryException,
        match=rf"data loss on stream '{unique_name}' lane 0: requested "
        r"sequence 0 is no longer available \(overwritten in the "
        r"ring.*\); the oldest available sequence is 6",
    ):
        query.awaitTermination()

    batch = spark.read.format("meteor").options(**grid_options(grid_settings)).option("stream", unique_name)
    with pytest.raises(Exception, match="data loss on stream"):
        batch.option("startingOffsets", from_zero).load().collect()
    skipped = batch.option("startingOffsets", from_zero).option("failOnDataLoss", "false").load()
    assert sorted(r.value for r in skipped.collect()) == [b"x-%d-0" % i for i in range(6, 10)]

    batches: list[list[tuple[Any, ...]]] = []
    query = (
        _reader(spark, grid_settings, unique_name, startingOffsets=from_zero, failOnDataLoss="false")
        .writeStream.foreachBatch(_collect_batches(batches))
        .option("checkpointLocation", str(tmp_path / "b"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assert sorted(row[2] for rows in batches for row in rows) == [b"x-%d-0" % i for i in range(6, 10)]


def test_batch_read_between_offsets(spark: Any, grid: Grid, grid_settings: GridSettings, unique_name: str) -> None:
    info = make_stream(grid, unique_name, lanes=2)
    put_items(grid, info, 0, values_items("a", items=5, per_item=1))
    put_items(grid, info, 1, values_items("b", items=5, per_item=1))
    df = (
        spark.read.format("meteor")
        .options(**grid_options(grid_settings))
        .option("stream", unique_name)
        .option("startingOffsets", json.dumps({unique_name: {"0": 1, "1": -2}}))
        .option("endingOffsets", json.dumps({unique_name: {"0": 3, "1": -1}}))
        .option("maxOffsetsPerPartition", "2")
        .load()
    )
    assert df.rdd.getNumPartitions() == 1 + 3
    assert sorted(r.value for r in df.collect()) == sorted([b"a-1-0", b"a-2-0"] + [b"b-%d-0" % i for i in range(5)])


def test_bad_options_fail_at_load_with_clear_messages(spark: Any, grid_settings: GridSettings) -> None:
    def reader() -> Any:
        return spark.readStream.format("meteor").options(**grid_options(grid_settings)).option("stream", "s")

    with pytest.raises(
        AnalysisException,
        match=r"unknown read option 'maxoffsetpertrigger' \(did you mean "
        r"'maxOffsetsPerTrigger'\?\)",
    ):
        reader().option("maxOffsetPerTrigger", "5").load()
    with pytest.raises(AnalysisException, match=r"option 'failOnDataLoss': expected true or false, got 'perhaps'"):
        reader().option("failOnDataLoss", "perhaps").load()
    with pytest.raises(AnalysisException, match="option 'stream' is required"):
        spark.read.format("meteor").load()


def test_missing_stream_fails_the_query_naming_it(
    spark: Any, grid_settings: GridSettings, unique_name: str, tmp_path: Path
) -> None:
    query = (
        _reader(spark, grid_settings, unique_name)
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(StreamingQueryException, match=rf"stream '{unique_name}' does not exist"):
        query.awaitTermination()


def test_one_task_reads_several_lane_ranges_exactly(grid: Grid, grid_settings: GridSettings, unique_name: str) -> None:
    """The executor path without Spark: a grouped task reads each of its ranges exactly, a resume offset inside
    the first item of a later range included, one lane per Arrow batch."""
    from meteor_spark.spark.batch_reader import MeteorBatchReader
    from meteor_spark.spark.datasource import SOURCE_SCHEMA
    from meteor_spark.spark.executor import LaneRange, LaneRanges
    from meteor_spark.spark.options import SourceOptions

    info = make_stream(grid, unique_name, lanes=3)
    published = {lane: put_items(grid, info, lane, values_items(f"l{lane}", items=4, per_item=3)) for lane in range(3)}
    task = LaneRanges(
        (
            LaneRange(unique_name, 0, 1, 3, grid_settings, info),
            LaneRange(unique_name, 1, 0, 4, grid_settings, info),
            LaneRange(unique_name, 2, 2, 4, grid_settings, info, first_offset=first_offset_of(2) + 1),
        )
    )
    reader = MeteorBatchReader(SourceOptions.parse({"stream": unique_name}, batch=True), SOURCE_SCHEMA)
    batches = list(reader.read(task))
    assert all(len(set(b.column("lane").to_pylist())) == 1 for b in batches)
    got = [
        (lane, value)
        for b in batches
        for lane, value in zip(b.column("lane").to_pylist(), b.column("value").to_pylist(), strict=True)
    ]
    expected = (
        [(0, r.value) for r in published[0][3:9]]
        + [(1, r.value) for r in published[1]]
        + [(2, r.value) for r in published[2][7:12]]
    )
    assert got == expected
    offsets = [o for b in batches if b.column("lane")[0].as_py() == 2 for o in b.column("offset").to_pylist()]
    assert offsets == [first_offset_of(2) + 1, first_offset_of(2) + 2] + [first_offset_of(3) + i for i in range(3)]


def test_grouped_lanes_read_equals_published(
    spark: Any, grid: Grid, grid_settings: GridSettings, unique_name: str
) -> None:
    info = make_stream(grid, unique_name, lanes=3)
    published = {lane: put_items(grid, info, lane, values_items(f"g{lane}", items=3, per_item=2)) for lane in range(3)}
    df = (
        spark.read.format("meteor")
        .options(**grid_options(grid_settings))
        .option("stream", unique_name)
        .option("maxPartitions", "1")
        .load()
    )
    assert df.rdd.getNumPartitions() == 1
    rows = df.select("lane", "offset", "value").collect()
    for lane, records in published.items():
        assert [r.value for r in sorted((r for r in rows if r.lane == lane), key=lambda r: r.offset)] == [
            r.value for r in records
        ]
    assert len(rows) == 18
