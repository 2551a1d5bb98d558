"""The sink's ``topic`` and ``message_id`` columns: they become the records' topic and message id (null: none); on
a stream with a deduplication window a row whose id was already published (before, or by another row of the
batch) is skipped and counted, not a failure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from spark_helpers import grid_options

from meteor_spark import Publisher, StreamConfig, Subscriber
from meteor_spark.format.records import Record
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.testing import wait_until

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_topic_and_message_id_columns_and_duplicates_skipped(
    spark: Any, grid: Grid, grid_settings: GridSettings, unique_name: str
) -> None:
    with Publisher(grid, StreamConfig(unique_name, lanes=2, dedup_window_ms=60_000)) as pub:
        pub.publish(b"from-core", message_id="a")
    rows: list[tuple[str, str | None, str | None]] = [
        ("v-a", "orders.eu", "a"),
        ("v-b", "orders.us", "b"),
        ("v-c", None, "c"),
        ("v-b2", None, "b"),
        ("v-none", "orders.eu", None),
    ]
    df = spark.createDataFrame(rows, "value string, topic string, message_id string")
    df.repartition(2).write.format("meteor").options(**grid_options(grid_settings)).mode("append").save(unique_name)

    got: list[Record] = []
    with Subscriber(grid, unique_name, initial_offset_scheme="earliest") as sub:
        wait_until(lambda: got.extend(sub.poll(timeout_ms=100)) or len(got) >= 4, timeout_s=30)
        got.extend(sub.poll(timeout_ms=300))
    by_id: dict[str | None, list[Record]] = {}
    for record in got:
        by_id.setdefault(record.message_id, []).append(record)
    assert set(by_id) == {None, "a", "b", "c"}
    assert [r.value for r in by_id["a"]] == [b"from-core"]
    assert len(by_id["b"]) == 1 and by_id["b"][0].value in (b"v-b", b"v-b2")
    assert by_id["c"][0].topic == "" and by_id[None][0].topic == "orders.eu"
    assert len(got) == 4


def test_a_streaming_sink_skips_ids_seen_in_the_window_across_batches(
    spark: Any, grid: Grid, grid_settings: GridSettings, unique_name: str, tmp_path: Path
) -> None:
    with Publisher(grid, StreamConfig(f"{unique_name}-in", lanes=1)) as pub:
        for n in (1, 2, 1, 3, 2, 1):
            pub.publish(b"order-%d" % n)
    Publisher(grid, StreamConfig(f"{unique_name}-out", lanes=2, dedup_window_ms=60_000)).close()
    query = (
        spark.readStream.format("meteor")
        .options(**grid_options(grid_settings))
        .option("stream", f"{unique_name}-in")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "2")
        .load()
        .selectExpr("value", "CAST(value AS STRING) AS message_id")
        .writeStream.format("meteor")
        .options(**grid_options(grid_settings))
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(availableNow=True)
        .start(f"{unique_name}-out")
    )
    query.awaitTermination()
    got: list[Record] = []
    with Subscriber(grid, f"{unique_name}-out", initial_offset_scheme="earliest") as sub:
        wait_until(lambda: got.extend(sub.poll(timeout_ms=100)) or len(got) >= 3, timeout_s=30)
        got.extend(sub.poll(timeout_ms=300))
    assert sorted(str(r.message_id) for r in got) == ["order-1", "order-2", "order-3"]
