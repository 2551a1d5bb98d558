"""A lane truncated and refilled under a Spark checkpoint or a group's offset fails the query (or, with
failOnDataLoss=false, is read again from its oldest item); never a silent skip of the records that refilled it.

The lane's ring is destroyed and refilled with more items than it had (a grid restarted without a store, or a member
restart that lost the ring log's tail): the checkpoint's position is inside the new lane, so only the item marks
carried in the checkpointed offsets (``meteor_spark.grid.item_marks``) can tell.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException
from spark_helpers import make_stream, put_items, run_available_now, stream_reader, values_items

from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.errors import ConfigError
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.spark.source_offset import SparkOffset
from meteor_spark.testing import wait_until

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_a_checkpoint_over_a_refilled_lane_fails_the_query_or_rereads_the_lane(
    spark: Any, grid: Grid, grid_settings: GridSettings, unique_name: str, tmp_path: Path
) -> None:
    info = make_stream(grid, unique_name, lanes=1)
    put_items(grid, info, 0, values_items("old", items=10, per_item=1))
    rows: list[bytes] = []
    query = run_available_now(
        stream_reader(spark, grid_settings, unique_name, startingOffsets="earliest"), tmp_path / "cp", rows
    )
    assert len(rows) == 10
    end = SparkOffset.from_json(json.loads(query.lastProgress["sources"][0]["endOffset"]))
    assert [(m.sequence) for m in end.marks_dict().values()] == [9]

    grid.ring(info.ring_names[0]).destroy()
    new = put_items(grid, info, 0, values_items("new", items=12, per_item=1))
    with pytest.raises(
        StreamingQueryException,
        match=r"lane 0 was truncated and refilled under the query's "
        r"checkpoint \(sequence 10\).*fresh checkpointLocation",
    ):
        run_available_now(stream_reader(spark, grid_settings, unique_name), tmp_path / "cp", rows)
    assert len(rows) == 10

    run_available_now(stream_reader(spark, grid_settings, unique_name, failOnDataLoss="false"), tmp_path / "cp", rows)
    again = rows[10:]
    assert again == [r.value for r in new]
    print(
        f"checkpoint over a refilled lane: the query failed with LaneTruncatedError; with failOnDataLoss=false "
        f"{len(again)} of {len(new)} new records read, 0 skipped"
    )


def test_a_group_offset_over_a_refilled_lane_fails_a_new_query(
    spark: Any, grid: Grid, grid_settings: GridSettings, unique_name: str, tmp_path: Path
) -> None:
    info = make_stream(grid, unique_name, lanes=1)
    put_items(grid, info, 0, values_items("old", items=10, per_item=1))
    got: list[bytes] = []
    with Subscriber(grid, unique_name, group="g", lease_ms=2000, initial_offset_scheme="earliest") as sub:
        wait_until(lambda: got.extend(r.value for r in sub.poll(50)) or len(got) >= 10, 10, message="old records")
        sub.confirm()
    grid.ring(info.ring_names[0]).destroy()
    new = put_items(grid, info, 0, values_items("new", items=12, per_item=1))

    rows: list[bytes] = []
    with pytest.raises(StreamingQueryException, match=r"lane 0 was truncated and refilled under group 'g''s offset"):
        run_available_now(
            stream_reader(spark, grid_settings, unique_name, group="g", groupLeaseMs="2000"), tmp_path / "cp", rows
        )
    assert rows == []
    run_available_now(
        stream_reader(spark, grid_settings, unique_name, group="g", groupLeaseMs="2000", failOnDataLoss="false"),
        tmp_path / "cp2",
        rows,
    )
    assert rows == [r.value for r in new]


def test_spark_offsets_carry_item_marks_and_old_checkpoints_still_read() -> None:
    from meteor_spark.grid.item_marks import ItemMark

    plain = SparkOffset.from_json({"s": {"0": 5}})  # a checkpoint from before the marks existed: not checked
    assert plain.marks_dict() == {} and plain.dumps() == '{"s": {"0": 5}}'
    marked = SparkOffset.of({"s": {0: 5, 1: 0}}, marks={("s", 0): ItemMark(4, 123)})
    assert marked.to_json() == {"s": {"0": 5, "1": 0}, "@meteor": {"marks": {"s": {"0": [4, 123]}}}}
    again = SparkOffset.from_json(json.loads(marked.dumps()))
    assert again == marked and again.marks_dict() == {("s", 0): ItemMark(4, 123)}
    with pytest.raises(ConfigError, match="not a meteor offset"):
        SparkOffset.from_json({"s": {"0": 5}, "@meteor": {"marks": {"s": {"0": "x"}}}})
