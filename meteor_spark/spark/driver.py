"""The driver side of a streaming read, in Spark's source runner: lane bounds, the group's leases and confirmed
offsets, and checks of the positions a query starts from.

One source of truth for where the group is: the ``GroupMember`` of each stream (the offsets it fenced or last
wrote for the lanes it holds; the grid for the others). Per micro-batch the driver reads every lane's bounds once
(``DriverState.view``, reused by ``partitions``), the confirmed offsets of lanes it does not hold with one
``get_all`` per stream, moves each held lane's offset with one fenced compare-and-set, and reads the item before
each moved lane's new end for its item mark: at most four grid calls per lane.

Truncated lanes: every end offset carries the item mark of the item before each lane's position
(``meteor_spark.grid.item_marks``; one single-item read per lane whose end moved, issued for all lanes at once); the
first offset a source runner starts from (a checkpoint, the group's offsets) has its marks checked once per lane.
Another item at a mark's sequence means the lane lost its tail and was refilled under the position:
``LaneTruncatedError``, or with ``failOnDataLoss=false`` the lane is read again from its oldest item (re-delivering
rather than skipping; the group, when held, is moved back there too), logged as a WARNING. While a query runs, the
tasks check the item before each batch's start against the same marks (``executor``), and a lane this runner saw
reach a position and now sees ending below it is the same truncation (``ended_below``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from meteor_spark.errors import (
    FencedError,
    LaneTruncatedError,
    NotAssignedError,
    OffsetOutOfRangeError,
    StreamNotFoundError,
)
from meteor_spark.format.offsets import first_offset_of, sequence_of
from meteor_spark.grid.client import Ring, result
from meteor_spark.grid.item_gate import ItemGate, stable_end
from meteor_spark.grid.item_marks import CHANGED, ItemMark, check_mark, mark_of
from meteor_spark.grid.reading import oldest_sequence
from meteor_spark.grid.streams import StreamInfo, open_stream, streams_bounds
from meteor_spark.groups.balancing import default_member_id
from meteor_spark.groups.exclusive import GroupMember
from meteor_spark.spark.clients import grid_for
from meteor_spark.spark.entity import QueryEntity
from meteor_spark.spark.group_handoff import LaneHandoff
from meteor_spark.spark.lane_takeover import changed_group_marks
from meteor_spark.spark.lane_watch import LaneWatch
from meteor_spark.spark.options import SourceOptions
from meteor_spark.spark.planning import by_stream
from meteor_spark.spark.positions import check_dead_letter_stream, stream_names
from meteor_spark.spark.source_offset import SparkOffset

if TYPE_CHECKING:  # pragma: no cover
    from meteor_spark.grid.client import Grid
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LaneView:
    """What the driver knows about its lanes while it plans one batch.

    Attributes:
        bounds: (head, next) ring sequences per (stream, lane).
        confirmed: the group's confirmed record offset per (stream, lane), for lanes that have one (empty when
            the query reads without a group).
        epochs: the lease epoch of each lane this query held, taken before ``confirmed`` (empty without a group):
            what a meteor sink stages the batch's offsets with (``group_handoff``).
        restarts: lanes this query started holding whose group offset was found truncated and refilled under it
            (``failOnDataLoss=false``): (stream, lane) -> (that offset's sequence, the oldest sequence, read from).
    """

    bounds: dict[tuple[str, int], tuple[int, int]]
    confirmed: dict[tuple[str, int], int]
    epochs: dict[tuple[str, int], int] = field(default_factory=dict)
    restarts: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)

    def confirmed_sequence(self, stream: str, lane: int) -> tuple[int, int] | None:
        """(sequence, record offset) of the group's confirmed offset for the lane, or None."""
        offset = self.confirmed.get((stream, lane))
        return None if offset is None else (sequence_of(offset), offset)


class DriverState:
    """Driver-side connections of a stream reader (source runner process only; never pickled)."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.grid: Grid = grid_for(options.grid)
        self.infos: dict[str, StreamInfo] = {}
        self.members: dict[str, GroupMember] = {}
        self.member_id = options.group_member_id or f"spark-{default_member_id()}"
        #: The query as a consuming entity of the ephemeral streams it reads (``meteor_spark.spark.entity``).
        self.entity = QueryEntity(self.grid, options, self.member_id)
        #: Ephemeral streams: each lane's end read just before the query registered as an entity. A new query
        #: starts there, so a record published once the registration is visible is the query's.
        self.subscribed_ends: dict[tuple[str, int], int] = {}
        #: ``streamPattern``: the lanes' bounds as planning reads them, idle lanes less often (``lane_watch``).
        self.watch = LaneWatch() if options.stream_pattern is not None else None
        for name in stream_names(self.grid, options):
            self._open(name)
        check_dead_letter_stream(self.grid, options)
        if options.group is not None:
            logger.info(
                "query reads stream(s) %s as member %r of group %r; its read tasks hand each batch's lane ends and "
                "lease epochs to a transactional meteor sink of the same query, which commits them in the batch's "
                "transaction (sink option groupOffsets, default auto)",
                ", ".join(self.infos),
                self.member_id,
                options.group,
            )
        #: Running (total bytes, items sampled) per lane, for byte-based admission.
        self.item_samples: dict[tuple[str, int], tuple[int, int]] = {}
        #: Trigger.AvailableNow: the lanes' ends when the run started; it reads up to them (``prepare_available_now``).
        self.available_now_target: SparkOffset | None = None
        #: The lanes' ends as last read (``plan_view``): progress reports, and what a deleted stream left unread.
        self.latest: SparkOffset | None = None
        #: Where this query started, when this source runner resolved it (``initialOffset``).
        self.initial: SparkOffset | None = None
        #: (stream, lane) -> record offset a start by time resolved to, inside the item the lane starts at:
        #: the batch reading that item drops its records before it.
        self.start_offsets: dict[tuple[str, int], int] = {}
        self.closed = False
        self.gate = ItemGate(self.grid, options.isolation)
        #: read_committed: (stream, lane) -> ring sequence below which every transactional item is decided.
        self.stable: dict[tuple[str, int], int] = {}
        #: Lanes whose starting position's item mark this source runner checked (once per lane and process).
        self.verified: set[tuple[str, int]] = set()
        #: failOnDataLoss=false: (stream, lane) -> (stale position, oldest sequence, stale mark) of lanes found
        #: truncated and refilled under it, read again from that oldest sequence (an offset at the same position
        #: with another mark was taken after the truncation: not moved).
        self.truncated: dict[tuple[str, int], tuple[int, int, ItemMark]] = {}
        self._planned: LaneView | None = None
        #: Items skipped as lost: the query's count carried in the offsets as of the last batch planned, and the
        #: items this source runner found lost after planning (``skipped_items`` adds them).
        self._planned_skipped = 0
        self._late_skipped = 0
        self._last_batch_mono = time.monotonic()
        #: Lanes another group member holds, logged once when this query started following them.
        self._standby: set[tuple[str, int]] = set()
        #: (stream, lane) -> the lease epoch under which this source runner compared the group's stored item mark
        #: of a lane it holds with the lane's item (``lane_takeover``): once per lane each time it starts holding it.
        self.checked_epochs: dict[tuple[str, int], int] = {}
        #: Lanes found so (``taken_over``) since the last view: that view's ``restarts`` (moved back once).
        self._restarts: dict[tuple[str, int], tuple[int, int]] = {}

    # -- the query run, step by step (the reader calls these; it writes no field itself) -----------------------

    def prepare_available_now(self) -> SparkOffset:
        """Trigger.AvailableNow: the run reads up to the lanes' ends as of now, and stops there."""
        self.available_now_target = SparkOffset.of(by_stream({k: nxt for k, (_, nxt) in self.bounds().items()}))
        return self.available_now_target

    def began_at(self, offset: SparkOffset, inside: dict[tuple[str, int], int]) -> None:
        """A new query starts at ``offset``; ``inside`` holds the record offsets its start by time resolved to
        inside the first item of a lane (the batch reading that item drops the records before them)."""
        self.initial = offset
        self.start_offsets.update(inside)

    def is_first_batch(self, begin: SparkOffset) -> bool:
        """Whether a batch starting at ``begin`` is this query's first (its progress report has no start offset)."""
        return self.initial is not None and begin.positions == self.initial.positions and not begin.skipped

    def seen_ends(self) -> dict[tuple[str, int], int]:
        """Each lane's end as last read by this source runner (empty before the first batch is planned)."""
        return self.latest.as_dict() if self.latest is not None else {}

    def plan_view(self) -> LaneView:
        """The view a batch is planned on: the streams read now (``streamPattern`` listed before the bounds are
        read, and again when a lane read ends below its last known end: a stream deleted meanwhile, whose destroyed
        ring reads as empty, is left out), their lanes' bounds and the group's confirmed offsets. ``latest``
        follows the bounds; ``partitions`` of the same batch reuses the view (``planned``)."""
        self.refresh_streams()
        view = self.view(watched=True)
        if self.watch is not None and self.watch.went_back and self.refresh_streams():
            view = LaneView({k: v for k, v in view.bounds.items() if k[0] in self.infos}, view.confirmed, view.epochs)
        self.latest = SparkOffset.of(by_stream({key: nxt for key, (_, nxt) in view.bounds.items()}))
        self._planned = view
        return view

    def resume_skip_count(self, begin: SparkOffset) -> None:
        """The query's count of items skipped as lost, as carried in the offset the next batch starts from."""
        self._planned_skipped = begin.skipped_items

    def batch_planned(self, end: SparkOffset) -> None:
        """A batch ending at ``end`` was planned: its skip count is the query's, and ``minOffsetsPerTrigger``'s
        wait starts again."""
        self._planned_skipped = end.skipped_items
        self._last_batch_mono = time.monotonic()

    def ms_since_last_batch(self) -> float:
        """Milliseconds since this source runner last planned a batch (``maxTriggerDelay``)."""
        return (time.monotonic() - self._last_batch_mono) * 1000

    def count_late_skip(self, items: int) -> None:
        """Items found lost after their batch was planned: counted by this source runner only (the batch's end
        offset is logged already)."""
        self._late_skipped += items

    @property
    def skipped_items(self) -> int:
        """Items skipped as lost: the query's count as of the last batch planned, plus those found lost later."""
        return self._planned_skipped + self._late_skipped

    def standing_by(self, stream: str, lane: int) -> None:
        """Another member holds the lane: logged once, when this query starts following the group's offset."""
        if (stream, lane) in self._standby:
            return
        self._standby.add((stream, lane))
        logger.info(
            "standby: group %r lane %d of stream %r is held by another member; this query follows the group's "
            "confirmed offset and reads nothing until the lane is free",
            self.options.group,
            lane,
            stream,
        )

    def holding(self, stream: str, lane: int) -> None:
        """This query holds the lane: logged when it took the lane over from standing by."""
        if (stream, lane) not in self._standby:
            return
        self._standby.discard((stream, lane))
        logger.info("group %r: this query now holds lane %d of stream %r", self.options.group, lane, stream)

    def _open(self, name: str) -> None:
        info = open_stream(self.grid, name, create=False)
        if info.config.ephemeral:
            for (stream, lane), (_, next_seq) in streams_bounds(self.grid, [info]).items():
                self.subscribed_ends[(stream, lane)] = next_seq
        self.entity.open(info)
        self.infos[name] = info
        if self.options.group is not None:
            member = GroupMember(
                self.grid,
                info,
                self.options.group,
                member_id=self.member_id,
                lease_ms=self.options.group_lease_ms,
                want="all",
            )
            member.start()
            self.members[name] = member

    def refresh_streams(self) -> list[str]:
        """With ``streamPattern``: start reading streams that match now, stop reading deleted ones. Returns the
        names of the streams that were deleted (their group members are closed). One map read per call (the names
        only: a stream's metadata is read once, when the query starts reading it)."""
        if self.options.stream_pattern is None:
            return []
        names = set(stream_names(self.grid, self.options))
        gone = sorted(set(self.infos) - names)
        for name in gone:
            del self.infos[name]
            self.checked_epochs = {key: e for key, e in self.checked_epochs.items() if key[0] != name}
            self.entity.forget(name)
            member = self.members.pop(name, None)
            if member is not None:
                try:
                    member.close()
                except Exception:  # the stream and its group state are gone; nothing is left to release
                    logger.warning("could not release the group leases of deleted stream %r", name, exc_info=True)
        for name in sorted(names - set(self.infos)):
            try:
                self._open(name)
            except StreamNotFoundError:
                continue  # deleted between the listing and the open: not a stream of this batch
            logger.info(
                "stream %r matches streamPattern %r: reading it from its oldest item",
                name,
                self.options.stream_pattern.pattern,
            )
        return gone

    def item_bytes(self, stream: str, lane: int, position: int) -> float | None:
        """Estimated bytes per ring item of the lane: a running average of items sampled by this source runner,
        one more (the item at ``position``, one read of one item) per call. None when nothing could be read."""
        batch = self.grid.ring(self.infos[stream].ring_names[lane]).read_many(position, 0, 1)
        total, count = self.item_samples.get((stream, lane), (0, 0))
        if batch.items:
            total, count = total + len(batch.items[0]), count + 1
            self.item_samples[(stream, lane)] = (total, count)
        return total / count if count else None

    def stable_end(self, key: tuple[str, int], start: int, end: int) -> int:
        """``read_committed``: the lane's last stable sequence in ``[start, end)`` (``item_gate.stable_end``); the
        items found decided are not read again by later batches. ``read_uncommitted``: ``end``.

        With ``maxOffsetsPerTrigger`` the headers scanned stop that many items after ``start`` (the batch admits no
        more of the lane), so a large backlog is not read on the driver at once."""
        if not self.gate.read_committed:
            return end
        stream, lane = key
        if self.options.max_offsets_per_trigger is not None:
            end = min(end, start + self.options.max_offsets_per_trigger)
        known = self.stable.get(key, start)
        if known >= end:
            return end
        found = stable_end(self.gate, self.grid, self.infos[stream], lane, max(start, known), end)
        self.stable[key] = found
        return found

    def lane_keys(self) -> list[tuple[str, int]]:
        """Every (stream, lane) read, from the stream metadata (no grid call)."""
        return [(name, lane) for name, info in self.infos.items() for lane in range(info.config.lanes)]

    def bounds(self) -> dict[tuple[str, int], tuple[int, int]]:
        """(head, next) ring sequences of every lane of every stream read (two round trips in all), all read (a
        pattern query's ``watch`` keeps them)."""
        if self.watch is not None:
            return self.watch.bounds(self.grid, self.infos.values(), everything=True)
        return streams_bounds(self.grid, self.infos.values())

    def view(self, *, watched: bool = False) -> LaneView:
        """Lane bounds, the group's lease epochs and confirmed offsets, read once. ``watched``: a pattern query's
        bounds as ``lane_watch`` refreshes them (idle lanes not read at every batch); else every lane is read. The
        group's item mark of each lane this query started holding since the last view is checked first
        (``taken_over``)."""
        epochs = self.held_epochs()
        bounds = (
            self.watch.bounds(self.grid, self.infos.values()) if watched and self.watch is not None else self.bounds()
        )
        self.taken_over(epochs)
        restarts, self._restarts = self._restarts, {}
        confirmed = self.confirmed_offsets()
        confirmed.update({key: first_offset_of(oldest) for key, (_, oldest) in restarts.items()})
        return LaneView(bounds, confirmed, epochs, restarts)

    def held_epochs(self) -> dict[tuple[str, int], int]:
        """The lease epoch of every lane this query holds now (the group members' local views, no grid call)."""
        return {(stream, lane): epoch for stream, m in self.members.items() for lane, epoch in m.assignment().items()}

    def taken_over(self, epochs: dict[tuple[str, int], int]) -> None:
        """Lanes held under an epoch not checked yet (query start, a restarted runner, a standby taking over
        mid-run): their group offsets' item marks checked (``lane_takeover``). Each lane truncated and refilled
        under it goes to ``_restarts`` as (stale sequence, oldest sequence) (``failOnDataLoss=false``; else
        ``_truncated`` raises ``LaneTruncatedError``); one found so already (same mark) is not logged again."""
        changed = changed_group_marks(self.grid, self.infos, self.members, epochs, self.checked_epochs)
        for key, (position, mark) in sorted(changed.items()):
            known = self.truncated.get(key)
            same = known is not None and known[0] == position and known[2] == mark
            whose = f"group {self.options.group!r}'s offset"
            self._restarts[key] = (
                position,
                known[1] if known and same else self._truncated(*key, position, mark, whose),
            )

    def planned(self) -> LaneView:
        """The view ``latestOffset`` read for the batch it planned (``plan_view``), else (a batch replayed after a
        restart, a second ``partitions`` call) a fresh one. Taken once: a later batch never plans on an old view."""
        planned, self._planned = self._planned, None
        return planned if planned is not None else self.view()

    def handoffs(self, view: LaneView, begin: SparkOffset, end: SparkOffset) -> dict[tuple[str, int], LaneHandoff]:
        """Per lane of an exclusive group, what a batch from ``begin`` to ``end`` hands a meteor sink that commits
        the group's offsets in its transaction (``group_handoff``): the end, the epoch held when the batch was
        planned, this member, the end's item mark. Empty without a group.

        A lane taken up after the view was read (a replayed batch waited for it) gets its current epoch only
        while the group's offset, as this member fenced it, is not past the batch's start: else another member
        processed part of the batch's range meanwhile, and the epoch stays None, so the sink refuses the batch."""
        group = self.options.group
        if group is None or not self.members:
            return {}
        marks, starts = end.marks_dict(), begin.as_dict()
        out: dict[tuple[str, int], LaneHandoff] = {}
        for stream, lane, sequence in end.positions:
            mark = marks.get((stream, lane))
            epoch = view.epochs.get((stream, lane))
            member = self.members.get(stream)
            if epoch is None and member is not None and lane in member.assignment():
                confirmed = member.known_offsets([lane]).get(lane)
                if confirmed is None or sequence_of(confirmed) <= starts.get((stream, lane), 0):
                    epoch = member.assignment().get(lane)
            out[(stream, lane)] = LaneHandoff(
                stream,
                group,
                lane,
                first_offset_of(sequence),
                epoch,
                self.member_id,
                mark if mark is not None and mark.sequence == sequence - 1 else None,
            )
        return out

    def confirmed_offsets(self) -> dict[tuple[str, int], int]:
        """The group's confirmed offset per lane, where one is stored: held lanes from the group member's memory
        (the holder is the only writer), the rest with one ``get_all`` per stream."""
        out: dict[tuple[str, int], int] = {}
        for stream, member in self.members.items():
            for lane, offset in member.known_offsets().items():
                if offset is not None:
                    out[(stream, lane)] = offset
        return out

    def oldest(self, stream: str, lane: int) -> int:
        """The oldest sequence the grid can serve for the lane (below the ring head where it keeps history)."""
        return oldest_sequence(self.grid, self.infos[stream], lane)

    def check_confirmed(self, stream: str, lane: int, confirmed: int | None, group: str | None, known_end: int) -> None:
        """A group offset past the lane's end is stale (the stream was re-created under it): an error, not a skip.

        ``known_end`` is the lane's end as read before; past it, the end is read again (another member may have
        read and confirmed items published since), and only a confirm past that is stale."""
        if confirmed is None or sequence_of(confirmed) <= known_end:
            return
        sequence = sequence_of(confirmed)
        end = self.grid.ring(self.infos[stream].ring_names[lane]).tail() + 1
        if sequence > end:
            raise OffsetOutOfRangeError(
                stream,
                lane,
                sequence,
                self.oldest(stream, lane),
                end,
                unit="sequence",
                hint=f"The confirmed offset of group {group!r} is stale: it was written before the stream was "
                f"deleted and re-created (or the grid restarted without persistence). Move the group with "
                f"meteor_spark.groups.admin.seek_group to a position inside the range, or read under a new group "
                f"name.",
            )

    def verify(self, offset: SparkOffset, whose: str) -> dict[tuple[str, int], int]:
        """Check the item marks of ``offset`` for lanes not checked yet by this process (one single-item read each).

        Returns the new start of each lane found truncated and refilled under its position (its oldest sequence;
        ``failOnDataLoss=false``), also for lanes found so earlier in this process at the same stale position.

        Raises:
            LaneTruncatedError: a lane was truncated and refilled under ``offset`` (``failOnDataLoss=true``).
        """
        positions = offset.as_dict()
        moved: dict[tuple[str, int], int] = {}
        for key, mark in offset.marks_dict().items():
            stream, lane = key
            position = positions.get(key)
            if stream not in self.infos or position is None:
                continue
            known = self.truncated.get(key)
            if known is not None and known[0] == position and known[2] == mark:
                moved[key] = known[1]
                continue
            if key in self.verified:
                continue
            self.verified.add(key)
            verdict, _ = check_mark(self.grid.ring(self.infos[stream].ring_names[lane]), mark)
            if verdict != CHANGED:
                continue
            moved[key] = self._truncated(stream, lane, position, mark, whose)
        return moved

    def ended_below(
        self,
        begin: SparkOffset,
        bounds: dict[tuple[str, int], tuple[int, int]],
        seen_ends: dict[tuple[str, int], int],
    ) -> dict[tuple[str, int], int]:
        """Lanes of a running query that now end below ``begin`` although this source runner saw them reach it and
        marked the item before it: the lane lost its tail while the query ran (a member restart), the same
        truncation the item mark catches once new records refill it (``_truncated``). Returns the new start of
        each such lane (its oldest sequence, ``failOnDataLoss=false``).

        Raises:
            LaneTruncatedError: such a lane, with ``failOnDataLoss=true``.
        """
        positions = begin.as_dict()
        moved: dict[tuple[str, int], int] = {}
        for key, mark in begin.marks_dict().items():
            position = positions.get(key)
            if (
                position is None
                or key not in bounds
                or key[0] not in self.infos
                or mark.sequence != position - 1
                or position <= bounds[key][1]
                or seen_ends.get(key, -1) < position
            ):
                continue
            known = self.truncated.get(key)
            if known is not None and known[0] == position and known[2] == mark:
                moved[key] = known[1]
                continue
            moved[key] = self._truncated(key[0], key[1], position, mark, "the running query's position")
        return moved

    def _truncated(self, stream: str, lane: int, position: int, mark: ItemMark, whose: str) -> int:
        oldest = self.oldest(stream, lane)
        if self.options.fail_on_data_loss:
            fix = (
                "Start the query with a fresh checkpointLocation"
                + (
                    f" after moving group {self.options.group!r} (`meteor groups STREAM GROUP --seek`, "
                    "meteor_spark.groups.admin.seek_group)"
                    if self.options.group is not None
                    else ""
                )
                + (
                    f" (the lane's oldest sequence is {oldest}), or set failOnDataLoss=false to read the lane again "
                    f"from its oldest item."
                )
            )
            raise LaneTruncatedError(
                stream, lane, position, oldest, mark.sequence, unit="sequence", whose=whose, fix=fix
            )
        self.truncated[(stream, lane)] = (position, oldest, mark)
        member = self.members.get(stream)
        if member is not None and lane in member.assignment():
            try:
                member.seek(lane, first_offset_of(oldest))
            except (FencedError, NotAssignedError) as exc:
                logger.warning(
                    "could not move group %r back on stream %r lane %d: %s", self.options.group, stream, lane, exc
                )
        logger.warning(
            "stream %r lane %d was truncated and refilled under %s (sequence %d: the item at sequence %d is not the "
            "one the position was taken after); failOnDataLoss=false: reading the lane again from its oldest item, "
            "sequence %d (items read before the truncation may be read again)",
            stream,
            lane,
            whose,
            position,
            mark.sequence,
            oldest,
        )
        return oldest

    def marks_for(self, ends: dict[tuple[str, int], int], begin: SparkOffset) -> dict[tuple[str, int], ItemMark]:
        """The item marks of the items before ``ends``: kept from ``begin`` where a lane did not move, else one
        single-item read per lane, all issued at once. A lane whose item is gone (overwritten) gets none."""
        known = begin.marks_dict()
        marks: dict[tuple[str, int], ItemMark] = {}
        reads: dict[tuple[str, int], Any] = {}
        for key, end in ends.items():
            stream, lane = key
            if end <= 0 or stream not in self.infos:
                continue
            mark = known.get(key)
            if mark is not None and mark.sequence == end - 1:
                marks[key] = mark
                continue
            reads[key] = self.grid.ring(self.infos[stream].ring_names[lane]).read_many_async(end - 1, 0, 1)
        for (stream, lane), future in reads.items():
            batch = Ring.to_batch(result(future, f"read the item before the end of stream {stream!r} lane {lane}"))
            if batch.sequences and batch.sequences[0] == ends[(stream, lane)] - 1:
                marks[(stream, lane)] = mark_of(batch.items[0], batch.sequences[0])
        # Offsets this process planned from what it read itself need no check when it starts a batch from them.
        self.verified.update(marks)
        return marks

    def held(self, stream: str, lane: int) -> bool:
        member = self.members.get(stream)
        return member is None or lane in member.assignment()

    def confirm(self, offset: SparkOffset) -> None:
        """Confirm ``offset`` (the end of a committed batch) for the lanes this query holds; forward only.

        The group member knows the offset it last wrote for each lane it holds, so a confirm that moves nothing
        costs no grid call and one that moves costs a single compare-and-set, fenced by the lease epoch."""
        marks = offset.marks_dict()
        self.taken_over(self.held_epochs())  # a lane taken up: its stored mark is checked before it is overwritten
        for stream, lane, sequence in offset.positions:
            member = self.members.get(stream)
            if member is None or self.checked_epochs.get((stream, lane)) != member.assignment().get(lane, -1):
                continue  # not held, or held since the check (checked when it is next planned)
            mark = marks.get((stream, lane))
            try:
                member.confirm(
                    lane,
                    first_offset_of(sequence),
                    mark=mark if mark is not None and mark.sequence == sequence - 1 else None,
                )
            except (FencedError, NotAssignedError) as exc:
                # Another member took the lane over (our lease lapsed): its position wins; ours is not written.
                logger.warning("not confirming stream %r lane %d at sequence %d: %s", stream, lane, sequence, exc)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.entity.close()
        for name, member in self.members.items():
            try:
                member.close()
            except Exception:  # releasing is best effort; the lease expires anyway
                logger.warning(
                    "could not release the group leases of stream %r; they expire on their own", name, exc_info=True
                )
        if self.members:
            logger.info("released the group's lane leases")
