"""A shared member taking a lane up: the lane's entry is checked against the ring before records are acquired.

A lane's sequences are not unique for ever: a member restart that cuts a ring log's torn tail (fsync ``interval`` or
``never`` after a machine crash), or a Hazelcast member restarted without a store, hands the lost sequences out again
to new records. A shared group's entry (``meteor_spark.groups.shared_state``) still says ``next`` is past them, so
fresh acquisitions would start above the new records that took the lost sequences: they would never be delivered,
and ranges acquired or available below ``next`` would name records that now hold other data.

So the entry carries the item mark (``meteor_spark.grid.item_marks``) of the ring item of the last record below
``next``, taken by the member that moved ``next`` on (from the bytes it read anyway: no extra grid call), and a
member takes a lane up, with one single-item read of that item, before it acquires anything there:

- on its first look at the lane (a member that starts later, after the restart);
- on its first look after ``Grid.connection_losses`` changed (a member that stayed connected: the client reconnects
  and retries on its own, so nothing else would tell it that the member it reads from restarted). Its cached ring
  items are dropped then too: they may be of the history the lane lost.

The same item there: reading goes on. Another item there (or, after a lost connection, a lane now ending below it):
the lane was truncated and refilled. By default ``LaneTruncatedError`` naming stream, lane, group and position,
raised by every member's ``poll`` until the group is told what to do (its state forgotten, or a member with
``skip_data_loss=True``). With ``skip_data_loss=True`` the member resets the entry to the lane's oldest record
(every acquisition dropped: what the lane holds now is delivered, some of it perhaps again, never skipped) with one
compare-and-set on the text it checked, so of members finding it at once one resets it (and counts it in
``truncated_lanes``); the others lose the compare-and-set, read the reset entry and find nothing to reset. Records
held from before the reset can no longer be settled (``FencedError``): they are delivered again.

Entries without a mark (written before marks existed) are checked against the lane's end only, as before.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from meteor_spark.consumer.shared_steps import check_mark_steps
from meteor_spark.errors import GroupError, LaneTruncatedError, OffsetOutOfRangeError
from meteor_spark.format.offsets import first_offset_of, sequence_of
from meteor_spark.grid.item_marks import CHANGED, PAST_END, SAME, ItemMark, mark_of
from meteor_spark.grid.reading import oldest_steps
from meteor_spark.grid.steps import Steps
from meteor_spark.groups.shared_state import LaneShare
from meteor_spark.groups.store import MAX_CAS_ATTEMPTS

logger = logging.getLogger(__name__)

#: Marks of ring items read, kept per lane (the one before a new ``next`` is stored with the entry).
MARKS_KEPT = 2048


class SharedTakeUp:
    """Checking a lane's entry against the ring when a member takes the lane up (see the module docs). A base class
    of ``SharedBookkeeping``; it holds no state of its own: the attributes it declares are the ``SharedSubscriber``'s.
    """

    stream: str
    group: str
    skip_data_loss: bool
    truncated_lanes: int
    truncations: list[tuple[int, int, int]]
    _grid: Any  # a Grid or an AsyncGrid: only its connection_losses is read here
    _map: Any  # the share map: GridMap (threaded) or AsyncGridMap (asyncio), called through steps
    _rings: list[Any]  # Ring or AsyncRing, called through steps
    _keys: list[str]
    _lock: Any
    _texts: dict[int, str]
    _own_write: dict[int, bool]
    _checked: dict[int, int]  # lane -> Grid.connection_losses when the lane was last taken up
    _items: dict[int, OrderedDict[int, Any]]
    _marks: dict[int, OrderedDict[int, ItemMark]]

    def _fetch(self, lane: int) -> Steps[tuple[str, LaneShare]]:  # pragma: no cover - SharedBookkeeping's
        raise NotImplementedError

    def _taken_up(self, lane: int) -> bool:
        """The lane was taken up since the grid last lost a connection."""
        return self._checked.get(lane) == self._grid.connection_losses

    def _take_up(self, lane: int, text: str, share: LaneShare) -> Steps[tuple[str, LaneShare]]:
        """Check the entry ``text`` just read against the ring (one single-item read); returns the entry to go on
        with (the one read, or the one reset to the lane's oldest record). Steps (``shared_steps``).

        Raises:
            LaneTruncatedError: the lane was truncated and refilled under the group's position (no opt-in).
            OffsetOutOfRangeError: the group's position lies past the lane's end (the stream was re-created).
        """
        for _ in range(MAX_CAS_ATTEMPTS):
            losses = self._grid.connection_losses
            after_loss = lane in self._checked
            if after_loss:
                self._forget_items(lane)
            ring = self._rings[lane]
            verdict = SAME if share.mark is None else (yield from check_mark_steps(ring, share.mark))
            end = (yield ring.tail) + 1
            past_end = sequence_of(share.next) > end
            # Past the end at a first look: the stream re-created under the group, as before marks (after a lost
            # connection, a lane ending below the item the group handed out last lost its tail).
            if past_end and verdict != CHANGED and (verdict != PAST_END or not after_loss):
                raise (yield from self._past_end(lane, sequence_of(share.next), end))
            if verdict not in (CHANGED, PAST_END):
                self._checked[lane] = losses
                return text, share
            assert share.mark is not None
            oldest = first_offset_of(min((yield from oldest_steps(ring)), end))
            if not self.skip_data_loss:
                raise self._truncation_error(lane, share, oldest, share.mark)
            if (yield from self._reset(lane, text, share, oldest)):
                self._checked[lane] = losses
                return self._texts[lane], LaneShare.initial(oldest)
            text, share = yield from self._fetch(lane)  # another member changed it (perhaps reset it): check again
        raise GroupError(
            f"resetting the truncated lane {lane} of stream {self.stream!r} shared group {self.group!r} lost the "
            f"compare-and-set {MAX_CAS_ATTEMPTS} times in a row to other members; poll again"
        )

    def _reset(self, lane: int, text: str, share: LaneShare, oldest: int) -> Steps[bool]:
        """With ``skip_data_loss``: one compare-and-set from ``text`` to the lane starting again at ``oldest``
        (counted and logged when it wins)."""
        fresh = LaneShare.initial(oldest).encode()
        key = self._keys[lane]
        if not (yield lambda: self._map.replace_if_same(key, text, fresh)):
            return False
        with self._lock:
            self._texts[lane] = fresh
            self._own_write[lane] = True
        self._forget_items(lane)
        self.truncated_lanes += 1
        self.truncations.append((lane, share.next, oldest))
        logger.warning(
            "stream %r lane %d was truncated and refilled under shared group %r's position %d (the item at sequence "
            "%d is not the one the group handed out last: a member restarted and lost the lane's last records); "
            "skip_data_loss is on: the group delivers the lane again from its oldest record, offset %d (records "
            "delivered before the truncation may be delivered again; records held can no longer be settled)",
            self.stream,
            lane,
            self.group,
            share.next,
            share.mark.sequence if share.mark is not None else -1,
            oldest,
        )
        return True

    def _truncation_error(self, lane: int, share: LaneShare, oldest: int, mark: ItemMark) -> LaneTruncatedError:
        return LaneTruncatedError(
            self.stream,
            lane,
            share.next,
            oldest,
            mark.sequence,
            whose=f"shared group {self.group!r}'s position (the first offset never acquired)",
            fix=(
                f"Decide where the group goes on: create a member with skip_data_loss=True, which resets the lane to "
                f"its oldest record {oldest} (delivered again, never skipped) and counts it; or forget the group's "
                f"state (meteor_spark.groups.admin.forget_groups(grid, {self.stream!r}, {self.group!r})) to start "
                f"it again by its initial offset scheme."
            ),
        )

    def _past_end(self, lane: int, seq: int, end: int) -> Steps[OffsetOutOfRangeError]:
        oldest = min((yield from oldest_steps(self._rings[lane])), end)
        return OffsetOutOfRangeError(
            self.stream,
            lane,
            first_offset_of(seq),
            first_offset_of(oldest),
            first_offset_of(end),
            hint=(
                f"It is where shared group {self.group!r} stands: was the stream deleted and re-created, or the grid "
                f"restarted without persistence? Forget the group's state "
                f"(meteor_spark.groups.admin.forget_groups(grid, {self.stream!r}, {self.group!r})) to start it "
                "again by its initial offset scheme."
            ),
        )

    def _forget_items(self, lane: int) -> None:
        """Drop the lane's cached items and marks (they may be of a history the lane lost)."""
        with self._lock:
            self._items[lane].clear()
            self._marks[lane].clear()

    def _remember_marks(self, lane: int, items: Sequence[Any], sequences: Sequence[int]) -> None:
        """Keep the marks of ring items just read (bounded)."""
        marks = self._marks[lane]
        with self._lock:
            for item, sequence in zip(items, sequences, strict=True):
                marks[sequence] = mark_of(item, sequence)
            while len(marks) > MARKS_KEPT:
                marks.popitem(last=False)

    def _mark_before(self, lane: int, end: int) -> ItemMark | None:
        """The mark of the ring item of the last record below offset ``end`` (None when not kept: the entry keeps
        the mark it has, of an earlier item, still a valid check)."""
        with self._lock:
            return self._marks[lane].get(sequence_of(end - 1))


__all__ = ["MARKS_KEPT", "SharedTakeUp"]
