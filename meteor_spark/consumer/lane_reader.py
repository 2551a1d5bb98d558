"""How a ``Subscriber`` reads its lanes: the steps of a ``poll`` (``LaneReader``, a base class of ``Subscriber``).

``meteor_spark.consumer.subscriber`` holds the public API and the poll loop; each step of the loop lives here: follow
the group's assignment (taking a lane up checks its confirmed offset and item mark), notice a lost grid connection,
issue one ``read_many`` per lane, take answers in (``meteor_spark.consumer.lane_state``), settle undecodable items and
truncated lanes, and hand a batch out. ``LaneReader`` holds no state of its own: the attributes it declares are the
``Subscriber``'s, set in its ``__init__``; it is a separate class only to keep the reading in one module.

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
(``meteor_spark.grid.item_marks``), and when it takes a lane up it reads that one item again. Another item at that
sequence means a member restart lost the lane's last records and new records took their sequences, below the
group's offset: ``LaneTruncatedError`` (a ``DataLossError``) on that lane; with ``skip_data_loss`` the group's offset
moves back to the lane's oldest record (re-delivering, never skipping, what the lane holds now) and it is counted
(``truncated_lanes``).

Corrupt items: a ring item that cannot be decoded (damaged, foreign, or of a newer format version) is handled by
the ``on_corrupt`` policy (``meteor_spark.format.corrupt``): ``error`` (default) raises ``FormatError`` with the
position left AT the item; ``skip`` passes over it and counts it (``corrupt_items``); ``dead_letter`` publishes the raw
item to a dead-letter stream, waits for the grid's acknowledgement, and only then moves past it.

Deserializers: with ``value_deserializer`` / ``key_deserializer`` the records returned carry the objects in
``value`` / ``key``. A record they refuse (e.g. invalid JSON) goes through the same ``on_corrupt`` choice:
``error`` raises ``DeserializationError`` naming stream, lane and offset, once the records before it were returned,
with the position left AT the record; ``skip`` leaves it out (counted in ``undecodable_records``, logged);
``dead_letter`` publishes it as stored (value, key, headers, plus source headers and the error) and leaves it out.
A skipped or dead-lettered record counts as processed: the position moves past it, so ``confirm()`` confirms it.

Errors and good records: a poll first returns the records read before a bad item (corrupt, lost, out of range);
the error is raised by the next poll, which finds nothing left before it in that lane. Errors stay until the
application seeks the lane (they are conditions of the position, not of the read).

Lost connections: the client reconnects and retries reads on its own, so a reader stays connected across a member
restart without resuming anything. After the grid lost a connection (``Grid.connection_losses``), each lane's next
read starts one item early and compares that item with the one read before (``LaneState.connection_lost``): the
same item, reading goes on; another item, or a lane now ending below it, means the restarted member lost the lane's
tail and new records took its sequences: once the records read before are delivered, ``LaneTruncatedError`` on the
lane, or with ``skip_data_loss`` the lane (grouped: the group's offset) goes back to its oldest record, counted in
``truncated_lanes``. A read outstanding across the loss is not taken in. A lane that has read nothing yet since it
started (or since a seek) knows no item to compare, and is not checked (a grouped lane taken up is checked against
its confirmed mark instead).
"""

from __future__ import annotations

import logging
from typing import Any

from meteor_spark.consumer.lane_state import LaneState, Skip, choose_parts, deliver_taken
from meteor_spark.consumer.refusals import Refusals
from meteor_spark.consumer.topics import TopicReading
from meteor_spark.consumer.wakeup import Wakeup
from meteor_spark.errors import (
    FencedError,
    GridOperationError,
    LaneTruncatedError,
    NotAssignedError,
    OffsetOutOfRangeError,
)
from meteor_spark.format.corrupt import CorruptItemPolicy
from meteor_spark.format.offsets import (
    InitialOffsetScheme,
    first_offset_of,
)
from meteor_spark.format.records import BatchPart, RecordBatch
from meteor_spark.format.serializers import DecodedLane, Deserializer
from meteor_spark.grid.client import result
from meteor_spark.grid.item_gate import ItemGate
from meteor_spark.grid.item_marks import CHANGED, SAME, ItemMark, check_mark
from meteor_spark.grid.reading import oldest_in
from meteor_spark.groups.protocol import truncated_lane_error
from meteor_spark.groups.redelivery import now_ms

logger = logging.getLogger(__name__)


class LaneReader(TopicReading):
    """The reading steps of a ``Subscriber`` (see the module docs); every attribute is the ``Subscriber``'s."""

    scheme: InitialOffsetScheme
    skip_data_loss: bool
    max_poll_records: int
    item_gate: ItemGate
    corrupt_policy: CorruptItemPolicy
    skipped_items: int
    skips: list[tuple[int, int, int]]
    truncated_lanes: int
    truncations: list[tuple[int, int, int]]
    delivered_records: int
    _next_lane: int
    _wakeup: Wakeup
    _full_lanes: bool
    _lanes_unread: bool
    _items_per_read: int
    _bytes_per_read: int
    _value_deserializer: Deserializer | None
    _key_deserializer: Deserializer | None
    _refusals: Refusals | None

    @property
    def refusals(self) -> Refusals:
        """Undecodable items and refused records: dead letters and counts (``meteor_spark.consumer.refusals``)."""
        assert self._refusals is not None
        return self._refusals

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
                position = self._lane_start(lane, position, nxt)
            except (FencedError, NotAssignedError) as exc:
                logger.debug("lane %d lost while starting it: %s", lane, exc)
                continue
            state = LaneState(self.stream, lane, ring, ring.capacity(), position, epoch, self._grid.connection_losses)
            state.not_before, _ = self._member.hold_of(lane)  # a delayed nack's pause holds for every member
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
                        f"meteor_spark.groups.admin.seek_group with the group stopped) to a position inside the range."
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
        if verdict == SAME and mark.sequence == state.fetch_seq - 1:
            state.position_mark = mark  # what a read after a lost connection checks first
        if verdict != CHANGED:
            return  # the same history, or nothing left to compare with (overwritten: the data-loss path applies)
        confirmed = state.position
        restart = first_offset_of(oldest)
        if not self.skip_data_loss:
            state.error = truncated_lane_error(
                self.stream, state.lane, self.group, confirmed, restart, mark.sequence, "Subscriber.seek"
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

    def _take_in(self) -> bool:
        """Take answered reads in and settle what they stopped at (undecodable items, truncated lanes); True when
        records or an error are ready to hand out. One scan of the lanes tells which settling steps have work: a
        poll that finds nothing to settle (nearly every one) takes the reader lock once, not five times. The same
        scan notes whether a lane lacks a read (``_lanes_unread``): when none does, ``_issue_reads`` has nothing to
        start, and a poll waiting for an answer skips it."""
        bad = truncated = ready = unread = False
        with self._lock:
            self._harvest()
            for state in self._lanes.values():
                if state.pending is None:
                    unread = True
                if state.bad is not None:
                    bad = True
                if state.truncated is not None:
                    truncated = True
                if state.buffered or state.error is not None:
                    ready = True
            self._lanes_unread = unread
        if not (bad or truncated):
            return ready
        self._lanes_unread = True  # settling may reset a lane (its read orphaned)
        if bad:
            self._settle_bad_items()
        if truncated:
            self._settle_truncations()
        return self._has_buffered() or self._has_error()

    def _has_buffered(self) -> bool:
        with self._lock:
            return any(state.buffered for state in self._lanes.values())

    def _has_error(self) -> bool:
        with self._lock:
            return any(state.error is not None or state.truncated is not None for state in self._lanes.values())

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
                    state.fail_bad_item()
                continue
            self.refusals.dead_letter_item(state.lane, sequence, raw, error)  # returns once the grid acknowledged it
            with self._lock:
                if state.pass_bad_item(sequence, raw):
                    self.refusals.passed_item(state.lane, sequence, error)

    def _notice_connection_losses(self) -> int:
        """(Reader lock held.) After the grid lost a connection (``Grid.connection_losses``), every lane's next read
        first verifies the item it read last (``LaneState.connection_lost``): the client reconnects and retries on
        its own, and a member that restarted may hold a lane truncated and refilled under the lane's position, which
        reading on would silently skip. Reads outstanding across the loss are orphaned. Returns the count."""
        losses = self._grid.connection_losses
        for state in self._lanes.values():
            if state.losses_seen != losses:
                orphan = state.connection_lost(losses)
                if orphan is not None:
                    self._orphans.append(orphan)
        return losses

    def _settle_truncations(self) -> None:
        """Lanes found truncated and refilled under their position after a lost connection (a member restart
        that lost their tail), once the records read before are delivered: ``LaneTruncatedError`` on the lane, or
        with ``skip_data_loss`` the lane (and grouped, the group's offset) goes back to its oldest record, counted
        like a truncation found on resuming (``_check_resume``). Outside the reader lock: it asks the grid."""
        with self._lock:
            todo = [
                (state, state.truncated) for state in self._lanes.values() if state.truncated and not state.buffered
            ]
        for state, mark in todo:
            assert mark is not None
            oldest = first_offset_of(min(oldest_in(state.ring), state.ring.tail() + 1))
            with self._lock:
                if self._lanes.get(state.lane) is not state or state.truncated is not mark:
                    continue  # sought or lost meanwhile
                position = state.position
                if not self.skip_data_loss:
                    state.truncated = None
                    state.error = self._live_truncation_error(state.lane, position, oldest, mark)
                    continue
            if self._member is not None:
                try:
                    self._member.seek(state.lane, oldest)
                except (FencedError, NotAssignedError) as exc:
                    logger.debug("lane %d lost while reading it again: %s", state.lane, exc)
                    continue  # the poll that notices drops it
            with self._lock:
                orphan = state.reset(oldest)
                if orphan is not None:
                    self._orphans.append(orphan)
            self.truncated_lanes += 1
            self.truncations.append((state.lane, position, oldest))
            logger.warning(
                "stream %r lane %d was truncated and refilled under this subscriber's position %d while it read (the "
                "item at sequence %d changed across a lost connection: a member restarted and lost the lane's last "
                "records); skip_data_loss is on: reading the lane again from its oldest record, offset %d (records "
                "read before the truncation may be delivered again)",
                self.stream,
                state.lane,
                position,
                mark.sequence,
                oldest,
            )

    def _live_truncation_error(self, lane: int, position: int, oldest: int, mark: ItemMark) -> LaneTruncatedError:
        whose = "this subscriber's position" if self.group is None else f"the position of group {self.group!r}"
        return LaneTruncatedError(
            self.stream,
            lane,
            position,
            oldest,
            mark.sequence,
            whose=f"{whose}, while it read across a lost connection",
            fix=(
                f"Decide where reading goes on: seek the lane (Subscriber.seek), e.g. to the oldest record {oldest}; "
                f"or opt in to skip_data_loss=True, which re-reads the lane from its oldest record and counts it."
            ),
        )

    def _issue_reads(self) -> int:
        """Start a read on every lane that has none outstanding and may read; returns how many were started."""
        issued = 0
        full = False
        with self._lock:
            if self._orphans:
                self._orphans = [f for f in self._orphans if not f.done()]
            losses = self._notice_connection_losses()
            for state in self._lanes.values():
                if state.pending is not None:
                    continue
                if state.buffered >= self.max_poll_records:
                    full = True  # read once a batch has drained it
                    continue
                if state.error is not None or state.bad is not None or state.truncated is not None:
                    continue  # stopped at a bad position until seek (or until the policy settles the item)
                if self.item_gate.held(state.lane):
                    continue  # waiting at an open transaction
                if state.not_before and state.not_before > now_ms():
                    continue  # paused by a delayed nack until then (0: never paused)
                count = state.read_count(self._items_per_read, self._bytes_per_read)
                future = state.ring.read_batch_async(state.read_start(), 1, count)
                state.pending = future
                state.pending_seq = state.fetch_seq
                state.pending_losses = losses
                future.add_done_callback(self._on_read_done)
                issued += 1
            self._full_lanes = full
        return issued

    def _on_read_done(self, _future: Any) -> None:
        self._wakeup.set()

    def _harvest(self) -> None:
        """Decode every finished read into buffered parts."""
        with self._lock:
            self._notice_connection_losses()
            for state in list(self._lanes.values()):
                future = state.pending
                if future is None or not future.done():
                    continue
                state.pending = None
                if state.pending_seq != state.fetch_seq:
                    continue  # issued before a seek
                if state.pending_losses != self._grid.connection_losses:
                    # Sent before a connection loss and perhaps answered after a restart (read only once it is done:
                    # the count rises first); read again once the lane's last item is verified.
                    state.connection_lost(self._grid.connection_losses)
                    continue
                try:
                    if future.is_success():  # the usual answer: no message to format
                        batch = future.result()
                    else:
                        where = f"read stream {self.stream!r} lane {state.lane} at sequence {state.fetch_seq}"
                        batch = result(future, where)
                except GridOperationError:
                    # A read parked on a ring that was destroyed meanwhile fails (DistributedObjectDestroyed). When
                    # the lane now ends before the position, that is a position past the end, not a grid failure.
                    end = state.ring.tail() + 1
                    if state.verify is not None and state.verify.sequence >= end:
                        state.truncated, state.verify = state.verify, None  # an item this reader read is gone
                        continue
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
        taken = self._choose_parts()
        if not taken:
            return RecordBatch.empty()
        if self._member is not None:
            # Re-validate leases before delivering: a lane taken over meanwhile must not be delivered again.
            for lane in list(taken):
                if not self._member.is_current(lane):
                    del taken[lane]
                    with self._lock:
                        if lane in self._lanes:
                            self._drop_lane(lane, "lease lost before delivery")
        decoded = self._deserialize(taken) if self._deserializing else None
        with self._lock:
            out, records, orphans = deliver_taken(self._lanes, taken, decoded)
            self._orphans.extend(orphans)
        batch = RecordBatch(out, records)
        self.delivered_records += len(batch)
        return batch

    def _choose_parts(self) -> dict[int, list[BatchPart]]:
        """The buffered parts the next batch takes, lane -> parts (the last one cut to the budget): up to
        ``max_poll_records`` records, lanes in rotation from ``_next_lane`` so no lane starves."""
        with self._lock:
            taken, self._next_lane = choose_parts(self._lanes, self._next_lane, self.max_poll_records, self.info.lanes)
            return taken

    @property
    def _deserializing(self) -> bool:
        return self._value_deserializer is not None or self._key_deserializer is not None

    def _deserialize(self, taken: dict[int, list[BatchPart]]) -> dict[int, DecodedLane]:
        return self.refusals.deserialize(taken, self._value_deserializer, self._key_deserializer)
