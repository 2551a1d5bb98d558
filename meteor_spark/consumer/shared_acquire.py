"""A shared member's acquiring side, once for the threaded and the asyncio member: options checked, state set up,
and the poll loop's steps (acquire per lane with one compare-and-set, read and cache ring items, pass over
undecodable ones, deserialize, hand out).

The group's semantics are described in ``meteor_spark.consumer.shared_groups``. Every method here that talks to
the grid is a generator of steps (``meteor_spark.consumer.shared_steps``): ``SharedSubscriber`` runs them on the
caller's thread, ``meteor_spark.aio.shared_subscriber.AsyncSharedSubscriber`` awaits them on the event loop, so
both members take every decision with the same code and store the same entries (they share groups).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from meteor_spark.consumer.shared_archive import SharedArchive
from meteor_spark.consumer.shared_groups import (
    MAX_WINDOW_ITEMS,
    HeldSpan,
    SharedRecord,
    UndecodableItem,
    corrupt_mode,
    corrupt_policy,
    shared_record,
)
from meteor_spark.errors import ArgumentTypeError, ConfigError, DataLossError, FormatError, GroupError, MeteorError
from meteor_spark.format.corrupt import dead_letter_record
from meteor_spark.format.item_decoding_small import decode_item_for_records
from meteor_spark.format.offsets import (
    InitialOffsetScheme,
    first_offset_of,
    index_of,
    make_offset,
    sequence_of,
)
from meteor_spark.format.records import BatchPart, Record, RecordBatch
from meteor_spark.format.serializers import Deserializer
from meteor_spark.format.wire import ItemView
from meteor_spark.grid.client import MAX_BATCH_ITEMS
from meteor_spark.grid.item_marks import ItemMark
from meteor_spark.grid.reading import oldest_steps
from meteor_spark.grid.steps import Steps
from meteor_spark.grid.streams import StreamInfo
from meteor_spark.groups.balancing import default_member_id
from meteor_spark.groups.leases import ExpiryObserver
from meteor_spark.groups.redelivery import now_ms
from meteor_spark.groups.shared_state import AVAILABLE, DONE, GroupSettings, LaneShare
from meteor_spark.groups.store import MAX_CAS_ATTEMPTS, lane_key
from meteor_spark.validate import check_int

logger = logging.getLogger("meteor_spark.consumer.shared_subscriber")

__all__ = ["MEMBER_OPTIONS", "UNSUPPORTED", "MemberChoices", "SharedAcquire", "check_member_options", "member_choices"]

#: Subscriber arguments that have no meaning for a shared group, and why (a ``ConfigError`` naming them).
UNSUPPORTED = {
    "lease_ms": "shared members hold no leases; acquisitions time out after acquisition_timeout_ms",
    "max_bytes_per_read": "reads are sized in ring items (max_items_per_read)",
    "auto_confirm_interval_ms": "records are settled one by one with ack/nack/reject",
}

#: Decoded ring items kept per lane (items never change, so the cache needs no invalidation).
_CACHE_ITEMS = 2048


@dataclass(frozen=True)
class MemberChoices:
    """A shared member's own options, checked before anything is read from or written to the grid."""

    group: str
    scheme: InitialOffsetScheme
    max_poll_records: int
    max_items_per_read: int
    member_id: str | None
    acquisition_timeout_ms: int | None
    max_deliveries: int | None
    dead_letter_stream: str | None
    dead_letter_after: int | None
    corrupt_mode: str
    skip_data_loss: bool


def check_member_options(
    client: str, unsupported: Mapping[str, str], others: Mapping[str, Any], **given: Any
) -> MemberChoices:
    """The checks of a shared member's options (``SharedSubscriber``'s and ``AsyncSharedSubscriber``'s: the same
    errors). ``others`` are the keyword arguments the constructor did not name: those in ``unsupported`` (name ->
    why) are a ``ConfigError`` when set, any other a ``TypeError``."""
    named = sorted(name for name, value in others.items() if value is not None and value is not False)
    unknown = [name for name in named if name not in unsupported]
    if unknown:
        raise TypeError(f"{client}() got unexpected keyword argument(s) {', '.join(unknown)}")
    if named:
        raise ConfigError(
            f"not supported by a shared group member ({client}): "
            + "; ".join(f"{name} ({unsupported[name]})" for name in named)
            + ". Drop them, or use an exclusive group (Subscriber)"
        )
    group = given["group"]
    if not isinstance(group, str) or not group:
        raise ConfigError(f"{client} needs a group: a non-empty group name, got {group!r}")
    if not isinstance(given["skip_data_loss"], bool):
        raise ArgumentTypeError(f"skip_data_loss must be True or False, got {given['skip_data_loss']!r}")
    scheme = InitialOffsetScheme.parse(given["initial_offset_scheme"])
    check_int("max_poll_records", given["max_poll_records"], 1, 1 << 31)
    check_int("max_items_per_read", given["max_items_per_read"], 1, MAX_BATCH_ITEMS)
    mode = corrupt_mode(given["on_corrupt"])
    if given["acquisition_timeout_ms"] is not None:
        check_int("acquisition_timeout_ms", given["acquisition_timeout_ms"], 1, (1 << 31) - 1)
    target = given["dead_letter_stream"]
    if target is not None and (not isinstance(target, str) or not target):
        raise ConfigError(f"dead_letter_stream must be a non-empty stream name, got {target!r}")
    if given["max_deliveries"] is not None:
        check_int("max_deliveries", given["max_deliveries"], 1, 1 << 15)
    return MemberChoices(
        group,
        scheme,
        given["max_poll_records"],
        given["max_items_per_read"],
        given["member_id"],
        given["acquisition_timeout_ms"],
        given["max_deliveries"],
        target,
        given["dead_letter_after"],
        mode,
        given["skip_data_loss"],
    )


#: The options a shared member's constructor names (``SharedSubscriber``'s and ``AsyncSharedSubscriber``'s alike).
MEMBER_OPTIONS = (
    "group",
    "initial_offset_scheme",
    "max_poll_records",
    "max_items_per_read",
    "member_id",
    "acquisition_timeout_ms",
    "max_deliveries",
    "dead_letter_stream",
    "dead_letter_after",
    "on_corrupt",
    "skip_data_loss",
)


def member_choices(client: str, arguments: Mapping[str, Any]) -> MemberChoices:
    """``check_member_options`` of a member constructor's ``arguments`` (its ``locals()``: the ``MEMBER_OPTIONS`` it
    names and ``others``, the keyword arguments it did not name). Both members' public signatures list the options;
    this reads them from there, so the forwarding is not written twice."""
    given = {name: arguments[name] for name in MEMBER_OPTIONS}
    return check_member_options(client, UNSUPPORTED, arguments["others"], **given)


class SharedAcquire(SharedArchive):
    """The acquiring side of a shared member (see the module docs); a base of ``SharedSubscriber`` and
    ``AsyncSharedSubscriber``, which drive its steps and own waiting and lifecycle."""

    info: StreamInfo
    max_poll_records: int
    settings: GroupSettings
    delivered_records: int
    refusals: Any  # Refusals without a publisher of its own: dead letters go through _publish_letters
    _value_deserializer: Deserializer | None
    _key_deserializer: Deserializer | None
    _items_per_read: int
    _home: int
    _contended: bool
    _closed: bool

    def _check_poll(self, timeout_ms: object) -> None:
        """A poll of a closed member, or with a timeout that is not a number >= 0, is refused."""
        if self._closed:
            raise MeteorError(f"the shared subscriber of stream {self.stream!r} is closed; create a new one")
        if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, (int, float)) or timeout_ms < 0:
            raise ConfigError(f"poll timeout_ms must be a number >= 0, got {timeout_ms!r}")

    def _settings_steps(self, choices: MemberChoices) -> Steps[GroupSettings]:
        """The group's settings (stored by its first member; a clash is a ``ConfigError``), set on this member."""
        settings = yield from self._group_settings(
            choices.acquisition_timeout_ms,
            choices.max_deliveries,
            choices.dead_letter_stream,
            choices.dead_letter_after,
        )
        self.settings = settings
        self.acquisition_timeout_ms = settings.acquisition_timeout_ms
        self.max_deliveries = settings.max_deliveries
        self.dead_letter_after = settings.dead_letter_after
        self.dead_letter_stream = settings.dead_letter_stream
        self.corrupt_policy = corrupt_policy(choices.corrupt_mode, settings.dead_letter_stream)
        return settings

    def _set_up(self, choices: MemberChoices, share_map: Any, rings: list[Any]) -> None:
        """The member's state, before its first step: ``share_map`` and ``rings`` are the grid objects the steps
        call (threaded or asyncio)."""
        lanes = self.info.lanes
        self.stream = self.info.name
        self.group = choices.group
        self.scheme = choices.scheme
        self.member_id = choices.member_id or default_member_id()
        self.max_poll_records = choices.max_poll_records
        self.skip_data_loss = choices.skip_data_loss
        self._map = share_map
        self._rings = rings
        # Hazelcast refuses a read of more items than the ring holds.
        self._items_per_read = min(choices.max_items_per_read, self.info.config.capacity)
        self._keys = [lane_key(self.stream, choices.group, lane) for lane in range(lanes)]
        self._incarnation = uuid.uuid4().hex[:4]
        self._acquisitions = 0
        self._observers = {lane: ExpiryObserver() for lane in range(lanes)}
        self._lock = threading.RLock()
        self._texts: dict[int, str] = {}  # lane -> entry text last read or written
        self._own_write: dict[int, bool] = {}  # lane -> this member's last step on the entry was a write
        self.truncated_lanes = 0
        self.truncations: list[tuple[int, int, int]] = []
        self._checked: dict[int, int] = {}  # lane -> Grid.connection_losses when the lane was last taken up
        self._marks: dict[int, OrderedDict[int, ItemMark]] = {lane: OrderedDict() for lane in range(lanes)}
        self._items: dict[int, OrderedDict[int, ItemView | UndecodableItem]] = {
            lane: OrderedDict() for lane in range(lanes)
        }
        self._held: dict[int, dict[int, HeldSpan]] = {lane: {} for lane in range(lanes)}
        # The lane this member tries first: it moves on by one lane per poll (no lane starves), except after a
        # poll that lost a compare-and-set there: members that collided fall out of step and spread over the lanes.
        self._home = uuid.uuid4().int % lanes
        self._contended = False
        self.delivered_records = 0
        self.acked_records = 0
        self.released_records = 0
        self.rejected_records = 0
        self.dead_lettered_records = 0
        self.refused_records = 0
        self.renewed_records = 0
        self.delayed_records = 0
        self.distance_dead_letters = 0

    def _acquire_round(self) -> Steps[RecordBatch]:
        """One pass over the lanes, from this member's home lane on, until ``max_poll_records`` are acquired."""
        lanes = self.info.lanes
        order = [(self._home + i) % lanes for i in range(lanes)]
        budget = self.max_poll_records
        parts: list[BatchPart] = []
        records: list[Record] = []
        for lane in order:
            if budget <= 0:
                break
            self._contended = False
            try:
                got_parts, got_records = yield from self._acquire(lane, budget)
            except MeteorError:
                if not records:
                    raise
                break  # hand out what other lanes gave first; the next poll meets the error again
            if lane == self._home and not (got_records and self._contended):
                self._home = (lane + 1) % lanes  # the next poll starts at the next lane: no lane starves
            if got_records:
                parts.extend(got_parts)
                records.extend(got_records)
                budget -= len(got_records)
        self.delivered_records += len(records)
        return RecordBatch(parts, records) if records else RecordBatch.empty()

    def _acquire(self, lane: int, budget: int) -> Steps[tuple[list[BatchPart], list[SharedRecord]]]:
        """One lane: acquire up to ``budget`` records (released or timed-out ones first, then fresh ones) with one
        compare-and-set, dead-letter those past ``max_deliveries``, and return the rest to hand out."""
        key = self._keys[lane]
        own = True  # first try the text this member wrote last (usually still current): saves a round trip
        for _ in range(MAX_CAS_ATTEMPTS):
            text, share = yield from self._read(lane, own_write=own)
            expired = self._timed_out(lane, share)
            share = share.expire(expired)
            self._acquisitions += 1
            token = f"{self.member_id}:{self._incarnation}:{self._acquisitions}"
            picks, archive, fresh_end, slices, corrupt = yield from self._pick(lane, share, budget)
            if not picks and not archive and fresh_end is None:
                if own and self._own_write.get(lane):
                    own = False  # what this member wrote may be stale: look at the entry before giving up
                    continue
                if expired:  # nothing to take, but the timed-out acquisitions are released for everyone
                    yield from self._write(lane, key, text, share)
                return [], []
            ranges = picks + [(first, end, deliveries) for first, end, deliveries, _ in archive]
            acquired = share.acquire(ranges, token, fresh_end)
            if fresh_end is not None:
                acquired = acquired.marked(self._mark_before(lane, fresh_end))
            if not (yield from self._write(lane, key, text, acquired)):
                own = False
                self._contended = True
                continue
            if expired:
                logger.info(
                    "stream %r lane %d group %r: acquisitions %s timed out; their records are available again",
                    self.stream,
                    lane,
                    self.group,
                    sorted(expired),
                )
            self._observers[lane].see(token, token)
            if corrupt:
                yield from self._pass_over(lane, token, corrupt)
            parts, out = yield from self._hand_out(lane, token, slices, {(f, e): why for f, e, _, why in archive})
            if out and (self._value_deserializer is not None or self._key_deserializer is not None):
                return (yield from self._deserialize(lane, parts, out))
            return parts, out
        raise GroupError(
            f"acquiring records of {self._where(lane)} lost the compare-and-set {MAX_CAS_ATTEMPTS} times in a row "
            f"to other members; poll again"
        )

    def _pick(
        self, lane: int, share: LaneShare, budget: int
    ) -> Steps[
        tuple[
            list[tuple[int, int, int]],
            list[tuple[int, int, int, str]],
            int | None,
            list[tuple[BatchPart, int]],
            list[tuple[int, UndecodableItem]],
        ]
    ]:
        """What to acquire: ``(first, end, deliveries)`` ranges to hand out, ranges to archive with the reason
        (delivered ``max_deliveries`` times already, or fallen more than ``dead_letter_after`` behind:
        ``shared_archive``), the new ``next`` for fresh records (or None), the record slices ``(part, deliveries)``
        of both (archived ones included), and the undecodable items inside those ranges (``on_corrupt`` skip or
        dead_letter: acquired with the rest, then passed over). Records nacked with a delay that has not passed
        are left where they are."""
        picks: list[tuple[int, int, int]] = []
        archive: list[tuple[int, int, int, str]] = []
        slices: list[tuple[BatchPart, int]] = []
        corrupt: list[tuple[int, UndecodableItem]] = []
        now, floor = now_ms(), (yield from self._distance_floor(lane, share))
        for span in share.available():
            if budget <= 0:
                break
            if span.first < floor:  # fallen too far behind: archived, delayed or not
                got, end, bad = yield from self._records_in(lane, span.first, min(span.end, floor), None)
                corrupt.extend(bad)
                if got or bad:
                    archive.append((span.first, end, span.deliveries, self._distance_reason()))
                    slices.extend((part, span.deliveries) for part in got)
                if end >= span.end or end == span.first:
                    continue
                span = span.cut(end, span.end)
            if not span.ready(now):
                continue  # nacked with a delay that has not passed yet
            give_up = self.max_deliveries is not None and span.deliveries >= self.max_deliveries
            deliveries = span.deliveries if give_up else span.deliveries + 1
            got, end, bad = yield from self._records_in(lane, span.first, span.end, None if give_up else budget)
            corrupt.extend(bad)
            if not got and not bad:
                continue
            if give_up:
                archive.append((span.first, end, deliveries, self._deliveries_reason(deliveries)))
            else:
                picks.append((span.first, end, deliveries))
            slices.extend((part, deliveries) for part in got)
            if not give_up:
                budget -= sum(part.size for part in got)
        fresh_end = None
        if budget > 0 and sequence_of(share.next) - sequence_of(share.start) < MAX_WINDOW_ITEMS:
            limit = first_offset_of(sequence_of(share.start) + MAX_WINDOW_ITEMS)
            got, end, bad = yield from self._records_in(lane, share.next, limit, budget, fresh=True)
            corrupt.extend(bad)
            if got or bad:
                fresh_end = end
                slices.extend((part, 1) for part in got)
        return picks, archive, fresh_end, slices, corrupt

    def _records_in(
        self, lane: int, first: int, end: int, budget: int | None, *, fresh: bool = False
    ) -> Steps[tuple[list[BatchPart], int, list[tuple[int, UndecodableItem]]]]:
        """The records of ``lane`` in ``[first, end)`` as parts, at most ``budget`` of them, the offset where what
        they cover ends (the next record's offset), and the undecodable items covered. Fresh reads stop at the
        lane's end instead of waiting.

        An undecodable item with ``on_corrupt="error"`` ends the range before it (the records before it are handed
        out); met first, it raises its ``FormatError`` (the lane stops there for this member).
        """
        parts: list[BatchPart] = []
        bad: list[tuple[int, UndecodableItem]] = []
        seq = sequence_of(first)
        covered = first
        while covered < end and (budget is None or budget > 0):
            view = yield from self._item(lane, seq, fresh)
            if view is None:
                break  # fresh records: the lane ends here for now
            if isinstance(view, UndecodableItem):
                if self.corrupt_policy.is_error:
                    if parts or bad:
                        break
                    raise view.error
                bad.append((seq, view))
                covered = first_offset_of(seq + 1)
                seq += 1
                continue
            lo = index_of(covered) if seq == sequence_of(covered) else 0
            hi = view.count if sequence_of(end) > seq else min(view.count, index_of(end))
            if budget is not None:
                hi = min(hi, lo + budget)
            if hi > lo:
                parts.append(BatchPart(self.stream, lane, seq, view, lo, hi))
                if budget is not None:
                    budget -= hi - lo
            covered = first_offset_of(seq + 1) if hi >= view.count else make_offset(seq, hi)
            seq += 1
            if hi < view.count:
                break
        return parts, covered, bad

    def _item(self, lane: int, seq: int, fresh: bool) -> Steps[ItemView | UndecodableItem | None]:
        """The decoded ring item ``seq`` of ``lane`` (cached; an undecodable one as ``UndecodableItem``); None past
        the lane's end."""
        cache = self._items[lane]
        with self._lock:
            view = cache.get(seq)
        if view is not None:
            return view
        ring = self._rings[lane]
        # Hazelcast (and the embedded grid) clamp a read into [head, tail + 1]; an empty answer says nothing about
        # where the lane ends (its next sequence is 0), so a position past the end shows once items are written.
        batch = yield lambda: ring.read_many(seq, 0, self._items_per_read)
        if not batch.sequences:
            if fresh:
                return None
            raise DataLossError(
                self.stream,
                lane,
                requested=first_offset_of(seq),
                oldest_available=first_offset_of((yield from oldest_steps(ring))),
            )
        if batch.sequences[0] > seq:
            raise DataLossError(
                self.stream, lane, requested=first_offset_of(seq), oldest_available=first_offset_of(batch.sequences[0])
            )
        if batch.sequences[0] < seq:  # clamped, and items were written below seq since
            raise (yield from self._past_end(lane, seq, (yield lambda: ring.tail()) + 1))
        self._remember_marks(lane, batch.items, batch.sequences)
        views = [
            self._decode(lane, item, sequence) for item, sequence in zip(batch.items, batch.sequences, strict=True)
        ]
        with self._lock:
            cache.update(zip(batch.sequences, views, strict=True))
            while len(cache) > _CACHE_ITEMS:
                cache.popitem(last=False)
        return views[0]

    def _decode(self, lane: int, item: bytes, sequence: int) -> ItemView | UndecodableItem:
        try:
            return decode_item_for_records(item, stream=self.stream, lane=lane, sequence=sequence)
        except FormatError as exc:
            return UndecodableItem(bytes(item), exc)

    def _pass_over(self, lane: int, token: str, corrupt: list[tuple[int, UndecodableItem]]) -> Steps[None]:
        """Undecodable items this member acquired (``on_corrupt`` skip or dead_letter): dead-lettered first when
        so chosen (acknowledged by the grid), then marked done for the group, counted and logged. A member dying
        in between leaves them acquired: they time out and are passed over again (at-least-once dead letters)."""
        if self.corrupt_policy.dead_letter_stream is not None:
            letters = [
                dead_letter_record(bad.raw, stream=self.stream, lane=lane, sequence=seq, error=bad.error)
                for seq, bad in corrupt
            ]
            yield lambda: self._publish_letters(letters)
        yield from self._change_lane(
            lane,
            [(first_offset_of(seq), first_offset_of(seq + 1), token) for seq, _ in corrupt],
            lambda share, runs, old: share.settle(runs, old, DONE),
        )
        for seq, bad in corrupt:
            self.refusals.passed_item(lane, seq, bad.error)

    def _schemas_caught_up(self) -> Any:
        """False: a threaded member's deserializer reads the schema registry itself; the asyncio member answers
        with its ``SchemaView.catch_up`` (awaited)."""
        return False

    def _deserialize(
        self, lane: int, parts: list[BatchPart], out: list[SharedRecord]
    ) -> Steps[tuple[list[BatchPart], list[SharedRecord]]]:
        """Deserialize the records handed out of one lane. Refused records go through ``on_corrupt``: with skip
        or dead_letter they are marked done (dead letters published first); with error they and the records after
        them are released (delivery count kept: ``max_deliveries`` ends a record that always fails) and, when
        nothing before them is handed out, the ``DeserializationError`` is raised."""
        decoded_lanes = self.refusals.decode({lane: parts}, self._value_deserializer, self._key_deserializer)
        failed = decoded_lanes[lane].refused or decoded_lanes[lane].stopped is not None
        if failed and (yield self._schemas_caught_up):  # a version registered since the asyncio member's last read
            decoded_lanes = self.refusals.decode({lane: parts}, self._value_deserializer, self._key_deserializer)
        letters = self.refusals.dead_letters_of(decoded_lanes)
        if letters:
            yield lambda: self._publish_letters(letters)
        self.refusals.count_refused(decoded_lanes)
        decoded = decoded_lanes[lane]
        deliveries = {r.offset: r.delivery_count for r in out}
        records = [shared_record(r, deliveries[r.offset]) for r in decoded.records]
        if decoded.refused:
            yield from self._settle([raw for raw, _ in decoded.refused], DONE, "pass over a refused record")
        if decoded.stopped is not None:
            offset, error = decoded.stopped
            yield from self._settle([r for r in out if r.offset >= offset], AVAILABLE, "release a refused record")
            if not records:
                raise error
        return decoded.parts, records

    def _waker_sequence(self, lane: int) -> int | None:
        """Where an idle member parks a one-item read on ``lane`` to learn of new items (the first sequence never
        acquired); None when there is nothing to wait for there (lane not looked at yet, window full, item
        cached)."""
        with self._lock:
            text = self._texts.get(lane)
        if text is None:
            return None
        share = LaneShare.decode(text, self._keys[lane])
        nxt = sequence_of(share.next)
        if nxt - sequence_of(share.start) >= MAX_WINDOW_ITEMS:
            return None  # the window is full: only settling (seen at the next recheck) makes room
        with self._lock:
            if nxt in self._items[lane]:
                return None
        return nxt

    def _release_held(self) -> Steps[None]:
        """Release every record still held (close): available to other members at once; a failure is logged
        (they time out instead)."""
        with self._lock:
            held = [
                Record(b"", offset=offset, lane=lane, stream=self.stream)
                for lane, records in self._held.items()
                for offset in records
            ]
        if held:
            try:
                yield from self._settle(held, AVAILABLE, "release on close")
            except MeteorError as exc:
                logger.warning("closing the shared subscriber of stream %r: %s", self.stream, exc)

    def held(self) -> int:
        """Records handed out to this member and not settled yet."""
        with self._lock:
            return sum(len(held) for held in self._held.values())

    def metrics(self) -> dict[str, int]:
        """Counters since creation."""
        return {
            "delivered_records": self.delivered_records,
            "acked_records": self.acked_records,
            "released_records": self.released_records,
            "rejected_records": self.rejected_records,
            "dead_lettered_records": self.dead_lettered_records,
            "refused_records": self.refused_records,
            "renewed_records": self.renewed_records,
            "delayed_records": self.delayed_records,
            "distance_dead_letters": self.distance_dead_letters,
            "truncated_lanes": self.truncated_lanes,
            "held_records": self.held(),
            "corrupt_items": self.refusals.corrupt_items,
            "undecodable_records": self.refusals.undecodable_records,
        }
