"""A ``Subscriber``'s positions: ``position``, ``confirm``, ``seek`` (``SubscriberOffsets``, a base class of
``Subscriber``).

Offsets: ``position(lane)`` is the offset of the next record to deliver; ``last_offset(lane)`` that of the last
one delivered. ``confirm()`` stores every delivered position in the group (the confirmed offset means "the next
record to read"); ``confirm(offset)`` / ``confirm(record)`` stores "everything up to and including this record".
``seek`` moves a lane (ungrouped: locally; grouped: the group's offset, fenced). ``SubscriberOffsets`` holds no
state of its own: the attributes it declares are the ``Subscriber``'s; it is a separate class only to keep the
offset API in one module.
"""

from __future__ import annotations

from meteor_spark.consumer.lane_state import SubscriberFields, confirm_point
from meteor_spark.consumer.topics import refuse_on_ephemeral
from meteor_spark.errors import (
    ConfigError,
    FencedError,
    GroupError,
    MeteorError,
    NotAssignedError,
    OffsetOutOfRangeError,
)
from meteor_spark.format.offsets import (
    first_offset_of,
)
from meteor_spark.format.records import Record
from meteor_spark.grid.item_marks import ItemMark
from meteor_spark.grid.reading import check_lane, oldest_in
from meteor_spark.grid.timestamps import MAX_TIMESTAMP_MS, offset_for_timestamp
from meteor_spark.groups.protocol import lost_in_transaction_error, unconfirmed_lost_error
from meteor_spark.validate import check_int


class SubscriberOffsets(SubscriberFields):
    """The offset API of a ``Subscriber`` (see the module docs); every attribute is the ``Subscriber``'s."""

    _closed: bool

    def _need_group(self, what: str) -> None:
        if self.group is None:
            raise GroupError(
                f"{what} needs a subscriber group: an ungrouped subscriber keeps its position locally; create it "
                f"with group=... to store offsets in the grid"
            )

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
        refuse_on_ephemeral(self.info, "confirm")
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
                    if state is not None:
                        state.confirmed_at(position)
            with self._lock:
                lost, self._unconfirmed_lost = self._unconfirmed_lost, {}
            lost.update(lost_now)
            if lost:
                raise unconfirmed_lost_error(self.stream, self.group, lost)
            return
        if isinstance(offset, Record):
            lane, offset = offset.lane, offset.offset
        lane = self._lane_arg(lane, "confirm")
        with self._lock:
            after, epoch, mark = confirm_point(self.stream, lane, offset, self._lanes.get(lane))
        self._member.confirm(lane, after, epoch=epoch, mark=mark)

    def delivered_unconfirmed(self) -> list[tuple[int, int, int | None, ItemMark | None]]:
        """``(lane, position, epoch, mark)`` of every lane with records delivered since its last confirm: what a
        transaction stages (``meteor_spark.consumer.transactional``).

        Raises:
            GroupError: ungrouped. FencedError: lanes lost (and dropped) after delivering records not confirmed
            yet: their new holders read those records again, so a transaction holding them must abort.
        """
        self._need_group("send_offsets")
        with self._lock:
            todo = [(lane, s.position, s.epoch, s.position_mark) for lane, s in sorted(self._lanes.items()) if s.dirty]
            lost, self._unconfirmed_lost = self._unconfirmed_lost, {}
        if lost:
            raise lost_in_transaction_error(self.stream, self.group, lost)
        return todo

    def mark_confirmed(self, positions: dict[int, int]) -> None:
        """Note that ``positions`` (lane -> position) are the group's offsets now (a committed transaction)."""
        with self._lock:
            for lane, position in positions.items():
                state = self._lanes.get(lane)
                if state is not None:
                    state.confirmed_at(position)

    def rewind(self) -> dict[int, int]:
        """Move every held lane back to the group's confirmed offset, locally (the group's offsets are not
        written): what an aborted transaction's records came from is delivered again, as after Kafka's
        ``abortTransaction`` and a seek to the committed offsets. Returns lane -> position now."""
        self._need_group("rewind")
        member = self._member
        if member is None:
            return {}
        with self._lock:
            lanes = sorted(self._lanes)
        for lane in lanes:
            try:
                member.settle_staged(lane)  # a committed transaction's offset not applied yet counts
            except (FencedError, NotAssignedError):
                continue  # lost: the poll that notices drops the lane
        confirmed = member.known_offsets(lanes)
        moved: dict[int, int] = {}
        with self._lock:
            for lane in lanes:
                state = self._lanes.get(lane)
                offset = confirmed.get(lane)
                if state is None or offset is None:
                    continue
                orphan = state.back_at(offset)
                if orphan is not None:
                    self._orphans.append(orphan)
                moved[lane] = offset
        return moved

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
        if self.info.config.ephemeral:
            with self._lock:
                current = self._lanes[lane].position if lane in self._lanes else None
            if current is not None and offset < current:
                refuse_on_ephemeral(self.info, f"seek back to offset {offset} on lane {lane}")
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
