"""The batch reader of ``format("meteor")`` (``spark.read``): the ring items between ``startingOffsets`` and
``endingOffsets`` (or their by-time forms), planned in one ``partitions`` call and read by ``executor``.

Positions are checked before anything is read (``positions``): a lane the stream does not have is a
``ConfigError``, a position past a lane's end an ``OffsetOutOfRangeError``, an end before its start a
``ConfigError``. Items overwritten below the start are a ``DataLossError``, or with ``failOnDataLoss=false`` are
skipped and logged. ``read_committed`` ends each lane at its last stable offset.

With ``spark.sql.python.filterPushdown.enabled``, ``MeteorPushdownReader`` takes the ``where`` predicates Spark
pushes (``pushdown``) and plans only the lanes and ring items they can match; the planned reads are logged at INFO
with the filters used and counted in ``planned_items``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from meteor_spark.errors import ConfigError, DataLossError
from meteor_spark.format.offsets import sequence_of
from meteor_spark.grid.item_gate import ItemGate, stable_end
from meteor_spark.grid.reading import oldest_sequence
from meteor_spark.grid.streams import StreamInfo, lane_bounds, open_stream
from meteor_spark.grid.timestamps import offset_for_timestamp
from meteor_spark.spark.clients import grid_for
from meteor_spark.spark.executor import LaneRange, LaneRanges, ReadsLaneRanges
from meteor_spark.spark.options import SourceOptions
from meteor_spark.spark.planning import Piece, plan_for
from meteor_spark.spark.positions import (
    Once,
    check_dead_letter_stream,
    check_lanes,
    check_time_lanes,
    end_by_time,
    resolve_position,
    start_by_time,
    stream_names,
)
from meteor_spark.spark.pushdown import Selection, select
from meteor_spark.spark.typed_columns import value_version_of

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Iterable

    from pyspark.sql.datasource import Filter

    from meteor_spark.grid.client import Grid

logger = logging.getLogger(__name__)


class MeteorBatchReader(ReadsLaneRanges, DataSourceReader):
    """``spark.read.format("meteor")``: the ring items between ``startingOffsets`` and ``endingOffsets``.

    Attributes:
        selection: what pushed filters let the read skip (``MeteorPushdownReader``); empty here.
        planned_items: ring items the last ``partitions()`` planned (what the tasks read), or None before.
    """

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        self.selection = Selection()
        self.planned_items: int | None = None

    def partitions(self) -> Sequence[InputPartition]:
        grid = grid_for(self.options.grid)
        infos = {name: open_stream(grid, name, create=False) for name in stream_names(grid, self.options)}
        check_dead_letter_stream(grid, self.options)
        check_lanes(self.options.starting, "startingOffsets", infos)
        check_lanes(self.options.ending, "endingOffsets", infos)
        check_time_lanes(self.options.starting_time, infos)
        check_time_lanes(self.options.ending_time, infos)
        lanes = _LaneRanges(self.options, grid, self.selection)
        skipped = 0
        for info in infos.values():
            wanted = set(self.selection.lanes_of(info.config.lanes, key_lanes=self.options.key_lanes))
            skipped += info.config.lanes - len(wanted)
            for lane, (head, next_seq) in sorted(lane_bounds(grid, info).items()):
                if lane in wanted:
                    lanes.add(info, lane, head, next_seq)
        tasks = lanes.tasks(infos, value_version_of(self.schema))
        self.planned_items = sum(task.items for task in tasks)
        if not self.selection.empty:
            logger.info(
                "filter pushdown: %s; planned %d ring items in %d lane range(s) (%d ring items before the filters "
                "narrowed them), %d lane(s) skipped, %d Spark task(s)",
                self.selection.describe(),
                self.planned_items,
                len(lanes.ranges),
                lanes.unfiltered_items,
                skipped,
                len(tasks),
            )
        return tasks


class MeteorPushdownReader(MeteorBatchReader):
    """The batch reader with ``pushFilters``: offered by ``MeteorDataSource.reader`` only in Spark's filter-pushdown
    planner worker (``compat.planning_filter_pushdown``), since a reader class overriding ``pushFilters`` fails
    every read with ``DATA_SOURCE_PUSHDOWN_DISABLED`` while ``spark.sql.python.filterPushdown.enabled`` is off."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        """Keep what the filters select (``pushdown.select``); return those Spark must still apply: every
        filter but the exact ones (lane and key equality), which Spark then leaves out of its own Filter."""
        self.selection, remaining = select(filters)
        return remaining


class _LaneRanges:
    """The lane ranges of one batch read, with the record offsets where a range starts or stops inside an item."""

    def __init__(self, options: SourceOptions, grid: Grid, selection: Selection) -> None:
        self.options = options
        self.grid = grid
        self.selection = selection
        #: ring items of the planned lanes before the pushed filters narrowed them (for the log).
        self.unfiltered_items = 0
        self.gate = ItemGate(grid, options.isolation)
        self.ranges: list[Piece] = []
        #: (stream, lane) -> record offset inside the first / last item read where the range starts / stops.
        self.first_offsets: dict[tuple[str, int], int] = {}
        self.stop_offsets: dict[tuple[str, int], int] = {}

    def add(self, info: StreamInfo, lane: int, head: int, next_seq: int) -> None:
        """Resolve one lane's start and end, check them and the items lost below the start, and keep its range."""
        grid, options, name = self.grid, self.options, info.name
        oldest = Once(lambda: oldest_sequence(grid, info, lane))
        if options.starting_time is not None:
            lo, first = start_by_time(grid, info, lane, options.starting_time, options.timestamp_strategy, next_seq)
            if first is not None:
                self.first_offsets[(name, lane)] = first
        else:
            lo = resolve_position(
                options.starting, "startingOffsets", name, lane, head, next_seq, group=None, oldest=oldest
            )
        if options.ending_time is not None:
            hi, stop = end_by_time(grid, info, lane, options.ending_time, next_seq)
            if stop is not None:
                self.stop_offsets[(name, lane)] = stop
        else:
            hi = resolve_position(
                options.ending, "endingOffsets", name, lane, head, next_seq, group=None, oldest=oldest
            )
        if hi < lo:
            start_name = options.starting_time.option if options.starting_time is not None else "startingOffsets"
            end_name = options.ending_time.option if options.ending_time is not None else "endingOffsets"
            raise ConfigError(
                f"stream {name!r} lane {lane}: {end_name} (ring sequence {hi}) is before {start_name} "
                f"(ring sequence {lo}); a batch read takes ring sequences [start, end)"
            )
        self.unfiltered_items += hi - lo
        lo, hi = self._narrowed(info, lane, lo, hi)
        if lo < head and lo < oldest():
            lo = self._lost_below(name, lane, lo, hi, oldest())
        # read_committed: not past the first item of a transaction still open (the last stable offset).
        hi = stable_end(self.gate, grid, info, lane, lo, hi)
        self.ranges.append((name, lane, lo, hi))

    def _narrowed(self, info: StreamInfo, lane: int, lo: int, hi: int) -> tuple[int, int]:
        """``[lo, hi)`` cut by the pushed filters: the ring items holding the offsets asked for, from the item of
        the lane's first record at or after the timestamp bound (none: the lane is empty)."""
        lo, hi = self.selection.offset_range(lo, hi)
        since = self.selection.since_ms
        if since is not None and since > 0 and lo < hi:
            offset = offset_for_timestamp(self.grid, info, lane, since)
            if offset is None:
                return hi, hi
            lo = min(max(lo, sequence_of(offset)), hi)
        return lo, hi

    def _lost_below(self, name: str, lane: int, lo: int, hi: int, oldest: int) -> int:
        """Items below the oldest servable one: a ``DataLossError``, or skipped and logged
        (``failOnDataLoss=false``); returns where the lane's range starts then."""
        if self.options.fail_on_data_loss:
            raise DataLossError(name, lane, requested=lo, oldest_available=oldest, unit="sequence")
        logger.warning(
            "data loss on stream %r lane %d: ring items %d..%d were overwritten; skipping %d items "
            "(failOnDataLoss=false)",
            name,
            lane,
            lo,
            oldest - 1,
            oldest - lo,
        )
        return min(oldest, hi)

    def tasks(self, infos: dict[str, StreamInfo], value_version: int | None) -> list[LaneRanges]:
        """The Spark tasks reading the ranges (``planning.plan_for``); ``value_version``: ``LaneRange``'s."""
        options = self.options
        keys = None if self.selection.keys is None else tuple(sorted(self.selection.keys))
        return [
            LaneRanges(
                tuple(
                    LaneRange(
                        stream,
                        lane,
                        lo,
                        hi,
                        options.grid,
                        infos[stream],
                        options.include_headers,
                        options.fail_on_data_loss,
                        corrupt=options.corrupt,
                        headers_as_map=options.headers_as_map,
                        first_offset=_inside(self.first_offsets.get((stream, lane)), lo),
                        stop_offset=_inside(self.stop_offsets.get((stream, lane)), hi - 1),
                        isolation=options.isolation,
                        topics=options.topics,
                        keys=keys,
                        value_version=value_version,
                    )
                    for stream, lane, lo, hi in task
                )
            )
            for task in plan_for(options, self.ranges)
        ]


def _inside(offset: int | None, sequence: int) -> int | None:
    """``offset`` when it lies inside the ring item at ``sequence`` (the piece of a split range holding it)."""
    return offset if offset is not None and sequence_of(offset) == sequence else None
