"""One lane's queue in a publisher's accumulator (``LaneQueue``): its segments, counts and in-flight flags.

The accumulator (``meteor_spark.producer.accumulator``) holds one per lane, under its lock; the sender changes a
lane's encode-ahead flags only through the transitions here (``begin_encoding``, ``encoded``, ``call_settled``,
``drop_ahead``). The queue cuts its own calls (``take``), to the bounds the accumulator gives.
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING, Any

import numpy as np

from meteor_spark.producer.calls import Piece, Segment

if TYPE_CHECKING:
    from meteor_spark.producer.batching import PublisherSettings

__all__ = ["LaneQueue"]


class LaneQueue:
    """What is queued for one lane: its segments, their count and bytes, and whether a call is in flight."""

    __slots__ = (
        "ahead",
        "encoding",
        "in_flight",
        "lane",
        "lock",
        "previous_done",
        "queued",
        "queued_bytes",
        "segments",
        "since",
    )

    def __init__(self, lane: int, lock: Any) -> None:
        self.lane = lane
        self.lock = lock  # the accumulator's
        self.segments: deque[Segment] = deque()
        self.queued = 0
        self.queued_bytes = 0
        self.since = 0.0
        self.in_flight = False
        # Encode-ahead (the sender's): the lane's next call, encoded while the current one is in flight, or being
        # encoded; ``previous_done`` says the call in flight settled while its successor was still being encoded
        # (the lane stays claimed: the encoder sends it).
        self.ahead: Any = None
        self.encoding = False
        self.previous_done = False

    def open_segment(self) -> Segment:
        """The lane's last segment when further records may join it, else a new one (lock held). A segment of plain
        ``publish_async`` values (``Segment.plain``) takes no other record: it is closed and a new one started."""
        if self.segments:
            last = self.segments[-1]
            if last.open and last.arrow is None:
                if not last.plain:
                    return last
                last.close()
        segment = Segment(self.lock)
        self.segments.append(segment)
        return segment

    def open_plain(self) -> Segment:
        """A new segment for plain ``publish_async`` values, after the lane's others (lock held; the last one was
        not such a segment open for more)."""
        if self.segments:
            self.segments[-1].close()
        segment = Segment(self.lock)
        segment.plain = segment.singles = True
        self.segments.append(segment)
        return segment

    def take(self, settings: PublisherSettings, items_per_call: int) -> tuple[list[Piece], int, int]:
        """Cut up to ``items_per_call`` ring items and ``settings.max_call_bytes`` bytes off the queue (lock held):
        the accumulator's ``cut`` (module docstring of ``meteor_spark.producer.accumulator``)."""
        max_records = settings.max_batch_records
        max_bytes = settings.max_item_bytes
        max_call = settings.max_call_bytes
        if self.queued <= max_records and self.queued_bytes <= min(max_bytes, max_call):
            return self._take_all()
        pieces: list[Piece] = []
        item = 0
        in_item = 0
        item_bytes = 0
        taken = 0
        taken_bytes = 0
        full = False  # the call has no room for the next item
        while self.segments and item < items_per_call and not full:
            segment = self.segments[0]
            segment.close()
            cum = segment.cumulative_bytes()
            p = segment.pos
            while p < segment.n and item < items_per_call:
                room = min(max_bytes - item_bytes, max_call - taken_bytes)
                stop = min(segment.n, p + max_records - in_item)
                # The largest stop whose bytes still fit the item and the call (searched only when the records up
                # to the record bound do not fit: with small records they do, for every item).
                fits = cum[stop] - cum[p] <= room
                fit = stop if fits else int(np.searchsorted(cum, cum[p] + room, side="right")) - 1
                if in_item == 0 and item > 0 and fit < stop:
                    # A further item goes into this call only whole (as the item bounds alone would cut it).
                    whole = int(np.searchsorted(cum, cum[p] + max_bytes, side="right")) - 1
                    whole = min(stop, max(whole, p + 1))
                    if cum[whole] - cum[p] > max_call - taken_bytes:
                        full = True
                        break
                stop = min(stop, fit)
                if stop <= p:
                    if in_item == 0:
                        stop = p + 1  # a record larger than an item (or than a call) travels alone
                    else:
                        item, in_item, item_bytes = item + 1, 0, 0
                        continue
                pieces.append(Piece(segment, p, stop, item, in_item))
                in_item += stop - p
                piece_bytes = int(cum[stop] - cum[p])
                item_bytes += piece_bytes
                taken_bytes += piece_bytes
                taken += stop - p
                p = stop
                if in_item >= max_records or item_bytes >= max_bytes:
                    item, in_item, item_bytes = item + 1, 0, 0
            segment.advance(p)
            if p >= segment.n:
                self.segments.popleft()
        n_items = item + (1 if in_item else 0)
        self.queued -= taken
        self.queued_bytes -= taken_bytes
        if self.queued:
            self.since = time.monotonic()
        return pieces, n_items, taken

    def _take_all(self) -> tuple[list[Piece], int, int]:
        """Everything queued, as one ring item (it fits one item and one call): no prefix sums to search, which is
        most of cutting a call of a few records (the latency of one record)."""
        pieces: list[Piece] = []
        in_item = 0
        while self.segments:
            segment = self.segments.popleft()
            segment.close()
            if segment.pos < segment.n:
                pieces.append(Piece(segment, segment.pos, segment.n, 0, in_item))
                in_item += segment.n - segment.pos
                segment.advance(segment.n)
        self.queued = 0
        self.queued_bytes = 0
        return pieces, (1 if in_item else 0), in_item

    # Encode-ahead's transitions (lock held), the sender's only way to change the lane's flags.

    def begin_encoding(self) -> None:
        """The sender took the lane's next call to encode it ahead, while the lane's call is in flight."""
        self.encoding = True

    def encoded(self, call: Any) -> bool:
        """The sender finished encoding the lane's next call ahead (``call`` None: encoding it failed). True when
        the call in flight settled meanwhile: the encoder then sends its call itself, or, when it has none, the lane
        is free again (the caller wakes the sender); False: the call is parked on the lane (``ahead``)."""
        self.encoding = False
        send_now = self.previous_done
        self.previous_done = False
        if not send_now:
            self.ahead = call
        elif call is None:
            self.in_flight = False
        return send_now

    def call_settled(self) -> Any:
        """The lane's call in flight settled: returns the call encoded ahead, to send now (the lane stays claimed
        for it), or None: the encoder still at it sends its call when done, or else the lane is free."""
        following = self.ahead
        if following is not None:
            self.ahead = None
        elif self.encoding:
            self.previous_done = True
        else:
            self.in_flight = False
        return following

    def drop_ahead(self) -> Any:
        """Take the call encoded ahead off the lane (None when there is none): a close fails it."""
        call, self.ahead = self.ahead, None
        return call
