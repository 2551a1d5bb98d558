"""What a streaming source runner checks of the checkpoint it resumes from, before planning on it: each lane's item
mark (a lane truncated and refilled under the position) and the lanes' bounds (a stream deleted and re-created, or
a grid restarted without persistence, under the checkpoint). Reading on from a stale position would skip records."""

from __future__ import annotations

from meteor_spark.errors import ConfigError, OffsetOutOfRangeError
from meteor_spark.spark.driver import DriverState
from meteor_spark.spark.planning import by_stream
from meteor_spark.spark.source_offset import SparkOffset

__all__ = ["check_checkpoint", "restarted"]


def restarted(state: DriverState, begin: SparkOffset) -> SparkOffset:
    """``begin`` with its item marks checked (``DriverState.verify``, once per lane and source runner): lanes found
    truncated and refilled under it start again at their oldest item (``failOnDataLoss=false``; else the check
    raises ``LaneTruncatedError``)."""
    moved = state.verify(begin, "the query's checkpoint")
    if not moved:
        return begin
    positions = begin.as_dict()
    positions.update(moved)
    marks = {key: mark for key, mark in begin.marks_dict().items() if key not in moved}
    return SparkOffset.of(by_stream(positions), begin.skipped_dict(), begin.batch_items, marks)


def check_checkpoint(
    state: DriverState, current: dict[tuple[str, int], int], bounds: dict[tuple[str, int], tuple[int, int]]
) -> None:
    """A checkpoint the lanes contradict is stale (the stream was deleted and re-created, or the grid restarted
    without persistence): refused, since reading on from it would skip records."""
    for stream, lane in current:
        if stream in state.infos and (stream, lane) not in bounds:
            raise ConfigError(
                f"the query's checkpoint has a position for lane {lane} of stream {stream!r}, which has lanes "
                f"0..{state.infos[stream].config.lanes - 1}: the checkpoint is stale (the stream was deleted and "
                f"re-created with fewer lanes). Start the query with a fresh checkpointLocation"
            )
    for (stream, lane), position in current.items():
        if (stream, lane) in bounds and position > bounds[(stream, lane)][1]:
            raise OffsetOutOfRangeError(
                stream,
                lane,
                position,
                state.oldest(stream, lane),
                bounds[(stream, lane)][1],
                unit="sequence",
                hint="The query's checkpoint is stale: it was written before the stream was deleted and "
                "re-created (or the grid restarted without persistence), and reading on from it would "
                "skip every record up to that position. Start the query with a fresh checkpointLocation.",
            )
