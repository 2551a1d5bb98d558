"""The edges of data loss in the Spark source, against the real grid and a real local[2] Spark: skip mode, positions
checked at query start, stale checkpoints and group offsets, corrupt ring items, history below the ring head."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import AnalysisException, StreamingQueryException
from spark_helpers import grid_options, make_stream, put_items, run_available_now, stream_reader, values_items

from meteor_spark.format.corrupt import (
    HEADER_ERROR,
    HEADER_SOURCE_LANE,
    HEADER_SOURCE_OFFSET,
    HEADER_SOURCE_SEQUENCE,
    HEADER_SOURCE_STREAM,
)
from meteor_spark.format.offsets import first_offset_of
from meteor_spark.format.records import decode_batch
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.streams import lane_bounds, open_stream
from meteor_spark.groups.admin import delete_stream
from meteor_spark.groups.exclusive import GroupMember
from meteor_spark.spark.source_offset import SparkOffset

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _batch_reader(spark: Any, settings: GridSettings, stream: str, **options: str) -> Any:
    return spark.read.format("meteor").options(**grid_options(settings)).option("stream", stream).options(**options)


def _skipped(query: Any) -> int:
    return SparkOffset.from_json(json.loads(query.lastProgress["sources"][0]["endOffset"])).skipped_items


def test_skip_mode_jumps_to_the_oldest_item_and_counts_each_lost_item_once_across_restarts(
    spark: Any, grid: Grid, grid_settings: GridSettings, unique_name: str, tmp_path: Path
) -> None:
    info = make_stream(grid, unique_name, lanes=1, capacity=10)
    put_items(grid, info, 0, values_items("r", items=100, per_item=1))  # the ring keeps 90..99
    options = {
        "startingOffsets": json.dumps({unique_name: {"0": 0}}),
        "maxOffsetsPerTrigger": "5",
        "failOnDataLoss": "false",
    }
    rows: list[bytes] = []

    query = run_available_now(stream_reader(spark, grid_settings, unique_name, **options), tmp_path / "cp", rows)
    batches = [p["numInputRows"] for p in query.recentProgress]
    print(f"skip mode: batches {batches}, {len(rows)} records read, {_skipped(query)} items counted as lost")
    assert sorted(rows) == sorted(b"r-%d-0" % i for i in range(90, 100))
    assert batches == [5, 5]  # no batch spent on the overwritten range
    assert _skipped(query) == 90

    # Restarted from the checkpoint with nothing lost meanwhile: the count is carried, not reset nor repeated.
    put_items(grid, info, 0, values_items("s", items=5, per_item=1))  # 100..104, the ring keeps 95..104
    query = run_available_now(stream_reader(spark, grid_settings, unique_name, **options), tmp_path / "cp", rows)
    assert [p["numInputRows"] for p in query.recentProgress] == [5]
    assert _skipped(query) == 90
    # And a loss while it was stopped is added once: 105..124 published, the ring keeps 115..124.
    put_items(grid, info, 0, values_items("t", items=20, per_item=1))
    query = run_available_now(stream_reader(spark, grid_settings, unique_name, **options), tmp_path / "cp", rows)
    assert [p["numInputRows"] for p in query.recentProgress] == [5, 5]
    assert _skipped(query) == 100
    assert len(rows) == len(set(rows)) == 10 + 5 + 10


def test_a_position_past_the_end_or_an_unknown_lane_fails_the_query_at_start(
    spark: Any, grid: Grid, grid_settings: GridSettings, unique_name: str, tmp_path: Path
) -> None:
    info = make_stream(grid, unique_name, lanes=1)
    put_items(grid, info, 0, values_items("x", items=10, per_item=1))

    past_end = json.dumps({unique_name: {"0": 1000}})
    query = (
        stream_reader(spark, grid_settings, unique_name, startingOffsets=past_end)
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "a"))
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(
        StreamingQueryException,
        match=rf"stream '{unique_name}' lane 0: sequence 1000 is past the "
        r"end of the lane; valid sequences are 0 to 10",
    ):
        query.awaitTermination()
    with pytest.raises(Exception, match=r"sequence 1000 is past the end of the lane; valid sequences are 0 to 10"):
        _batch_reader(spark, grid_settings, unique_name, startingOffsets=past_end).load().collect()
    with pytest.raises(Exception, match=r"sequence 11 is past the end of the lane; valid sequences are 0 to 10"):
        _batch_reader(
            spark, grid_settings, unique_name, endingOffsets=json.dumps({unique_name: {"0": 11}})
        ).load().collect()

    unknown_lane = json.dumps({unique_name: {"0": 0, "99": 0}})
    query = (
        stream_reader(spark, grid_settings, unique_name, startingOffsets=unknown_lane)
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "b"))
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(
        StreamingQueryException,
        match=rf"startingOffsets names lane\(s\) 99 of stream "
        rf"'{unique_name}', which has lanes 0..0",
    ):
        query.awaitTermination()
    with pytest.raises(Exception, match=r"names lane\(s\) 99 of stream"):
        _batch_reader(spark, grid_settings, unique_name, startingOffsets=unknown_lane).load().collect()


def test_unknown_and_invalid_stream_names_fail_before_anything_is_read(
    spark: Any, grid_settings: GridSettings, unique_name: str
) -> None:
    with pytest.raises(AnalysisException, match=r"option 'stream': stream name 'not a name' is not valid"):
        stream_reader(spark, grid_settings, "not a name")
    with pytest.raises(AnalysisException, match=r"stream name 'a/b' is not valid"):
        _batch_reader(spark, grid_settings, "a/b").load()
    with pytest.raises(Exception, match=rf"StreamNotFoundError.*stream '{unique_name}' does not exist"):
        _batch_reader(spark, grid_settings, unique_name).load().collect()


def test_a_stale_checkpoint_is_an_error_not_a_silent_skip(
    spark: Any, grid: Grid, grid_settings: GridSettings, unique_name: str, tmp_path: Path
) -> None:
    info = make_stream(grid, unique_name, lanes=2)
    put_items(grid, info, 0, values_items("old", items=10, per_item=1))
    rows: list[bytes] = []
    reader = lambda: stream_reader(spark, grid_settings, unique_name, startingOffsets="earliest")  # noqa: E731
    run_available_now(reader(), tmp_path / "cp", rows)
    assert len(rows) == 10

    delete_stream(grid, unique_name)
    info = make_stream(grid, unique_name, lanes=2)
    put_items(grid, info, 0, values_items("new", items=3, per_item=1))
    with pytest.raises(
        StreamingQueryException,
        match=r"sequence 10 is past the end of the lane; valid sequences "
        r"are 0 to 3.*checkpoint is stale.*fresh checkpointLocation",
    ):
        run_available_now(reader(), tmp_path / "cp", rows)
    delete_stream(grid, unique_name)
    make_stream(grid, unique_name, lanes=1)
    with pytest.raises(
        StreamingQueryException,
        match=rf"checkpoint has a position for lane 1 of stream "
        rf"'{unique_name}', which has lanes 0..0: the checkpoint is stale",
    ):
        run_available_now(reader(), tmp_path / "cp", rows)
    assert len(rows) == 10


def test_a_stale_group_offset_is_an_error_not_a_silent_skip(
    spark: Any, grid: Grid, grid_settings: GridSettings, unique_name: str, tmp_path: Path
) -> None:
    info = make_stream(grid, unique_name, lanes=1)
    put_items(grid, info, 0, values_items("old", items=10, per_item=1))
    member = GroupMember(grid, info, "g", member_id="tool", lease_ms=2000)
    member.start()
    try:
        from meteor_spark.testing import wait_until

        wait_until(lambda: 0 in member.assignment(), timeout_s=10, message="the member to hold lane 0")
        member.confirm(0, first_offset_of(10))
    finally:
        member.close()
    grid.ring(info.ring_names[0]).destroy()  # the lane starts again from 0 under the group's offset
    put_items(grid, info, 0, values_items("new", items=3, per_item=1))
    assert lane_bounds(grid, info)[0] == (0, 3)

    rows: list[bytes] = []
    with pytest.raises(
        StreamingQueryException,
        match=r"sequence 10 is past the end of the lane; valid sequences "
        r"are 0 to 3.*group 'g' is stale",
    ):
        run_available_now(
            stream_reader(
                spark, grid_settings, unique_name, startingOffsets="earliest", group="g", groupLeaseMs="2000"
            ),
            tmp_path / "cp",
            rows,
        )
    assert rows == []


def _with_foreign_item(grid: Grid, name: str) -> list[bytes]:
    """Stream ``name``: good items at sequences 0-1, a foreign item at 2, good items at 3-4; the good values."""
    info = make_stream(grid, name, lanes=1)
    good = [r.value for r in put_items(grid, info, 0, values_items("a", items=2, per_item=3))]
    assert grid.ring(info.ring_names[0]).add(b"not a meteor batch") == 2
    good += [r.value for r in put_items(grid, info, 0, values_items("b", items=2, per_item=3))]
    return good


def test_a_corrupt_item_fails_the_read_naming_it_by_default(
    spark: Any, grid: Grid, grid_settings: GridSettings, unique_name: str, tmp_path: Path
) -> None:
    _with_foreign_item(grid, unique_name)
    with pytest.raises(
        Exception,
        match=rf"stream '{unique_name}' lane 0 sequence 2: the ring item \(18 bytes\) is "
        r"not a meteor record batch",
    ):
        _batch_reader(spark, grid_settings, unique_name).load().collect()
    rows: list[bytes] = []
    with pytest.raises(StreamingQueryException, match=rf"stream '{unique_name}' lane 0 sequence 2"):
        run_available_now(
            stream_reader(spark, grid_settings, unique_name, startingOffsets="earliest"), tmp_path / "cp", rows
        )


def test_on_corrupt_skip_reads_every_good_record(
    spark: Any, grid: Grid, grid_settings: GridSettings, unique_name: str, tmp_path: Path
) -> None:
    good = _with_foreign_item(grid, unique_name)
    batch = _batch_reader(spark, grid_settings, unique_name, onCorrupt="skip").load()
    assert sorted(r.value for r in batch.collect()) == sorted(good)
    rows: list[bytes] = []
    run_available_now(
        stream_reader(
            spark, grid_settings, unique_name, startingOffsets="earliest", onCorrupt="skip", maxOffsetsPerTrigger="2"
        ),
        tmp_path / "cp",
        rows,
    )
    assert sorted(rows) == sorted(good)


def test_dead_letter_stream_gets_the_raw_item_with_where_and_why(
    spark: Any, grid: Grid, grid_settings: GridSettings, unique_name: str, tmp_path: Path
) -> None:
    good = _with_foreign_item(grid, unique_name)
    dlq = f"{unique_name}-dlq"
    options = {"startingOffsets": "earliest", "deadLetterStream": dlq}
    with pytest.raises(StreamingQueryException, match=rf"option 'deadLetterStream': stream '{dlq}' does not exist"):
        run_available_now(stream_reader(spark, grid_settings, unique_name, **options), tmp_path / "a", [])

    dlq_info = make_stream(grid, dlq, lanes=1)
    rows: list[bytes] = []
    run_available_now(stream_reader(spark, grid_settings, unique_name, **options), tmp_path / "b", rows)
    assert sorted(rows) == sorted(good)

    head, end = lane_bounds(grid, dlq_info)[0]
    batch = grid.ring(dlq_info.ring_names[0]).read_many(head, 0, end - head)
    letters = [
        r
        for item, seq in zip(batch.items, batch.sequences, strict=True)
        for r in decode_batch(item, stream=dlq, lane=0, sequence=seq)
    ]
    assert [r.value for r in letters] == [b"not a meteor batch"]
    headers = dict(letters[0].headers)
    assert headers[HEADER_SOURCE_STREAM] == unique_name.encode()
    assert headers[HEADER_SOURCE_LANE] == b"0"
    assert headers[HEADER_SOURCE_SEQUENCE] == b"2"
    assert headers[HEADER_SOURCE_OFFSET] == str(first_offset_of(2)).encode()
    assert b"not a meteor record batch" in headers[HEADER_ERROR]

    batch_rows = _batch_reader(spark, grid_settings, unique_name, deadLetterStream=dlq).load().collect()
    assert sorted(r.value for r in batch_rows) == sorted(good)
    assert lane_bounds(grid, dlq_info)[0][1] == end + 1  # the batch read refused the item once more


@pytest.mark.embedded_only
def test_reads_from_earliest_serve_history_below_the_ring_head(spark: Any, tmp_path: Path) -> None:
    from meteor_spark.server import EmbeddedGrid

    server = EmbeddedGrid(port=0, process=True, data_dir=tmp_path / "data")
    server.start()
    try:
        settings = GridSettings(members=(server.address,), cluster_name=server.cluster_name)
        with Grid(settings) as grid:
            info = make_stream(grid, "history", lanes=1, capacity=10)
            published = [r.value for r in put_items(grid, info, 0, values_items("h", items=50, per_item=2))]
            assert lane_bounds(grid, info)[0] == (40, 50)

            batch = _batch_reader(spark, settings, "history").load()
            assert sorted(r.value for r in batch.collect()) == sorted(published)
            from_zero = _batch_reader(
                spark, settings, "history", startingOffsets=json.dumps({"history": {"0": 0}})
            ).load()
            assert from_zero.count() == 100
            rows: list[bytes] = []
            run_available_now(
                stream_reader(spark, settings, "history", startingOffsets="earliest", maxOffsetsPerTrigger="20"),
                tmp_path / "cp",
                rows,
            )
            assert sorted(rows) == sorted(published)
            assert open_stream(grid, "history").name == "history"
    finally:
        server.stop()
