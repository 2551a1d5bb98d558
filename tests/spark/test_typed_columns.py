"""valueFormat=avro: typed value columns from a stream's schemas, struct values written to a typed stream, a round
trip Python -> Spark -> Python across three schema versions, and undecodable records through onCorrupt."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import AnalysisException
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual
from spark_helpers import grid_options

from meteor_spark.consumer.dead_letters import ScanReport, scan_dead_letters
from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.format.avro import SCHEMA_HEADER, AvroSchema, AvroValues
from meteor_spark.format.records import Record
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.schemas import register_schema
from meteor_spark.grid.streams import StreamConfig, open_stream
from meteor_spark.producer.publisher import Publisher
from meteor_spark.testing import wait_until

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _order(*fields: dict[str, Any]) -> dict[str, Any]:
    return {"type": "record", "name": "Order", "namespace": "shop", "fields": list(fields)}


ID = {"name": "id", "type": "long"}
CUSTOMER = {"name": "customer", "type": "string"}
NOTE = {"name": "note", "type": ["null", "string"], "default": None}
AMOUNT = {"name": "amount", "type": "double", "default": 0.0}
V1 = _order(ID, CUSTOMER, NOTE)
V2 = _order(ID, CUSTOMER, NOTE, AMOUNT)  # adds a field with a default
V3 = _order(ID, CUSTOMER, AMOUNT)  # removes one that had a default
#: The output stream's schema: what the query makes of an order.
TOTAL = {
    "type": "record",
    "name": "Total",
    "fields": [{"name": "id", "type": "long"}, {"name": "who", "type": "string"}, {"name": "cents", "type": "long"}],
}
PUBLISHED = [
    (1, {"id": 1, "customer": "ada", "note": "first"}),
    (2, {"id": 2, "customer": "bob", "note": None, "amount": 2.5}),
    (3, {"id": 3, "customer": "cy", "amount": 3.25}),
]


def _reader(spark: Any, settings: GridSettings, stream: str, **options: str) -> Any:
    return spark.read.format("meteor").options(**grid_options(settings)).option("stream", stream).options(**options)


def test_python_spark_python_round_trip_across_three_schema_versions(
    spark: Any, grid: Grid, grid_settings: GridSettings, unique_name: str, tmp_path: Path
) -> None:
    source, target = f"{unique_name}-orders", f"{unique_name}-totals"
    for schema in (V1, V2, V3):
        register_schema(grid, source, schema)
    register_schema(grid, target, TOTAL)
    Publisher(grid, StreamConfig(target, lanes=2, value_format="avro")).close()
    for version, value in PUBLISHED:  # one record per version, each carrying its writer's version
        with Publisher(
            grid, StreamConfig(source, lanes=2, value_format="avro"), value_serializer=AvroValues(version)
        ) as pub:
            pub.publish(Record(value, key=str(value["id"]).encode()))

    started = time.monotonic()
    typed = _reader(spark, grid_settings, source, valueFormat="avro").load()
    assert typed.schema["value"].dataType.simpleString() == "struct<id:bigint,customer:string,amount:double>"
    expected = spark.createDataFrame(
        [(1, "ada", 0.0), (2, "bob", 2.5), (3, "cy", 3.25)], "id bigint, customer string, amount double"
    )
    assertDataFrameEqual(typed.select("value.*"), expected)
    pinned = _reader(spark, grid_settings, source, valueFormat="avro", valueSchemaVersion="1").load()
    assertDataFrameEqual(
        pinned.select("value.*"),
        spark.createDataFrame(
            [(1, "ada", "first"), (2, "bob", None), (3, "cy", None)], "id bigint, customer string, note string"
        ),
    )

    print(f"typed batch reads: {time.monotonic() - started:.1f} s")
    started = time.monotonic()
    query = (
        spark.readStream.format("meteor")
        .options(**grid_options(grid_settings))
        .option("stream", source)
        .option("startingOffsets", "earliest")
        .option("valueFormat", "avro")
        .load()
        .select(
            "key",
            F.struct(
                F.col("value.id").alias("id"),
                F.upper("value.customer").alias("who"),
                (F.col("value.amount") * 100).cast("long").alias("cents"),
            ).alias("value"),
        )
        .writeStream.format("meteor")
        .options(**grid_options(grid_settings))
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(availableNow=True)
        .start(target)
    )
    query.awaitTermination()
    print(f"typed streaming query (availableNow): {time.monotonic() - started:.1f} s")

    got: list[Record] = []
    with Subscriber(grid, target, initial_offset_scheme="earliest") as sub:  # a typed stream: dicts by default
        wait_until(lambda: got.extend(sub.poll(50)) or len(got) >= 3, 20, message="3 records written by Spark")
    assert sorted((r.value for r in got), key=lambda v: v["id"]) == [
        {"id": 1, "who": "ADA", "cents": 0},
        {"id": 2, "who": "BOB", "cents": 250},
        {"id": 3, "who": "CY", "cents": 325},
    ]
    assert {dict(r.headers)[SCHEMA_HEADER] for r in got} == {b"1"}


def test_undecodable_records_go_through_on_corrupt_and_bad_options_are_refused(
    spark: Any, grid: Grid, grid_settings: GridSettings, unique_name: str
) -> None:
    register_schema(grid, unique_name, V1)
    good = AvroSchema.parse(V1).encode({"id": 1, "customer": "a", "note": None})
    with Publisher(grid, StreamConfig(unique_name), value_serializer="bytes") as raw:
        raw.publish(Record(good, headers=((SCHEMA_HEADER, b"1"),)))
        raw.publish(Record(good, headers=((SCHEMA_HEADER, b"9"),)))  # a version nobody registered
        raw.publish(Record(b"\xff\xff", headers=((SCHEMA_HEADER, b"1"),)))  # not a value of the schema
        raw.publish(Record(good, headers=((SCHEMA_HEADER, b"1"),)))

    skipped = _reader(spark, grid_settings, unique_name, valueFormat="avro", onCorrupt="skip").load()
    assert [r.value.id for r in skipped.collect()] == [1, 1]
    dlq = f"{unique_name}-dlq"
    Publisher(grid, StreamConfig(dlq)).close()  # a Spark read's dead-letter stream must exist
    lettered = _reader(
        spark, grid_settings, unique_name, valueFormat="avro", onCorrupt="dead_letter", deadLetterStream=dlq
    ).load()
    assert lettered.count() == 2
    letters = list(scan_dead_letters(grid, open_stream(grid, dlq), ScanReport()))
    assert sorted(letter.source_offset for letter in letters if letter.source_offset is not None) == [65536, 131072]
    assert any("schema version 9 is not registered" in letter.error for letter in letters)
    with pytest.raises(Exception, match="schema version 9 is not registered"):
        _reader(spark, grid_settings, unique_name, valueFormat="avro").load().collect()

    with pytest.raises(AnalysisException, match=r"option valueFormat=avro: stream '.*-none' has no schema"):
        _reader(spark, grid_settings, f"{unique_name}-none", valueFormat="avro").load()
    with pytest.raises(AnalysisException, match=r"option 'valueSchemaVersion' needs valueFormat=avro"):
        _reader(spark, grid_settings, unique_name, valueSchemaVersion="1").load()
    with pytest.raises(AnalysisException, match=r"has no schema version 4"):
        _reader(spark, grid_settings, unique_name, valueFormat="avro", valueSchemaVersion="4").load()
    typed_target = f"{unique_name}-typed"
    register_schema(grid, typed_target, V1)
    Publisher(grid, StreamConfig(typed_target, value_format="avro")).close()
    with pytest.raises(Exception, match=r"is typed \(value_format='avro'\): write a struct 'value' column"):
        spark.createDataFrame([("x",)], "value string").write.format("meteor").options(
            **grid_options(grid_settings)
        ).mode("append").save(typed_target)
