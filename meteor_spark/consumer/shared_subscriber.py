"""A member of a shared group: ``SharedSubscriber`` acquires records and hands them out (the poll loop).

The group's semantics (acquisitions, timeouts, delivery counts, dead letters, guarantees) are described in
``meteor_spark.consumer.shared_groups``, which also holds the member's side of the group's state (``SharedBookkeeping``:
lane entries, settings, settling). Here: the poll loop (acquire per lane with one compare-and-set, read and cache
ring items, pass over undecodable ones, deserialize, hand out) and the member's lifecycle.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import OrderedDict
from typing import Any

from meteor_spark.consumer.refusals import Refusals, dead_letter_publisher
from meteor_spark.consumer.shared_archive import SharedArchive
from meteor_spark.consumer.shared_groups import (
    MAX_WINDOW_ITEMS,
    RECHECK_S,
    HeldSpan,
    SharedRecord,
    UndecodableItem,
    corrupt_mode,
    corrupt_policy,
    shared_record,
)
from meteor_spark.consumer.topics import refuse_on_ephemeral
from meteor_spark.errors import (
    ArgumentTypeError,
    ConfigError,
    DataLossError,
    FormatError,
    GroupError,
    MeteorError,
)
from meteor_spark.format.avro import AvroValues
from meteor_spark.format.offsets import (
    InitialOffsetScheme,
    first_offset_of,
    index_of,
    make_offset,
    sequence_of,
)
from meteor_spark.format.records import BatchPart, Record, RecordBatch
from meteor_spark.format.serializers import Deserializer, deserializer
from meteor_spark.format.wire import ItemView, decode_item
from meteor_spark.grid.client import MAX_BATCH_ITEMS, Grid, GridMap, Ring
from meteor_spark.grid.item_marks import ItemMark
from meteor_spark.grid.reading import oldest_in
from meteor_spark.grid.streams import StreamConfig, StreamInfo, open_stream
from meteor_spark.grid.typed_values import value_deserializer_for
from meteor_spark.groups.balancing import default_member_id
from meteor_spark.groups.leases import ExpiryObserver
from meteor_spark.groups.redelivery import now_ms
from meteor_spark.groups.shared_state import AVAILABLE, DONE, SHARE_MAP, LaneShare
from meteor_spark.groups.store import MAX_CAS_ATTEMPTS, lane_key
from meteor_spark.metrics import attach as attach_metrics
from meteor_spark.metrics import registry_of as metrics_registry
from meteor_spark.validate import check_int

logger = logging.getLogger(__name__)

__all__ = ["SharedSubscriber"]

#: Decoded ring items kept per lane (items never change, so the cache needs no invalidation).
_CACHE_ITEMS = 2048

#: Subscriber arguments that have no meaning for a shared group, and why.
_UNSUPPORTED = {
    "lease_ms": "shared members hold no leases; acquisitions time out after acquisition_timeout_ms",
    "max_bytes_per_read": "reads are sized in ring items (max_items_per_read)",
    "auto_confirm_interval_ms": "records are settled one by one with ack/nack/reject",
}


class SharedSubscriber(SharedArchive):
    """A member of a shared group (see the module docs); not a ``Subscriber`` (no positions: records are settled one
    by one), as Kafka's ``KafkaShareConsumer`` is not a ``KafkaConsumer``. ``Subscriber(..., shared=True)`` is the
    deprecated spelling of this constructor.

    Args:
        grid: the grid connection.
        stream: a ``StreamConfig`` (created when missing) or the name of an existing stream.
        group: the shared group's name.
        initial_offset_scheme: where a lane starts when the group has no entry for it yet (AUTO = EARLIEST).
        max_poll_records: records acquired by one ``poll`` at most.
        max_items_per_read: ring items asked for by one read.
        member_id: this member's id (default ``<host>-<pid>-<random>``); shown in the entries' tokens.
        acquisition_timeout_ms: how long a poll's records stay acquired (default 30 s).
        max_deliveries: deliveries after which an unacknowledged record is dead-lettered (default 5 with a
            ``dead_letter_stream``; without one, None: never given up on).
        dead_letter_stream: where records past ``max_deliveries`` and rejected records go (opened by name,
            created with the default configuration when missing).
        dead_letter_after: records an available record (released, timed out, or nacked with a delay) may fall
            behind the most recently acquired one of its lane before it is archived to ``dead_letter_stream``
            (None: never; needs ``dead_letter_stream``; ``meteor_spark.groups.redelivery``).
        acquisition_timeout_ms, max_deliveries, dead_letter_stream, dead_letter_after: group settings (see the
            module docs): None takes the group's (or, for its first member, the defaults).
        on_corrupt: what this member does with an undecodable ring item or a record its deserializers refuse
            (``meteor_spark.format.corrupt``): ``"error"`` (default: ``FormatError`` / ``DeserializationError``; the
            lane stops at it), ``"skip"`` (passed over, counted, marked done for the group) or ``"dead_letter"`` (to the
            group's ``dead_letter_stream`` first).
        value_deserializer, key_deserializer: as ``Subscriber``'s (``"json"``, ``"str"``, ``"bytes"`` or a
            callable).
        metrics: True (prometheus_client's default registry) or a ``CollectorRegistry``: export this member's
            counters (delivered, acknowledged, released, rejected, dead-lettered, refused, renewed, passed over)
            and the records it holds (``meteor_spark.metrics``; needs the ``metrics`` extra).
        skip_data_loss: a lane truncated and refilled under the group's position (a member restart lost its tail)
            is reset to its oldest record, delivered again and counted, instead of ``LaneTruncatedError``
            (``meteor_spark.consumer.shared_takeup``). Overwritten records still raise ``DataLossError``.

    Attributes:
        delivered_records: records handed out (a redelivery counts again).
        acked_records, released_records, rejected_records: records settled by this member.
        dead_lettered_records: records this member published to the dead-letter stream (max_deliveries,
            dead_letter_after or reject); distance_dead_letters: those of them archived by ``dead_letter_after``.
        delayed_records: records this member nacked with a delay.
        refused_records: records this member tried to settle after losing them (``FencedError``).
        renewed_records: records whose lock this member renewed.
        truncated_lanes, truncations: lanes this member reset after a truncation (``(lane, position, oldest)``).
        refusals: undecodable items and refused records passed over (``corrupt_items``, ``undecodable_records``).
    """

    def __init__(
        self,
        grid: Grid,
        stream: StreamConfig | str,
        *,
        group: str | None = None,
        initial_offset_scheme: InitialOffsetScheme | str = InitialOffsetScheme.AUTO,
        max_poll_records: int = 10_000,
        max_items_per_read: int = 100,
        member_id: str | None = None,
        acquisition_timeout_ms: int | None = None,
        max_deliveries: int | None = None,
        dead_letter_stream: str | None = None,
        dead_letter_after: int | None = None,
        on_corrupt: str | None = None,
        value_deserializer: str | Deserializer | AvroValues | None = None,
        key_deserializer: str | Deserializer | None = None,
        metrics: Any = None,
        skip_data_loss: bool = False,
        **others: Any,
    ) -> None:
        # long: one constructor on purpose: the options are checked (a ConfigError naming each) before the group's
        # settings are read or stored in the grid, then the member's state is set in one place.
        given = sorted(name for name, value in others.items() if value is not None and value is not False)
        unknown = [name for name in given if name not in _UNSUPPORTED]
        if unknown:
            raise TypeError(f"SharedSubscriber() got unexpected keyword argument(s) {', '.join(unknown)}")
        if given:
            raise ConfigError(
                "not supported by a shared group member (SharedSubscriber): "
                + "; ".join(f"{name} ({_UNSUPPORTED[name]})" for name in given)
                + ". Drop them, or use an exclusive group (Subscriber)"
            )
        if not isinstance(group, str) or not group:
            raise ConfigError(f"SharedSubscriber needs a group: a non-empty group name, got {group!r}")
        if not isinstance(skip_data_loss, bool):
            raise ArgumentTypeError(f"skip_data_loss must be True or False, got {skip_data_loss!r}")
        self.scheme = InitialOffsetScheme.parse(initial_offset_scheme)
        check_int("max_poll_records", max_poll_records, 1, 1 << 31)
        check_int("max_items_per_read", max_items_per_read, 1, MAX_BATCH_ITEMS)
        mode = corrupt_mode(on_corrupt)
        registry = metrics_registry(metrics)
        if acquisition_timeout_ms is not None:
            check_int("acquisition_timeout_ms", acquisition_timeout_ms, 1, (1 << 31) - 1)
        if dead_letter_stream is not None and (not isinstance(dead_letter_stream, str) or not dead_letter_stream):
            raise ConfigError(f"dead_letter_stream must be a non-empty stream name, got {dead_letter_stream!r}")
        if max_deliveries is not None:
            check_int("max_deliveries", max_deliveries, 1, 1 << 15)
        self._grid = grid
        self.info: StreamInfo = open_stream(grid, stream)
        refuse_on_ephemeral(self.info, "a shared group (acknowledged records)")
        self.stream = self.info.name
        self.group = group
        self.member_id = member_id or default_member_id()
        self.max_poll_records = max_poll_records
        self._map: GridMap = grid.map(SHARE_MAP)
        settings = self._group_settings(acquisition_timeout_ms, max_deliveries, dead_letter_stream, dead_letter_after)
        self.settings = settings
        self.acquisition_timeout_ms = settings.acquisition_timeout_ms
        self.max_deliveries = settings.max_deliveries
        self.dead_letter_after = settings.dead_letter_after
        self.dead_letter_stream = settings.dead_letter_stream
        dead_letter_stream = settings.dead_letter_stream
        self.corrupt_policy = corrupt_policy(mode, dead_letter_stream)
        self._value_deserializer = value_deserializer_for(grid, self.info, value_deserializer)
        self._key_deserializer = deserializer(key_deserializer, "key_deserializer")
        # Hazelcast refuses a read of more items than the ring holds.
        self._items_per_read = min(max_items_per_read, self.info.config.capacity)
        self._rings: list[Ring] = [grid.ring(name) for name in self.info.ring_names]
        self._keys = [lane_key(self.stream, group, lane) for lane in range(self.info.lanes)]
        self._incarnation = uuid.uuid4().hex[:4]
        self._acquisitions = 0
        self._observers = {lane: ExpiryObserver() for lane in range(self.info.lanes)}
        self._lock = threading.RLock()
        self._poll_lock = threading.Lock()
        self._wakeup = threading.Event()
        self._wakers: dict[int, Any] = {}
        self._texts: dict[int, str] = {}  # lane -> entry text last read or written
        self._own_write: dict[int, bool] = {}  # lane -> this member's last step on the entry was a write
        self.skip_data_loss = skip_data_loss
        self.truncated_lanes = 0
        self.truncations: list[tuple[int, int, int]] = []
        self._checked: dict[int, int] = {}  # lane -> Grid.connection_losses when the lane was last taken up
        self._marks: dict[int, OrderedDict[int, ItemMark]] = {lane: OrderedDict() for lane in range(self.info.lanes)}
        self._items: dict[int, OrderedDict[int, ItemView | UndecodableItem]] = {
            lane: OrderedDict() for lane in range(self.info.lanes)
        }
        self._held: dict[int, dict[int, HeldSpan]] = {lane: {} for lane in range(self.info.lanes)}
        # The lane this member tries first: it moves on by one lane per poll (no lane starves), except after a
        # poll that lost a compare-and-set there: members that collided fall out of step and spread over the lanes.
        self._home = uuid.uuid4().int % self.info.lanes
        self._contended = False
        self._closed = False
        self.delivered_records = 0
        self.acked_records = 0
        self.released_records = 0
        self.rejected_records = 0
        self.dead_lettered_records = 0
        self.refused_records = 0
        self.renewed_records = 0
        self.delayed_records = 0
        self.distance_dead_letters = 0
        self._dead_letters = None if dead_letter_stream is None else dead_letter_publisher(grid, dead_letter_stream)
        self.refusals = Refusals(grid, self.stream, self.corrupt_policy)
        self._detach_metrics = attach_metrics(registry, self)

    # ------------------------------------------------------------------------------------------------ polling

    def poll(self, timeout_ms: float = 0) -> RecordBatch:
        """Acquire records available now, or the first to become available within ``timeout_ms``, and hand them
        out (``SharedRecord``s, each with its ``delivery_count``); empty when none came. Settle each with ``ack``,
        ``nack`` or ``reject`` within ``acquisition_timeout_ms``.

        Raises:
            DataLossError: records of the window were overwritten in the ring before they were settled.
            FormatError: a ring item cannot be decoded.
            GridError: the grid failed (nothing was acquired by the failing step).
        """
        if self._closed:
            raise MeteorError(f"the shared subscriber of stream {self.stream!r} is closed; create a new one")
        if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, (int, float)) or timeout_ms < 0:
            raise ConfigError(f"poll timeout_ms must be a number >= 0, got {timeout_ms!r}")
        deadline = time.monotonic() + timeout_ms / 1000.0
        with self._poll_lock:
            while True:
                self._wakeup.clear()
                batch = self._acquire_round()
                remaining = deadline - time.monotonic()
                if batch or remaining <= 0:
                    return batch
                self._arm_wakers()
                self._wakeup.wait(min(remaining, RECHECK_S))

    def _acquire_round(self) -> RecordBatch:
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
                got_parts, got_records = self._acquire(lane, budget)
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

    def _acquire(self, lane: int, budget: int) -> tuple[list[BatchPart], list[SharedRecord]]:
        """One lane: acquire up to ``budget`` records (released or timed-out ones first, then fresh ones) with one
        compare-and-set, dead-letter those past ``max_deliveries``, and return the rest to hand out."""
        key = self._keys[lane]
        own = True  # first try the text this member wrote last (usually still current): saves a round trip
        for _ in range(MAX_CAS_ATTEMPTS):
            text, share = self._read(lane, own_write=own)
            expired = self._timed_out(lane, share)
            share = share.expire(expired)
            self._acquisitions += 1
            token = f"{self.member_id}:{self._incarnation}:{self._acquisitions}"
            picks, archive, fresh_end, slices, corrupt = self._pick(lane, share, budget)
            if not picks and not archive and fresh_end is None:
                if own and self._own_write.get(lane):
                    own = False  # what this member wrote may be stale: look at the entry before giving up
                    continue
                if expired:  # nothing to take, but the timed-out acquisitions are released for everyone
                    self._write(lane, key, text, share)
                return [], []
            ranges = picks + [(first, end, deliveries) for first, end, deliveries, _ in archive]
            acquired = share.acquire(ranges, token, fresh_end)
            if fresh_end is not None:
                acquired = acquired.marked(self._mark_before(lane, fresh_end))
            if not self._write(lane, key, text, acquired):
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
                self._pass_over(lane, token, corrupt)
            parts, out = self._hand_out(lane, token, slices, {(f, e): why for f, e, _, why in archive})
            if out and (self._value_deserializer is not None or self._key_deserializer is not None):
                return self._deserialize(lane, parts, out)
            return parts, out
        raise GroupError(
            f"acquiring records of {self._where(lane)} lost the compare-and-set {MAX_CAS_ATTEMPTS} times in a row "
            f"to other members; poll again"
        )

    def _pick(
        self, lane: int, share: LaneShare, budget: int
    ) -> tuple[
        list[tuple[int, int, int]],
        list[tuple[int, int, int, str]],
        int | None,
        list[tuple[BatchPart, int]],
        list[tuple[int, UndecodableItem]],
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
        now, floor = now_ms(), self._distance_floor(lane, share)
        for span in share.available():
            if budget <= 0:
                break
            if span.first < floor:  # fallen too far behind: archived, delayed or not
                got, end, bad = self._records_in(lane, span.first, min(span.end, floor), None)
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
            got, end, bad = self._records_in(lane, span.first, span.end, None if give_up else budget)
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
            got, end, bad = self._records_in(lane, share.next, limit, budget, fresh=True)
            corrupt.extend(bad)
            if got or bad:
                fresh_end = end
                slices.extend((part, 1) for part in got)
        return picks, archive, fresh_end, slices, corrupt

    def _records_in(
        self, lane: int, first: int, end: int, budget: int | None, *, fresh: bool = False
    ) -> tuple[list[BatchPart], int, list[tuple[int, UndecodableItem]]]:
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
            view = self._item(lane, seq, fresh)
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

    def _item(self, lane: int, seq: int, fresh: bool) -> ItemView | UndecodableItem | None:
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
        batch = ring.read_many(seq, 0, self._items_per_read)
        if not batch.sequences:
            if fresh:
                return None
            raise DataLossError(
                self.stream, lane, requested=first_offset_of(seq), oldest_available=first_offset_of(oldest_in(ring))
            )
        if batch.sequences[0] > seq:
            raise DataLossError(
                self.stream, lane, requested=first_offset_of(seq), oldest_available=first_offset_of(batch.sequences[0])
            )
        if batch.sequences[0] < seq:  # clamped, and items were written below seq since
            raise self._past_end(lane, seq, ring.tail() + 1)
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
            return decode_item(item, stream=self.stream, lane=lane, sequence=sequence)
        except FormatError as exc:
            return UndecodableItem(bytes(item), exc)

    def _pass_over(self, lane: int, token: str, corrupt: list[tuple[int, UndecodableItem]]) -> None:
        """Undecodable items this member acquired (``on_corrupt`` skip or dead_letter): dead-lettered first when
        so chosen (acknowledged by the grid), then marked done for the group, counted and logged. A member dying
        in between leaves them acquired: they time out and are passed over again (at-least-once dead letters)."""
        for seq, bad in corrupt:
            self.refusals.dead_letter_item(lane, seq, bad.raw, bad.error)
        self._change_lane(
            lane,
            [(first_offset_of(seq), first_offset_of(seq + 1), token) for seq, _ in corrupt],
            lambda share, runs, old: share.settle(runs, old, DONE),
        )
        for seq, bad in corrupt:
            self.refusals.passed_item(lane, seq, bad.error)

    def _deserialize(
        self, lane: int, parts: list[BatchPart], out: list[SharedRecord]
    ) -> tuple[list[BatchPart], list[SharedRecord]]:
        """Deserialize the records handed out of one lane. Refused records go through ``on_corrupt``: with skip
        or dead_letter they are marked done (dead letters published first); with error they and the records after
        them are released (delivery count kept: ``max_deliveries`` ends a record that always fails) and, when
        nothing before them is handed out, the ``DeserializationError`` is raised."""
        decoded = self.refusals.deserialize({lane: parts}, self._value_deserializer, self._key_deserializer)[lane]
        deliveries = {r.offset: r.delivery_count for r in out}
        records = [shared_record(r, deliveries[r.offset]) for r in decoded.records]
        if decoded.refused:
            self._settle([raw for raw, _ in decoded.refused], DONE, "pass over a refused record")
        if decoded.stopped is not None:
            offset, error = decoded.stopped
            self._settle([r for r in out if r.offset >= offset], AVAILABLE, "release a refused record")
            if not records:
                raise error
        return decoded.parts, records

    # ------------------------------------------------------------------------------------------------ waiting

    def _arm_wakers(self) -> None:
        """One parked read per lane at the first offset never acquired: wakes ``poll`` when new items arrive."""
        for lane in range(self.info.lanes):
            waker = self._wakers.get(lane)
            if waker is not None and not waker.done():
                continue
            with self._lock:
                text = self._texts.get(lane)
            if text is None:
                continue
            share = LaneShare.decode(text, self._keys[lane])
            nxt = sequence_of(share.next)
            if nxt - sequence_of(share.start) >= MAX_WINDOW_ITEMS:
                continue  # the window is full: only settling (seen at the next recheck) makes room
            with self._lock:
                if nxt in self._items[lane]:
                    continue
            future = self._rings[lane].read_many_async(nxt, 1, 1)
            future.add_done_callback(lambda _f: self._wakeup.set())
            self._wakers[lane] = future

    # ------------------------------------------------------------------------------------------------ lifecycle

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

    def close(self) -> None:
        """Release every record still held (available to other members at once), close the dead-letter publisher.
        Settle what was processed first: released records are delivered again."""
        if self._closed:
            return
        self._closed = True
        self._wakeup.set()
        try:
            with self._lock:
                held = [
                    Record(b"", offset=offset, lane=lane, stream=self.stream)
                    for lane, records in self._held.items()
                    for offset in records
                ]
            if held:
                try:
                    self._settle(held, AVAILABLE, "release on close")
                except MeteorError as exc:  # they time out instead
                    logger.warning("closing the shared subscriber of stream %r: %s", self.stream, exc)
        finally:
            if self._detach_metrics is not None:
                self._detach_metrics()
            self.refusals.close()
            if self._dead_letters is not None:
                self._dead_letters.close()

    def __enter__(self) -> SharedSubscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SharedSubscriber(stream={self.stream!r}, group={self.group!r}, member={self.member_id!r})"
