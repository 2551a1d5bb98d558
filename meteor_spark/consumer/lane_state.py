"""A subscriber's read state of one lane, and what one answer of the grid does to it.

The ``Subscriber`` (``meteor_spark.consumer.subscriber``) owns the lanes, the locks, the group and the public API; this
module owns what happens inside one lane: where delivery stands, what is buffered, the outstanding ``read_many``,
and how an answer is taken in, stopping at a gap (data loss), a position past the lane's end, an undecodable item or
a transaction still open (``meteor_spark.grid.item_gate``). Nothing here locks or talks to a group: callers hold the
subscriber's reader lock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from meteor_spark.errors import ConfigError, DataLossError, FormatError, MeteorError, OffsetOutOfRangeError
from meteor_spark.format.item_decoding_small import decode_item_for_records
from meteor_spark.format.offsets import first_offset_of, index_of, make_offset, sequence_of
from meteor_spark.format.records import BatchPart, Record
from meteor_spark.format.serializers import DecodedLane
from meteor_spark.grid.client import MAX_BATCH_ITEMS, Grid, Ring
from meteor_spark.grid.item_gate import DELIVER, WAIT, ItemGate
from meteor_spark.grid.item_marks import ItemMark, mark_of
from meteor_spark.grid.reading import oldest_in
from meteor_spark.grid.streams import StreamInfo


@dataclass(frozen=True)
class Skip:
    """Ring items found gone (overwritten or quarantined) and skipped under ``skip_data_loss``.

    Attributes:
        lost_from: the offset the lane would have delivered next.
        oldest: the first offset read after the gap.
        first_sequence, next_sequence: the ring items skipped, ``[first_sequence, next_sequence)``.
    """

    lost_from: int
    oldest: int
    first_sequence: int
    next_sequence: int

    @property
    def items(self) -> int:
        return self.next_sequence - self.first_sequence


class LaneState:
    """Read state of one lane: where delivery stands, what is buffered, the outstanding read."""

    __slots__ = (
        "_position_item",
        "_position_mark",
        "bad",
        "buffered",
        "capacity",
        "delivered_items",
        "dirty",
        "epoch",
        "error",
        "fetch_seq",
        "item_bytes",
        "item_counts",
        "items",
        "lane",
        "last_delivered",
        "last_read",
        "losses_seen",
        "not_before",
        "parts",
        "passed_mark",
        "pending",
        "pending_losses",
        "pending_seq",
        "position",
        "ring",
        "stream",
        "truncated",
        "verify",
    )

    def __init__(
        self,
        stream: str,
        lane: int,
        ring: Ring,
        capacity: int,
        position: int,
        epoch: int | None,
        losses_seen: int = 0,
    ) -> None:
        self.stream = stream
        self.lane = lane
        self.ring = ring
        self.capacity = capacity
        self.epoch = epoch
        self.position = position  # offset of the next record to deliver
        self.last_delivered = -1  # offset of the last record delivered
        self.not_before = 0  # grouped: not read before this wall-clock ms (a delayed nack; consumer.exclusive_nack)
        self.fetch_seq = sequence_of(position)  # next ring sequence to request
        self.pending: Any = None
        self.pending_seq = -1
        self.parts: deque[BatchPart] = deque()
        self.buffered = 0
        self.dirty = False  # delivered since the last confirm()
        self.item_counts: dict[int, int] = {}  # records per ring item, for the items of the last delivery
        # For the item marks stored with confirmed offsets (meteor_spark.grid.item_marks): the raw buffered items and
        # those of the last delivery (references to bytes the buffered records point into anyway; a mark is computed
        # once per delivery, not per item), the mark of the item ``position`` was taken after, and of the last item
        # passed over by policy.
        self.items: dict[int, Any] = {}
        self.delivered_items: dict[int, Any] = {}
        self._position_mark: ItemMark | None = None
        self._position_item: tuple[int, Any] | None = None  # (sequence, raw item) whose mark is not computed yet
        self.passed_mark: ItemMark | None = None
        self.item_bytes = 0  # average size of this lane's ring items in the last read (0: not known yet)
        self.error: MeteorError | None = None  # the lane is stopped at its position until a seek
        self.bad: tuple[int, bytes, FormatError] | None = None  # an undecodable item at fetch_seq, not settled yet
        # Reading across a lost connection (``Grid.connection_losses``): the member may have restarted with a ring
        # that lost its tail and was refilled under ``fetch_seq``. The count this lane last checked against and the
        # one its outstanding read was sent under; the last item read (sequence, raw item); the mark the next read
        # must find again before anything it returns is taken in (it starts one item early); the mark found changed.
        self.losses_seen = losses_seen
        self.pending_losses = losses_seen
        self.last_read: tuple[int, Any] | None = None
        self.verify: ItemMark | None = None
        self.truncated: ItemMark | None = None

    @property
    def position_mark(self) -> ItemMark | None:
        """The mark of the item ``position`` was taken after, computed when first asked for: a delivery records
        only which item it ended in, as most are neither confirmed nor checked after a lost connection."""
        pending = self._position_item
        if pending is not None:
            self._position_mark = mark_of(pending[1], pending[0])
            self._position_item = None
        return self._position_mark

    @position_mark.setter
    def position_mark(self, mark: ItemMark | None) -> None:
        self._position_mark = mark
        self._position_item = None

    def reset(self, position: int) -> Any:
        """Move to ``position``; returns the outstanding read, now orphaned."""
        orphan = self.pending
        self.pending = None
        self.position = position
        self.fetch_seq = sequence_of(position)
        self.parts.clear()
        self.buffered = 0
        self.error = None
        self.bad = None
        self.items.clear()
        self.delivered_items = {}
        self.position_mark = self.passed_mark = None
        self.last_read = None
        self.verify = self.truncated = None
        return orphan

    def confirmed_at(self, position: int) -> None:
        """The group's offset is now ``position``: nothing is left to confirm, unless the lane moved on since."""
        if self.position == position:
            self.dirty = False

    def back_at(self, offset: int) -> Any:
        """Back at the group's ``offset`` (an aborted transaction's rewind): moved there unless it is there with
        nothing delivered since; nothing left to confirm. Returns the outstanding read, now orphaned (or None)."""
        orphan = self.reset(offset) if self.position != offset or self.dirty else None
        self.dirty = False
        return orphan

    def held_at(self, target: int, not_before_ms: int) -> Any:
        """Rewound to ``target`` by a nack, not read before ``not_before_ms`` (0: at once); the group's offset was
        written there, so nothing is left to confirm. Returns the outstanding read, now orphaned."""
        orphan = self.reset(target)
        self.not_before = not_before_ms
        self.last_delivered = target - 1
        self.dirty = False
        return orphan

    def mark_before_fetch(self) -> ItemMark | None:
        """The mark of the item just before ``fetch_seq`` (the last one read, delivered or passed over), which must
        still be there after a lost connection; None when this lane knows none (nothing read since it started)."""
        want = self.fetch_seq - 1
        if self.last_read is not None and self.last_read[0] == want:
            return mark_of(self.last_read[1], want)
        for mark in (self.position_mark, self.passed_mark):
            if mark is not None and mark.sequence == want:
                return mark
        item = self.items.get(want)
        return None if item is None else mark_of(item, want)

    def connection_lost(self, losses: int) -> Any:
        """The grid lost a connection (count ``losses``): the next read starts one item early to find the mark of
        the item before ``fetch_seq`` again. Returns the outstanding read, now orphaned (it may be answered from
        after a member restart)."""
        orphan = self.pending
        self.pending = None
        self.losses_seen = losses
        if self.error is None and self.truncated is None:
            self.verify = self.mark_before_fetch()
        return orphan

    def read_count(self, items_per_read: int, bytes_per_read: int) -> int:
        """Ring items the next read asks for: ``items_per_read``, fewer when the lane's items are large enough that
        they would pass ``bytes_per_read``; until a lane's item size is known, a few items (its backlog may be of
        MiB-sized items)."""
        count = min(items_per_read, self.capacity, MAX_BATCH_ITEMS)
        return max(1, min(count, bytes_per_read // self.item_bytes if self.item_bytes else 4))

    def read_start(self) -> int:
        """The sequence the next read starts at: one item early while a mark is to be verified."""
        return self.verify.sequence if self.verify is not None else self.fetch_seq

    def _verified(self, items: list[Any], sequences: list[int]) -> int:
        """Settle ``verify`` against a read that started at its sequence: returns how many leading items to leave
        out (the verified one), or -1 when the lane was truncated (``truncated`` is set): another item is there, or
        the lane now ends before it (the grid answered from below it) though this reader read it. An item gone below
        the oldest one served (overwritten) leaves nothing to compare: the usual data-loss handling applies."""
        mark, self.verify = self.verify, None
        if mark is None or sequences[0] > mark.sequence:
            return 0
        if sequences[0] < mark.sequence or mark_of(items[0], mark.sequence) != mark:
            self.truncated = mark
            return -1
        return 1

    def passed(self) -> None:
        """Items up to ``fetch_seq`` were skipped by policy: with nothing buffered, the position moves past them
        (and is confirmed by the next ``confirm()``), so a restarted reader does not count them again."""
        if self.parts:
            return
        after = first_offset_of(self.fetch_seq)
        if after > self.position:
            self.position = after
            self.dirty = True
            if self.passed_mark is not None and self.passed_mark.sequence == self.fetch_seq - 1:
                self.position_mark = self.passed_mark

    def delivered(self, sequences: list[int]) -> None:
        """The records of the items ``sequences`` were handed out up to ``position``: the position's mark is the last
        one's, and items behind it are dropped (what stays is bounded by the buffered items)."""
        items = self.items
        last = sequences[-1]
        self.delivered_items = {seq: items[seq] for seq in sequences if seq in items}
        item = items.get(last)
        if item is not None:
            self._position_item = (last, item)  # its mark: position_mark
        if len(items) > 1 or last not in items:  # else the one buffered item is the last delivered one: kept
            self.items = {seq: item for seq, item in items.items() if seq >= last}

    def consume(self, parts: list[BatchPart]) -> None:
        """Take ``parts`` (the head of the buffer, the last one perhaps cut short) out of the buffer."""
        for part in parts:
            head = self.parts[0]
            if part.stop >= head.stop:
                self.parts.popleft()
            else:
                self.parts[0] = BatchPart(head.stream, head.lane, head.sequence, head.item, part.stop, head.stop)
            self.buffered -= part.size

    def handed_out(self, parts: list[BatchPart]) -> None:
        """The records of ``parts`` were delivered: move the position past the last one (to the next item's first
        record when it ends an item), remember their items for ``confirm(record)``, mark the lane for ``confirm()``."""
        last = parts[-1]
        self.item_counts = {part.sequence: part.item.count for part in parts}
        self.delivered([part.sequence for part in parts])
        self.last_delivered = last.last_offset
        self.position = (
            first_offset_of(last.sequence + 1)
            if last.stop >= last.item.count
            else make_offset(last.sequence, last.stop)
        )
        self.dirty = True
        self.passed()  # items skipped by policy right after the last delivered one

    def mark_of_delivered(self, sequence: int) -> ItemMark | None:
        """The mark of an item of the last delivery (``confirm(record)``), None when it is not one of them."""
        item = self.delivered_items.get(sequence)
        return None if item is None else mark_of(item, sequence)

    def past_end(self, end: int) -> OffsetOutOfRangeError:
        """The error of a position past the lane's end ``end`` (a ring sequence), naming the valid range."""
        position = self.position if not self.parts else first_offset_of(self.fetch_seq)
        oldest = min(oldest_in(self.ring), end)
        return OffsetOutOfRangeError(self.stream, self.lane, position, first_offset_of(oldest), first_offset_of(end))

    def accept(self, items: list[Any], sequences: list[int], *, skip_data_loss: bool, gate: ItemGate) -> Skip | None:
        """Buffer the records of one read; stop at a gap, a bad position, an undecodable item or an open
        transaction. Returns the gap skipped under ``skip_data_loss`` (for the caller to count), else None.

        After a lost connection the read started one item early (``verify``): that item is compared with the mark
        of the one read before, and left out; another item there stops the lane (``truncated``)."""
        if self.verify is not None:
            leading = self._verified(items, sequences)
            if leading < 0:
                return None
            items, sequences = items[leading:], sequences[leading:]
            if not items:
                return None
        expected = self.fetch_seq
        first = sequences[0]
        lost_from = self.position if not self.parts else first_offset_of(expected)
        skip = None
        if first > expected:
            oldest = first_offset_of(first)
            if not skip_data_loss:
                self.error = DataLossError(self.stream, self.lane, requested=lost_from, oldest_available=oldest)
                return None
            skip = Skip(lost_from, oldest, expected, first)
            self.fetch_seq = first
            self.passed()
        elif first < expected:
            # The grid clamps a read past tail + 1 to tail + 1: the lane now ends before the position (re-created
            # or truncated), and the answer holds items written since, below it.
            self.error = self.past_end(self.ring.tail() + 1)
            return None
        for item, seq in zip(items, sequences, strict=True):
            try:
                view = decode_item_for_records(item, stream=self.stream, lane=self.lane, sequence=seq)
            except FormatError as exc:
                self.bad = (seq, bytes(item), exc)
                return skip  # the items after it are read again once the policy has settled this one
            verdict = gate.check(self.lane, seq, view)
            if verdict == WAIT:
                self.fetch_seq = seq  # the lane's last stable offset: read again once the transaction is decided
                gate.hold(self.lane)
                return skip
            self.last_read = (seq, item)
            if verdict != DELIVER:
                self.fetch_seq = seq + 1  # aborted or a re-sent copy: passed over
                self.passed_mark = mark_of(item, seq)
                self.passed()
                continue
            start = 0
            if seq == sequence_of(self.position):
                start = min(index_of(self.position), view.count)
            if start < view.count:
                self.parts.append(BatchPart(self.stream, self.lane, seq, view, start, view.count))
                self.buffered += view.count - start
                self.items[seq] = item
            elif seq == sequence_of(self.position):
                self.position = first_offset_of(seq + 1)
            self.fetch_seq = seq + 1
        return skip

    def fail_bad_item(self) -> None:
        """``on_corrupt=error``: the lane stops at its undecodable item, with the item's ``FormatError``."""
        if self.bad is not None:
            self.error = self.bad[2]
            self.bad = None

    def pass_bad_item(self, sequence: int, raw: bytes) -> bool:
        """``on_corrupt`` skip / dead_letter (its dead letter acknowledged): move past the undecodable item at
        ``sequence``. False when the lane was sought meanwhile (nothing moves)."""
        if self.bad is None or self.bad[0] != sequence or self.fetch_seq != sequence:
            return False
        self.bad = None
        self.fetch_seq = sequence + 1
        self.passed_mark = mark_of(raw, sequence)
        self.passed()
        return True

    def stop_at(self, offset: int, error: MeteorError) -> Any:
        """Stop at the record ``offset`` with ``error`` once the records before it are delivered: what is buffered
        from it on is dropped (read again after a seek). Returns the outstanding read, now orphaned."""
        self.parts.clear()
        self.buffered = 0
        orphan = self.pending
        self.pending = None
        self.fetch_seq = sequence_of(offset)
        self.bad = None
        self.error = error
        return orphan


def confirm_point(
    stream: str, lane: int, offset: object, state: LaneState | None
) -> tuple[int, int | None, ItemMark | None]:
    """What ``confirm(offset, lane=...)`` of a group member stores: the position after that delivered record, the
    lane's epoch and the mark of its item (``ConfigError`` for an offset that is not one of a delivered record).

    "The next record" after the last one of an item is the next item's first (offset + 1 would be read the same way,
    but would count the finished item as lag)."""
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ConfigError(f"confirm: offset {offset!r} is invalid; give the offset of a delivered record (>= 0)")
    last = -1 if state is None else state.last_delivered
    if state is None or offset > last:
        raise ConfigError(
            f"confirm: offset {offset} on lane {lane} of stream {stream!r} was not delivered to this "
            f"subscriber (last delivered: {last}); confirm only records you processed"
        )
    sequence = sequence_of(offset)
    count = state.item_counts.get(sequence)
    after = first_offset_of(sequence + 1) if count == index_of(offset) + 1 else offset + 1
    return after, state.epoch, state.mark_of_delivered(sequence)


def choose_parts(
    lanes: dict[int, LaneState], next_lane: int, budget: int, lane_count: int
) -> tuple[dict[int, list[BatchPart]], int]:
    """The buffered parts the next batch takes, lane -> parts (the last one cut to the budget): up to ``budget``
    records, lanes in rotation from ``next_lane`` so no lane starves; and the lane the next batch starts at."""
    if len(lanes) == 1:  # one lane (a single-lane stream, or a member holding one): no rotation to work out
        rotation = list(lanes)
    else:
        order = sorted(lanes)
        rotation = [lane for lane in order if lane >= next_lane] + [lane for lane in order if lane < next_lane]
    taken: dict[int, list[BatchPart]] = {}
    for lane in rotation:
        parts: list[BatchPart] = []
        for part in lanes[lane].parts:
            if budget <= 0:
                break
            if part.size > budget:
                part = BatchPart(part.stream, part.lane, part.sequence, part.item, part.start, part.start + budget)
            parts.append(part)
            budget -= part.size
        if parts:
            taken[lane] = parts
        if budget <= 0:
            break
    if taken:
        next_lane = (max(taken) + 1) % max(1, lane_count)
    return taken, next_lane


def deliver_taken(
    lanes: dict[int, LaneState], taken: dict[int, list[BatchPart]], decoded: dict[int, DecodedLane] | None
) -> tuple[list[BatchPart], list[Record] | None, list[Any]]:
    """Hand out what ``choose_parts`` took (deserialized into ``decoded`` when the reader deserializes): the lanes'
    buffers and positions move past it, a lane whose deserializer stopped at a record stops there. Returns the
    parts delivered, their deserialized records (None without deserializers) and the reads orphaned by a stop.
    Lanes gone meanwhile (lost, sought, closed) are left out."""
    out: list[BatchPart] = []
    records: list[Record] | None = None if decoded is None else []
    orphans: list[Any] = []
    for lane, parts in taken.items():
        delivered = lanes.get(lane)
        if delivered is None:
            continue
        delivered.consume(parts)
        if decoded is None:
            out.extend(parts)
        elif records is not None:
            out.extend(decoded[lane].parts)
            records.extend(decoded[lane].records)
            stopped = decoded[lane].stopped
            if stopped is not None:
                orphan = delivered.stop_at(*stopped)
                if orphan is not None:
                    orphans.append(orphan)
        if parts:  # empty: deserialization stopped the lane at its first record
            delivered.handed_out(parts)
    return out, records, orphans


class SubscriberFields:
    """The ``Subscriber`` fields that its parts (``LaneReader``, ``SubscriberOffsets``) read, declared once so mypy
    checks them; it holds no state: the ``Subscriber`` sets them."""

    stream: str
    group: str | None
    info: StreamInfo
    _grid: Grid
    _lock: Any  # the reader lock (an RLock): lanes and their state
    _lanes: dict[int, LaneState]
    _orphans: list[Any]  # reads left parked on the grid (a lane sought, lost or closed), until they end
    _member: Any  # grouped: the GroupMember (None when ungrouped or deactivated)
    _unconfirmed_lost: dict[int, int | None]  # lane -> epoch of records delivered, lost unconfirmed
