"""An ``AsyncSubscriber``'s exclusive group: its lanes follow an ``AsyncGroupMember``'s assignment.

The threaded grouped ``Subscriber``'s rules (``meteor_spark.consumer.lane_reader`` / ``subscriber_offsets``), on the
event loop: a lane assigned starts at the group's confirmed offset (else the initial scheme, confirmed at once), a
group offset past the lane's end is ``OffsetOutOfRangeError``, the item mark stored with the offset is compared with
the item now at its sequence (``LaneTruncatedError``, or with ``skip_data_loss`` the group's offset moved back to
the lane's oldest record, counted); a lane no longer assigned is dropped, and if it had delivered records not
confirmed, the next ``confirm()`` says so (``FencedError``); leases are re-validated before delivering; a lane paused
by a delayed ``nack`` (this member's, ``meteor_spark.aio.nack``, or another's) is not read before its instant.
On an ephemeral stream (``meteor_spark.consumer.topics``' rules) a lane whose offset is still the one stored when
the group was gone starts at its end (``stale_offsets``), ``save_positions`` stores the lanes' positions before a
poll hands their records out, and ``confirm`` is refused.
``confirm``, ``deactivate`` / ``reactivate`` (``leave`` / ``rejoin``) and what a transaction needs of a subscriber
(``delivered_unconfirmed``, ``mark_confirmed``, ``rewind``) are the threaded one's, awaited.
"""

from __future__ import annotations

import asyncio
import logging

from meteor_spark.aio.group_member import AsyncGroupMember
from meteor_spark.aio.nack import AsyncNack, dead_letter_publisher, group_settings
from meteor_spark.aio.views import RingBounds
from meteor_spark.consumer.auto_confirm import AutoConfirm
from meteor_spark.consumer.lane_state import LaneState, confirm_point
from meteor_spark.consumer.topics import ephemeral_lane_start, refuse_on_ephemeral
from meteor_spark.errors import (
    ConfigError,
    FencedError,
    GroupError,
    MeteorError,
    NotAssignedError,
    OffsetOutOfRangeError,
)
from meteor_spark.format.offsets import InitialOffsetScheme, first_offset_of
from meteor_spark.format.records import BatchPart, Record
from meteor_spark.grid.aio_client import AsyncGrid
from meteor_spark.grid.item_marks import CHANGED, SAME, ItemMark, verdict_of
from meteor_spark.groups.exclusive_settings import ExclusiveSettings
from meteor_spark.groups.protocol import (
    check_lane,
    lost_in_transaction_error,
    truncated_lane_error,
    unconfirmed_lost_error,
)
from meteor_spark.groups.redelivery import now_ms

__all__ = ["GroupedLanes"]

logger = logging.getLogger(__name__)


class GroupedLanes:
    """The group side of one ``AsyncSubscriber`` (see the module docs): it changes the subscriber's ``lanes`` and
    ``bounds`` dicts in place, on the loop."""

    def __init__(
        self,
        member: AsyncGroupMember,
        lanes: dict[int, LaneState],
        bounds: dict[int, RingBounds],
        *,
        scheme: InitialOffsetScheme | str,
        skip_data_loss: bool,
        auto_confirm: AutoConfirm | None,
        stale_offsets: dict[int, int] | None = None,
    ) -> None:
        self.member = member
        self.stream = member.stream
        self.group = member.group
        self._lanes = lanes
        self._bounds = bounds
        self._scheme = scheme
        self._skip_data_loss = skip_data_loss
        self.auto_confirm = auto_confirm
        self._stale = {} if stale_offsets is None else dict(stale_offsets)  # ephemeral: the gone group's offsets
        self._unconfirmed_lost: dict[int, int | None] = {}
        self.truncated_lanes = 0
        self.truncations: list[tuple[int, int, int]] = []
        self.wakeup = asyncio.Event()
        self.active = True  # False between deactivate and reactivate
        self.nack: AsyncNack | None = None  # set by join

    async def join(self, grid: AsyncGrid, ring_names: list[str], wanted: ExclusiveSettings | None) -> None:
        """Start the member (it takes the lanes it should hold now), then read them; NONE needs every lane's
        confirmed offset (``GroupError`` naming the lanes without one). Then the group's settings (``wanted``: what
        this member gives) and the ``nack`` part (``meteor_spark.aio.nack``)."""
        await self.member.start()
        if self._scheme is InitialOffsetScheme.NONE:
            known = await self.member.known_offsets(range(self.member.lanes))
            missing = [lane for lane, offset in known.items() if offset is None]
            if missing:
                raise GroupError(
                    f"initial_offset_scheme NONE: group {self.group!r} has no confirmed offset on stream "
                    f"{self.stream!r} lane(s) {missing}; confirm or seek the group first, or use EARLIEST/LATEST"
                )
        await self.sync(grid, ring_names)
        settings = await group_settings(grid, self.stream, self.group, wanted)
        letters = None if settings is None else await dead_letter_publisher(grid, settings.dead_letter_stream)
        self.nack = AsyncNack(self.member, self._lanes, self._bounds, settings, letters)

    async def sync(self, grid: AsyncGrid, ring_names: list[str]) -> None:
        """Follow the member's assignment: drop lanes no longer held, start the new ones (or those held again
        with a new epoch)."""
        assignment = dict(self.member.assignment().items())
        for lane in [lane for lane in self._lanes if lane not in assignment]:
            self._drop(lane, "no longer assigned")
        fresh = [(lane, epoch) for lane, epoch in assignment.items() if self._lane_epoch(lane) != epoch]
        for lane, epoch in fresh:
            try:
                state = await self._start_lane(grid, ring_names[lane], lane, epoch)
            except (FencedError, NotAssignedError) as exc:
                logger.debug("lane %d lost while starting it: %s", lane, exc)
                continue
            if lane in self._lanes:
                self._drop(lane, "assigned again with a new epoch")
            self._lanes[lane] = state
            logger.info(
                "asyncio subscriber of stream %r group %r: lane %d assigned (epoch %d), starting at offset %d",
                self.stream,
                self.group,
                lane,
                epoch,
                state.position,
            )

    def _lane_epoch(self, lane: int) -> int | None:
        state = self._lanes.get(lane)
        return None if state is None else state.epoch

    async def _start_lane(self, grid: AsyncGrid, ring_name: str, lane: int, epoch: int) -> LaneState:
        ring = await grid.ring(ring_name)
        head, tail = await ring.head(), await ring.tail()
        bounds = RingBounds(ring, head, tail)
        nxt = tail + 1
        oldest = min(head if head <= tail else nxt, nxt)
        position = await self.member.initial_offset(lane, self._scheme, oldest, nxt)
        position = await self._ephemeral_start(lane, position, nxt)
        self._bounds[lane] = bounds
        state = LaneState(self.stream, lane, bounds, await ring.capacity(), position, epoch, grid.connection_losses)  # type: ignore[arg-type]
        state.not_before, _ = self.member.hold_of(lane)  # a delayed nack's pause holds for every member
        if position > first_offset_of(nxt):
            state.error = OffsetOutOfRangeError(
                self.stream,
                lane,
                position,
                first_offset_of(oldest),
                first_offset_of(nxt),
                hint=(
                    f"It is the confirmed offset of group {self.group!r}: was the stream deleted and re-created, "
                    f"or the grid restarted without persistence? Seek the lane (AsyncSubscriber.seek, or "
                    f"meteor_spark.groups.admin.seek_group with the group stopped) to a position inside the range."
                ),
            )
        else:
            await self._check_resume(state, bounds, oldest)
        return state

    async def _ephemeral_start(self, lane: int, position: int, next_seq: int) -> int:
        """``TopicReading._lane_start``: the lane's end when the group's offset is still the stale one, the group's
        offset moved there (fenced)."""
        start = ephemeral_lane_start(self._stale.pop(lane, None), position, next_seq)
        if start != position:
            await self.member.seek(lane, start)
            logger.info(
                "ephemeral stream %r lane %d: group %r had no live member, starting at the end (offset %d, not %d)",
                self.stream,
                lane,
                self.group,
                start,
                position,
            )
        return start

    async def save_positions(self, lanes: list[int]) -> set[int]:
        """Ephemeral: store each of ``lanes``' position in the group (fenced) before its records are handed out;
        the lanes refused (lost meanwhile: their records are not handed out here)."""
        lost: set[int] = set()
        for lane in lanes:
            state = self._lanes.get(lane)
            if state is None:
                lost.add(lane)
                continue
            position = state.position
            try:
                await self.member.confirm(lane, position, epoch=state.epoch, mark=state.position_mark)
            except (FencedError, NotAssignedError) as exc:
                logger.info(
                    "ephemeral stream %r lane %d lost before hand-out, not delivered: %s", self.stream, lane, exc
                )
                lost.add(lane)
                continue
            state.confirmed_at(position)
        return lost

    async def _check_resume(self, state: LaneState, bounds: RingBounds, oldest: int) -> None:
        """``LaneReader._check_resume``: the stored item mark against the item now at its sequence (one read)."""
        mark = self.member.confirmed_mark(state.lane)
        if mark is None:
            return
        batch = await bounds.ring.read_many(mark.sequence, 0, 1)
        verdict = verdict_of(mark, batch.items, batch.sequences)
        if verdict == SAME and mark.sequence == state.fetch_seq - 1:
            state.position_mark = mark
        if verdict != CHANGED:
            return
        confirmed = state.position
        restart = first_offset_of(oldest)
        if not self._skip_data_loss:
            state.error = truncated_lane_error(
                self.stream, state.lane, self.group, confirmed, restart, mark.sequence, "AsyncSubscriber.seek"
            )
            return
        await self.member.seek(state.lane, restart)
        state.reset(restart)
        self.truncated_lanes += 1
        self.truncations.append((state.lane, confirmed, restart))
        logger.warning(
            "stream %r lane %d was truncated and refilled under group %r's offset %d; skip_data_loss is on: the "
            "group reads the lane again from its oldest record, offset %d",
            self.stream,
            state.lane,
            self.group,
            confirmed,
            restart,
        )

    def _drop(self, lane: int, why: str) -> None:
        state = self._lanes.pop(lane)
        if state.pending is not None:
            state.pending.cancel()
            state.pending = None
        if state.dirty:
            self._unconfirmed_lost[lane] = state.epoch  # the next confirm() says so instead of passing over it
        logger.info(
            "asyncio subscriber of stream %r group %r: stopped reading lane %d (%s)", self.stream, self.group, lane, why
        )

    def revalidate(self, taken: dict[int, list[BatchPart]]) -> None:
        """Before delivering: leave out (and drop) lanes whose lease this member no longer holds by its own
        judgement, so a lane taken over meanwhile is not delivered here too."""
        for lane in list(taken):
            if not self.member.is_current(lane):
                del taken[lane]
                if lane in self._lanes:
                    self._drop(lane, "lease lost before delivery")

    def paused(self, state: LaneState) -> bool:
        """A threaded member's delayed nack: the lane is not read before its wall-clock instant."""
        return state.not_before > now_ms()

    def pause_left(self) -> float:
        """Seconds until the first paused lane may be read again (inf when none is paused)."""
        now = now_ms()
        waits = [state.not_before - now for state in self._lanes.values() if state.not_before > now]
        return min(waits) / 1000.0 if waits else float("inf")

    # -- confirm ------------------------------------------------------------------------------------------------

    async def confirm(self, offset: int | Record | None, lane: int | None, lanes: int) -> None:
        """``Subscriber.confirm``'s arguments: nothing (every delivered position), a ``Record``, or an offset with
        its lane (which a one-lane stream may leave out). Refused on an ephemeral stream (no acknowledgement)."""
        refuse_on_ephemeral(self.member.info, "confirm")
        if offset is None:
            await self.confirm_all()
            return
        if isinstance(offset, Record):
            lane, offset = offset.lane, offset.offset
        if lane is None:
            if lanes != 1:
                raise ConfigError(
                    f"confirm: stream {self.stream!r} has {lanes} lanes; say which one (lane=...), or pass a Record"
                )
            lane = 0
        check_lane(lane, lanes, self.stream)
        await self.confirm_one(lane, offset)

    async def confirm_all(self) -> None:
        """``Subscriber.confirm()``: every delivered position, lane by lane; lanes lost with unconfirmed records
        delivered are a ``FencedError`` after the others were confirmed."""
        todo = [(lane, s.position, s.epoch, s.position_mark) for lane, s in sorted(self._lanes.items()) if s.dirty]
        lost_now: dict[int, int | None] = {}
        for lane, position, epoch, mark in todo:
            try:
                await self.member.confirm(lane, position, epoch=epoch, mark=mark)
            except (FencedError, NotAssignedError):
                lost_now[lane] = epoch
                continue
            state = self._lanes.get(lane)
            if state is not None:
                state.confirmed_at(position)
        lost, self._unconfirmed_lost = self._unconfirmed_lost, {}
        lost.update(lost_now)
        if lost:
            raise unconfirmed_lost_error(self.stream, self.group, lost)

    async def confirm_one(self, lane: int, offset: int) -> None:
        """``Subscriber.confirm(offset, lane=...)``: up to and including that delivered record."""
        after, epoch, mark = confirm_point(self.stream, lane, offset, self._lanes.get(lane))
        await self.member.confirm(lane, after, epoch=epoch, mark=mark)

    async def confirm_automatically(self) -> None:
        """Auto-confirm what earlier polls handed out; a lane lost meanwhile is logged (its new holder reads those
        records again)."""
        assert self.auto_confirm is not None
        try:
            await self.confirm_all()
        except FencedError as exc:
            logger.warning("auto-confirm of stream %r group %r: %s", self.stream, self.group, exc)
        self.auto_confirm.done()

    def metrics(self) -> dict[str, int]:
        """The figures ``Subscriber.metrics()`` has for a grouped subscriber: the nack counters, and while active the
        group member's."""
        nack = self.nack
        figures = {} if nack is None else nack.metrics()
        return figures if not self.active else {**figures, **self.member.metrics()}

    async def close(self) -> None:
        """Leave (releasing the leases) and close the dead-letter publisher of ``dead_letter_after``."""
        await self.member.close()
        if self.nack is not None and self.nack.letters is not None:
            await self.nack.letters.close()

    # -- leaving and rejoining (Subscriber.deactivate / reactivate) ---------------------------------------------

    async def leave(self) -> None:
        """``Subscriber.deactivate``: confirm what was handed out (with auto-confirm), leave the group (its lanes
        go to the other members), stop reading every lane."""
        if not self.active:
            return
        self.active = False
        if self.auto_confirm is not None:
            try:
                await self.confirm_automatically()
            except MeteorError as exc:
                logger.warning("auto-confirm of stream %r group %r on leaving failed: %s", self.stream, self.group, exc)
        for lane in list(self._lanes):
            self._drop(lane, "deactivated")
        await self.member.close()
        self.wakeup.clear()  # set by the member leaving; reactivate (or close) sets it again

    async def rejoin(self, grid: AsyncGrid, ring_names: list[str]) -> None:
        """``Subscriber.reactivate``: join again as a new member with the same id (a closed one cannot rejoin)."""
        if self.active:
            return
        old = self.member
        self.member = AsyncGroupMember(
            grid, old.info, old.group, member_id=old.member_id, lease_ms=old.lease_ms, on_change=self._changed
        )
        if self.nack is not None:
            self.nack.member = self.member
        await self.member.start()
        await self.sync(grid, ring_names)
        self.active = True
        self.wakeup.set()

    def _changed(self, _assignment: object) -> None:
        self.wakeup.set()

    # -- transactions (AsyncTransactionalPublisher.send_offsets) ------------------------------------------------

    def delivered_unconfirmed(self) -> list[tuple[int, int, int | None, ItemMark | None]]:
        """``Subscriber.delivered_unconfirmed``: ``(lane, position, epoch, mark)`` of every lane with records
        delivered since its last confirm (``FencedError``: lanes lost with such records: abort)."""
        todo = [(lane, s.position, s.epoch, s.position_mark) for lane, s in sorted(self._lanes.items()) if s.dirty]
        lost, self._unconfirmed_lost = self._unconfirmed_lost, {}
        if lost:
            raise lost_in_transaction_error(self.stream, self.group, lost)
        return todo

    def mark_confirmed(self, positions: dict[int, int]) -> None:
        """``Subscriber.mark_confirmed``: ``positions`` are the group's offsets now (a committed transaction)."""
        for lane, position in positions.items():
            state = self._lanes.get(lane)
            if state is not None:
                state.confirmed_at(position)

    async def rewind(self) -> dict[int, int]:
        """``Subscriber.rewind``: every held lane back to the group's confirmed offset, locally (after an abort),
        a committed transaction's offset not applied yet counting. Returns lane -> position now."""
        lanes = sorted(self._lanes)
        for lane in lanes:
            try:
                await self.member.settle_staged(lane)
            except (FencedError, NotAssignedError):
                continue  # lost: the poll that notices drops the lane
        confirmed = await self.member.known_offsets(lanes)
        moved: dict[int, int] = {}
        for lane in lanes:
            state = self._lanes.get(lane)
            offset = confirmed.get(lane)
            if state is None or offset is None:
                continue
            orphan = state.back_at(offset)
            if orphan is not None:
                orphan.cancel()
            moved[lane] = offset
        return moved
