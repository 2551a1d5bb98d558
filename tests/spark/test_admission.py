"""Byte-based admission (maxBytesPerTrigger, maxBytesPerLanePerTrigger) and the headersAsMap column, against the real
grid and a real local[2] Spark."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from chispa import assert_df_equality
from spark_helpers import grid_options, make_stream, put_items

from meteor_spark.format.records import Record
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.streams import lane_bounds, open_stream

pytestmark = [pytest.mark.spark, pytest.mark.slow]

RECORDS_PER_ITEM = 10
VALUE_BYTES = 1000


def _incompressible_items(prefix: str, items: int) -> list[list[Record]]:
    """Ring items of about RECORDS_PER_ITEM x VALUE_BYTES stored bytes each (random values do not compress)."""
    return [
        [Record(prefix.encode() + b"-%d-%d-" % (i, j) + os.urandom(VALUE_BYTES)) for j in range(RECORDS_PER_ITEM)]
        for i in range(items)
    ]


def _item_bytes(grid: Grid, name: str) -> float:
    info = open_stream(grid, name, create=False)
    sizes: list[int] = []
    for lane, (head, next_seq) in lane_bounds(grid, info).items():
        sizes.extend(len(item) for item in grid.ring(info.ring_names[lane]).read_many(head, 0, next_seq - head).items)
    return sum(sizes) / len(sizes)


def _run_available_now(
    spark: Any, settings: GridSettings, name: str, checkpoint: Path, **options: str
) -> tuple[list[Counter[int]], list[bytes], Any]:
    """Run an AvailableNow query; per batch, the ring items read per lane; every value read; the query."""
    batches: list[Counter[int]] = []
    values: list[bytes] = []

    def on_batch(df: Any, batch_id: int) -> None:
        rows = df.select("lane", "value").collect()
        batches.append(Counter({lane: n // RECORDS_PER_ITEM for lane, n in Counter(r.lane for r in rows).items()}))
        values.extend(r.value for r in rows)

    query = (
        spark.readStream.format("meteor")
        .options(**grid_options(settings))
        .option("stream", name)
        .option("startingOffsets", "earliest")
        .options(**options)
        .load()
        .writeStream.foreachBatch(on_batch)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return batches, values, query


def test_available_now_with_max_bytes_per_trigger_runs_several_batches_and_reads_everything_once(
    spark: Any, grid: Grid, grid_settings: GridSettings, unique_name: str, tmp_path: Path
) -> None:
    info = make_stream(grid, unique_name, lanes=2)
    published = [r.value for lane in (0, 1) for r in put_items(grid, info, lane, _incompressible_items(f"l{lane}", 6))]
    item_bytes = _item_bytes(grid, unique_name)
    cap = int(4.5 * item_bytes)  # about two items per lane and batch

    batches, values, query = _run_available_now(
        spark, grid_settings, unique_name, tmp_path / "cp", maxBytesPerTrigger=str(cap)
    )

    ran = [p for p in query.recentProgress if p["numInputRows"] > 0]
    print(
        f"maxBytesPerTrigger={cap} (items of ~{item_bytes:.0f} bytes): {len(ran)} batches, items per batch "
        f"{[sum(b.values()) for b in batches if b]}"
    )
    assert len(ran) == len([b for b in batches if b]) >= 3
    # The cap, plus at most one item per lane (a lane always admits one; the sizes are estimates).
    assert all(sum(b.values()) * item_bytes <= cap + 2 * item_bytes for b in batches), batches
    assert sorted(values) == sorted(published)  # everything, exactly once


def test_per_lane_byte_cap_and_the_tighter_of_two_limits(
    spark: Any, grid: Grid, grid_settings: GridSettings, unique_name: str, tmp_path: Path
) -> None:
    info = make_stream(grid, unique_name, lanes=2)
    published = [r.value for r in put_items(grid, info, 0, _incompressible_items("a", 5))]
    published += [r.value for r in put_items(grid, info, 1, _incompressible_items("b", 1))]
    item_bytes = _item_bytes(grid, unique_name)

    batches, values, _ = _run_available_now(
        spark, grid_settings, unique_name, tmp_path / "cp1", maxBytesPerLanePerTrigger=str(int(2.5 * item_bytes))
    )
    assert [dict(b) for b in batches if b] == [{0: 2, 1: 1}, {0: 2}, {0: 1}]
    assert sorted(values) == sorted(published)

    # maxOffsetsPerTrigger=2 (split over the lanes with a backlog) is tighter than ~4 items per lane: it wins.
    batches, values, _ = _run_available_now(
        spark,
        grid_settings,
        unique_name,
        tmp_path / "cp2",
        maxBytesPerLanePerTrigger=str(int(4.5 * item_bytes)),
        maxOffsetsPerTrigger="2",
    )
    assert [dict(b) for b in batches if b] == [{0: 1, 1: 1}, {0: 2}, {0: 2}]
    assert sorted(values) == sorted(published)


def test_headers_as_map_round_trip(spark: Any, grid: Grid, grid_settings: GridSettings, unique_name: str) -> None:
    source, target = f"{unique_name}-src", f"{unique_name}-dst"
    put_items(
        grid,
        make_stream(grid, source),
        0,
        [
            [
                Record(b"v1", headers=(("a", b"1"), ("b", b"2"), ("a", b"3"))),
                Record(b"v2"),
                Record(b"v3", headers=(("c", b""),)),
            ]
        ],
    )
    make_stream(grid, target)

    def read(name: str, **options: str) -> Any:
        return (
            spark.read.format("meteor")
            .options(**grid_options(grid_settings))
            .option("stream", name)
            .option("includeHeaders", "true")
            .options(**options)
            .load()
            .select("value", "headers")
            .orderBy("value")
        )

    as_map = read(source, headersAsMap="true")
    expected = spark.createDataFrame(
        [(b"v1", {"a": b"3", "b": b"2"}), (b"v2", {}), (b"v3", {"c": b""})], "value binary, headers map<string,binary>"
    )
    assert_df_equality(as_map, expected)  # a repeated key keeps its last value (maps cannot be sorted on)

    # The sink takes the map shape as it takes the array shape.
    as_map.write.mode("append").format("meteor").options(**grid_options(grid_settings)).option("stream", target).save()
    assert_df_equality(read(target, headersAsMap="true"), expected)
    as_array = spark.createDataFrame(
        [(b"v1", [("a", b"3"), ("b", b"2")]), (b"v2", []), (b"v3", [("c", b"")])],
        "value binary, headers array<struct<key:string,value:binary>>",
    )
    got = read(target).selectExpr("value", "array_sort(headers) AS headers")
    assert_df_equality(got, as_array)
