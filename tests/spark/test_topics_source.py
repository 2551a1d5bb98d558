"""The source's ``topics`` option: a row filter on any stream; on an ephemeral stream a streaming query is a consuming
entity while its source runner runs (it registers, publishers keep what it matches, it leaves when stopped)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql.streaming.datasource import ReadAllAvailable
from spark_helpers import grid_options, stream_reader

from meteor_spark import Publisher, StreamConfig
from meteor_spark.errors import ConfigError
from meteor_spark.format.records import Record
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.subscriptions import NOT_STORED, live_subscriptions
from meteor_spark.spark.datasource import SOURCE_SCHEMA
from meteor_spark.spark.entity import QueryEntity
from meteor_spark.spark.options import SourceOptions
from meteor_spark.spark.reader import MeteorStreamReader
from meteor_spark.testing import wait_until

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_the_option_is_a_list_of_checked_patterns() -> None:
    assert SourceOptions.parse({"stream": "s", "topics": "orders.*.created, audit.#"}).topics == (
        "orders.*.created",
        "audit.#",
    )
    assert SourceOptions.parse({"stream": "s"}).topics is None
    with pytest.raises(ConfigError, match=r"option 'topics'.*'ord\*rs'"):
        SourceOptions.parse({"stream": "s", "topics": "ord*rs"})


def test_a_batch_read_keeps_the_matching_rows(
    spark: Any, grid: Grid, grid_settings: GridSettings, unique_name: str
) -> None:
    with Publisher(grid, StreamConfig(unique_name, lanes=2)) as pub:
        pub.publish_many(
            [Record(b"1", topic="a.x"), Record(b"2", topic="b"), Record(b"3", topic="a.y"), Record(b"4")]
        ).result(10)
    reader = spark.read.format("meteor").options(**grid_options(grid_settings)).option("stream", unique_name)
    plain = reader.option("topics", "a.*").load()
    assert "headers" not in plain.columns
    assert sorted(r.value for r in plain.collect()) == [b"1", b"3"]
    with_headers = reader.option("topics", "b,").option("includeHeaders", "true").load().collect()
    assert sorted(r.value for r in with_headers) == [b"2", b"4"]
    assert [h.key for h in next(r for r in with_headers if r.value == b"2").headers] == ["meteor.topic"]


def test_a_streaming_query_is_an_entity_of_an_ephemeral_stream(
    spark: Any, grid: Grid, grid_settings: GridSettings, unique_name: str, tmp_path: Path
) -> None:
    Publisher(grid, StreamConfig(unique_name, lanes=2, ephemeral=True)).close()
    rows: list[bytes] = []

    def on_batch(batch: Any, batch_id: int) -> None:
        rows.extend(r.value for r in batch.select("value").collect())

    query = (
        stream_reader(spark, grid_settings, unique_name, topics="orders.#")
        .writeStream.foreachBatch(on_batch)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        wait_until(lambda: live_subscriptions(grid, unique_name), 120, message="the query registered")
        (entry,) = live_subscriptions(grid, unique_name)
        assert entry.entity.startswith("query/") and entry.topics == ("orders.#",)
        with Publisher(grid, unique_name) as pub:
            assert pub.publish(b"kept", topic="orders.eu.created") >= 0
            assert pub.publish(b"dropped", topic="audit.login") == NOT_STORED
        wait_until(lambda: rows == [b"kept"], 120, message="the matching row arrived")
    finally:
        query.stop()
    wait_until(lambda: not live_subscriptions(grid, unique_name), 30, message="the stopped query left the registry")


def test_a_record_published_once_the_registration_is_visible_is_the_new_querys(
    grid: Grid, grid_settings: GridSettings, unique_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The query's start is read before it registers: a publish landing between the registration and the
    start's resolution is inside the first batch, not before the start."""
    Publisher(grid, StreamConfig(unique_name, lanes=2, ephemeral=True)).close()
    register = QueryEntity.open
    published: list[int] = []

    def open_then_publish(self: QueryEntity, info: Any) -> None:
        register(self, info)
        with Publisher(grid, unique_name) as pub:
            published.append(pub.publish(b"right after", topic="orders.x"))

    monkeypatch.setattr(QueryEntity, "open", open_then_publish)
    options = SourceOptions.parse({**grid_options(grid_settings), "stream": unique_name})
    reader = MeteorStreamReader(options, SOURCE_SCHEMA)
    try:
        start = reader.initialOffset()
        end = reader.latestOffset(start, ReadAllAvailable())
    finally:
        reader.stop()
    assert published[0] >= 0 and end != start


def test_group_with_an_ephemeral_stream_fails_the_query_naming_both(
    spark: Any, grid: Grid, grid_settings: GridSettings, unique_name: str, tmp_path: Path
) -> None:
    Publisher(grid, StreamConfig(unique_name, ephemeral=True)).close()
    query = (
        stream_reader(spark, grid_settings, unique_name, group="g")
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    with pytest.raises(StreamingQueryException, match="option 'group' with stream"):
        query.awaitTermination(120)
    query.stop()
