"""A grouped Spark source that takes a lane over mid-run checks the item mark stored with the group's offset
(``meteor_spark.spark.lane_takeover``): a lane truncated and refilled while a standby followed the group is caught
when the standby takes it over (``LaneTruncatedError``), or with ``failOnDataLoss=false`` read again from its
oldest item; never a silent skip of the new records below the group's offset.

The standby plans a batch after the refill, so the marks in its own offsets are read from the refilled lane and the
tasks' check of the item before their range (``LaneRange.expect``) matches them: only the mark the holder stored
with the group's offset can tell. Driver-level (no SparkSession): holder and standby are two ``MeteorStreamReader``s
of one group on which the test makes Spark's calls; the tasks' ranges are read with ``read_lane_ranges``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable
from spark_helpers import grid_options, make_stream, put_items, values_items

from meteor_spark.errors import LaneTruncatedError
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.streams import StreamInfo
from meteor_spark.spark import clients
from meteor_spark.spark import reader as reader_module
from meteor_spark.spark.datasource import SOURCE_SCHEMA
from meteor_spark.spark.executor import LaneRanges, read_lane_ranges
from meteor_spark.spark.options import SourceOptions
from meteor_spark.spark.reader import MeteorStreamReader
from meteor_spark.testing import wait_until
from tests.ring_logs import cut_records

OLD, LOST, NEW = 30, 10, 30


@pytest.fixture(autouse=True)
def _no_stop_hooks(monkeypatch: pytest.MonkeyPatch) -> None:
    # The SIGTERM/atexit hooks belong to Spark's source runner process, not to the test process.
    monkeypatch.setattr(reader_module, "install_stop_hooks", lambda reader: None)


@pytest.fixture
def readers() -> Iterator[list[MeteorStreamReader]]:
    made: list[MeteorStreamReader] = []
    yield made
    for reader in made:
        reader.stop()


def _reader(settings: GridSettings, stream: str, member: str, fail: bool) -> MeteorStreamReader:
    options = SourceOptions.parse(
        {
            **grid_options(settings),
            "stream": stream,
            "group": "g",
            "groupMemberId": member,
            "groupLeaseMs": "10000",  # the holder keeps its lease across the member restart
            "startingOffsets": "earliest",
            "failOnDataLoss": str(fail).lower(),
        }
    )
    return MeteorStreamReader(options, SOURCE_SCHEMA)


def _read(partitions: Sequence[Any]) -> list[bytes]:
    values = []
    for task in partitions:
        assert isinstance(task, LaneRanges)
        values += [v.as_py() for batch in read_lane_ranges(task.ranges) for v in batch.column("value")]
    return values


def _one_per_record(grid: Grid, info: StreamInfo, prefix: str, count: int) -> list[bytes]:
    """``count`` items of one record each, one ``add_all`` (one ring-log record) per item."""
    return [r.value for item in values_items(prefix, items=count, per_item=1) for r in put_items(grid, info, 0, [item])]


def _takeover(
    settings: GridSettings,
    stream: str,
    readers: list[MeteorStreamReader],
    fail: bool,
    truncate_and_refill: Callable[[], list[bytes]],
) -> str:
    """Holder reads and confirms the lane's ``OLD`` records; the lane is truncated and refilled; the standby follows
    the group's offset on the refilled lane, then takes the lane over. Returns the figures."""
    holder, standby = _reader(settings, stream, "query-a", fail), _reader(settings, stream, "query-b", fail)
    readers.extend([holder, standby])
    a0, b0 = holder.initialOffset(), standby.initialOffset()
    a1 = holder.latestOffset(a0, ReadAllAvailable())
    old = _read(holder.partitions(a0, a1))
    holder.commit(a1)
    assert len(old) == OLD

    new = truncate_and_refill()
    b1 = standby.latestOffset(b0, ReadAllAvailable())
    assert b1[stream] == {"0": OLD} and _read(standby.partitions(b0, b1)) == []
    standby.commit(b1)

    holder.stop()
    state = standby._driver()
    wait_until(lambda: state.held(stream, 0), 20, message="the standby takes the lane over")
    started = time.monotonic()
    if fail:
        with pytest.raises(LaneTruncatedError, match=r"lane 0 was truncated and refilled under group 'g''s offset"):
            standby.latestOffset(b1, ReadAllAvailable())
        took_ms = (time.monotonic() - started) * 1000
        return f"LaneTruncatedError at the takeover after {took_ms:.1f} ms, 0 of {len(new)} new records delivered"
    b2 = standby.latestOffset(b1, ReadAllAvailable())
    rows = _read(standby.partitions(b1, b2))
    took_ms = (time.monotonic() - started) * 1000
    standby.commit(b2)
    skipped = len(set(new) - set(rows))
    assert skipped == 0, f"{skipped} of {len(new)} new records silently skipped at the takeover"
    again = len(rows) - len(new)
    assert rows[-len(new) :] == new and rows[:again] == old[:again]
    return (
        f"failOnDataLoss=false: {len(new)} of {len(new)} new records delivered, 0 skipped, {again} surviving old "
        f"records delivered again (the lane from its oldest item), takeover batch planned and read in {took_ms:.1f} ms"
    )


@pytest.mark.parametrize("fail", [True, False], ids=["error", "reread"])
def test_a_standby_taking_over_a_lane_refilled_under_the_group_offset(
    grid: Grid, grid_settings: GridSettings, unique_name: str, readers: list[MeteorStreamReader], fail: bool
) -> None:
    """The lane's ring is destroyed and refilled past the group's offset (a grid restarted without a store)."""
    info = make_stream(grid, unique_name)
    _one_per_record(grid, info, "old", OLD)

    def destroy_and_refill() -> list[bytes]:
        grid.ring(info.ring_names[0]).destroy()
        return _one_per_record(grid, info, "new", OLD + 10)

    figures = _takeover(grid_settings, unique_name, readers, fail, destroy_and_refill)
    print(f"standby takeover over a ring destroyed and refilled with {OLD + 10} records: {figures}")


@pytest.mark.embedded_only
@pytest.mark.fault
@pytest.mark.parametrize("fail", [True, False], ids=["error", "reread"])
def test_a_standby_taking_over_after_a_member_restart_that_cut_the_lane(
    tmp_path: Path, readers: list[MeteorStreamReader], fail: bool
) -> None:
    """The issue's scenario: the holder confirms past ``OLD``; the persisted member is SIGKILLed, its ring log
    loses the last ``LOST`` records, and it restarts; ``NEW`` records take sequences 20..49."""
    from meteor_spark.server import EmbeddedGrid

    member = EmbeddedGrid(port=0, process=True, data_dir=tmp_path / "data", fsync="never").start()
    try:
        settings = GridSettings(members=(member.address,), cluster_name=member.cluster_name, connect_timeout_s=60)
        with Grid(settings) as grid:
            info = make_stream(grid, "orders")
            _one_per_record(grid, info, "old", OLD)

            def kill_cut_and_refill() -> list[bytes]:
                member.kill()
                cut_records(next((tmp_path / "data" / "rings").glob("meteor.stream*orders*.log")), LOST)
                member.restart()
                new = _one_per_record(grid, info, "new", NEW)  # waits for the client to reconnect
                assert grid.ring(info.ring_names[0]).tail() == OLD - LOST + NEW - 1
                return new

            figures = _takeover(settings, "orders", readers, fail, kill_cut_and_refill)
    finally:
        for reader in readers:
            reader.stop()
            clients.forget(reader.options.grid)  # the source runner's cached client of this member
        member.stop()
    print(f"standby takeover after a restart that cut {LOST} of {OLD} confirmed records, {NEW} new: {figures}")
