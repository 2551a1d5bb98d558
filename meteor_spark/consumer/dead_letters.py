"""Reading a dead-letter stream: each record made into a ``DeadLetter`` (where it came from, why, how often it was
delivered), and the summary ``meteor dlq list`` shows.

Dead letters are written by three paths, all with the headers of ``meteor_spark.format.corrupt``: a reader's
``on_corrupt=dead_letter`` (an undecodable ring item, ``meteor.source.kind=item``, or a record its deserializers
refused), a shared group (``max_deliveries`` reached, a ``reject``, ``dead_letter_after``: with
``meteor.source.group`` and ``meteor.delivery.count``) and an exclusive group's ``dead_letter_after``. A record of
the stream without those headers (published there by hand) is still listed, with its source unknown.

A scan reads what the grid holds of each lane (the ring is bounded, so is the scan), skipping items overwritten
while it reads (counted) and items it cannot decode (counted: a dead-letter stream is written by this library).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from meteor_spark.errors import ConfigError, FormatError, OffsetOutOfRangeError
from meteor_spark.format.corrupt import (
    DEAD_LETTER_HEADERS,
    HEADER_DELIVERY_COUNT,
    HEADER_ERROR,
    HEADER_SOURCE_GROUP,
    HEADER_SOURCE_KIND,
    HEADER_SOURCE_LANE,
    HEADER_SOURCE_OFFSET,
    HEADER_SOURCE_STREAM,
    HEADER_SOURCE_TOPIC,
    KIND_ITEM,
)
from meteor_spark.format.offsets import first_offset_of, sequence_of
from meteor_spark.format.records import Record, decode_batch
from meteor_spark.format.routing import ROUTING_HEADERS
from meteor_spark.grid.client import Grid
from meteor_spark.grid.reading import read_range
from meteor_spark.grid.streams import StreamInfo, lane_bounds

#: Header a redriven record carries: ``<dead-letter stream>:<lane>:<offset>`` of the dead letter it came from.
HEADER_REDRIVEN_FROM = "meteor.redriven.from"


@dataclass(frozen=True)
class DeadLetter:
    """One record of a dead-letter stream, with its dead-letter headers parsed.

    Attributes:
        record: the record as stored in the dead-letter stream (its ``lane`` and ``offset`` are the dead letter's).
        source_stream, source_lane, source_offset: where it was read from (None when the headers lack them).
        error: why it was dead-lettered (``meteor.error``); ``""`` when not given.
        group: the group that dead-lettered it (None for a reader's ``on_corrupt``).
        deliveries: its delivery count in a shared group (None when not counted).
        topic: its topic in the source stream (``""``: none, or not recorded).
        is_item: a whole undecodable ring item, not a record: it cannot be redriven as a record.
        user_headers: the headers it had in the source stream (dead-letter and routing headers left out).
    """

    record: Record
    source_stream: str | None
    source_lane: int | None
    source_offset: int | None
    error: str
    group: str | None
    deliveries: int | None
    topic: str
    is_item: bool
    user_headers: tuple[tuple[str, bytes], ...]

    @property
    def lane(self) -> int:
        return self.record.lane

    @property
    def offset(self) -> int:
        return self.record.offset

    @property
    def position(self) -> str:
        """``<dead-letter stream>:<lane>:<offset>``: what names this dead letter in a redriven record."""
        return f"{self.record.stream}:{self.record.lane}:{self.record.offset}"


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        return None


def parse_dead_letter(record: Record) -> DeadLetter:
    """A stored dead-letter record's parts (headers it lacks stay None; nothing here raises on odd headers)."""
    seen: dict[str, str] = {}
    user: list[tuple[str, bytes]] = []
    for name, value in record.headers:
        if name in DEAD_LETTER_HEADERS:
            seen[name] = value.decode("utf-8", "replace")
        elif name not in ROUTING_HEADERS and name != HEADER_REDRIVEN_FROM:
            user.append((name, value))
    return DeadLetter(
        record=record,
        source_stream=seen.get(HEADER_SOURCE_STREAM),
        source_lane=_int(seen.get(HEADER_SOURCE_LANE)),
        source_offset=_int(seen.get(HEADER_SOURCE_OFFSET)),
        error=seen.get(HEADER_ERROR, ""),
        group=seen.get(HEADER_SOURCE_GROUP),
        deliveries=_int(seen.get(HEADER_DELIVERY_COUNT)),
        topic=seen.get(HEADER_SOURCE_TOPIC, ""),
        is_item=seen.get(HEADER_SOURCE_KIND) == KIND_ITEM,
        user_headers=tuple(user),
    )


@dataclass
class ScanReport:
    """What a scan looked at: per lane ``[first, end)`` offsets read, and what it passed over."""

    lanes: dict[int, tuple[int, int]] = field(default_factory=dict)
    items: int = 0
    overwritten_items: int = 0
    undecodable_items: int = 0


def scan_dead_letters(
    grid: Grid,
    info: StreamInfo,
    report: ScanReport,
    *,
    lanes: list[int] | None = None,
    from_offset: int | None = None,
    to_offset: int | None = None,
    max_items: int | None = None,
) -> Iterator[DeadLetter]:
    """The dead letters the grid holds in ``info``'s stream, lane by lane, oldest first; with ``from_offset`` /
    ``to_offset`` only offsets in ``[from_offset, to_offset)``; with ``max_items`` at most that many ring items per
    lane, the newest (a bounded look). ``report`` is filled in as it goes."""
    bounds = lane_bounds(grid, info)
    for lane in range(info.lanes) if lanes is None else lanes:
        head, end = bounds[lane]
        start = head if from_offset is None else max(head, sequence_of(from_offset))
        stop = end if to_offset is None else min(end, sequence_of(to_offset - 1) + 1) if to_offset > 0 else head
        if max_items is not None:
            start = max(start, stop - max_items)
        if stop <= start:
            report.lanes[lane] = (first_offset_of(start), first_offset_of(start))
            continue
        reader = read_range(grid, info, lane, start, stop, skip_data_loss=True)
        try:
            for items, sequences in reader:
                for raw, seq in zip(items, sequences, strict=True):
                    report.items += 1
                    try:
                        batch = decode_batch(raw, stream=info.name, lane=lane, sequence=seq)
                    except FormatError:
                        report.undecodable_items += 1
                        continue
                    for record in batch:
                        if from_offset is not None and record.offset < from_offset:
                            continue
                        if to_offset is not None and record.offset >= to_offset:
                            continue
                        yield parse_dead_letter(record)
        except OffsetOutOfRangeError:
            pass  # the lane was truncated under the scan: what it held was read
        report.overwritten_items += reader.skipped_items
        report.lanes[lane] = (first_offset_of(start), first_offset_of(stop))


def find_dead_letter(grid: Grid, info: StreamInfo, offset: int, lane: int | None) -> DeadLetter:
    """The dead letter at ``offset`` (of ``lane``, or the only lane holding that offset when the stream has one
    lane or ``lane`` is None and exactly one lane holds a record there).

    Raises:
        ConfigError: no lane holds a record at ``offset`` (names the lanes' offset ranges), or several do.
    """
    lanes = list(range(info.lanes)) if lane is None else [lane]
    found: list[DeadLetter] = []
    for candidate in lanes:
        report = ScanReport()
        found.extend(
            scan_dead_letters(
                grid, info, report, lanes=[candidate], from_offset=offset, to_offset=offset + 1, max_items=None
            )
        )
    if not found:
        bounds = lane_bounds(grid, info)
        ranges = ", ".join(
            f"lane {n}: [{first_offset_of(bounds[n][0])}, {first_offset_of(bounds[n][1])})" for n in lanes
        )
        raise ConfigError(
            f"dead-letter stream {info.name!r} holds no record at offset {offset} (items held, as offsets: {ranges}); "
            f"`meteor dlq list {info.name}` shows the offsets it holds"
        )
    if len(found) > 1:
        raise ConfigError(
            f"offset {offset} exists in lanes {', '.join(str(d.lane) for d in found)} of {info.name!r}: give --lane"
        )
    return found[0]


@dataclass
class LetterGroup:
    """Dead letters sharing a source (stream, lane, group) or an error: how many and where."""

    count: int = 0
    first_offset: int | None = None
    last_offset: int | None = None
    first_source: int | None = None
    last_source: int | None = None
    redriven: int = 0

    def add(self, letter: DeadLetter, redriven: bool) -> None:
        self.count += 1
        self.redriven += redriven
        self.first_offset = _low(self.first_offset, letter.offset)
        self.last_offset = _high(self.last_offset, letter.offset)
        if letter.source_offset is not None:
            self.first_source = _low(self.first_source, letter.source_offset)
            self.last_source = _high(self.last_source, letter.source_offset)


def _low(a: int | None, b: int) -> int:
    return b if a is None else min(a, b)


def _high(a: int | None, b: int) -> int:
    return b if a is None else max(a, b)
