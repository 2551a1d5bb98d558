"""The Subscriber, ungrouped or grouped (its push-style ``Receiver`` is in ``meteor_spark.receiver``).

An **ungrouped** subscriber reads every lane of a stream with its own, local positions (lost on close, like
Meteor). A **grouped** subscriber is a member of a subscriber group (``meteor_spark.groups.GroupMember``): it reads
only the lanes the group assigned to it, starts each at the group's confirmed offset (else the initial scheme),
re-validates its lease before delivering a batch (so a lane it lost is never delivered again), and confirms
offsets synchronously and fenced.

Reading: at most one ``read_many`` per lane is outstanding. It parks on the member until records arrive and is
kept across polls (a poll that times out leaves it in place for the next one) instead of leaving one parked
operation behind per timed-out poll. Hazelcast cannot cancel a parked read; one left behind by ``seek``, a lost
lane or ``close`` ends when the next item arrives in that lane.

Falling behind: the grid silently restarts a read below the oldest item it can serve at that item; the subscriber
compares sequences and raises ``DataLossError`` (position unchanged, so it keeps failing until the application
seeks), or, with ``skip_data_loss=True``, moves straight to the oldest record still served, counts the skipped
ring items once (``skipped_items``, ``skips``) and logs a warning. The number of *records* in lost items is
unknowable (they are gone), so the skip is counted in ring items and reported as an offset range. On a grid that
keeps history below the ring's head (a persistent embedded member, a Hazelcast RingbufferStore) such reads are
served, so they are not data loss, and EARLIEST starts at the oldest record the grid can serve.

Past the end: a position beyond a lane's end (``seek`` past it, or a group's confirmed offset after the stream was
re-created or truncated) is an ``OffsetOutOfRangeError`` naming the valid range, never a wait that silently skips
everything written up to that position.

Truncated lanes: a grouped subscriber confirms each offset with a mark of the item it was taken after
(``meteor_spark.item_marks``), and when it takes a lane up it reads that one item again. Another item at that
sequence means a member restart lost the lane's last records and new records took their sequences, below the
group's offset: ``LaneTruncatedError`` (a ``DataLossError``) on that lane; with ``skip_data_loss`` the group's offset
moves back to the lane's oldest record (re-delivering, never skipping, what the lane holds now) and it is counted
(``truncated_lanes``).

Corrupt items: a ring item that cannot be decoded (damaged, foreign, or of a newer format version) is handled by
the ``on_corrupt`` policy (``meteor_spark.corrupt``): ``error`` (default) raises ``FormatError`` with the position
left AT the item; ``skip`` passes over it and counts it (``corrupt_items``); ``dead_letter`` publishes the raw item
to a dead-letter stream, waits for the grid's acknowledgement, and only then moves past it.

Deserializers: with ``value_deserializer`` / ``key_deserializer`` the records returned carry the objects in
``value`` / ``key``. A record they refuse (e.g. invalid JSON) goes through the same ``on_corrupt`` choice:
``error`` raises ``DeserializationError`` naming stream, lane and offset, once the records before it were returned,
with the position left AT the record; ``skip`` leaves it out (counted in ``undecodable_records``, logged);
``dead_letter`` publishes it as stored (value, key, headers, plus source headers and the error) and leaves it out.
A skipped or dead-lettered record counts as processed: the position moves past it, so ``confirm()`` confirms it.

Errors and good records: a poll first returns the records read before a bad item (corrupt, lost, out of range);
the error is raised by the next poll, which finds nothing left before it in that lane. Errors stay until the
application seeks the lane (they are conditions of the position, not of the read).

Offsets: ``position(lane)`` is the offset of the next record to deliver; ``last_offset(lane)`` that of the last
one delivered. ``confirm()`` stores every delivered position in the group (the confirmed offset means "the next
record to read"); ``confirm(offset)`` / ``confirm(record)`` stores "everything up to and including this record".
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from meteor_spark.auto_confirm import AutoConfirm
from meteor_spark.corrupt import CorruptItemPolicy
from meteor_spark.errors import (
    ArgumentTypeError,
    ConfigError,
    FencedError,
    GridOperationError,
    GroupError,
    LaneTruncatedError,
    MeteorError,
    NotAssignedError,
    OffsetOutOfRangeError,
)
from meteor_spark.grid import MAX_BATCH_ITEMS, Grid, Ring, require_grid, result
from meteor_spark.groups import GroupMember
from meteor_spark.item_gate import ItemGate
from meteor_spark.item_marks import CHANGED, check_mark, mark_of
from meteor_spark.lane_state import LaneState, Skip
from meteor_spark.metrics import attach as attach_metrics
from meteor_spark.metrics import registry_of as metrics_registry
from meteor_spark.offsets import (
    InitialOffsetScheme,
    first_offset_of,
    index_of,
    make_offset,
    resolve_initial,
    sequence_of,
)
from meteor_spark.reading import check_lane, oldest_in
from meteor_spark.receiver import ErrorHandler, Receiver, RecordHandler
from meteor_spark.records import BatchPart, Record, RecordBatch
from meteor_spark.refusals import Refusals
from meteor_spark.serializers import DecodedLane, Deserializer, deserializer
from meteor_spark.streams import StreamConfig, StreamInfo, open_stream
from meteor_spark.timestamps import MAX_TIMESTAMP_MS, offset_for_timestamp
from meteor_spark.validate import MAX_TIMEOUT_MS, check_int, check_text, check_timeout

logger = logging.getLogger(__name__)

__all__ = ["InitialOffsetScheme", "Receiver", "RecordHandler", "Subscriber"]


class Subscriber:
    """Reads records from a stream.

    Args:
        grid: the grid connection.
        stream: a ``StreamConfig`` (created when missing) or the name of an existing stream.
        shared: with ``group``: join it as a *shared* group (queue semantics: records acquired for a time and
            acknowledged one by one, any number of members per lane); the object made is a
            ``meteor_spark.shared_groups.SharedSubscriber``, with its own arguments (acquisition_timeout_ms,
            max_deliveries, dead_letter_stream).
        group: subscriber group name; None = ungrouped.
        initial_offset_scheme: where to start without a position (``InitialOffsetScheme`` or its name).
        skip_data_loss: skip (and count) lost records instead of raising ``DataLossError``; grouped, a lane truncated
            and refilled under the group's offset is read again from its oldest record (counted in
            ``truncated_lanes``) instead of raising ``LaneTruncatedError``.
        on_corrupt: what to do with a ring item that cannot be decoded: ``"error"`` (default: ``FormatError``,
            position left at the item), ``"skip"`` (counted in ``corrupt_items``, logged) or ``"dead_letter"``.
        dead_letter_stream: the stream undecodable items are published to (implies ``on_corrupt="dead_letter"``);
            opened by name, created with the default configuration when missing. Each refused item becomes one
            record (its raw bytes, with headers naming source stream, lane, sequence, offset and the error;
            ``meteor_spark.corrupt``), acknowledged by the grid before reading goes on.
        value_deserializer, key_deserializer: turn stored values / keys (keys that are set) into objects:
            ``"json"``, ``"str"``, ``"bytes"`` or a callable (``meteor_spark.serializers``). A record they refuse
            goes through ``on_corrupt`` (error, skip or dead_letter; see the module docs).
        max_poll_records: records returned by one ``poll`` at most.
        max_items_per_read: ring items asked for by one ``read_many`` (each holds up to ``max_batch_records``).
        max_bytes_per_read: ring-item bytes asked for by one ``read_many``, about: the item count is adapted to the
            lane's item size (at least one item). One response of many MiB holds up every other reader sharing the
            grid connection and makes the member buffer it; about a MiB keeps responses streaming.
        lease_ms: grouped: lease length, i.e. failover time after a crash (default 5 s).
        member_id: grouped: this member's id (default ``<host>-<pid>-<random>``).
        metrics: True (prometheus_client's default registry) or a ``CollectorRegistry``: export this subscriber's
            counters, its lag per lane and, grouped, its group figures (``meteor_spark.metrics``; needs the
            ``metrics`` extra).
        auto_confirm_interval_ms: grouped: confirm on its own, at most every that many ms, at the start of a
            ``poll`` (what the previous polls handed out) and on ``close`` (``meteor_spark.auto_confirm``: the
            semantics, at-least-once; a crash re-delivers what was handed out since the last confirm).
        isolation: ``"read_uncommitted"`` (default: every item) or ``"read_committed"``: records of transactions
            (the transactional Spark sink) only once committed, never aborted ones; a lane waits at the first item
            of a transaction still open (``meteor_spark.item_gate``). Re-sent copies of an item (same producer id
            and sequence) are dropped in both.

    Attributes:
        skipped_items: ring items lost and skipped (``skip_data_loss``), each counted once.
        skips: ``(lane, first lost offset, first offset read after)`` per skip.
        truncated_lanes: grouped, ``skip_data_loss``: lanes found truncated and refilled under the group's offset
            (``LaneTruncatedError`` otherwise) and read again from their oldest record.
        truncations: ``(lane, confirmed offset, offset read again from)`` of each of them.
        corrupt_items: undecodable ring items passed over (``on_corrupt`` skip or dead_letter).
        corrupt: ``(lane, sequence)`` of each of them.
        undecodable_records: records the deserializers refused and ``on_corrupt`` passed over (skip or dead_letter).
        delivered_records: records returned by ``poll``.
        item_gate: the ``meteor_spark.item_gate.ItemGate`` (isolation, re-sent copies); its counters
            (``aborted_items``, ``aborted_records``, ``duplicate_items``, ``duplicate_records``) are in ``metrics()``.

    Examples:
        >>> with Subscriber(grid, "orders", group="billing") as sub:      # doctest: +SKIP
        ...     batch = sub.poll(timeout_ms=100)
        ...     for record in batch:
        ...         handle(record)
        ...     sub.confirm()
    """

    def __new__(cls, grid: Grid, stream: StreamConfig | str, *, shared: bool = False, **options: Any) -> Any:
        """``shared=True`` makes a member of a shared group instead (queue semantics:
        ``meteor_spark.shared_groups.SharedSubscriber``)."""
        if shared:
            from meteor_spark.shared_groups import SharedSubscriber

            return SharedSubscriber(grid, stream, **options)
        misplaced = sorted({"acquisition_timeout_ms", "max_deliveries"} & set(options))
        if misplaced:
            raise ConfigError(f"{', '.join(misplaced)}: only for shared groups; add shared=True (with a group)")
        return super().__new__(cls)

    def __init__(
        self,
        grid: Grid,
        stream: StreamConfig | str,
        *,
        shared: bool = False,
        group: str | None = None,
        initial_offset_scheme: InitialOffsetScheme | str = InitialOffsetScheme.AUTO,
        skip_data_loss: bool = False,
        max_poll_records: int = 10_000,
        max_items_per_read: int = 100,
        max_bytes_per_read: int = 1 << 20,
        lease_ms: int = 5000,
        member_id: str | None = None,
        on_corrupt: str | None = None,
        dead_letter_stream: str | None = None,
        value_deserializer: str | Deserializer | None = None,
        key_deserializer: str | Deserializer | None = None,
        metrics: Any = None,
        auto_confirm_interval_ms: int | None = None,
        isolation: str | None = None,
        # shared groups' own: __new__ hands them to a SharedSubscriber, and refuses them without shared=True
        acquisition_timeout_ms: int | None = None,
        max_deliveries: int | None = None,
    ) -> None:
        require_grid(grid)
        registry = metrics_registry(metrics)
        self.item_gate = ItemGate(grid, isolation)
        self._value_deserializer = deserializer(value_deserializer, "value_deserializer")
        self._key_deserializer = deserializer(key_deserializer, "key_deserializer")
        self.scheme = InitialOffsetScheme.parse(initial_offset_scheme)
        self.corrupt_policy = CorruptItemPolicy.parse(on_corrupt, dead_letter_stream)
        check_int("max_poll_records", max_poll_records, 1, 1 << 31)
        check_int("max_items_per_read", max_items_per_read, 1, MAX_BATCH_ITEMS)
        check_int("max_bytes_per_read", max_bytes_per_read, 1, 1 << 31)
        if group is not None:
            check_text("group", group, what="(a group name, or None for an ungrouped subscriber)")
        if member_id is not None:
            check_text("member_id", member_id, what="(or None for a generated one)")
        check_int("lease_ms", lease_ms, 1, MAX_TIMEOUT_MS)
        if not isinstance(skip_data_loss, bool):
            raise ArgumentTypeError(f"skip_data_loss must be True or False, got {skip_data_loss!r}")
        if group is None and self.scheme is InitialOffsetScheme.NONE:
            raise ConfigError(
                "initial_offset_scheme NONE needs a group: an ungrouped subscriber has no stored offset to start "
                "from; use EARLIEST or LATEST, or give the subscriber a group"
            )
        if auto_confirm_interval_ms is not None and group is None:
            raise ConfigError(
                "auto_confirm_interval_ms needs a group: an ungrouped subscriber has no stored offsets to confirm; "
                "give the subscriber a group, or leave auto_confirm_interval_ms unset"
            )
        self._auto_confirm = None if auto_confirm_interval_ms is None else AutoConfirm(auto_confirm_interval_ms)
        self._grid = grid
        self.info: StreamInfo = open_stream(grid, stream)
        self.stream = self.info.name
        if self.corrupt_policy.dead_letter_stream == self.stream:
            raise ConfigError(
                f"dead_letter_stream={self.stream!r} is the stream being read: refused items would be read again; "
                f"name another stream"
            )
        self.group = group
        self.skip_data_loss = skip_data_loss
        self.max_poll_records = max_poll_records
        self._items_per_read = max_items_per_read
        self._bytes_per_read = max_bytes_per_read
        self._lease_ms = lease_ms
        self._member_id = member_id
        self._lock = threading.RLock()  # reader state
        self._poll_lock = threading.Lock()  # one poll at a time
        self._wakeup = threading.Event()
        self._lanes: dict[int, LaneState] = {}
        self._unconfirmed_lost: dict[int, int | None] = {}  # lane -> epoch of records delivered, lost unconfirmed
        self._orphans: list[Any] = []
        self._next_lane = 0
        self._member: Any = None
        self._receiver: Receiver | None = None
        self._closed = False
        self._active = True
        self.skipped_items = 0
        self.skips: list[tuple[int, int, int]] = []  # (lane, first lost offset, first offset read after)
        self.truncated_lanes = 0
        self.truncations: list[tuple[int, int, int]] = []  # (lane, confirmed offset, offset read again from)
        self.delivered_records = 0
        self._refusals: Refusals | None = None
        if group is None:
            for lane in range(self.info.lanes):
                ring = grid.ring(self.info.ring_names[lane])
                nxt = ring.tail() + 1
                start = resolve_initial(
                    self.scheme,
                    False,
                    None,
                    min(oldest_in(ring), nxt),
                    nxt,
                    where=f"stream {self.stream!r} lane {lane}",
                )
                self._lanes[lane] = LaneState(self.stream, lane, ring, ring.capacity(), start, None)
        else:
            member = self._join()
            if self.scheme is InitialOffsetScheme.NONE:
                missing = [lane for lane in range(self.info.lanes) if member.confirmed(lane) is None]
                if missing:
                    member.close()
                    raise GroupError(
                        f"initial_offset_scheme NONE: group {group!r} has no confirmed offset on stream "
                        f"{self.stream!r} lane(s) {missing}; confirm or seek the group first, or use EARLIEST/LATEST"
                    )
        try:
            self._refusals = Refusals(grid, self.stream, self.corrupt_policy)
        except BaseException:
            if self._member is not None:
                self._member.close()
            raise
        self._detach_metrics = attach_metrics(registry, self)

    # ------------------------------------------------------------------------------------------------ state

    def _join(self) -> GroupMember:
        member = GroupMember(
            self._grid,
            self.info,
            self.group,  # type: ignore[arg-type]
            member_id=self._member_id,
            lease_ms=self._lease_ms,
            on_change=lambda _assignment: self._wakeup.set(),
        )
        member.start()
        self._member = member
        return member

    def _sync_assignment(self) -> None:
        """Grouped: follow the member's assignment (new lanes start at the confirmed offset or the scheme)."""
        if self._member is None:
            return
        assignment = dict(self._member.assignment().items())
        with self._lock:
            for lane in [lane for lane in self._lanes if lane not in assignment]:
                self._drop_lane(lane, "no longer assigned")
            fresh = [
                (lane, epoch)
                for lane, epoch in assignment.items()
                if lane not in self._lanes or self._lanes[lane].epoch != epoch
            ]
        for lane, epoch in fresh:
            ring = self._grid.ring(self.info.ring_names[lane])
            oldest = oldest_in(ring)
            nxt = ring.tail() + 1
            try:
                position = self._member.initial_offset(lane, self.scheme, min(oldest, nxt), nxt)
            except (FencedError, NotAssignedError) as exc:
                logger.debug("lane %d lost while starting it: %s", lane, exc)
                continue
            state = LaneState(self.stream, lane, ring, ring.capacity(), position, epoch)
            if position > first_offset_of(nxt):
                # The group's offset lies past the lane's end (stream re-created, lane truncated, grid restarted
                # without persistence): reading on would silently skip every record written up to it.
                state.error = OffsetOutOfRangeError(
                    self.stream,
                    lane,
                    position,
                    first_offset_of(min(oldest, nxt)),
                    first_offset_of(nxt),
                    hint=(
                        f"It is the confirmed offset of group {self.group!r}: was the stream deleted and re-created, "
                        f"or the grid restarted without persistence? Seek the lane (Subscriber.seek, or "
                        f"meteor_spark.admin.seek_group with the group stopped) to a position inside the range."
                    ),
                )
            else:
                try:
                    self._check_resume(state, min(oldest, nxt))
                except (FencedError, NotAssignedError) as exc:
                    logger.debug("lane %d lost while starting it: %s", lane, exc)
                    continue
                position = state.position
            with self._lock:
                if lane in self._lanes:
                    self._drop_lane(lane, "assigned again with a new epoch")
                self._lanes[lane] = state
            logger.info(
                "subscriber of stream %r group %r: lane %d assigned (epoch %d), starting at offset %d",
                self.stream,
                self.group,
                lane,
                epoch,
                position,
            )

    def _check_resume(self, state: LaneState, oldest: int) -> None:
        """Grouped: compare the item mark stored with the lane's confirmed offset with the item now at its sequence
        (one read of one item, when a lane is taken up). Another item there means the lane was truncated and
        refilled under the offset (a member restart that lost the lane's last records): ``LaneTruncatedError`` on
        the lane, or with ``skip_data_loss`` the group's offset is moved back to the lane's oldest record, so what
        the lane holds now is delivered (some of it perhaps again) rather than passed over, and it is counted."""
        mark = self._member.confirmed_mark(state.lane)
        if mark is None:
            return
        verdict, _ = check_mark(state.ring, mark)
        if verdict != CHANGED:
            return  # the same history, or nothing left to compare with (overwritten: the data-loss path applies)
        confirmed = state.position
        restart = first_offset_of(oldest)
        if not self.skip_data_loss:
            state.error = LaneTruncatedError(
                self.stream,
                state.lane,
                confirmed,
                restart,
                mark.sequence,
                whose=f"group {self.group!r}'s offset",
                fix=(
                    f"Decide where the group goes on: seek the lane (Subscriber.seek, `meteor groups seek`, or "
                    f"meteor_spark.admin.seek_group with the group stopped), e.g. to the oldest record {restart}; or "
                    f"opt in to skip_data_loss=True, which re-reads the lane from its oldest record and counts it."
                ),
            )
            return
        self._member.seek(state.lane, restart)
        state.reset(restart)
        self.truncated_lanes += 1
        self.truncations.append((state.lane, confirmed, restart))
        logger.warning(
            "stream %r lane %d was truncated and refilled under group %r's offset %d (the item at sequence %d is "
            "not the one the offset was taken after); skip_data_loss is on: the group reads the lane again from "
            "its oldest record, offset %d (records read before the truncation may be delivered again)",
            self.stream,
            state.lane,
            self.group,
            confirmed,
            mark.sequence,
            restart,
        )

    def _drop_lane(self, lane: int, why: str) -> None:
        state = self._lanes.pop(lane)
        if state.pending is not None:
            self._orphans.append(state.pending)
        if state.dirty and why != "deactivated":
            # Delivered, not confirmed, and the lane is gone: the next confirm() says so instead of passing over it.
            self._unconfirmed_lost[lane] = state.epoch
        logger.info(
            "subscriber of stream %r group %r: stopped reading lane %d (%s)", self.stream, self.group, lane, why
        )

    # ------------------------------------------------------------------------------------------------ polling

    def poll(self, timeout_ms: float = 0) -> RecordBatch:
        """Records available now, or the first to arrive within ``timeout_ms``; empty when none came.

        Records read before a bad item are returned first; the error comes with the next poll. A lane stays
        stopped at its error until ``seek``.

        Raises:
            DataLossError: the next records are gone (unless ``skip_data_loss``).
            FormatError: a ring item cannot be decoded (named by stream, lane and sequence) and ``on_corrupt`` is
                ``error``; the position stays at the item; ``seek`` past it to go on.
            OffsetOutOfRangeError: the lane's position lies past its end.
            LaneTruncatedError: grouped, the lane was truncated and refilled under the group's offset (unless
                ``skip_data_loss``); ``seek`` the lane to go on.
            DeserializationError: a deserializer refused a record and ``on_corrupt`` is ``error``; the position
                stays at the record; ``seek`` past it to go on.
            GridError: the grid failed (for ``dead_letter``: publishing the refused item failed; retried by the
                next poll).
        """
        if self._closed:
            raise MeteorError(f"the subscriber of stream {self.stream!r} is closed; create a new one")
        check_timeout("poll timeout_ms", timeout_ms)
        deadline = time.monotonic() + timeout_ms / 1000.0
        with self._poll_lock:
            if self._auto_confirm is not None and self._auto_confirm.due():
                self._confirm_automatically()
            while True:
                self._wakeup.clear()
                if self._active:
                    self._sync_assignment()
                    self._harvest()
                    self._settle_bad_items()
                    if self._has_buffered() or self._has_error():
                        break
                    self._issue_reads()
                    self._harvest()
                    self._settle_bad_items()
                    if self._has_buffered() or self._has_error():
                        break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._wakeup.wait(min(remaining, self.item_gate.hold_left()))
            self._raise_stopped_lane()
            batch = self._take()
            if self._active:
                self._issue_reads()  # prefetch while the caller works on this batch
            return batch

    def _confirm_automatically(self) -> None:
        """Auto-confirm what earlier polls handed out. A lane lost meanwhile is logged, not raised: its new holder
        reads those records again (at-least-once), and the other lanes were confirmed."""
        assert self._auto_confirm is not None
        try:
            self.confirm()
        except FencedError as exc:
            logger.warning("auto-confirm of stream %r group %r: %s", self.stream, self.group, exc)
        self._auto_confirm.done()

    def _confirm_on_leaving(self) -> None:
        """With auto-confirm, before leaving the group (close, deactivate): confirm what was handed out, or with a
        receiver what its callback finished (not the rest of a batch it stopped in). A failure is logged: leaving
        goes on, and the next holder reads those records again."""
        if self._auto_confirm is None or self._member is None:
            return
        try:
            if self._receiver is not None:
                self._receiver.confirm_finished()
            else:
                self._confirm_automatically()
        except MeteorError as exc:
            logger.warning("auto-confirm of stream %r group %r on leaving failed: %s", self.stream, self.group, exc)

    def _has_buffered(self) -> bool:
        with self._lock:
            return any(state.buffered for state in self._lanes.values())

    def _has_error(self) -> bool:
        with self._lock:
            return any(state.error is not None for state in self._lanes.values())

    def _raise_stopped_lane(self) -> None:
        """Raise the error of a lane stopped at it, once the records read before it were delivered."""
        with self._lock:
            for lane in sorted(self._lanes):
                state = self._lanes[lane]
                if state.error is not None and not state.buffered:
                    raise state.error

    def _settle_bad_items(self) -> None:
        """Apply the corrupt-item policy to lanes stopped at an undecodable item (outside the reader lock: a
        dead letter waits for the grid)."""
        with self._lock:
            todo = [(state, state.bad) for state in self._lanes.values() if state.bad is not None]
        for state, (sequence, raw, error) in todo:
            if self.corrupt_policy.is_error:
                with self._lock:
                    state.bad = None
                    state.error = error
                continue
            self.refusals.dead_letter_item(state.lane, sequence, raw, error)  # returns once the grid acknowledged it
            with self._lock:
                if state.bad is None or state.bad[0] != sequence or state.fetch_seq != sequence:
                    continue  # sought meanwhile
                state.bad = None
                state.fetch_seq = sequence + 1
                state.passed_mark = mark_of(raw, sequence)
                state.passed()
                self.refusals.passed_item(state.lane, sequence, error)

    def _issue_reads(self) -> None:
        with self._lock:
            self._orphans = [f for f in self._orphans if not f.done()]
            for state in self._lanes.values():
                if state.pending is not None or state.buffered >= self.max_poll_records:
                    continue
                if state.error is not None or state.bad is not None:
                    continue  # stopped at a bad position until seek (or until the policy settles the item)
                if self.item_gate.held(state.lane):
                    continue  # waiting at an open transaction
                count = min(self._items_per_read, state.capacity, MAX_BATCH_ITEMS)
                # Until a lane's item size is known, a few items: its backlog may be of MiB-sized items.
                count = max(1, min(count, self._bytes_per_read // state.item_bytes if state.item_bytes else 4))
                future = state.ring.read_many_async(state.fetch_seq, 1, count)
                state.pending = future
                state.pending_seq = state.fetch_seq
                future.add_done_callback(self._on_read_done)

    def _on_read_done(self, _future: Any) -> None:
        self._wakeup.set()

    def _harvest(self) -> None:
        """Decode every finished read into buffered parts."""
        with self._lock:
            for state in list(self._lanes.values()):
                future = state.pending
                if future is None or not future.done():
                    continue
                state.pending = None
                if state.pending_seq != state.fetch_seq:
                    continue  # issued before a seek
                where = f"read stream {self.stream!r} lane {state.lane} at sequence {state.fetch_seq}"
                try:
                    batch = Ring.to_batch(result(future, where))
                except GridOperationError:
                    # A read parked on a ring that was destroyed meanwhile fails (DistributedObjectDestroyed). When
                    # the lane now ends before the position, that is a position past the end, not a grid failure.
                    end = state.ring.tail() + 1
                    if state.fetch_seq <= end:
                        raise
                    state.error = state.past_end(end)
                    continue
                if batch.items:
                    state.item_bytes = max(1, sum(map(len, batch.items)) // len(batch.items))
                    skip = state.accept(
                        list(batch.items),
                        list(batch.sequences),
                        skip_data_loss=self.skip_data_loss,
                        gate=self.item_gate,
                    )
                    if skip is not None:
                        self._count_skip(state.lane, skip)

    def _count_skip(self, lane: int, skip: Skip) -> None:
        self.skipped_items += skip.items
        self.skips.append((lane, skip.lost_from, skip.oldest))
        logger.warning(
            "stream %r lane %d: offsets %d..%d (ring items %d..%d) were gone (overwritten or quarantined) "
            "before they were read; skipped them (skip_data_loss is on)",
            self.stream,
            lane,
            skip.lost_from,
            skip.oldest - 1,
            skip.first_sequence,
            skip.next_sequence - 1,
        )

    def _take(self) -> RecordBatch:
        """Up to ``max_poll_records`` buffered records, lanes in rotation; lanes lost meanwhile are dropped."""
        with self._lock:
            lanes = sorted(self._lanes)
            if not lanes:
                return RecordBatch.empty()
            rotation = [lane for lane in lanes if lane >= self._next_lane]
            rotation += [lane for lane in lanes if lane < self._next_lane]
            budget = self.max_poll_records
            taken: dict[int, list[BatchPart]] = {}
            for lane in rotation:
                state = self._lanes[lane]
                parts: list[BatchPart] = []
                for part in state.parts:
                    if budget <= 0:
                        break
                    if part.size > budget:
                        part = BatchPart(
                            part.stream, part.lane, part.sequence, part.item, part.start, part.start + budget
                        )
                    parts.append(part)
                    budget -= part.size
                if parts:
                    taken[lane] = parts
                if budget <= 0:
                    break
            if not taken:
                return RecordBatch.empty()
            self._next_lane = (max(taken) + 1) % max(1, self.info.lanes)
        if self._member is not None:
            # Re-validate leases before delivering: a lane taken over meanwhile must not be delivered again.
            for lane in list(taken):
                if not self._member.is_current(lane):
                    del taken[lane]
                    with self._lock:
                        if lane in self._lanes:
                            self._drop_lane(lane, "lease lost before delivery")
        decoded = self._deserialize(taken) if self._deserializing else None
        out: list[BatchPart] = []
        records: list[Record] | None = None if decoded is None else []
        with self._lock:
            for lane, parts in taken.items():
                delivered = self._lanes.get(lane)
                if delivered is None:
                    continue
                for part in parts:
                    head = delivered.parts[0]
                    if part.stop >= head.stop:
                        delivered.parts.popleft()
                    else:
                        delivered.parts[0] = BatchPart(
                            head.stream, head.lane, head.sequence, head.item, part.stop, head.stop
                        )
                    delivered.buffered -= part.size
                if decoded is None:
                    out.extend(parts)
                elif records is not None:
                    out.extend(decoded[lane].parts)
                    records.extend(decoded[lane].records)
                    stopped = decoded[lane].stopped
                    if stopped is not None:
                        orphan = delivered.stop_at(*stopped)
                        if orphan is not None:
                            self._orphans.append(orphan)
                if not parts:
                    continue  # deserialization stopped the lane at its first record
                last = parts[-1]
                delivered.item_counts = {part.sequence: part.item.count for part in parts}
                delivered.delivered([part.sequence for part in parts])
                delivered.last_delivered = last.last_offset
                delivered.position = (
                    first_offset_of(last.sequence + 1)
                    if last.stop >= last.item.count
                    else make_offset(last.sequence, last.stop)
                )
                delivered.dirty = True
                delivered.passed()  # items skipped by policy right after the last delivered one
        batch = RecordBatch(out, records)
        self.delivered_records += len(batch)
        return batch

    @property
    def _deserializing(self) -> bool:
        return self._value_deserializer is not None or self._key_deserializer is not None

    def _deserialize(self, taken: dict[int, list[BatchPart]]) -> dict[int, DecodedLane]:
        return self.refusals.deserialize(taken, self._value_deserializer, self._key_deserializer)

    # ------------------------------------------------------------------------------------------------ offsets

    def _lane_arg(self, lane: int | None, what: str) -> int:
        if lane is None:
            if self.info.lanes == 1:
                return 0
            raise ConfigError(
                f"{what}: stream {self.stream!r} has {self.info.lanes} lanes; say which one (lane=...), or pass a "
                f"Record"
            )
        try:
            return check_lane(self.info, lane)
        except ConfigError as exc:
            raise ConfigError(f"{what}: {exc}") from None

    def position(self, lane: int | None = None) -> int:
        """Offset of the next record this subscriber will deliver on ``lane``."""
        lane = self._lane_arg(lane, "position")
        with self._lock:
            state = self._lanes.get(lane)
            if state is None:
                raise NotAssignedError(f"lane {lane} of stream {self.stream!r} is not assigned to this subscriber")
            return state.position

    def positions(self) -> dict[int, int]:
        """``position`` of every lane this subscriber reads."""
        with self._lock:
            return {lane: state.position for lane, state in sorted(self._lanes.items())}

    def last_offset(self, lane: int | None = None) -> int:
        """Offset of the last record delivered on ``lane`` (-1 before the first)."""
        lane = self._lane_arg(lane, "last_offset")
        with self._lock:
            state = self._lanes.get(lane)
            return -1 if state is None else state.last_delivered

    def confirm(self, offset: int | Record | None = None, *, lane: int | None = None) -> None:
        """Grouped: store in the group that records were processed (synchronous, fenced).

        ``confirm()`` confirms everything delivered so far on every lane (a no-op before the first delivery);
        ``confirm(offset, lane=...)`` or ``confirm(record)`` confirms up to and including that record.

        Raises:
            GroupError: ungrouped subscriber. FencedError: the lane was taken over (nothing written for it; with
            ``confirm()``, the other lanes are confirmed first).
            ConfigError: an offset that was not delivered yet.
        """
        self._need_group("confirm")
        if offset is None:
            with self._lock:
                todo = [
                    (lane_, s.position, s.epoch, s.position_mark) for lane_, s in sorted(self._lanes.items()) if s.dirty
                ]
            lost_now: dict[int, int | None] = {}
            for lane_, position, epoch, mark in todo:
                try:
                    self._member.confirm(lane_, position, epoch=epoch, mark=mark)
                except (FencedError, NotAssignedError):  # lost since; the poll that notices drops it
                    lost_now[lane_] = epoch
                    continue
                with self._lock:
                    state = self._lanes.get(lane_)
                    if state is not None and state.position == position:
                        state.dirty = False
            with self._lock:
                lost, self._unconfirmed_lost = self._unconfirmed_lost, {}
            lost.update(lost_now)
            if lost:
                raise FencedError(
                    f"confirm refused for stream {self.stream!r} lane(s) {sorted(lost)} of group {self.group!r}: "
                    f"this member lost them (epochs {[lost[lane] for lane in sorted(lost)]}) after delivering records "
                    f"it had not confirmed; nothing was written for them, and the lanes' new holders read those "
                    f"records again"
                )
            return
        if isinstance(offset, Record):
            lane, offset = offset.lane, offset.offset
        lane = self._lane_arg(lane, "confirm")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ConfigError(f"confirm: offset {offset!r} is invalid; give the offset of a delivered record (>= 0)")
        with self._lock:
            state = self._lanes.get(lane)
            last = -1 if state is None else state.last_delivered
        if offset > last:
            raise ConfigError(
                f"confirm: offset {offset} on lane {lane} of stream {self.stream!r} was not delivered to this "
                f"subscriber (last delivered: {last}); confirm only records you processed"
            )
        with self._lock:
            count = state.item_counts.get(sequence_of(offset)) if state is not None else None
            mark = state.mark_of_delivered(sequence_of(offset)) if state is not None else None
        # "The next record" after the last one of an item is the next item's first (offset + 1 would be read
        # the same way, but would count the finished item as lag).
        after = first_offset_of(sequence_of(offset) + 1) if count == index_of(offset) + 1 else offset + 1
        self._member.confirm(lane, after, epoch=None if state is None else state.epoch, mark=mark)

    def seek(self, offset: int, *, lane: int | None = None) -> None:
        """Continue reading ``lane`` at ``offset`` (ungrouped: locally; grouped: moves the group's offset, fenced).

        Also the way on from a lane stopped at an error (data loss, corrupt item, position past the end).
        An offset below the oldest record the grid can serve is accepted: reading it is data loss (raised, or
        skipped with ``skip_data_loss``).

        Raises:
            ConfigError: a negative offset, or a lane the stream does not have.
            OffsetOutOfRangeError: an offset past the lane's end (the valid range is named).
        """
        if self._closed:
            raise MeteorError(f"the subscriber of stream {self.stream!r} is closed")
        lane = self._lane_arg(lane, "seek")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ConfigError(f"seek: offset {offset!r} is invalid; offsets are integers >= 0")
        ring = self._grid.ring(self.info.ring_names[lane])
        end = ring.tail() + 1
        if offset > first_offset_of(end):
            oldest = min(oldest_in(ring), end)
            raise OffsetOutOfRangeError(
                self.stream,
                lane,
                offset,
                first_offset_of(oldest),
                first_offset_of(end),
                hint="Seek to a position inside the range, or to the end to read only new records.",
            )
        if self._member is not None:
            with self._lock:
                if lane not in self._lanes:
                    raise NotAssignedError(
                        f"seek: lane {lane} of stream {self.stream!r} is not assigned to this member of group "
                        f"{self.group!r}"
                    )
            self._member.seek(lane, offset)
        with self._lock:
            state = self._lanes[lane]
            orphan = state.reset(offset)
            if orphan is not None:
                self._orphans.append(orphan)

    def seek_to_timestamp(self, ts_ms: int, *, lane: int | None = None) -> dict[int, int | None]:
        """Continue reading each lane (every lane this subscriber reads, or only ``lane``) at the first record whose
        timestamp is >= ``ts_ms`` (ms since the epoch), found by ``timestamps.offset_for_timestamp`` (a binary
        search over ring items; its docstring says what out-of-order timestamps do). Grouped, it moves the group's
        offsets, like ``seek``.

        A lane with no such record is moved to its end (only records published from now on are read); Kafka's
        ``offsetsForTimes`` returns None there and leaves the choice to the caller, which the returned mapping
        still shows.

        Returns:
            lane -> the offset found, or None for a lane moved to its end.

        Raises:
            ConfigError: a timestamp that is not an integer >= 0, or a lane the stream does not have.
            NotAssignedError: grouped, ``lane`` is not assigned to this member.
        """
        check_int("seek_to_timestamp: ts_ms", ts_ms, 0, MAX_TIMESTAMP_MS, what="(ms since the epoch)")
        if lane is None:
            with self._lock:
                lanes = sorted(self._lanes)
        else:
            lanes = [self._lane_arg(lane, "seek_to_timestamp")]
        found: dict[int, int | None] = {}
        for each in lanes:
            offset = offset_for_timestamp(self._grid, self.info, each, ts_ms)
            found[each] = offset
            if offset is None:
                offset = first_offset_of(self._grid.ring(self.info.ring_names[each]).tail() + 1)
            self.seek(offset, lane=each)
        return found

    # ------------------------------------------------------------------------------------------------ groups

    def _need_group(self, what: str) -> None:
        if self.group is None:
            raise GroupError(
                f"{what} needs a subscriber group: an ungrouped subscriber keeps its position locally; create it "
                f"with group=... to store offsets in the grid"
            )

    def is_assigned(self) -> bool:
        """Ungrouped: always True. Grouped: holds at least one lane."""
        if self._member is None:
            return self.group is None
        return bool(self._member.assignment())

    @property
    def lanes(self) -> list[int]:
        """The lanes this subscriber reads now."""
        with self._lock:
            return sorted(self._lanes)

    @property
    def member(self) -> Any:
        """Grouped: the ``GroupMember`` (None when ungrouped or deactivated)."""
        return self._member

    def deactivate(self) -> None:
        """Grouped: leave the group (its lanes go to other members); ``poll`` returns nothing until ``reactivate``.

        Confirm what was processed first (with ``auto_confirm_interval_ms`` this does it): unconfirmed records are
        read again by the next holder.
        """
        self._need_group("deactivate")
        with self._poll_lock:
            self._confirm_on_leaving()
            member, self._member = self._member, None
            self._active = False
            with self._lock:
                for lane in list(self._lanes):
                    self._drop_lane(lane, "deactivated")
        if member is not None:
            member.close()

    def reactivate(self) -> None:
        """Grouped: join the group again after ``deactivate``."""
        self._need_group("reactivate")
        with self._poll_lock:
            if self._active:
                return
            self._join()
            self._active = True
        self._wakeup.set()

    # ------------------------------------------------------------------------------------------------ receiver

    def attach_receiver(
        self,
        callback: RecordHandler,
        poll_timeout_ms: float = 100,
        *,
        on_error: ErrorHandler | None = None,
        per_batch: bool = False,
        auto_confirm_interval_ms: int | None = None,
    ) -> Receiver:
        """Deliver records to ``callback`` on a background thread (at most one receiver per subscriber);
        ``auto_confirm_interval_ms``: confirm what the callback finished (``Receiver``)."""
        if self._receiver is not None and self._receiver.is_alive():
            raise ConfigError(
                f"the subscriber of stream {self.stream!r} already has a receiver; close it before attaching another"
            )
        self._receiver = Receiver(
            self,
            callback,
            poll_timeout_ms,
            on_error=on_error,
            per_batch=per_batch,
            auto_confirm_interval_ms=auto_confirm_interval_ms,
        )
        return self._receiver

    # ------------------------------------------------------------------------------------------------ lifecycle

    @property
    def refusals(self) -> Refusals:
        """Undecodable items and refused records: dead letters and counts (``meteor_spark.refusals``)."""
        assert self._refusals is not None
        return self._refusals

    @property
    def corrupt_items(self) -> int:
        return self.refusals.corrupt_items

    @property
    def corrupt(self) -> list[tuple[int, int]]:
        return self.refusals.corrupt

    @property
    def undecodable_records(self) -> int:
        return self.refusals.undecodable_records

    def metrics(self) -> dict[str, int]:
        """Counters since creation; grouped, also the group member's lease figures and the lanes it holds."""
        figures = {
            "delivered_records": self.delivered_records,
            "skipped_items": self.skipped_items,
            "corrupt_items": self.corrupt_items,
            "undecodable_records": self.undecodable_records,
            **self.item_gate.counters(),
        }
        member = self._member
        if member is not None:
            figures.update(member.metrics())
        return figures

    def lag(self) -> dict[int, int]:
        """Ring items behind each lane's end, from the next record to deliver, per lane read (one grid call per
        lane)."""
        with self._lock:
            lanes = [(state.lane, state.ring, state.position) for state in self._lanes.values()]
        return {lane: max(0, ring.tail() + 1 - sequence_of(position)) for lane, ring, position in lanes}

    def close(self) -> None:
        """Stop the receiver, leave the group (grouped), close the dead-letter publisher. Confirm what was processed
        before closing (with ``auto_confirm_interval_ms`` close does it: what was handed out, or with a receiver
        what its callback finished)."""
        if self._closed:
            return
        if self._receiver is not None:
            self._receiver.close()
        self._confirm_on_leaving()
        if self._detach_metrics is not None:
            self._detach_metrics()
        self._closed = True
        self._wakeup.set()
        with self._poll_lock:
            member, self._member = self._member, None
            with self._lock:
                self._lanes.clear()
        try:
            if member is not None:
                member.close()
        finally:
            self.refusals.close()

    def __enter__(self) -> Subscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        kind = f"group {self.group!r}" if self.group else "ungrouped"
        return f"Subscriber(stream={self.stream!r}, {kind}, lanes={self.lanes})"
