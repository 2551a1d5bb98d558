"""df.write / df.writeStream .format("meteor"): round trips, schema errors, no duplicates for replayed batches."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.errors import AnalysisException, StreamingQueryException
from pyspark.sql.types import StructType
from spark_helpers import grid_options, make_stream, put_items, read_values, values_items

from meteor_spark.errors import ConfigError
from meteor_spark.format.offsets import first_offset_of
from meteor_spark.format.records import decode_batch
from meteor_spark.grid.client import Grid, GridSettings, Ring
from meteor_spark.grid.streams import StreamConfig, lane_bounds, open_stream
from meteor_spark.producer.publisher import LaneWritten
from meteor_spark.spark.options import SinkOptions
from meteor_spark.spark.sink_columns import validate_input_schema
from meteor_spark.spark.writer import SINK_COMMITS_MAP, MeteorBatchWriter, MeteorStreamWriter, lanes_written

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_batch_write_then_batch_read_round_trip(
    spark: Any, grid: Grid, grid_settings: GridSettings, unique_name: str
) -> None:
    make_stream(grid, unique_name, lanes=3)
    rows = [(f"k{i % 5}", f"value-{i}", [("h", bytes([i]))]) for i in range(50)]
    df = spark.createDataFrame(rows, "key string, value string, headers array<struct<key:string,value:binary>>")
    df.write.format("meteor").options(**grid_options(grid_settings)).mode("append").save(unique_name)

    back = (
        spark.read.format("meteor")
        .options(**grid_options(grid_settings))
        .option("stream", unique_name)
        .option("includeHeaders", "true")
        .load()
    )
    got = sorted((r.key.decode(), r.value.decode(), [(h.key, h.value) for h in r.headers]) for r in back.collect())
    assert got == sorted((k, v, h) for k, v, h in rows)
    # Records with the same key went to the same lane, in the order they were written.
    by_key: dict[bytes, set[int]] = {}
    for r in back.collect():
        by_key.setdefault(r.key, set()).add(r.lane)
    assert all(len(lanes) == 1 for lanes in by_key.values())


def test_stream_write_from_a_meteor_stream_round_trip_and_no_duplicates_on_replay(
    spark: Any, grid: Grid, grid_settings: GridSettings, unique_name: str, tmp_path: Path
) -> None:
    source = make_stream(grid, f"{unique_name}-in", lanes=2)
    make_stream(grid, f"{unique_name}-out", lanes=2)
    published = [r.value for lane in (0, 1) for r in put_items(grid, source, lane, values_items(f"l{lane}", 3, 2))]
    checkpoint = tmp_path / "cp"

    def run() -> None:
        query = (
            spark.readStream.format("meteor")
            .options(**grid_options(grid_settings))
            .option("stream", f"{unique_name}-in")
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", "2")
            .load()
            .writeStream.format("meteor")
            .options(**grid_options(grid_settings))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start(f"{unique_name}-out")
        )
        query.awaitTermination()

    run()
    written = read_values(grid, f"{unique_name}-out")
    assert sorted(v for values in written.values() for v in values) == sorted(published)
    # The source's lane column routes each record to the same lane of the target stream.
    assert sorted(written[0]) == sorted(v for v in published if v.startswith(b"l0"))

    # Make Spark replay the last batch although the sink committed it: drop the commit-log entry (what a driver
    # crash between the sink's commit and Spark's commit log leaves behind).
    commits = sorted((checkpoint / "commits").glob("[0-9]*"), key=lambda p: int(p.name))
    last = commits[-1]
    last.unlink()
    (last.parent / f".{last.name}.crc").unlink(missing_ok=True)
    run()
    assert (checkpoint / "commits" / last.name).exists()  # the batch really ran again
    again = read_values(grid, f"{unique_name}-out")
    assert again == written  # ... and published nothing twice
    sink_commits = grid.map(SINK_COMMITS_MAP)
    keys = [k for k in sink_commits.keys() if k.startswith(str(checkpoint))]  # noqa: SIM118 (a grid map, not a dict)
    assert len(keys) == 1 and not keys[0].endswith("/unknown-query")  # keyed by Spark's real query id
    commit = grid.map(SINK_COMMITS_MAP).get(keys[0])
    assert commit is not None
    assert json.loads(commit)["batch"] == int(last.name)


def test_a_committed_batch_id_is_never_published_again(
    grid: Grid, grid_settings: GridSettings, unique_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_stream(grid, unique_name)
    schema = StructType.fromJson(
        {"type": "struct", "fields": [{"name": "value", "type": "binary", "nullable": True, "metadata": {}}]}
    )
    options = SinkOptions.parse({"stream": unique_name, "sinkId": unique_name, **grid_options(grid_settings)})
    writer = MeteorStreamWriter(options, schema, overwrite=False)
    properties = {"streaming.sql.batchId": "4", "sql.streaming.queryId": "q-1"}
    monkeypatch.setattr("meteor_spark.spark.writer._local_property", properties.get)
    batch = pa.RecordBatch.from_pydict({"value": [b"a", b"b"]})

    first = writer.write(iter([batch]))
    assert (first.rows, first.skipped, first.streams[0].records) == (2, False, 2)
    writer.commit([first], 4)
    replay = writer.write(iter([batch]))
    assert replay.skipped and replay.rows == 2
    writer.commit([replay], 4)
    properties["streaming.sql.batchId"] = "5"
    assert not writer.write(iter([batch])).skipped
    assert read_values(grid, unique_name)[0] == [b"a", b"b", b"a", b"b"]
    # Another query (a deleted and recreated checkpoint gets a new query id) starts from batch 0 again.
    properties.update({"streaming.sql.batchId": "0", "sql.streaming.queryId": "q-2"})
    assert not writer.write(iter([batch])).skipped


def test_commit_messages_carry_records_and_first_last_offsets_per_lane(
    grid: Grid,
    grid_settings: GridSettings,
    unique_name: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    info = make_stream(grid, unique_name, lanes=2)
    # Lane 1 already holds two items: the writer's offsets there must start after them.
    put_items(grid, info, 1, values_items("old", 2, 3))
    schema = StructType.fromJson(
        {
            "type": "struct",
            "fields": [
                {"name": "value", "type": "binary", "nullable": True, "metadata": {}},
                {"name": "lane", "type": "integer", "nullable": True, "metadata": {}},
            ],
        }
    )
    options = SinkOptions.parse({"stream": unique_name, "sinkId": unique_name, **grid_options(grid_settings)})
    writer = MeteorStreamWriter(options, schema, overwrite=False)
    properties = {"streaming.sql.batchId": "0", "sql.streaming.queryId": "q-lanes"}
    monkeypatch.setattr("meteor_spark.spark.writer._local_property", properties.get)
    batches = [
        pa.RecordBatch.from_pydict({"value": [b"a0", b"b1", b"c0"], "lane": [0, 1, 0]}),
        pa.RecordBatch.from_pydict({"value": [b"d1", b"e0"], "lane": [1, 0]}),
    ]

    message = writer.write(iter(batches))

    assert [(w.stream, w.records) for w in message.streams] == [(unique_name, 5)]
    got = {w.lane: (w.records, w.first_offset, w.last_offset) for w in message.streams[0].lanes}
    # Compare with the offsets the records really have in the grid.
    stored: dict[int, list[tuple[bytes, int]]] = {}
    for lane, (head, next_seq) in lane_bounds(grid, info).items():
        for item, sequence in zip(*_items(grid, info, lane, head, next_seq), strict=True):
            stored.setdefault(lane, []).extend(
                (r.value, r.offset) for r in decode_batch(item, stream=unique_name, lane=lane, sequence=sequence)
            )
    ours = {lane: [o for v, o in pairs if not v.startswith(b"old")] for lane, pairs in stored.items()}
    assert got == {lane: (len(o), o[0], o[-1]) for lane, o in ours.items()}
    assert got[1][1] >= first_offset_of(2)  # after the two items that were there
    assert [v for v, _ in stored[0]] == [b"a0", b"c0", b"e0"]

    with caplog.at_level(logging.INFO, logger="meteor_spark.spark.writer"):
        writer.commit([message, None], 0)
    summary = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("micro-batch 0: wrote"))
    for lane, (records, first, last) in got.items():
        assert f"lane {lane} {records} records at offsets {first}..{last}" in summary
    assert lanes_written([message, message]) == {
        (unique_name, lane): LaneWritten(lane, 2 * records, first, last) for lane, (records, first, last) in got.items()
    }


@pytest.mark.parametrize(
    ("max_records", "max_bytes", "per_item"),
    [(1000, 1 << 20, 1000), (40_000, 8 << 20, (1 << 20) // 99)],
    ids=["default stream", "items allowed above 1 MiB"],
)
def test_the_sinks_larger_calls_store_the_items_a_default_publisher_cuts(
    grid: Grid,
    grid_settings: GridSettings,
    unique_name: str,
    monkeypatch: pytest.MonkeyPatch,
    max_records: int,
    max_bytes: int,
    per_item: int,
) -> None:
    """The sink's publishers send up to ``SINK_MAX_CALL_BYTES`` of records a call, yet cut the ring items a default
    publisher (1 MiB calls) cuts, also where the stream allows larger ones: every row once, in order."""
    calls: list[int] = []
    real = Ring.add_all_async

    def add_all_async(ring: Ring, items: Any, *args: Any) -> Any:
        calls.append(len(items))
        return real(ring, items, *args)

    monkeypatch.setattr(Ring, "add_all_async", add_all_async)
    info = open_stream(grid, StreamConfig(unique_name, max_batch_records=max_records, max_batch_bytes=max_bytes))
    options = SinkOptions.parse({"stream": unique_name, **grid_options(grid_settings)})
    schema = StructType.fromJson(
        {"type": "struct", "fields": [{"name": "value", "type": "binary", "nullable": True, "metadata": {}}]}
    )
    writer = MeteorBatchWriter(options, schema, overwrite=False)
    rows = [b"%099d" % i for i in range(40_000)]  # 99 bytes each: 3,960,000, within one call of the sink's

    message = writer.write(iter([pa.RecordBatch.from_pydict({"value": rows})]))

    n_items = -(-40_000 // per_item)
    assert [(w.records, w.items) for w in message.streams] == [(40_000, n_items)]
    assert calls == [n_items]  # one call; a default publisher sends four, of 1 MiB each
    head, next_seq = lane_bounds(grid, info)[0]
    items, sequences = _items(grid, info, 0, head, next_seq)
    decoded = [decode_batch(i, stream=unique_name, lane=0, sequence=s) for i, s in zip(items, sequences, strict=True)]
    assert [len(batch) for batch in decoded] == [min(per_item, 40_000 - i * per_item) for i in range(n_items)]
    assert [r.value for batch in decoded for r in batch] == rows
    writer.commit([message])


def _items(grid: Grid, info: Any, lane: int, head: int, next_seq: int) -> tuple[list[bytes], list[int]]:
    batch = grid.ring(info.ring_names[lane]).read_many(head, 0, next_seq - head)
    return list(batch.items), list(batch.sequences)


@pytest.mark.parametrize(
    ("ddl", "message"),
    [
        ("key string", r"no 'value' column; columns given: key. Expected columns: value binary or string"),
        ("Value string", r"found 'Value': column names are case-sensitive"),
        ("value int", r"column 'value' has type int, expected binary or string"),
        ("value string, partition int", r"unknown column 'partition' \(int\); expected columns: value"),
        ("value string, headers map<string,int>", "column 'headers' has type map<string,int>"),
        ("value string, lane string", "column 'lane' has type string, expected int"),
    ],
)
def test_wrong_input_schemas_are_explained(ddl: str, message: str) -> None:
    schema = StructType.fromDDL(ddl)
    assert isinstance(schema, StructType)  # pyspark types fromDDL as any DataType
    with pytest.raises(ConfigError, match=message):
        validate_input_schema(schema, SinkOptions.parse({"stream": "s"}))


def test_wrong_schema_fails_the_write_at_start_listing_columns(spark: Any, grid_settings: GridSettings) -> None:
    df = spark.createDataFrame([(1, "x")], "id int, payload string")
    with pytest.raises(AnalysisException, match=r"no 'value' column; columns given: id, payload. Expected columns: "):
        df.write.format("meteor").options(**grid_options(grid_settings)).mode("append").save("never-written")
    with pytest.raises(Exception, match="no target stream"):
        spark.createDataFrame([("x",)], "value string").write.format("meteor").options(
            **grid_options(grid_settings)
        ).mode("append").save()
    shutil.rmtree("spark-warehouse", ignore_errors=True)


def test_a_bad_sink_option_fails_the_streaming_query_at_its_first_batch_not_at_start(
    spark: Any, grid: Grid, grid_settings: GridSettings, unique_name: str, tmp_path: Path
) -> None:
    """PySpark runs nothing of a Python data source at ``writeStream.start()``: the DataSource is built and
    ``streamWriter()`` called only when the first micro-batch is planned (``schema()`` is never called for a write),
    so a bad sink option can be refused no earlier. ``start()`` returns; the query then fails naming the option
    (a batch ``save()`` builds its writer at once and raises there)."""
    source = make_stream(grid, f"{unique_name}-in")
    put_items(grid, source, 0, values_items("v", 1, 1))
    query = (
        spark.readStream.format("meteor")
        .options(**grid_options(grid_settings))
        .option("stream", f"{unique_name}-in")
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.format("meteor")
        .options(**grid_options(grid_settings))
        .option("transactionTimeoutMs", "0")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(availableNow=True)
        .start(f"{unique_name}-out")
    )
    with pytest.raises(StreamingQueryException, match=r"option 'transactionTimeoutMs': expected a whole number > 0"):
        query.awaitTermination()
    assert query.lastProgress is None  # no batch completed
    with pytest.raises(AnalysisException, match=r"option 'transactional': expected true or false, got 'maybe'"):
        spark.createDataFrame([(b"v",)], "value binary").write.format("meteor").options(
            **grid_options(grid_settings)
        ).option("transactional", "maybe").mode("append").save(f"{unique_name}-out")
