"""Starts and ends by time against the real grid and a real local[2] Spark.

The stream has two lanes whose records were published with explicit timestamps, out of timestamp order across the
lanes (lane 1 was written after lane 0, holding times in between and before lane 0's), and inside an item of lane 1.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import AnalysisException, StreamingQueryException
from pyspark.testing import assertDataFrameEqual
from spark_helpers import grid_options, make_stream, put_items

from meteor_spark.format.records import Record
from meteor_spark.grid.client import Grid, GridSettings

pytestmark = [pytest.mark.spark, pytest.mark.slow]

T = 1_700_000_000_000
#: lane -> ring items -> record times (ms after T); a record's value is "<lane>@<time>".
LAYOUT = {
    0: [[0, 10], [20, 30, 40]],
    1: [[35, 5], [45, 50]],
}


@pytest.fixture
def stream(grid: Grid, unique_name: str) -> str:
    info = make_stream(grid, unique_name, lanes=2)
    for lane, items in LAYOUT.items():
        put_items(
            grid, info, lane, [[Record(f"{lane}@{ms}".encode(), timestamp_ms=T + ms) for ms in item] for item in items]
        )
    return unique_name


def _expected(spark: Any, values: list[str]) -> Any:
    return spark.createDataFrame([(v,) for v in values], "value string")


def _values(df: Any) -> Any:
    return df.selectExpr("CAST(value AS STRING) AS value")


def _batch(spark: Any, settings: GridSettings, stream: str, **options: str) -> Any:
    return (
        spark.read.format("meteor").options(**grid_options(settings)).option("stream", stream).options(**options).load()
    )


def test_batch_read_between_times_returns_exactly_the_records_in_range(
    spark: Any, grid_settings: GridSettings, stream: str
) -> None:
    # Lane 0 starts at 30 (inside its second item: 20 is not read) and has nothing at or after 45, so it ends at
    # its end. Lane 1 starts at its first record (35); 5 follows it in the lane and is read, as Kafka reads every
    # record after the offset it found; it ends before 45.
    df = _batch(spark, grid_settings, stream, startingTimestamp=str(T + 25), endingTimestamp=str(T + 45))
    assertDataFrameEqual(_values(df), _expected(spark, ["0@30", "0@40", "1@35", "1@5"]))
    # Per lane: lane 0 from 15 to 35 (ends inside its second item), lane 1 from 40 to 50 (starts at its second
    # item: its first holds nothing at or after 40; ends inside it).
    df = _batch(
        spark,
        grid_settings,
        stream,
        startingOffsetsByTimestamp=json.dumps({stream: {"0": T + 15, "1": T + 40}}),
        endingOffsetsByTimestamp=json.dumps({stream: {"0": T + 35, "1": T + 50}}),
    )
    assertDataFrameEqual(_values(df), _expected(spark, ["0@20", "0@30", "1@45"]))
    offsets = sorted((r.lane, r.offset) for r in df.collect())
    assert offsets == [(0, (1 << 16) | 0), (0, (1 << 16) | 1), (1, 1 << 16)]


def test_streaming_read_starts_per_lane_by_time(
    spark: Any, grid_settings: GridSettings, stream: str, tmp_path: Path
) -> None:
    name = stream.replace("-", "_")
    query = (
        spark.readStream.format("meteor")
        .options(**grid_options(grid_settings))
        .option("stream", stream)
        .option("startingOffsetsByTimestamp", json.dumps({stream: {"0": T + 30, "1": T + 0}}))
        .load()
        .writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assertDataFrameEqual(_values(spark.table(name)), _expected(spark, ["0@30", "0@40", "1@35", "1@5", "1@45", "1@50"]))


def test_no_record_at_or_after_the_time_fails_naming_it_or_starts_at_the_end(
    spark: Any, grid: Grid, grid_settings: GridSettings, stream: str, tmp_path: Path
) -> None:
    with pytest.raises(
        Exception,
        match=rf"startingTimestamp: stream '{stream}' lane 0 has no record with a "
        rf"timestamp at or after {T + 42}.*startingOffsetsByTimestampStrategy=latest",
    ):
        _batch(spark, grid_settings, stream, startingTimestamp=str(T + 42)).collect()

    batches: list[list[str]] = []

    def run() -> None:
        query = (
            spark.readStream.format("meteor")
            .options(**grid_options(grid_settings))
            .option("stream", stream)
            .option("startingTimestamp", str(T + 42))
            .option("startingOffsetsByTimestampStrategy", "latest")
            .load()
            .writeStream.foreachBatch(lambda df, _: batches.append(sorted(r.value.decode() for r in df.collect())))
            .option("checkpointLocation", str(tmp_path / "cp"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()

    run()
    assert sorted(v for rows in batches for v in rows) == ["1@45", "1@50"]  # lane 0 starts at its end
    # A record published on lane 0 afterwards is read, whatever its time: the lane's start was its end.
    put_items(grid, make_stream(grid, stream, lanes=2), 0, [[Record(b"0@late", timestamp_ms=T + 1)]])
    batches.clear()
    run()
    assert sorted(v for rows in batches for v in rows) == ["0@late"]


def test_bad_values_fail_naming_the_option(
    spark: Any, grid_settings: GridSettings, stream: str, tmp_path: Path
) -> None:
    with pytest.raises(
        AnalysisException,
        match=r"option 'startingTimestamp': expected a time in ms since the "
        r"epoch \(a whole number >= 0\), got '-1'",
    ):
        _batch(spark, grid_settings, stream, startingTimestamp="-1")
    with pytest.raises(AnalysisException, match=r"options 'startingTimestamp' and 'startingOffsets' both say"):
        _batch(spark, grid_settings, stream, startingTimestamp="1", startingOffsets="earliest")
    with pytest.raises(
        Exception,
        match=rf"startingOffsetsByTimestamp names lane\(s\) 7 of stream '{stream}', "
        r"which has lanes 0..1",
    ):
        _batch(
            spark, grid_settings, stream, startingOffsetsByTimestamp=json.dumps({stream: {"0": T, "1": T, "7": T}})
        ).collect()
    with pytest.raises(Exception, match=rf"startingOffsetsByTimestamp has no time for stream '{stream}' lane 1"):
        _batch(spark, grid_settings, stream, startingOffsetsByTimestamp=json.dumps({stream: {"0": T}})).collect()
    query = (
        spark.readStream.format("meteor")
        .options(**grid_options(grid_settings))
        .option("stream", stream)
        .option("endingTimestamp", str(T))
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(StreamingQueryException, match=r"option 'endingTimestamp' applies to batch reads only"):
        query.awaitTermination()


def test_late_records_in_the_middle_and_at_the_end_of_a_lane(
    spark: Any, grid: Grid, grid_settings: GridSettings, unique_name: str
) -> None:
    """Published one record per item with explicit timestamps, a late (older) record in the middle of lane 0 and at
    the end of lane 1: each lane starts at the earliest record at or after its time (Kafka's offsetsForTimes), and
    every record after it is read, the late one included."""
    from meteor_spark.producer.publisher import Publisher

    make_stream(grid, unique_name, lanes=2)
    layout = {0: [100, 200, 50, 300, 400], 1: [100, 200, 300, 400, 50]}
    with Publisher(grid, unique_name, max_batch_records=1, linger_ms=0) as publisher:
        for lane, stamps in layout.items():
            for ms in stamps:
                publisher.publish(Record(f"{lane}@{ms}".encode(), timestamp_ms=T + ms, lane=lane))
    df = _batch(
        spark,
        grid_settings,
        unique_name,
        startingOffsetsByTimestamp=json.dumps({unique_name: {"0": T + 60, "1": T + 400}}),
    )
    expected = [f"0@{ms}" for ms in layout[0]] + ["1@400", "1@50"]
    assertDataFrameEqual(_values(df), _expected(spark, expected))
