"""Reads that select nothing are empty: 0 rows with the source's schema, as Kafka's source returns 0 rows.

Each batch case below selects nothing in every lane, so Spark plans no task of ours and hands the reader its one
placeholder partition; each streaming case runs a micro-batch (or none) with nothing new.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from spark_helpers import grid_options, make_stream, put_items

from meteor_spark.format.records import Record
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.spark.datasource import SOURCE_SCHEMA, SOURCE_SCHEMA_WITH_HEADERS

pytestmark = [pytest.mark.spark, pytest.mark.slow]

T = 1_700_000_000_000


@pytest.fixture
def stream(grid: Grid, unique_name: str) -> str:
    """Two lanes, two items each, record times T+10..T+40."""
    info = make_stream(grid, unique_name, lanes=2)
    for lane in (0, 1):
        put_items(
            grid,
            info,
            lane,
            [[Record(b"%d-%d" % (lane, ms), timestamp_ms=T + ms) for ms in item] for item in ([10, 20], [30, 40])],
        )
    return unique_name


def _read(spark: Any, settings: GridSettings, stream: str, **options: str) -> Any:
    return (
        spark.read.format("meteor").options(**grid_options(settings)).option("stream", stream).options(**options).load()
    )


def _lanes(stream: str, value: int) -> str:
    return json.dumps({stream: {"0": value, "1": value}})


EMPTY_BATCH_READS: dict[str, dict[str, str]] = {
    "startingOffsets=latest": {"startingOffsets": "latest"},
    "endingOffsets at 0 in every lane": {"endingOffsets": "@0"},
    "start and end at the same lane offsets": {"startingOffsets": "@1", "endingOffsets": "@1"},
    "endingTimestamp before every record": {"endingTimestamp": str(T)},
    "endingOffsetsByTimestamp before every record": {"endingOffsetsByTimestamp": "@T"},
    "startingTimestamp past the end, strategy latest": {
        "startingTimestamp": str(T + 1000),
        "startingOffsetsByTimestampStrategy": "latest",
    },
    "startingOffsetsByTimestamp past the end, strategy latest": {
        "startingOffsetsByTimestamp": "@T+1000",
        "startingOffsetsByTimestampStrategy": "latest",
    },
    "startingTimestamp equal to endingTimestamp": {"startingTimestamp": str(T + 20), "endingTimestamp": str(T + 20)},
    "startingTimestamp inside an item, endingTimestamp just after it": {
        "startingTimestamp": str(T + 21),
        "endingTimestamp": str(T + 30),
    },
    "startingOffsets=latest, endingOffsets=latest": {"startingOffsets": "latest", "endingOffsets": "latest"},
}


def _resolved(stream: str, options: dict[str, str]) -> dict[str, str]:
    special = {
        "@0": _lanes(stream, 0),
        "@1": _lanes(stream, 1),
        "@T": _lanes(stream, T),
        "@T+1000": _lanes(stream, T + 1000),
    }
    return {name: special.get(value, value) for name, value in options.items()}


@pytest.mark.parametrize("case", sorted(EMPTY_BATCH_READS))
def test_a_batch_read_selecting_nothing_is_empty_with_the_schema(
    spark: Any, grid_settings: GridSettings, stream: str, case: str
) -> None:
    df = _read(spark, grid_settings, stream, **_resolved(stream, EMPTY_BATCH_READS[case]))
    assert df.schema == SOURCE_SCHEMA
    assert df.collect() == []
    assert df.count() == 0


def test_an_empty_stream_reads_as_empty_with_and_without_headers(
    spark: Any, grid: Grid, grid_settings: GridSettings, unique_name: str
) -> None:
    make_stream(grid, unique_name, lanes=3)
    assert _read(spark, grid_settings, unique_name).collect() == []
    with_headers = _read(spark, grid_settings, unique_name, includeHeaders="true")
    assert with_headers.schema == SOURCE_SCHEMA_WITH_HEADERS
    assert with_headers.collect() == []
    assert (
        _read(
            spark,
            grid_settings,
            unique_name,
            startingOffsets="latest",
            isolation="read_committed",
        ).collect()
        == []
    )


def test_a_streaming_query_with_nothing_new_yields_no_rows(
    spark: Any, grid_settings: GridSettings, stream: str, grid: Grid, unique_name: str, tmp_path: Path
) -> None:
    empty = f"{unique_name}-empty"
    make_stream(grid, empty, lanes=2)
    for name, options in ((stream, {"startingOffsets": "latest"}), (empty, {})):
        rows: list[Any] = []

        def keep(df: Any, _batch_id: int, rows: list[Any] = rows) -> None:
            rows.extend(df.collect())

        query = (
            spark.readStream.format("meteor")
            .options(**grid_options(grid_settings))
            .option("stream", name)
            .options(**options)
            .load()
            .writeStream.foreachBatch(keep)
            .trigger(availableNow=True)
            .option("checkpointLocation", str(tmp_path / name))
            .start()
        )
        try:
            assert query.awaitTermination(120)
            assert query.exception() is None
        finally:
            query.stop()
        assert rows == []
