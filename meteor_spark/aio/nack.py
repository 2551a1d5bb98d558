"""``nack`` on an asyncio member of an exclusive group (``AsyncSubscriber(group=...)``): delayed redelivery and
dead letters by distance, with the threaded ``Subscriber.nack``'s semantics, options and errors.

The semantics are ``meteor_spark.consumer.exclusive_nack``'s (read its module docs): each lane of the nacked records
is rewound, for this group only, to its first nacked record, and paused until ``delay_ms`` has passed; the rewind
and the pause's wall-clock instant are stored in the lane's offsets entry (``AsyncGroupMember.hold``), so whichever
member reads the lane next, threaded or asyncio, after this one died or gave the lane up, waits for the same
instant. With the group setting ``dead_letter_after=N`` (``meteor_spark.groups.exclusive_settings``: stored with the
group by the first member that gives it), records nacked more than ``N`` records behind the furthest one the group
delivered on the lane go to the group's dead-letter stream (acknowledged first) instead of being redelivered.

Every decision (the records' checks and errors, which records are too far, the dead letters' headers, where the
lane is rewound to and until when) is one of ``exclusive_nack``'s shared functions; this module awaits the grid
calls around them: the ring items read to measure the distance, the dead letters published, the fenced rewind.
"""

from __future__ import annotations

from collections.abc import Iterable

from meteor_spark.aio.group_member import AsyncGroupMember
from meteor_spark.aio.publisher import AsyncPublisher
from meteor_spark.aio.views import RingBounds
from meteor_spark.consumer.exclusive_nack import (
    check_nack_range,
    dead_letter_after_needs_group,
    distance_letters,
    distance_span,
    log_dead_letters,
    nack_not_assigned,
    nacked_by_lane,
    rewind_of,
    too_far,
)
from meteor_spark.consumer.lane_state import LaneState
from meteor_spark.errors import DataLossError, StreamNotFoundError
from meteor_spark.format.records import Record
from meteor_spark.grid.aio_client import AsyncGrid
from meteor_spark.grid.streams import StreamConfig
from meteor_spark.groups.exclusive_settings import (
    ExclusiveSettings,
    agreed_settings,
    exclusive_settings_key,
    wanted_settings,
)
from meteor_spark.groups.redelivery import check_delay
from meteor_spark.groups.store import OFFSETS_MAP

__all__ = ["AsyncNack", "check_group_settings", "dead_letter_publisher", "group_settings"]

#: Ring items asked for by one read while measuring a distance.
_ITEMS_PER_READ = 100


def check_group_settings(
    group: str | None, dead_letter_after: int | None, dead_letter_stream: str | None
) -> ExclusiveSettings | None:
    """The settings an ``AsyncSubscriber`` gives its group, checked before anything connects (the threaded
    ``Subscriber``'s checks and errors)."""
    if group is None:
        if dead_letter_after is not None:
            raise dead_letter_after_needs_group()
        return None
    return wanted_settings(dead_letter_after, dead_letter_stream)


async def group_settings(
    grid: AsyncGrid, stream: str, group: str, wanted: ExclusiveSettings | None
) -> ExclusiveSettings | None:
    """``exclusive_settings.exclusive_settings``, awaited: the group's settings, stored by this member when it
    gives them and the group has none (same errors)."""
    offsets = await grid.map(OFFSETS_MAP)
    key = exclusive_settings_key(stream, group)
    text = await offsets.get(key)
    if text is None and wanted is not None:
        text = await offsets.put_if_absent(key, wanted.encode())
    return agreed_settings(text, wanted, stream, group)


async def dead_letter_publisher(grid: AsyncGrid, name: str) -> AsyncPublisher:
    """An ``AsyncPublisher`` to the dead-letter stream ``name``, created with the default configuration when
    missing (``refusals.dead_letter_publisher``'s twin; also ``on_corrupt``'s)."""
    try:
        return await AsyncPublisher(grid, name).start()
    except StreamNotFoundError:
        return await AsyncPublisher(grid, StreamConfig(name)).start()


class AsyncNack:
    """The ``nack`` of one asyncio group member (see the module docs). ``lanes`` / ``bounds`` are the
    subscriber's dicts (``LaneReads``), read and reset in place on the loop."""

    def __init__(
        self,
        member: AsyncGroupMember,
        lanes: dict[int, LaneState],
        bounds: dict[int, RingBounds],
        settings: ExclusiveSettings | None,
        letters: AsyncPublisher | None,
    ) -> None:
        self.member = member
        self.stream = member.stream
        self.group = member.group
        self._lanes = lanes
        self._bounds = bounds
        self.dead_letter_after = None if settings is None else settings.dead_letter_after
        self.dead_letter_stream = None if settings is None else settings.dead_letter_stream
        self.letters = letters
        self.nacked_records = 0
        self.delayed_records = 0
        self.dead_lettered_records = 0

    def metrics(self) -> dict[str, int]:
        return {
            "nacked_records": self.nacked_records,
            "delayed_records": self.delayed_records,
            "dead_lettered_records": self.dead_lettered_records,
        }

    async def nack(self, records: Record | Iterable[Record], delay_ms: int) -> None:
        """``Subscriber.nack``: checked first (nothing written on a ``ConfigError``), then lane by lane."""
        delay = check_delay(delay_ms)
        by_lane = nacked_by_lane(records, self.stream)
        for lane, nacked in by_lane.items():
            state = self._lanes.get(lane)
            if state is None:
                raise nack_not_assigned(self.stream, self.group, lane)
            confirmed = (await self.member.known_offsets([lane])).get(lane)
            check_nack_range(self.stream, self.group, lane, nacked, state.last_delivered, confirmed)
        for lane, nacked in sorted(by_lane.items()):
            await self._nack_lane(lane, nacked, delay)

    async def _nack_lane(self, lane: int, nacked: list[Record], delay: int) -> None:
        """Rewind one lane (dead letters by distance first), store the rewind and pause, reset the reader."""
        state = self._lanes[lane]
        position, epoch = state.position, state.epoch
        _, stored_high = self.member.hold_of(lane)
        high = max(position, stored_high or 0)
        letters = await self._too_far(lane, nacked, high)
        if letters:
            await self._dead_letter(lane, letters)
        remaining, target, until = rewind_of(nacked, letters, delay)
        await self.member.hold(lane, target, not_before_ms=until, high=high, epoch=epoch)
        current = self._lanes.get(lane)
        if current is not None and current.epoch == epoch:
            orphan = current.held_at(target, until)
            if orphan is not None:
                orphan.cancel()
        self.nacked_records += len(remaining)
        if until:
            self.delayed_records += len(remaining)

    async def _too_far(self, lane: int, nacked: list[Record], high: int) -> list[Record]:
        span = distance_span(nacked, high, self.dead_letter_after)
        if span is None or self.dead_letter_after is None:
            return []
        first, end = span
        ring = self._bounds[lane].ring
        raw: dict[int, bytes] = {}
        sequence = first
        while sequence < end:
            batch = await ring.read_many(sequence, 0, min(end - sequence, _ITEMS_PER_READ))
            if not batch.items or batch.sequences[0] != sequence:
                oldest = batch.sequences[0] if batch.items else sequence
                raise DataLossError(self.stream, lane, sequence, oldest, unit="sequence")
            raw.update(zip(batch.sequences, batch.items, strict=True))
            sequence = batch.sequences[-1] + 1
        return too_far(self.stream, lane, nacked, high, self.dead_letter_after, raw)

    async def _dead_letter(self, lane: int, letters: list[Record]) -> None:
        """Publish ``letters`` to the group's dead-letter stream; acknowledged by the grid before the rewind."""
        assert self.letters is not None and self.dead_letter_after is not None
        tagged, reason = distance_letters(letters, self.group, self.dead_letter_after)
        await self.letters.publish_many(tagged)
        self.dead_lettered_records += len(letters)
        log_dead_letters(self.stream, lane, self.group, letters, self.dead_letter_stream, reason)
