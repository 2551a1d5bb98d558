"""The stored state of one lane of a shared group (queue semantics), and the pure steps that change it.

A shared group (``meteor_spark.consumer.shared_subscriber``) keeps one entry per lane in the grid map
``meteor.share.lanes``, key ``["<stream>","<group>",<lane>]``, value canonical JSON (compact, sorted keys: the grid's
compare-and-set
compares bytes)::

    {"next":327680,"spans":[[262144,262146,"d"],[262146,262150,"a",1,"w1-4711-1a2b:9f3c:17"],
     [262150,327680,"r",2]],"start":262144,"v":1}

- ``start``: the share-partition start offset (KIP-932's SPSO). Every record below it was acknowledged or
  archived; the entry says nothing about them any more.
- ``next``: the first offset never acquired (one past KIP-932's SPEO). Records from it on are acquired fresh.
- ``spans`` cover ``[start, next)`` exactly, in order and without gaps, one per run of records in the same state:

  - ``[first, end, "a", deliveries, token]``: acquired by the acquisition ``token`` (one poll of one member);
    ``deliveries`` counts this delivery;
  - ``[first, end, "r", deliveries]``: available again (released by ``nack``, or its acquisition timed out),
    delivered ``deliveries`` times so far; ``[first, end, "r", deliveries, not_before]`` when a ``nack`` with a delay
    released it: not available before the wall-clock instant ``not_before`` (ms since the epoch; it lives here, not
    in the member, so the delay holds when that member dies: ``meteor_spark.groups.redelivery``);
  - ``[first, end, "d"]``: done (acknowledged, rejected or archived after ``max_deliveries``).

  Offsets are record offsets (``sequence << 16 | index``) and a span ends at the offset of the record after its
  last one (the next record of the item, or the first of the next item), so spans never leave record-less holes.
  Adjacent spans in the same state merge, and done spans at the front fold into ``start``: the entry holds a
  handful of ranges, whatever the number of records in flight.
- ``mark`` (optional): ``[sequence, crc]``, the item mark (``meteor_spark.grid.item_marks``) of the ring item of
  the last record below ``next``, taken when a member moves ``next`` on. A member taking the lane up (its first
  look, or its first after the grid lost a connection) compares it with the item now at that sequence: another item
  means the lane lost its tail in a member restart and new records took the sequences below ``next``. Entries
  without one (written before marks) are read as before and simply not checked; steps keep the mark as it is.

Every function here is pure (no grid, no clock); ``shared_groups`` reads an entry, applies one step and writes the
result back with one compare-and-set on the exact text it read.

The group's settings live in the same map, key ``["<stream>","<group>","@settings"]`` (``GroupSettings``): the
record lock duration (``acquisition_timeout_ms``), the delivery limit (``max_deliveries``), the dead-letter
stream and the distance after which an available record is dead-lettered (``dead_letter_after``, stored only when
set). They belong to the group, not to a member (Kafka share groups: ``share.record.lock.duration.ms`` and
``share.delivery.count.limit`` are group configs): every member judges timeouts with the same lock duration, so
records a dead member held come back after the group's lock time whoever is left.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from meteor_spark.grid.item_marks import ItemMark
from meteor_spark.groups.leases import canonical, decode_entry

__all__ = ["ACQUIRED", "AVAILABLE", "DONE", "SHARE_MAP", "GroupSettings", "LaneShare", "Span", "settings_key"]

#: The grid map holding every shared group's lane entries (keys as ``group_store.lane_key``, so the tools that
#: forget a stream's groups find them too).
SHARE_MAP = "meteor.share.lanes"

#: Version of the entry layout; a reader meeting a newer one refuses to interpret it.
SHARE_FORMAT = 1

ACQUIRED = "a"
AVAILABLE = "r"
DONE = "d"

#: The third element of a group's settings key (a lane key has the lane number there).
SETTINGS = "@settings"


def settings_key(stream: str, group: str) -> str:
    """Key of a shared group's settings (shaped like a lane key, so tools that forget a stream's groups find it)."""
    return canonical([stream, group, SETTINGS])


@dataclass(frozen=True)
class GroupSettings:
    """A shared group's settings, stored by its first member (see the module docs).

    Attributes:
        acquisition_timeout_ms: the record lock duration.
        max_deliveries: deliveries after which an unacknowledged record is dead-lettered (None: never).
        dead_letter_stream: where such records, rejected records and undecodable items go (None: none).
        dead_letter_after: records an available record may fall behind the most recently acquired one before it is
            dead-lettered (None: never; ``meteor_spark.groups.redelivery``).
    """

    acquisition_timeout_ms: int
    max_deliveries: int | None = None
    dead_letter_stream: str | None = None
    dead_letter_after: int | None = None

    def encode(self) -> str:
        raw: dict[str, Any] = {
            "v": SHARE_FORMAT,
            "acquisition_timeout_ms": self.acquisition_timeout_ms,
            "max_deliveries": self.max_deliveries,
            "dead_letter_stream": self.dead_letter_stream,
        }
        if self.dead_letter_after is not None:  # only when set: settings stored before it read the same
            raw["dead_letter_after"] = self.dead_letter_after
        return canonical(raw)

    @classmethod
    def decode(cls, text: str, where: str) -> GroupSettings:
        """Parse stored settings (``FormatError`` naming ``where`` when malformed)."""
        return decode_entry(
            text, f"shared group settings {where}", "shared group settings", "shared group", SHARE_FORMAT, cls._build
        )

    @classmethod
    def _build(cls, raw: dict[str, Any]) -> GroupSettings:
        deliveries = raw["max_deliveries"]
        stream = raw["dead_letter_stream"]
        after = raw.get("dead_letter_after")
        return cls(
            int(raw["acquisition_timeout_ms"]),
            None if deliveries is None else int(deliveries),
            None if stream is None else str(stream),
            None if after is None else int(after),
        )


@dataclass(frozen=True)
class Span:
    """Records ``[first, end)`` of a lane in one state (see the module docs)."""

    first: int
    end: int
    state: str
    deliveries: int = 0
    token: str | None = None
    not_before: int = 0  # available spans: not before this wall-clock ms (0: at once)

    def encode(self) -> list[Any]:
        if self.state == ACQUIRED:
            return [self.first, self.end, ACQUIRED, self.deliveries, self.token]
        if self.state == AVAILABLE and self.not_before:
            return [self.first, self.end, AVAILABLE, self.deliveries, self.not_before]
        if self.state == AVAILABLE:
            return [self.first, self.end, AVAILABLE, self.deliveries]
        return [self.first, self.end, DONE]

    @classmethod
    def decode(cls, raw: Sequence[Any]) -> Span:
        first, end, state = int(raw[0]), int(raw[1]), str(raw[2])
        if not first < end or state not in (ACQUIRED, AVAILABLE, DONE):
            raise ValueError(f"bad span {list(raw)!r}")
        if state == ACQUIRED:
            return cls(first, end, state, int(raw[3]), str(raw[4]))
        if state == AVAILABLE:
            return cls(first, end, state, int(raw[3]), None, int(raw[4]) if len(raw) > 4 else 0)
        return cls(first, end, state)

    def same_kind(self, other: Span) -> bool:
        mine = (self.state, self.deliveries, self.token, self.not_before)
        return mine == (other.state, other.deliveries, other.token, other.not_before)

    def cut(self, first: int, end: int) -> Span:
        return Span(first, end, self.state, self.deliveries, self.token, self.not_before)

    def ready(self, now_ms: int) -> bool:
        """An available span whose delay (if any) has passed at the wall-clock instant ``now_ms``."""
        return self.state == AVAILABLE and self.not_before <= now_ms


@dataclass(frozen=True)
class LaneShare:
    """One lane's stored state: ``start``, ``next``, the spans between them and the mark of the item before
    ``next`` (see the module docs)."""

    start: int
    next: int
    spans: tuple[Span, ...] = ()
    mark: ItemMark | None = None

    @classmethod
    def initial(cls, offset: int) -> LaneShare:
        """A lane nobody acquired anything of yet, starting at ``offset``."""
        return cls(offset, offset)

    def encode(self) -> str:
        raw: dict[str, Any] = {
            "v": SHARE_FORMAT,
            "start": self.start,
            "next": self.next,
            "spans": [s.encode() for s in self.spans],
        }
        if self.mark is not None:
            raw["mark"] = self.mark.encode()
        return canonical(raw)

    def marked(self, mark: ItemMark | None) -> LaneShare:
        """This state with ``mark`` as the mark of the item before ``next`` (None keeps the one it has)."""
        return self if mark is None else replace(self, mark=mark)

    @classmethod
    def decode(cls, text: str, where: str) -> LaneShare:
        """Parse a stored entry; ``where`` names it in the error message (``FormatError`` when malformed)."""
        return decode_entry(
            text, f"shared group entry {where}", "shared group entry", "shared group", SHARE_FORMAT, cls._build
        )

    @classmethod
    def _build(cls, raw: dict[str, Any]) -> LaneShare:
        share = cls(
            int(raw["start"]),
            int(raw["next"]),
            tuple(Span.decode(s) for s in raw["spans"]),
            ItemMark.decode(raw.get("mark")),
        )
        at = share.start
        for span in share.spans:
            if span.first != at:
                raise ValueError(f"spans do not cover [start, next) without gaps at offset {at}")
            at = span.end
        if at != share.next:
            raise ValueError(f"spans end at {at}, not at next {share.next}")
        return share

    # ------------------------------------------------------------------------------------------ reading

    def tokens(self) -> set[str]:
        """The acquisitions holding records now."""
        return {s.token for s in self.spans if s.state == ACQUIRED and s.token is not None}

    def available(self) -> list[Span]:
        """The spans available for (re)delivery, lowest offsets first."""
        return [s for s in self.spans if s.state == AVAILABLE]

    def held_by(self, token: str) -> list[Span]:
        return [s for s in self.spans if s.state == ACQUIRED and s.token == token]

    # ------------------------------------------------------------------------------------------ steps

    def expire(self, tokens: Iterable[str]) -> LaneShare:
        """Acquisitions ``tokens`` timed out: their records become available, delivery counts kept."""
        gone = set(tokens)
        if not gone:
            return self
        spans = [
            Span(s.first, s.end, AVAILABLE, s.deliveries) if s.state == ACQUIRED and s.token in gone else s
            for s in self.spans
        ]
        return LaneShare(self.start, self.next, tuple(spans), self.mark).normalized()

    def acquire(self, ranges: Sequence[tuple[int, int, int]], token: str, new_next: int | None = None) -> LaneShare:
        """Acquire ``ranges`` (``(first, end, deliveries)``, each inside one available span) and, with
        ``new_next``, the fresh records ``[next, new_next)`` (delivered for the first time), for ``token``.

        Raises:
            ValueError: a range that is not available (a bug of the caller: it computed ranges from this state).
        """
        spans = list(self.spans)
        for first, end, deliveries in ranges:
            painted = _paint(
                spans, first, end, lambda s: s.state == AVAILABLE, Span(first, end, ACQUIRED, deliveries, token)
            )
            if painted is None:
                raise ValueError(f"offsets [{first}, {end}) are not available to acquire")
            spans = painted
        nxt = self.next
        if new_next is not None and new_next > nxt:
            spans.append(Span(nxt, new_next, ACQUIRED, 1, token))
            nxt = new_next
        return LaneShare(self.start, nxt, tuple(spans), self.mark).normalized()

    def settle(
        self, ranges: Sequence[tuple[int, int]], token: str, state: str, not_before: int = 0
    ) -> tuple[LaneShare, list[tuple[int, int]]]:
        """Move the records ``ranges`` held by ``token`` to ``state``: ``DONE`` (acknowledged, rejected, archived)
        or ``AVAILABLE`` (released; delivery count kept; with ``not_before``, not available before that wall-clock
        instant).

        Returns:
            the new state and the ranges refused because ``token`` no longer holds all of them (its acquisition
            timed out and the records were released or taken by another member, or they were settled already).
        """
        spans: list[Span] = list(self.spans)
        refused: list[tuple[int, int]] = []
        for first, end in ranges:
            painted = _paint(
                spans,
                first,
                end,
                lambda s: s.state == ACQUIRED and s.token == token,
                Span(first, end, state, not_before=not_before if state == AVAILABLE else 0),
                keep_deliveries=True,
            )
            if painted is None:
                refused.append((first, end))
            else:
                spans = painted
        return LaneShare(self.start, self.next, tuple(spans), self.mark).normalized(), refused

    def renew(
        self, ranges: Sequence[tuple[int, int]], token: str, new_token: str
    ) -> tuple[LaneShare, list[tuple[int, int]]]:
        """Move the records ``ranges`` held by ``token`` to the acquisition ``new_token`` (delivery counts kept): a
        new token is a fresh acquisition to every member judging timeouts, so the lock starts again (Kafka's
        RENEW, KIP-1222). Returns the new state and the ranges refused (no longer held by ``token``)."""
        spans: list[Span] = list(self.spans)
        refused: list[tuple[int, int]] = []
        for first, end in ranges:
            painted = _paint(
                spans,
                first,
                end,
                lambda s: s.state == ACQUIRED and s.token == token,
                Span(first, end, ACQUIRED, 0, new_token),
                keep_deliveries=True,
            )
            if painted is None:
                refused.append((first, end))
            else:
                spans = painted
        return LaneShare(self.start, self.next, tuple(spans), self.mark).normalized(), refused

    def normalized(self) -> LaneShare:
        """Adjacent spans of the same kind merged, done spans at the front folded into ``start``."""
        merged: list[Span] = []
        for span in self.spans:
            if merged and merged[-1].end == span.first and merged[-1].same_kind(span):
                merged[-1] = merged[-1].cut(merged[-1].first, span.end)
            else:
                merged.append(span)
        start = self.start
        while merged and merged[0].state == DONE:
            start = merged.pop(0).end
        return LaneShare(start, self.next, tuple(merged), self.mark)


def _paint(
    spans: list[Span], first: int, end: int, allowed: Any, new: Span, keep_deliveries: bool = False
) -> list[Span] | None:
    """``spans`` with ``[first, end)`` replaced by ``new`` (its attributes; with ``keep_deliveries`` each piece
    keeps its delivery count), or None when any part of the range lies in a span ``allowed`` refuses or outside
    the spans."""
    out: list[Span] = []
    covered = first
    for span in spans:
        if span.end <= first or span.first >= end:
            out.append(span)
            continue
        if not allowed(span) or span.first > covered:
            return None
        if span.first < first:
            out.append(span.cut(span.first, first))
        lo, hi = max(span.first, first), min(span.end, end)
        deliveries = span.deliveries if keep_deliveries and new.state != DONE else new.deliveries
        out.append(Span(lo, hi, new.state, deliveries, new.token, new.not_before))
        covered = hi
        if span.end > end:
            out.append(span.cut(end, span.end))
    if covered < end:
        return None
    return out
