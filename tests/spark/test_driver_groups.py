"""The stream reader's driver side with a group, driven directly (no SparkSession): grid calls per micro-batch,
standby, takeover and a fenced confirm, in milliseconds.

Spark calls ``latestOffset``, ``partitions`` and ``commit`` on the source runner; these tests make the same calls
in the same order on a ``MeteorStreamReader`` whose grid client counts what the driver sends.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Iterator
from typing import Any

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable
from spark_helpers import grid_options, make_stream, put_items, values_items

from meteor_spark.bench.jobs.pattern import CountingGrid
from meteor_spark.format.offsets import first_offset_of
from meteor_spark.format.records import Record
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.streams import StreamInfo
from meteor_spark.groups.leases import Lease, LeaseMap, wall_ms
from meteor_spark.groups.store import LEASES_MAP, OFFSETS_MAP, ConfirmedOffset, lane_key
from meteor_spark.spark import driver as driver_module
from meteor_spark.spark import reader as reader_module
from meteor_spark.spark.datasource import SOURCE_SCHEMA
from meteor_spark.spark.executor import LaneRanges
from meteor_spark.spark.options import SourceOptions
from meteor_spark.spark.reader import MeteorStreamReader
from meteor_spark.testing import wait_until

LANES = 8


@pytest.fixture
def counting(grid: Grid, monkeypatch: pytest.MonkeyPatch) -> CountingGrid:
    counting = CountingGrid(grid)
    monkeypatch.setattr(driver_module, "grid_for", lambda settings: counting)
    # The SIGTERM/atexit hooks belong to Spark's source runner process, not to the test process.
    monkeypatch.setattr(reader_module, "install_stop_hooks", lambda reader: None)
    return counting


def _reader(settings: GridSettings, stream: str, member: str, **extra: str) -> MeteorStreamReader:
    options = SourceOptions.parse(
        {
            **grid_options(settings),
            "stream": stream,
            "group": "g",
            "groupMemberId": member,
            "startingOffsets": "earliest",
            **extra,
        }
    )
    return MeteorStreamReader(options, SOURCE_SCHEMA)


@pytest.fixture
def readers(grid_settings: GridSettings) -> Iterator[list[MeteorStreamReader]]:
    made: list[MeteorStreamReader] = []
    yield made
    for reader in made:
        reader.stop()


def _publish_one_item_per_lane(grid: Grid, info: StreamInfo, tag: str) -> None:
    for lane in range(info.config.lanes):
        put_items(grid, info, lane, values_items(f"{tag}-{lane}-", 1, 3))


def _ranges(partitions: Any) -> dict[int, tuple[int, int]]:
    out = {}
    for task in partitions:
        assert isinstance(task, LaneRanges)
        for part in task.ranges:
            out[part.lane] = (part.start, part.end)
    return out


def _stored_offsets(grid: Grid, stream: str, lanes: int = LANES) -> dict[int, int | None]:
    offsets = grid.map(OFFSETS_MAP)
    out = {}
    for lane in range(lanes):
        text = offsets.get(lane_key(stream, "g", lane))
        out[lane] = None if text is None else ConfirmedOffset.decode(text, "test").offset
    return out


def test_a_grouped_micro_batch_costs_at_most_four_grid_calls_per_lane(
    grid: Grid,
    grid_settings: GridSettings,
    unique_name: str,
    counting: CountingGrid,
    readers: list[MeteorStreamReader],
) -> None:
    info = make_stream(grid, unique_name, lanes=LANES)
    _publish_one_item_per_lane(grid, info, "a")
    reader = _reader(grid_settings, unique_name, "query-1")
    readers.append(reader)
    start = reader.initialOffset()
    assert start == {unique_name: {str(lane): 0 for lane in range(LANES)}}

    per_batch = []
    planning_ms = []
    for batch in range(4):
        _publish_one_item_per_lane(grid, info, f"b{batch}")
        counting.calls.clear()
        began = time.perf_counter()
        end = reader.latestOffset(start, ReadAllAvailable())
        ranges = _ranges(reader.partitions(start, end))
        reader.commit(end)
        planning_ms.append((time.perf_counter() - began) * 1000)
        per_batch.append(counting.total())
        print(f"batch {batch}: {counting.total()} grid calls for {LANES} lanes: {dict(counting.calls)}")
        # Every lane read exactly what arrived since the last batch, and the group confirmed the batch's end.
        assert ranges == {
            lane: (int(start[unique_name][str(lane)]), int(end[unique_name][str(lane)])) for lane in range(LANES)
        }
        assert all(hi - lo == (2 if batch == 0 else 1) for lo, hi in ranges.values())
        assert _stored_offsets(grid, unique_name) == {
            lane: first_offset_of(int(end[unique_name][str(lane)])) for lane in range(LANES)
        }
        start = end
    print(
        f"grid calls per grouped micro-batch ({LANES} lanes): {per_batch}; planning ms: "
        f"{[round(ms, 1) for ms in planning_ms]}"
    )
    # Bounds (2), the confirm's compare-and-set (1) and the item before the new end, for its mark (1).
    assert max(per_batch) <= 4 * LANES

    # A batch with nothing new confirms nothing and reads only the lane bounds.
    counting.calls.clear()
    assert reader.latestOffset(start, ReadAllAvailable()) == start
    assert counting.total() <= 2 * LANES + 1, dict(counting.calls)


def test_the_driver_stands_by_takes_over_and_is_fenced_without_spark(
    grid: Grid,
    grid_settings: GridSettings,
    unique_name: str,
    counting: CountingGrid,
    readers: list[MeteorStreamReader],
) -> None:
    info = make_stream(grid, unique_name, lanes=2)
    _publish_one_item_per_lane(grid, info, "a")
    holder = _reader(grid_settings, unique_name, "query-a")
    standby = _reader(grid_settings, unique_name, "query-b")
    readers.extend([holder, standby])
    a_start = holder.initialOffset()
    b_start = standby.initialOffset()
    assert b_start == a_start == {unique_name: {"0": 0, "1": 0}}

    # The holder reads and commits a batch; the standby reads nothing and follows the group's confirmed offsets.
    a_end = holder.latestOffset(a_start, ReadAllAvailable())
    assert _ranges(holder.partitions(a_start, a_end)) == {0: (0, 1), 1: (0, 1)}
    holder.commit(a_end)
    b_end = standby.latestOffset(b_start, ReadAllAvailable())
    assert b_end[unique_name] == a_end[unique_name] == {"0": 1, "1": 1}
    assert _ranges(standby.partitions(b_start, b_end)) == {}
    standby.commit(b_end)
    assert _stored_offsets(grid, unique_name, 2) == {0: first_offset_of(1), 1: first_offset_of(1)}

    # The holder stops (graceful handover): the standby takes the lanes and reads on from the group's position.
    _publish_one_item_per_lane(grid, info, "b")
    holder.stop()
    state = standby._driver()
    wait_until(lambda: state.held(unique_name, 0) and state.held(unique_name, 1), 10, message="takeover")
    b_next = standby.latestOffset(b_end, ReadAllAvailable())
    assert _ranges(standby.partitions(b_end, b_next)) == {0: (1, 2), 1: (1, 2)}

    # Another member takes lane 0 over behind the standby's back (as after a lease the standby failed to renew)
    # and fences the offsets entry: the standby's confirm of its batch is refused, the usurper's position stays.
    key = lane_key(unique_name, "g", 0)
    lease_map = LeaseMap(grid.map(LEASES_MAP))
    text, lease = lease_map.read(key)
    assert lease is not None and lease.holder == "query-b"
    usurped = lease_map.acquire(key, "usurper", 60_000, text, lease)
    assert usurped is not None
    fenced = ConfirmedOffset(usurped.lease.epoch, first_offset_of(1), "usurper", wall_ms()).encode()
    stored = grid.map(OFFSETS_MAP).get(key)
    assert stored is not None and grid.map(OFFSETS_MAP).replace_if_same(key, stored, fenced)
    assert 0 in state.members[unique_name].assignment()  # the standby's local view is stale until its next renewal
    standby.commit(b_next)
    assert _stored_offsets(grid, unique_name, 2) == {0: first_offset_of(1), 1: first_offset_of(2)}
    assert Lease.decode(grid.map(LEASES_MAP).get(key) or "", "test").holder == "usurper"


def test_planning_with_large_items_reads_one_item_per_moved_lane_for_its_mark(
    grid: Grid,
    grid_settings: GridSettings,
    unique_name: str,
    counting: CountingGrid,
    readers: list[MeteorStreamReader],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The planning cost of the item marks with 1 MiB items (``DriverState.marks_for``: one single-item read per
    lane whose end moved, the item before the new end). Spark logs a batch's end offset before its tasks run, so
    the mark of the item before the end can only come from a read on the driver (figures printed)."""
    lanes, batches = 8, 5
    info = make_stream(grid, unique_name, lanes=lanes, capacity=64)
    payload = os.urandom(1 << 20)  # incompressible: the stored item is about 1 MiB
    reader = MeteorStreamReader(
        SourceOptions.parse({**grid_options(grid_settings), "stream": unique_name, "startingOffsets": "earliest"}),
        SOURCE_SCHEMA,
    )
    readers.append(reader)
    marks_ms: list[float] = []
    marks_for = driver_module.DriverState.marks_for

    def timed_marks_for(self: Any, *args: Any) -> Any:
        began = time.perf_counter()
        try:
            return marks_for(self, *args)
        finally:
            marks_ms.append((time.perf_counter() - began) * 1000)

    monkeypatch.setattr(driver_module.DriverState, "marks_for", timed_marks_for)
    start = reader.initialOffset()
    planning_ms, ring_reads = [], []
    for _ in range(batches):
        for lane in range(lanes):
            put_items(grid, info, lane, [[Record(payload)]])
        counting.calls.clear()
        began = time.perf_counter()
        end = reader.latestOffset(start, ReadAllAvailable())
        reader.partitions(start, end)
        planning_ms.append((time.perf_counter() - began) * 1000)
        ring_reads.append(counting.calls["ring.read_many_async"] + counting.calls["ring.read_many"])
        start = end
    per_batch_marks = marks_ms[1:]  # the first call is initialOffset's
    print(
        f"planning with 1 MiB items, {lanes} lanes, one new item per lane per batch: "
        f"median {statistics.median(planning_ms):.1f} ms per batch (latestOffset + partitions), of which the "
        f"item-mark reads median {statistics.median(per_batch_marks):.1f} ms; ring item reads per batch "
        f"{ring_reads}"
    )
    assert ring_reads == [lanes] * batches
