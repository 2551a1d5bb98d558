"""Positions by time: the offset of the first record at or after a timestamp, found by binary search over ring items.

Kafka's ``offsetsForTimes`` answers "the earliest offset whose timestamp is greater than or equal to the given
timestamp" (None when there is none), found through a per-segment index of the largest timestamp so far. A ring
item's header carries one timestamp, its *base* timestamp: the smallest timestamp of its records. The search here is
the honest equivalent over that header:

1. Binary search over the ring items ``[oldest_sequence, end)`` of the lane for the *boundary* item ``b``: the first
   item whose base timestamp is >= ``ts_ms``, assuming base timestamps do not decrease along the lane. Each probe
   reads one item (``read_many`` of one item at the chosen sequence), so the search costs ``O(log n)`` reads and
   never a scan. Version 0 items (no timestamps) count as older than any time.
2. A look inside item ``b - 1`` (its base is < ``ts_ms``, but later records in it may be >= ``ts_ms``): the first
   record there whose timestamp is >= ``ts_ms`` is the answer; otherwise the first record of item ``b`` (every
   record of ``b`` is >= its base >= ``ts_ms``); otherwise (no such item) None.

What is guaranteed, whatever the timestamps:

* a returned offset is that of a record whose timestamp is >= ``ts_ms``;
* no record of item ``b - 1`` before it has a timestamp >= ``ts_ms``, and item ``b - 1``'s base is < ``ts_ms``
  (``b`` is a true boundary of the search: the binary search always ends between an item below and one at or above
  the time, or at the lane's oldest item or end).

When every item's base timestamp is at least the largest timestamp of the items before it (one publisher stamping
wall-clock time, the default), this is exactly Kafka's answer: the first record in lane order whose timestamp is
>= ``ts_ms``. With timestamps set by publishers out of order (``timestamp_ms``), records before the answer may also
be >= ``ts_ms`` (they are not found: finding them would take a scan of every item) and records after it may be
older (they are delivered by a reader starting there, as Kafka delivers every record after the offset it found).
None means the search found no item at or after the time and the lane's last item holds no record >= ``ts_ms``.

Works below the ring head where the grid serves history (a persistent member, a RingbufferStore): the search range
starts at ``reading.oldest_sequence``.
"""

from __future__ import annotations

import logging
from typing import Any

from meteor_spark.errors import FormatError
from meteor_spark.grid import Grid, Ring
from meteor_spark.offsets import make_offset
from meteor_spark.reading import check_lane, oldest_in
from meteor_spark.streams import StreamInfo
from meteor_spark.validate import check_int
from meteor_spark.wire import decode_item, item_base_timestamp

logger = logging.getLogger(__name__)

#: Largest timestamp accepted (signed 64-bit ms, as in the item header).
MAX_TIMESTAMP_MS = (1 << 63) - 1


def offset_for_timestamp(grid: Grid, info: StreamInfo, lane: int, ts_ms: int) -> int | None:
    """The offset of the first record of ``lane`` whose timestamp is >= ``ts_ms`` (ms since the epoch), as found
    by the binary search over the items' base timestamps described in the module docstring; None when there is none.

    Raises:
        ConfigError: a lane the stream does not have, or a timestamp that is not an integer >= 0.
    """
    check_int("timestamp (ms since the epoch)", ts_ms, 0, MAX_TIMESTAMP_MS)
    ring = grid.ring(info.ring_names[check_lane(info, lane)])
    return _Search(ring, info.name, lane, ts_ms).run()


class _Search:
    """One search over one ring; remembers the items it read so the final look never reads one twice."""

    def __init__(self, ring: Ring, stream: str, lane: int, ts_ms: int) -> None:
        self.ring = ring
        self.stream = stream
        self.lane = lane
        self.ts_ms = ts_ms
        self.items: dict[int, Any] = {}

    def run(self) -> int | None:
        oldest = oldest_in(self.ring)
        end = self.ring.tail() + 1
        lo, hi = oldest, end
        while lo < hi:
            mid = (lo + hi) // 2
            got = self._read(mid)
            if got is None:
                lo = max(lo, self._oldest_after_loss(mid, hi))
                oldest = max(oldest, lo)
                continue
            if self._at_or_after(mid, got):
                hi = mid
            else:
                lo = mid + 1
        boundary = lo
        if boundary > oldest:
            inside = self._first_inside(boundary - 1)
            if inside is not None:
                return inside
        return make_offset(boundary, 0) if boundary < end else None

    def _read(self, sequence: int) -> Any | None:
        """The item at ``sequence``, or None when the grid no longer serves it (overwritten during the search)."""
        if sequence in self.items:
            return self.items[sequence]
        batch = self.ring.read_many(sequence, 0, 1)
        if not batch.sequences or batch.sequences[0] != sequence:
            return None
        item = batch.items[0]
        self.items[sequence] = item
        return item

    def _oldest_after_loss(self, sequence: int, hi: int) -> int:
        """Items up to ``sequence`` were overwritten while searching: the search goes on above them."""
        return min(max(oldest_in(self.ring), sequence + 1), hi)

    def _at_or_after(self, sequence: int, item: Any) -> bool:
        try:
            base = item_base_timestamp(item, stream=self.stream, lane=self.lane, sequence=sequence)
        except FormatError as exc:
            logger.warning("timestamp search: %s; taken as older than the time searched for", exc)
            return False
        return base is not None and base >= self.ts_ms

    def _first_inside(self, sequence: int) -> int | None:
        """The offset of the first record of the item at ``sequence`` whose timestamp is >= the time, or None."""
        item = self._read(sequence)
        if item is None:
            return None
        try:
            view = decode_item(item, stream=self.stream, lane=self.lane, sequence=sequence)
        except FormatError as exc:
            logger.warning("timestamp search: %s; no record of it taken as the answer", exc)
            return None
        stamps = view.timestamps(0, view.count)
        if stamps is None:
            return None
        hits = (stamps >= self.ts_ms).nonzero()[0]
        return make_offset(sequence, int(hits[0])) if len(hits) else None
