"""Positions by time: the offset of the first record at or after a timestamp, found by binary search over ring items.

Kafka's ``offsetsForTimes`` answers "the earliest offset whose timestamp is greater than or equal to the given
timestamp" (None when there is none), found through a per-segment time index of the largest timestamp so far.
Every ring item's header carries that index entry: ``lane_max_ts``, the largest record timestamp of the lane up
to and including the item (``meteor_spark.format.wire``, format version 2). It never decreases along a lane, whatever
the
order of the records' own timestamps, so:

1. A binary search over the ring items ``[oldest_sequence, end)`` of the lane finds the *boundary* item ``b``: the
   first item whose ``lane_max_ts`` is >= ``ts_ms``. Each probe reads one item (``read_many`` of one item at the
   chosen sequence), so the search costs ``O(log n)`` reads and never a scan.
2. Every record before ``b`` is older than ``ts_ms`` (item ``b - 1``'s running maximum is), and item ``b`` holds
   a record >= ``ts_ms`` (its running maximum rose to it there): the answer is the first such record of item
   ``b``. With no boundary (every running maximum below the time) the answer is None.

That is exactly Kafka's answer, with late records anywhere in the lane (its start, middle or end) and across
items, as long as each item's ``lane_max_ts`` is the lane's true running maximum. The publisher makes it so for
publishers that write a lane one after another, restarts included (a publisher continues the value of the lane's
last item, ``meteor_spark.producer.sender``). Publishers writing one lane at the same moment each continue the value
they read when they started: an item's value then covers its own publisher's records and the lane as it was when that
publisher started, so a record >= the time that a concurrent publisher wrote before the boundary can be passed
over (its timestamp is not in the values the search probed). When item ``b`` holds no record >= the time (that
case, or a running maximum raised by an item that was never stored), up to ``LOOK_AHEAD`` following items are
looked in; failing that, the answer is the first record after them (every record passed over is older than the
time).

Older items (format versions 0 and 1) carry no running maximum: a version 1 item stands in the search by its base
timestamp (the smallest of its records) and a version 0 item as older than any time, as before version 2; when
the item before the boundary is such an item, its records are looked in first (its base is < ``ts_ms``, later
records in it may be >= ``ts_ms``). For a lane written only by such items the search is the old one: a record
>= the time before the answer can be missed when timestamps are out of order. Undecodable items count as older
than the time (logged).

Works below the ring head where the grid serves history (a persistent member, a RingbufferStore): the search range
starts at ``reading.oldest_sequence``.
"""

from __future__ import annotations

import logging
from typing import Any

from meteor_spark.errors import FormatError
from meteor_spark.format.item_header import item_base_timestamp, item_lane_max_timestamp
from meteor_spark.format.offsets import make_offset
from meteor_spark.format.wire import decode_item
from meteor_spark.grid.client import Grid, Ring
from meteor_spark.grid.reading import check_lane, oldest_in
from meteor_spark.grid.streams import StreamInfo
from meteor_spark.validate import check_int

logger = logging.getLogger(__name__)

#: Largest timestamp accepted (signed 64-bit ms, as in the item header).
MAX_TIMESTAMP_MS = (1 << 63) - 1

#: Items looked in after the boundary item when it holds no record at or after the time (see the module docstring).
LOOK_AHEAD = 16


def offset_for_timestamp(grid: Grid, info: StreamInfo, lane: int, ts_ms: int) -> int | None:
    """The offset of the first record of ``lane`` whose timestamp is >= ``ts_ms`` (ms since the epoch), as found
    by the binary search over the items' running maximum timestamps described in the module docstring; None when
    there is none.

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
        if boundary > oldest and self._max_in_header(boundary - 1) is None:
            inside = self._first_inside(boundary - 1)
            if inside is not None:
                return inside
        for sequence in range(boundary, min(end, boundary + LOOK_AHEAD)):
            inside = self._first_inside(sequence)
            if inside is not None:
                return inside
            if self._max_in_header(sequence) is None:
                return make_offset(sequence, 0)  # an older item: the search of before version 2 ends here
        after = boundary + LOOK_AHEAD
        return make_offset(after, 0) if after < end else None

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
        """Whether the lane's running maximum at this item (its base timestamp for a version 1 item) reached the
        time."""
        try:
            stamp = item_lane_max_timestamp(item, stream=self.stream, lane=self.lane, sequence=sequence)
            if stamp is None:
                stamp = item_base_timestamp(item, stream=self.stream, lane=self.lane, sequence=sequence)
        except FormatError as exc:
            logger.warning("timestamp search: %s; taken as older than the time searched for", exc)
            return False
        return stamp is not None and stamp >= self.ts_ms

    def _max_in_header(self, sequence: int) -> int | None:
        """The item's running maximum, None when it has none (older format, undecodable, no longer served)."""
        item = self._read(sequence)
        if item is None:
            return None
        try:
            return item_lane_max_timestamp(item, stream=self.stream, lane=self.lane, sequence=sequence)
        except FormatError:
            return None

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
