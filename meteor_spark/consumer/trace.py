"""Tracing a record: where it is, which groups have confirmed past it, how often a shared group delivered it, and
whether it was dead-lettered (what ``meteor trace`` shows).

A ``Tracer`` reads the stream's group state once (exclusive groups' confirmed offsets in ``meteor.group.offsets``,
shared groups' lane entries in ``meteor.share.lanes``) and looks through the groups' dead-letter streams once,
bounded (the newest ``max_dlq_items`` ring items of each lane; the report says which offsets were looked at), then
traces any number of records of the stream against that picture. Nothing here writes to the grid.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from meteor_spark.consumer.dead_letters import ScanReport, scan_dead_letters
from meteor_spark.consumer.redrive import read_progress
from meteor_spark.errors import ConfigError, FormatError, StreamNotFoundError
from meteor_spark.format.offsets import index_of, make_offset, sequence_of
from meteor_spark.format.partitioning import lane_for_key
from meteor_spark.format.records import Record, decode_batch
from meteor_spark.grid.client import Grid
from meteor_spark.grid.reading import check_lane, read_range
from meteor_spark.grid.streams import StreamInfo, lane_bounds, open_stream
from meteor_spark.groups.admin import group_state, list_groups, list_shared_groups
from meteor_spark.groups.exclusive_settings import ExclusiveSettings, exclusive_settings_key
from meteor_spark.groups.shared_state import ACQUIRED, AVAILABLE, SHARE_MAP, GroupSettings, LaneShare, settings_key
from meteor_spark.groups.store import OFFSETS_MAP, lane_key

#: Ring items per lane of each dead-letter stream a trace looks through by default (the newest).
DEFAULT_DLQ_ITEMS = 10_000
#: Ring items of a key's lane a key trace reads back through at most by default (the newest).
DEFAULT_KEY_ITEMS = 10_000
MAX_LOOK_ITEMS = 10_000_000


@dataclass(frozen=True)
class GroupPosition:
    """One group's view of a record.

    Attributes:
        kind: ``exclusive`` or ``shared``.
        state: exclusive: ``confirmed`` (its confirmed offset is past the record), ``pending`` (not yet),
            ``no offset`` (never confirmed on that lane); shared: ``done`` (acknowledged, rejected or dead-lettered),
            ``acquired`` (held by a member's poll now), ``released`` (to be delivered again), ``not delivered``.
        position: exclusive: the confirmed offset (the next record it reads); shared: the lane's start offset.
        deliveries: shared, acquired or released: deliveries so far.
    """

    group: str
    kind: str
    state: str
    position: int | None
    deliveries: int | None = None


@dataclass(frozen=True)
class DeadLetterHit:
    """A dead letter of the traced record."""

    dlq: str
    lane: int
    offset: int
    error: str
    group: str | None
    deliveries: int | None
    redriven: bool


@dataclass(frozen=True)
class DlqLook:
    """How far a trace looked through one dead-letter stream (``missing``: the stream does not exist)."""

    dlq: str
    lanes: dict[int, tuple[int, int]]
    items: int
    missing: bool = False


@dataclass(frozen=True)
class RecordTrace:
    """Where one record is and what became of it.

    Attributes:
        status: ``in ring`` (readable), ``overwritten`` (below the lane's oldest item).
        record: the record (None when overwritten).
        item_records: records in its ring item.
    """

    stream: str
    lane: int
    offset: int
    status: str
    record: Record | None
    item_records: int
    groups: list[GroupPosition]
    dead_letters: list[DeadLetterHit]

    @property
    def sequence(self) -> int:
        return sequence_of(self.offset)

    @property
    def index(self) -> int:
        return index_of(self.offset)


@dataclass
class KeyTrace:
    """The most recent records of a key: its lane, what was looked through (``[first, end)`` ring sequences)."""

    key: bytes
    lane: int
    looked: tuple[int, int]
    records: list[RecordTrace] = field(default_factory=list)


class Tracer:
    """The group and dead-letter picture of one stream, and traces of its records against it."""

    def __init__(
        self, grid: Grid, info: StreamInfo, *, dlqs: tuple[str, ...] = (), max_dlq_items: int = DEFAULT_DLQ_ITEMS
    ) -> None:
        if not 1 <= max_dlq_items <= MAX_LOOK_ITEMS:
            raise ConfigError(f"max_dlq_items must be 1 to {MAX_LOOK_ITEMS:,}, got {max_dlq_items}")
        self.grid = grid
        self.info = info
        self.bounds = lane_bounds(grid, info)
        self.exclusive = sorted({g.group for g in list_groups(grid, info.name)})
        self.shared = list_shared_groups(grid, info.name)
        self._confirmed = {
            group: {s.lane: s.confirmed for s in group_state(grid, info, group)} for group in self.exclusive
        }
        keys = [lane_key(info.name, group, lane) for group in self.shared for lane in range(info.lanes)]
        self._shares = grid.map(SHARE_MAP).get_all(keys) if keys else {}
        self.looks: list[DlqLook] = []
        self._letters: dict[tuple[int, int], list[DeadLetterHit]] = {}
        for dlq in sorted(set(self._group_dlqs()) | set(dlqs)):
            self._look(dlq, max_dlq_items)

    def _group_dlqs(self) -> list[str]:
        """The dead-letter streams the stream's groups name in their stored settings."""
        out = []
        stream = self.info.name
        offsets = self.grid.map(OFFSETS_MAP).get_all([exclusive_settings_key(stream, g) for g in self.exclusive])
        for key, text in offsets.items():
            out.append(ExclusiveSettings.decode(text, f"{key} in map {OFFSETS_MAP!r}").dead_letter_stream)
        shared = self.grid.map(SHARE_MAP).get_all([settings_key(stream, g) for g in self.shared])
        for key, text in shared.items():
            name = GroupSettings.decode(text, f"{key} in map {SHARE_MAP!r}").dead_letter_stream
            if name is not None:
                out.append(name)
        return out

    def _look(self, dlq: str, max_items: int) -> None:
        try:
            info = open_stream(self.grid, dlq, create=False)
        except StreamNotFoundError:
            self.looks.append(DlqLook(dlq, {}, 0, missing=True))
            return
        progress = read_progress(self.grid, dlq)
        report = ScanReport()
        for letter in scan_dead_letters(self.grid, info, report, max_items=max_items):
            if letter.source_stream != self.info.name or letter.source_lane is None or letter.source_offset is None:
                continue
            hit = DeadLetterHit(
                dlq,
                letter.lane,
                letter.offset,
                letter.error,
                letter.group,
                letter.deliveries,
                progress.is_done(letter.lane, letter.offset),
            )
            self._letters.setdefault((letter.source_lane, letter.source_offset), []).append(hit)
        self.looks.append(DlqLook(dlq, dict(report.lanes), report.items))

    def trace(self, lane: int, offset: int) -> RecordTrace:
        """Trace the record at ``offset`` of ``lane``.

        Raises:
            ConfigError: the lane does not exist, or no record was ever written at ``offset`` (names the range).
        """
        check_lane(self.info, lane)
        head, end = self.bounds[lane]
        seq, index = sequence_of(offset), index_of(offset)
        if offset < 0 or seq >= end:
            raise ConfigError(
                f"stream {self.info.name!r} lane {lane} has no record at offset {offset}: its items end at offset "
                f"{make_offset(end, 0)} (sequence {end}); the offsets it holds start at {make_offset(head, 0)}"
            )
        record: Record | None = None
        status, count = "overwritten", 0
        if seq >= head:
            items = [
                raw
                for chunk, _ in read_range(self.grid, self.info, lane, seq, seq + 1, skip_data_loss=True)
                for raw in chunk
            ]
            if items:
                try:
                    batch = decode_batch(items[0], stream=self.info.name, lane=lane, sequence=seq)
                except FormatError as exc:
                    raise ConfigError(f"the ring item holding offset {offset} cannot be decoded: {exc}") from exc
                count = len(batch)
                if index >= count:
                    raise ConfigError(
                        f"stream {self.info.name!r} lane {lane} has no record at offset {offset}: its ring item "
                        f"(sequence {seq}) holds {count} record(s), offsets {make_offset(seq, 0)} to "
                        f"{make_offset(seq, count - 1)}"
                    )
                record, status = batch[index], "in ring"
        return RecordTrace(
            self.info.name,
            lane,
            offset,
            status,
            record,
            count,
            self._groups(lane, offset),
            list(self._letters.get((lane, offset), [])),
        )

    def _groups(self, lane: int, offset: int) -> list[GroupPosition]:
        out = []
        for group in self.exclusive:
            confirmed = self._confirmed[group].get(lane)
            state = "no offset" if confirmed is None else "confirmed" if confirmed > offset else "pending"
            out.append(GroupPosition(group, "exclusive", state, confirmed))
        for group in self.shared:
            key = lane_key(self.info.name, group, lane)
            text = self._shares.get(key)
            if text is None:
                out.append(GroupPosition(group, "shared", "not delivered", None))
                continue
            share = LaneShare.decode(text, f"{key} in map {SHARE_MAP!r}")
            out.append(_shared_position(group, share, offset))
        return out

    def trace_key(self, key: bytes, *, limit: int, max_items: int = DEFAULT_KEY_ITEMS) -> KeyTrace:
        """The key's lane and its ``limit`` most recent records among the newest ``max_items`` ring items there."""
        if not 1 <= max_items <= MAX_LOOK_ITEMS:
            raise ConfigError(f"max_items must be 1 to {MAX_LOOK_ITEMS:,}, got {max_items}")
        lane = lane_for_key(key, self.info.lanes)
        head, end = self.bounds[lane]
        first = max(head, end - max_items)
        found: list[tuple[int, int]] = []
        stop = end
        while stop > first and len(found) < limit:
            start = max(first, stop - 100)
            chunk: list[tuple[int, int]] = []
            for items, sequences in read_range(self.grid, self.info, lane, start, stop, skip_data_loss=True):
                for raw, seq in zip(items, sequences, strict=True):
                    try:
                        batch = decode_batch(raw, stream=self.info.name, lane=lane, sequence=seq)
                    except FormatError:
                        continue
                    chunk.extend((lane, r.offset) for r in batch if r.key == key)
            found.extend(reversed(chunk))  # newest first
            stop = start
        result = KeyTrace(key, lane, (first, end))
        result.records = [self.trace(lane, offset) for _, offset in found[:limit]]
        return result


def _shared_position(group: str, share: LaneShare, offset: int) -> GroupPosition:
    if offset < share.start:
        return GroupPosition(group, "shared", "done", share.start)
    if offset >= share.next:
        return GroupPosition(group, "shared", "not delivered", share.start)
    for span in share.spans:
        if span.first <= offset < span.end:
            if span.state == ACQUIRED:
                return GroupPosition(group, "shared", "acquired", share.start, span.deliveries)
            if span.state == AVAILABLE:
                return GroupPosition(group, "shared", "released", share.start, span.deliveries)
            return GroupPosition(group, "shared", "done", share.start)
    return GroupPosition(group, "shared", "done", share.start)
