"""Which streams a read takes and where each of its lanes starts or ends: symbolic positions (earliest, latest,
group), per-lane ring sequences, and positions by time; with the checks of the lanes and streams they name.

Shared by the streaming reader's source runner (``driver``, ``reader``) and the batch reader; every function reads
the grid only for what it resolves (no state of its own).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from meteor_spark.errors import ConfigError, GroupError, OffsetOutOfRangeError, StreamNotFoundError
from meteor_spark.format.offsets import InitialOffsetScheme, index_of, resolve_initial, sequence_of
from meteor_spark.grid.streams import STREAMS_MAP, StreamInfo, open_stream
from meteor_spark.grid.timestamps import offset_for_timestamp
from meteor_spark.spark.options import (
    EARLIEST_SENTINEL,
    LATEST_SENTINEL,
    OffsetSpec,
    Position,
    SourceOptions,
    TimePosition,
    TimestampStrategy,
)

if TYPE_CHECKING:  # pragma: no cover
    from meteor_spark.grid.client import Grid


class Once:
    """A value computed on first use only (the oldest servable sequence costs a grid read)."""

    def __init__(self, compute: Any) -> None:
        self._compute = compute
        self._value: int | None = None

    def __call__(self) -> int:
        if self._value is None:
            self._value = int(self._compute())
        return self._value


def stream_names(grid: Grid, options: SourceOptions) -> list[str]:
    """The streams a query reads now: option ``stream`` as given, or every stream matching ``streamPattern``
    (sorted; possibly none). A pattern costs one read of the metadata map's names (not its values: the caller opens
    the streams it does not read yet)."""
    if options.stream_pattern is None:
        return list(options.streams)
    names = grid.map(STREAMS_MAP).keys()  # a GridMap method: one call returning every key
    return sorted(name for name in names if options.matches(name))


def check_dead_letter_stream(grid: Grid, options: SourceOptions) -> None:
    """The dead-letter stream must exist when the query starts, not when the first corrupt item turns up."""
    name = options.corrupt.dead_letter_stream
    if name is None:
        return
    try:
        open_stream(grid, name, create=False)
    except StreamNotFoundError as exc:
        raise StreamNotFoundError(f"option 'deadLetterStream': {exc}") from None


def check_lanes(position: Position, option: str, infos: dict[str, StreamInfo]) -> None:
    """Per-lane positions may name only lanes the stream has."""
    for stream, lanes in position.lanes.items():
        if stream not in infos:
            raise StreamNotFoundError(
                f"{option} names stream {stream!r}, which does not exist (streamPattern matches no stream of that "
                f"name); create it first or remove it from {option}"
            )
        count = infos[stream].config.lanes
        unknown = sorted(lane for lane in lanes if lane >= count)
        if unknown:
            raise ConfigError(
                f"{option} names lane(s) {', '.join(map(str, unknown))} of stream {stream!r}, which has lanes "
                f"0..{count - 1}; give positions for those lanes only"
            )


def resolve_position(
    position: Position,
    option: str,
    stream: str,
    lane: int,
    head: int,
    next_seq: int,
    *,
    group: str | None,
    oldest: Callable[[], int],
) -> int:
    """The ring sequence a symbolic or per-lane position means for one lane. ``oldest()`` gives the oldest sequence
    the grid can serve (called only when needed: it costs a grid read).

    Raises:
        OffsetOutOfRangeError: a per-lane position past the lane's end.
    """
    if position.spec is OffsetSpec.EARLIEST:
        return _initial(InitialOffsetScheme.EARLIEST, stream, lane, oldest, next_seq)
    if position.spec is OffsetSpec.LATEST:
        return _initial(InitialOffsetScheme.LATEST, stream, lane, oldest, next_seq)
    if position.spec is OffsetSpec.GROUP:
        raise GroupError(
            f"startingOffsets=group: group {group!r} has no confirmed offset for stream {stream!r} lane {lane}; "
            f"start it with startingOffsets=earliest or latest (lanes the group has confirmed still start there)"
        )
    lanes = position.lanes.get(stream)
    if lanes is None or lane not in lanes:
        given = ", ".join(str(k) for k in sorted(lanes or {}))
        raise ConfigError(
            f"{option} has no position for stream {stream!r} lane {lane} (given lanes: {given or 'none'}); give "
            f'every lane, e.g. {{"{stream}": {{"{lane}": {EARLIEST_SENTINEL}}}}} for its oldest item'
        )
    sequence = lanes[lane]
    if sequence == EARLIEST_SENTINEL:
        return _initial(InitialOffsetScheme.EARLIEST, stream, lane, oldest, next_seq)
    if sequence == LATEST_SENTINEL:
        return _initial(InitialOffsetScheme.LATEST, stream, lane, oldest, next_seq)
    if sequence > next_seq:
        raise OffsetOutOfRangeError(
            stream,
            lane,
            sequence,
            oldest(),
            next_seq,
            unit="sequence",
            hint=f"{option} asks for a ring sequence nothing was written at yet; give one inside the range, or -2 "
            f"(earliest) / -1 (latest).",
        )
    return sequence


def _initial(scheme: InitialOffsetScheme, stream: str, lane: int, oldest: Callable[[], int], next_seq: int) -> int:
    """The ring sequence ``earliest`` / ``latest`` means for one lane, by the one resolver the core uses too."""
    where = f"stream {stream!r} lane {lane}"
    offset = resolve_initial(scheme, False, None, oldest, next_seq, where=where)
    return sequence_of(offset)


def check_time_lanes(position: TimePosition | None, infos: dict[str, StreamInfo]) -> None:
    """Per-lane times may name only lanes the stream has."""
    if position is not None:
        check_lanes(Position(None, position.lanes), position.option, infos)


def start_by_time(
    grid: Grid, info: StreamInfo, lane: int, position: TimePosition, strategy: TimestampStrategy, next_seq: int
) -> tuple[int, int | None]:
    """Where a start by time puts one lane: (ring sequence, record offset inside that item to start at, or None to
    read the whole item). The record is the first at or after the time (``timestamps.offset_for_timestamp``).

    Raises:
        ConfigError: the lane has no record at or after the time and the strategy is ``error`` (Kafka's default).
    """
    ms = position.ms_for(info.name, lane)
    offset = offset_for_timestamp(grid, info, lane, ms)
    if offset is None:
        if strategy is TimestampStrategy.ERROR:
            raise ConfigError(
                f"{position.option}: stream {info.name!r} lane {lane} has no record with a timestamp at or after "
                f"{ms} (ms since the epoch); give an earlier time, or set startingOffsetsByTimestampStrategy=latest "
                f"to start such lanes at their end"
            )
        return next_seq, None
    sequence = sequence_of(offset)
    return sequence, offset if index_of(offset) else None


def end_by_time(
    grid: Grid, info: StreamInfo, lane: int, position: TimePosition, next_seq: int
) -> tuple[int, int | None]:
    """Where an end by time stops one lane (exclusive): (ring sequence to stop before, and the record offset to
    stop before inside the last item read, or None to read that item whole). The end is the first record at or
    after the time; with none, the lane's end, as Kafka's ``endingTimestamp`` does."""
    offset = offset_for_timestamp(grid, info, lane, position.ms_for(info.name, lane))
    if offset is None:
        return next_seq, None
    sequence = sequence_of(offset)
    if index_of(offset):
        return sequence + 1, offset
    return sequence, None
