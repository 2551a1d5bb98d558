"""One lane's queue in a publisher's accumulator (``LaneQueue``): its segments, counts and in-flight flags.

The accumulator (``meteor_spark.producer.accumulator``) holds one per lane, under its lock; the sender changes a
lane's encode-ahead flags only through the transitions here (``begin_encoding``, ``encoded``, ``call_settled``,
``drop_ahead``).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from meteor_spark.producer.calls import Segment

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
