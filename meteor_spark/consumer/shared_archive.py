"""What a shared member archives while it acquires: records delivered ``max_deliveries`` times, and available
records that have fallen more than ``dead_letter_after`` records behind the most recently acquired one of their
lane (dead letters by distance, ``meteor_spark.groups.redelivery``).

``SharedArchive`` is a base class of ``meteor_spark.consumer.shared_subscriber.SharedSubscriber``: the poll loop picks
the ranges to acquire, and this class says where the distance limit cuts a lane's available records
(``_distance_floor``) and, once the acquisition is written, hands the records out and dead-letters the archived
ones (``_hand_out``). Records are archived exactly as ``max_deliveries`` does it: acquired with the others under the
poll's token, published to the group's dead-letter stream (acknowledged by the grid), then marked done; a member
dying in between leaves them acquired, they time out and are archived again (at-least-once dead letters).

Only available records are measured (released, timed out, or delayed by ``nack(delay_ms=...)``): a record a member
holds right now is being processed and is left alone; if it is released later, it is measured then.
"""

from __future__ import annotations

from meteor_spark.consumer.shared_groups import (
    HeldSpan,
    SharedBookkeeping,
    SharedRecord,
    UndecodableItem,
    shared_record,
)
from meteor_spark.format.offsets import first_offset_of, make_offset
from meteor_spark.format.records import BatchPart
from meteor_spark.format.wire import ItemView
from meteor_spark.grid.steps import Steps
from meteor_spark.groups.redelivery import distance_floor
from meteor_spark.groups.shared_state import LaneShare

__all__ = ["SharedArchive"]


class _NotCached(Exception):
    """A ring item ``_distance_floor``'s walk needs that is not cached yet."""

    def __init__(self, sequence: int) -> None:
        super().__init__(sequence)
        self.sequence = sequence


class SharedArchive(SharedBookkeeping):
    """Archiving while acquiring (see the module docs); every attribute is the ``SharedSubscriber``'s."""

    dead_letter_after: int | None
    max_deliveries: int | None
    distance_dead_letters: int

    def _item(self, lane: int, seq: int, fresh: bool) -> Steps[ItemView | UndecodableItem | None]:  # pragma: no cover
        raise NotImplementedError  # SharedAcquire's: the cached ring item

    def _record_count(self, lane: int, seq: int, counts: dict[int, int]) -> int:
        """Records in the ring item ``seq`` of ``lane`` (an undecodable item counts as one), from ``counts`` (what
        this walk read) or the cache; else ``_NotCached`` (``_distance_floor`` reads it and walks again)."""
        if seq in counts:
            return counts[seq]
        with self._lock:
            view = self._items[lane].get(seq)
        if view is None:
            raise _NotCached(seq)
        return view.count if isinstance(view, ItemView) else 1

    def _distance_floor(self, lane: int, share: LaneShare) -> Steps[int]:
        """The lowest offset of ``lane`` not yet more than ``dead_letter_after`` records behind the most recently
        acquired record (the one before ``next``): available records below it are archived. ``start`` (nothing
        to archive) without the setting or without available records. ``redelivery.distance_floor`` walks the
        cached items; an item it needs that is not cached is read (a step) and the walk starts again."""
        if self.dead_letter_after is None or not share.available():
            return share.start
        counts: dict[int, int] = {}  # at most dead_letter_after + 1 items: the walk's length
        while True:
            try:
                return distance_floor(
                    share.start, share.next, self.dead_letter_after, lambda seq: self._record_count(lane, seq, counts)
                )
            except _NotCached as missing:
                view = yield from self._item(lane, missing.sequence, False)
                counts[missing.sequence] = view.count if isinstance(view, ItemView) else 1

    def _distance_reason(self) -> str:
        return (
            f"fell more than dead_letter_after={self.dead_letter_after} records behind the most recently consumed "
            f"record of its lane"
        )

    def _deliveries_reason(self, deliveries: int) -> str:
        return f"delivered {deliveries} times (max_deliveries={self.max_deliveries}) without being acknowledged"

    def _hand_out(
        self, lane: int, token: str, slices: list[tuple[BatchPart, int]], archive: dict[tuple[int, int], str]
    ) -> Steps[tuple[list[BatchPart], list[SharedRecord]]]:
        """Record the acquired records as held, dead-letter the archived ones (``archive``: range -> reason),
        return the others."""
        parts: list[BatchPart] = []
        out: list[SharedRecord] = []
        letters: dict[str, list[SharedRecord]] = {}
        held = self._held[lane]
        for part, deliveries in slices:
            records = part.records()
            offsets = [r.offset for r in records]
            ends = offsets[1:] + [
                first_offset_of(part.sequence + 1)
                if part.stop >= part.item.count
                else make_offset(part.sequence, part.stop)
            ]
            shared = [shared_record(r, deliveries) for r in records]
            with self._lock:
                for record, end in zip(shared, ends, strict=True):
                    held[record.offset] = HeldSpan(token, end, deliveries)
            reason = next((why for (first, end), why in archive.items() if first <= part.first_offset < end), None)
            if reason is not None:
                letters.setdefault(reason, []).extend(shared)
            else:
                parts.append(part)
                out.extend(shared)
        for reason, archived in letters.items():
            yield from self._archive(archived, reason)
            if reason == self._distance_reason():
                self.distance_dead_letters += len(archived)
        return parts, out
