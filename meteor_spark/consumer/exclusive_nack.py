"""``nack`` on a member of an exclusive group (``Subscriber(group=...)``): delayed redelivery and dead letters by
distance (``ExclusiveNack``, a base class of ``Subscriber``).

``nack(records, delay_ms=...)`` rewinds each lane of ``records`` to its first nacked record, for this group only:
the group's offset of the lane moves to that record (records delivered before it in the lane count as processed,
as a ``confirm`` of them would), and the lane pauses for the group until ``delay_ms`` has passed, then is read
again from there, the records after the nacked one included (the lane is read in order). The rewind and the
wall-clock instant the pause ends are stored in the lane's offsets entry (``GroupMember.hold``), so whichever member
reads the lane next, after this one died or gave the lane up, waits for the same instant. Other groups and ungrouped
subscribers of the stream are not affected: they have positions of their own. ``delay_ms=0`` rewinds without a
pause.

With the group setting ``dead_letter_after=N`` (``meteor_spark.groups.exclusive_settings``), a nacked record more
than ``N`` records behind the furthest record the group delivered on its lane (``high``, kept in the offsets entry
across rewinds and members) is not rewound to: it is published to the group's dead-letter stream (as stored, with
headers naming its stream, lane, offset, group and the reason; acknowledged by the grid first) and the lane goes on
after it, rewound to the next nacked record that is still near enough (with the delay), or, when none is left, to
the record after the last one dead-lettered (at once). The distance grows as the group reads past a record before
nacking it: a member that nacks each failing record as soon as it meets it (reading nothing past it) keeps the
distance at one, and such a record is retried until it succeeds; count retries yourself or read a batch past it.

A member dying after a dead letter was published and before the rewind was written leaves the group's offset where
it was: the record is delivered again, and dead-lettered again when nacked (at-least-once dead letters).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from meteor_spark.consumer.lane_state import SubscriberFields
from meteor_spark.consumer.refusals import dead_letter_publisher
from meteor_spark.errors import ConfigError, NotAssignedError
from meteor_spark.format.corrupt import HEADER_SOURCE_GROUP, dead_letter_for_record
from meteor_spark.format.item_header import item_count
from meteor_spark.format.offsets import index_of, sequence_of
from meteor_spark.format.records import BatchPart, Record
from meteor_spark.format.wire import decode_item
from meteor_spark.grid.reading import read_range
from meteor_spark.groups.exclusive_settings import exclusive_settings
from meteor_spark.groups.redelivery import check_delay, not_before, now_ms, records_between
from meteor_spark.groups.store import OFFSETS_MAP

logger = logging.getLogger("meteor_spark.consumer.subscriber")

__all__ = [
    "ExclusiveNack",
    "check_nack_range",
    "dead_letter_after_needs_group",
    "distance_letters",
    "distance_span",
    "log_dead_letters",
    "nack_not_assigned",
    "nacked_by_lane",
    "rewind_of",
    "too_far",
]


class ExclusiveNack(SubscriberFields):
    """``nack`` of a grouped ``Subscriber`` (see the module docs); every attribute is the ``Subscriber``'s."""

    dead_letter_after: int | None
    group_dead_letter_stream: str | None
    nacked_records: int
    delayed_records: int
    dead_lettered_records: int
    _distance_letters: Any  # the dead-letter publisher of dead_letter_after, None without it
    _wakeup: Any
    _poll_lock: Any  # one poll at a time: a nack waits for a poll in progress (its auto-confirm, its delivery)

    def _need_group(self, what: str) -> None:  # pragma: no cover - SubscriberOffsets'
        raise NotImplementedError

    def _load_group_settings(self, dead_letter_after: int | None, dead_letter_stream: str | None) -> None:
        """Grouped: the group's ``dead_letter_after`` (stored by the first member that gives it); before joining."""
        self.dead_letter_after = None
        self.group_dead_letter_stream = None
        self._distance_letters = None
        if self.group is None:
            if dead_letter_after is not None:
                raise dead_letter_after_needs_group()
            return
        settings = exclusive_settings(
            self._grid.map(OFFSETS_MAP), self.stream, self.group, dead_letter_after, dead_letter_stream
        )
        if settings is None:
            return
        self.dead_letter_after = settings.dead_letter_after
        self.group_dead_letter_stream = settings.dead_letter_stream
        self._distance_letters = dead_letter_publisher(self._grid, settings.dead_letter_stream)

    def _close_nack(self) -> None:
        if self._distance_letters is not None:
            self._distance_letters.close()

    def _pause_left(self) -> float:
        """Seconds until the first lane paused by a delayed ``nack`` may be read again (infinity when none is)."""
        now = now_ms()
        with self._lock:
            waits = [state.not_before - now for state in self._lanes.values() if state.not_before > now]
        return min(waits) / 1000.0 if waits else float("inf")

    def nack(self, records: Record | Iterable[Record], *, delay_ms: int = 0) -> None:
        """Grouped: redeliver from the first of ``records`` in each of their lanes, not before ``delay_ms`` from
        now, for this group only (see the module docs); with ``dead_letter_after``, records nacked too far behind
        are dead-lettered instead.

        Raises:
            GroupError: ungrouped subscriber.
            ConfigError: ``delay_ms`` negative, not an integer or above ``redelivery.MAX_NACK_DELAY_MS``; a record
                that was not delivered to this subscriber, or is confirmed already; nothing was written.
            FencedError: the lane was taken over meanwhile (nothing written for it; its new holder reads it).
        """
        self._need_group("nack")
        delay = check_delay(delay_ms)
        with self._poll_lock:  # not between a poll's delivery and its auto-confirm
            by_lane = self._nacked_by_lane(records)
            for lane, nacked in sorted(by_lane.items()):
                self._nack_lane(lane, nacked, delay)
        self._wakeup.set()

    def _nacked_by_lane(self, records: Record | Iterable[Record]) -> dict[int, list[Record]]:
        """``records`` per lane, lowest offsets first, each checked: delivered to this subscriber, not confirmed."""
        assert self.group is not None
        by_lane = nacked_by_lane(records, self.stream)
        for lane, nacked in by_lane.items():
            with self._lock:
                state = self._lanes.get(lane)
                last = -1 if state is None else state.last_delivered
            if state is None:
                raise nack_not_assigned(self.stream, self.group, lane)
            check_nack_range(self.stream, self.group, lane, nacked, last, self._member.known_offsets([lane]).get(lane))
        return by_lane

    def _nack_lane(self, lane: int, nacked: list[Record], delay: int) -> None:
        """Rewind one lane (dead letters by distance first), store the rewind and pause, reset the reader."""
        with self._lock:
            state = self._lanes[lane]
            position, epoch = state.position, state.epoch
        _, stored_high = self._member.hold_of(lane)
        high = max(position, stored_high or 0)
        letters = self._too_far(lane, nacked, high)
        if letters:
            self._dead_letter(lane, letters)
        remaining, target, until = rewind_of(nacked, letters, delay)
        self._member.hold(lane, target, not_before_ms=until, high=high, epoch=epoch)
        with self._lock:
            current = self._lanes.get(lane)
            if current is not None and current.epoch == epoch:
                orphan = current.held_at(target, until)
                if orphan is not None:
                    self._orphans.append(orphan)
        self.nacked_records += len(remaining)
        if until:
            self.delayed_records += len(remaining)

    def _too_far(self, lane: int, nacked: list[Record], high: int) -> list[Record]:
        """The leading nacked records more than ``dead_letter_after`` behind ``high``, read from the ring as stored
        (values and keys as bytes, whatever the deserializers made of them)."""
        span = distance_span(nacked, high, self.dead_letter_after)
        if span is None:
            return []
        raw: dict[int, bytes] = {}
        for items, sequences in read_range(self._grid, self.info, lane, *span):
            raw.update(zip(sequences, items, strict=True))
        assert self.dead_letter_after is not None
        return too_far(self.stream, lane, nacked, high, self.dead_letter_after, raw)

    def _dead_letter(self, lane: int, letters: list[Record]) -> None:
        """Publish ``letters`` to the group's dead-letter stream and wait for the grid's acknowledgement."""
        assert self.group is not None and self.dead_letter_after is not None
        tagged, reason = distance_letters(letters, self.group, self.dead_letter_after)
        self._distance_letters.publish_many(tagged).result()
        self.dead_lettered_records += len(letters)
        log_dead_letters(self.stream, lane, self.group, letters, self.group_dead_letter_stream, reason)


# -- the decisions of a nack, shared with the asyncio member (meteor_spark.aio.nack) -------------------------------


def dead_letter_after_needs_group() -> ConfigError:
    return ConfigError(
        "dead_letter_after needs a group: it is a group setting (the distance behind the group's most recently "
        "consumed record); give the subscriber a group, or leave dead_letter_after unset"
    )


def nacked_by_lane(records: Record | Iterable[Record], stream: str) -> dict[int, list[Record]]:
    """``records`` (a record, a batch or an iterable of them, all of ``stream``) per lane, lowest offsets first."""
    if isinstance(records, Record):
        records = [records]
    try:
        chosen = list(records)
    except TypeError:
        raise ConfigError(f"nack takes a record, a batch or an iterable of records, got {records!r}") from None
    by_lane: dict[int, list[Record]] = {}
    for record in chosen:
        if not isinstance(record, Record) or record.stream != stream:
            raise ConfigError(f"nack takes records this subscriber of stream {stream!r} delivered, got {record!r}")
        by_lane.setdefault(record.lane, []).append(record)
    for nacked in by_lane.values():
        nacked.sort(key=lambda r: r.offset)
    return by_lane


def nack_not_assigned(stream: str, group: str, lane: int) -> NotAssignedError:
    return NotAssignedError(
        f"nack: lane {lane} of stream {stream!r} is not read by this member of group {group!r} "
        f"(lost or never assigned); nothing was written"
    )


def check_nack_range(
    stream: str, group: str, lane: int, nacked: list[Record], last: int, confirmed: int | None
) -> None:
    """``ConfigError`` unless every nacked record was delivered (up to ``last``) and not confirmed."""
    first, final = nacked[0].offset, nacked[-1].offset
    if final > last or (confirmed is not None and first < confirmed):
        raise ConfigError(
            f"nack: records of stream {stream!r} lane {lane} from offset {first} to {final} were not all "
            f"delivered and unconfirmed (delivered up to {last}, group {group!r} confirmed up to "
            f"{confirmed}); nack only records this subscriber delivered and has not confirmed; nothing was "
            f"written"
        )


def rewind_of(nacked: list[Record], letters: list[Record], delay: int) -> tuple[list[Record], int, int]:
    """After ``letters`` (the leading nacked records dead-lettered): the records nacked for redelivery, the offset
    the lane is rewound to, and the wall-clock instant it pauses until (0: at once)."""
    remaining = nacked[len(letters) :]
    target = remaining[0].offset if remaining else letters[-1].offset + 1
    return remaining, target, not_before(delay) if remaining else 0


def distance_span(nacked: list[Record], high: int, limit: int | None) -> tuple[int, int] | None:
    """The ring sequences ``[first, end)`` to read to measure the nacked records' distance to ``high``; None when
    no read is needed (no ``dead_letter_after``, or near enough even at the most records an item can hold)."""
    if limit is None or records_between(nacked[0].offset, high, lambda _seq: 1 << 16) <= limit:
        return None
    return sequence_of(nacked[0].offset), max(sequence_of(high), sequence_of(nacked[-1].offset) + 1)


def too_far(stream: str, lane: int, nacked: list[Record], high: int, limit: int, raw: dict[int, bytes]) -> list[Record]:
    """The leading nacked records more than ``limit`` records behind ``high``, decoded from ``raw`` (the ring
    items of ``distance_span``: sequence -> item) as stored."""
    counts = {seq: item_count(item, stream=stream, lane=lane, sequence=seq) for seq, item in raw.items()}
    far = []
    for record in nacked:
        if records_between(record.offset, high, counts.__getitem__) - 1 <= limit:
            break
        seq = sequence_of(record.offset)
        view = decode_item(raw[seq], stream=stream, lane=lane, sequence=seq)
        index = index_of(record.offset)
        far.append(BatchPart(stream, lane, seq, view, index, index + 1).records()[0])
    return far


def distance_letters(letters: list[Record], group: str, limit: int) -> tuple[list[Record], str]:
    """The dead letters of records nacked too far behind (headers naming the source and the group), and why."""
    reason = (
        f"nacked more than dead_letter_after={limit} records behind the most recently consumed record of its lane "
        f"in group {group!r}"
    )
    tagged = [dead_letter_for_record(r, reason) for r in letters]
    return [replace(r, headers=(*r.headers, (HEADER_SOURCE_GROUP, group.encode()))) for r in tagged], reason


def log_dead_letters(
    stream: str, lane: int, group: str, letters: list[Record], target: str | None, reason: str
) -> None:
    logger.warning(
        "stream %r lane %d group %r: %d record(s) dead-lettered to %r: %s (first: offset %d)",
        stream,
        lane,
        group,
        len(letters),
        target,
        reason,
        letters[0].offset,
    )
