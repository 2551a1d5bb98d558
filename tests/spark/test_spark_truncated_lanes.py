"""A lane truncated and refilled under a Spark checkpoint or a group's offset fails the query (or, with
failOnDataLoss=false, is read again from its oldest item); never a silent skip of the records that refilled it.

The lane's ring is destroyed and refilled with more items than it had (a grid restarted without a store, or a member
restart that lost the ring log's tail): the checkpoint's position is inside the new lane, so only the item marks
carried in the checkpointed offsets (``meteor_spark.grid.item_marks``) can tell.

A query that keeps running across such a restart starts no source runner again: each task reading a lane range
compares the item before its range with the mark of the previous batch's end (``executor._checked_start``), and a
lane seen ending below the query's position is the same truncation (``DriverState.ended_below``). The fault test
SIGKILLs a persistent embedded member, cuts whole records off its ring log (a lost unflushed tail) and restarts it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException
from spark_helpers import make_stream, put_items, run_available_now, stream_reader, values_items

from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.errors import ConfigError, LaneTruncatedError, StreamDeletedError
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.streams import open_stream
from meteor_spark.groups.admin import delete_stream
from meteor_spark.spark.source_offset import SparkOffset
from meteor_spark.testing import wait_until
from tests.ring_logs import cut_records

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


LIVE_OLD, LIVE_LOST, LIVE_NEW = 50, 10, 50
TRIGGER_S = 20


@pytest.mark.embedded_only
@pytest.mark.fault
@pytest.mark.parametrize(
    ("fsync", "trigger"), [("never", None), ("interval", f"{TRIGGER_S} seconds")], ids=["polling", "between-triggers"]
)
@pytest.mark.parametrize("fail", [True, False], ids=["error", "reread"])
def test_a_running_query_across_a_member_restart_that_refills_a_lane(
    spark: Any, tmp_path: Path, fsync: str, trigger: str | None, fail: bool
) -> None:
    """50 records read by a running query; SIGKILL; the ring log loses its last 10; restart; 50 new records take
    sequences 40..89 while the query keeps running: it fails with ``LaneTruncatedError``, or with
    ``failOnDataLoss=false`` reads every new record (the lane again from its oldest item), never skipping the 10
    new records below its position.

    ``polling``: batches are planned back to back, so the driver may see the lane ending below the position before
    the new records arrive (``ended_below``) or a task the refilled lane (``_checked_start``), whichever comes first.
    ``between-triggers``: restart and refill fall between two triggers, so the next batch's task catches it."""
    from meteor_spark.server import EmbeddedGrid

    member = EmbeddedGrid(port=0, process=True, data_dir=tmp_path / "data", fsync=fsync).start()
    rows: list[bytes] = []
    try:
        settings = GridSettings(members=(member.address,), cluster_name=member.cluster_name, connect_timeout_s=60)
        with Grid(settings) as grid:
            info = make_stream(grid, "orders", lanes=1)
            for item in values_items("old", items=LIVE_OLD, per_item=1):
                put_items(grid, info, 0, [item])  # one ring-log record per item: the cut loses whole items
            df = stream_reader(spark, settings, "orders", startingOffsets="earliest", failOnDataLoss=str(fail).lower())
            writer = df.writeStream.foreachBatch(lambda batch, _: rows.extend(r.value for r in batch.collect()))
            if trigger is not None:
                writer = writer.trigger(processingTime=trigger)
            query = writer.option("checkpointLocation", str(tmp_path / "cp")).start()
            try:
                wait_until(lambda: len(rows) >= LIVE_OLD, 120, message="the old records read")
                if trigger is not None:
                    # Spark fires processing-time triggers on multiples of the interval (epoch time): start the fault
                    # 1-8 s after one, so restart and refill end before the next and the driver plans nothing between.
                    wait_until(lambda: 1 <= time.time() % TRIGGER_S <= 8, TRIGGER_S, message="room before a trigger")
                member.kill()
                cut_records(next((tmp_path / "data" / "rings").glob("meteor.stream*orders*.log")), LIVE_LOST)
                started = time.monotonic()
                member.restart()
                new: list[bytes] = []
                for item in values_items("new", items=LIVE_NEW, per_item=1):
                    new.extend(r.value for r in put_items(grid, info, 0, [item]))  # waits for the reconnect
                ring = grid.ring(open_stream(grid, "orders").ring_names[0])
                assert ring.tail() == LIVE_OLD - LIVE_LOST + LIVE_NEW - 1
                wait_until(
                    lambda: query.exception() is not None or new[-1] in rows, 120, message="detection or new records"
                )
                took = time.monotonic() - started
                outcome = _live_outcome(query, rows, new, fail, by_task=trigger is not None)
            finally:
                query.stop()
    finally:
        member.stop()
    print(
        f"running query across a restart (fsync={fsync}, trigger={trigger or 'back to back'}, failOnDataLoss={fail}): "
        f"ring log cut by {LIVE_LOST} "
        f"of {LIVE_OLD} read records, {LIVE_NEW} new; {outcome}; restart to outcome {took:.2f} s"
    )


def _live_outcome(query: Any, rows: list[bytes], new: list[bytes], fail: bool, *, by_task: bool) -> str:
    """Check what the running query did after the restart; its figures. A task's error says "Restart the query",
    the driver's "Start the query"."""
    lost = len(set(new) - set(rows))
    duplicated = len(rows) - len(set(rows))
    if fail:
        error = query.exception()
        assert error is not None, f"the query went on over the refilled lane: {lost} of {len(new)} new records lost"
        assert "LaneTruncatedError" in str(error) or "was truncated and refilled" in str(error)
        assert "stream 'orders' lane 0 was truncated and refilled under the running query's position" in str(error)
        assert set(rows) & set(new) == set()
        task = "Restart the query with a fresh checkpointLocation" in str(error)
        assert task or not by_task
        return (
            f"LaneTruncatedError raised by {'a task' if task else 'the driver'}, 0 new records delivered past the "
            f"truncation, {len(rows)} rows before"
        )
    assert query.exception() is None
    assert lost == 0, f"{lost} of {len(new)} new records silently skipped"
    return f"{len(set(new) & set(rows))} of {len(new)} new records read, lost {lost}, duplicated {duplicated}"


def test_a_task_compares_the_item_before_its_range_with_the_expected_mark(
    grid: Grid, grid_settings: GridSettings, unique_name: str
) -> None:
    """The task-side check without Spark: the item before the range is the marked one (read as planned), another
    one (``LaneTruncatedError``, or with ``failOnDataLoss=false`` the lane from its oldest item to the range's end,
    no further than the lane's end), gone (overwritten: no truncation, the range's own read reports loss), not
    marked (not checked), or its stream deleted since the batch was planned (``StreamDeletedError``, or nothing read
    with ``failOnDataLoss=false``)."""
    from meteor_spark.grid.item_marks import ItemMark, mark_of
    from meteor_spark.spark.executor import LaneRange, read_lane_ranges

    info = make_stream(grid, unique_name, lanes=1)
    put_items(grid, info, 0, values_items("v", items=6, per_item=1))
    item = grid.ring(info.ring_names[0]).read_many(2, 0, 1).items[0]

    def read(expect: ItemMark | None, start: int = 3, end: int = 5, *, fail: bool = True, on: Any = info) -> list:
        part = LaneRange(on.name, 0, start, end, grid_settings, on, fail_on_data_loss=fail, expect=expect)
        return [v.as_py() for batch in read_lane_ranges((part,)) for v in batch.column("value")]

    planned = [b"v-3-0", b"v-4-0"]
    everything = [b"v-0-0", b"v-1-0", b"v-2-0", b"v-3-0", b"v-4-0", b"v-5-0"]
    assert read(mark_of(item, 2)) == planned and read(None) == planned
    other = ItemMark(2, mark_of(item, 2).crc ^ 1)
    with pytest.raises(LaneTruncatedError, match=rf"stream '{unique_name}' lane 0 was truncated and refilled under "):
        read(other)
    assert read(other, fail=False) == everything[:5]
    with pytest.raises(LaneTruncatedError, match=r"\(sequence 9\)"):
        read(ItemMark(8, 0), 9, 12)  # the lane now ends before the marked item
    assert read(ItemMark(8, 0), 9, 12, fail=False) == everything

    small = make_stream(grid, unique_name + "-small", lanes=1, capacity=10)
    put_items(grid, small, 0, values_items("s", items=15, per_item=1))
    assert read(ItemMark(4, 0), 6, 8, on=small) == [b"s-6-0", b"s-7-0"]  # the marked item was overwritten

    delete_stream(grid, unique_name)  # deleted after the batch was planned: the driver's data loss, not a truncation
    with pytest.raises(
        StreamDeletedError, match=r"the stream was deleted while the query read it, with ring sequences 3\.\.4"
    ):
        read(mark_of(item, 2))
    assert read(mark_of(item, 2), fail=False) == []
