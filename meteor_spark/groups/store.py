"""Subscriber groups' stored values: the grid maps, their keys and the values kept in them.

Three maps shared by every stream and group; keys and values are canonical JSON text, compact with
sorted keys, because the grid's compare-and-set compares bytes):

``meteor.group.leases``
    key ``["<stream>","<group>",<lane>]`` -> a lease (``meteor_spark.groups.leases.Lease``)::

        {"beat":7,"epoch":3,"holder":"host-4711-1a2b3c4d","lease_ms":5000,"renewed_ms":1700000000000,"v":1}

    Releasing writes ``"holder":null`` and keeps the epoch, so epochs are never reused.

    Key ``["<stream>","<group>","@generation"]``: the group's membership generation, rewritten (with a TTL of two
    lease periods) by a member that joins or leaves, after its heartbeat was written or removed::

        {"by":"host-4711-1a2b3c4d","change":"join","id":"5f0c2a9e1b7d4c3a","v":1}

    Balanced members read it (one ``get``) every 100 ms between renewals; a changed text (a missing entry too)
    makes them recompute the assignment at once, so lanes move to a joiner without waiting for the holders' next
    renewal. It carries no authority: leases and epochs still decide who holds a lane.
``meteor.group.offsets``
    key ``["<stream>","<group>",<lane>]`` -> the lane's confirmed offset and the fencing epoch::

        {"by":"host-4711-1a2b3c4d","epoch":3,"mark":[18,2868764981],"offset":1245184,"updated_ms":1700000000000,
         "v":1}

    ``offset`` is a record offset (``sequence << 16 | index``) meaning "the next record to read"; it is null when
    the lane was assigned but never confirmed. ``mark`` (optional: entries without it, written by earlier versions,
    ``seek`` or tools, are not checked) is the ``meteor_spark.grid.item_marks.ItemMark`` of the item the offset was
    taken after: a member resuming the lane compares it with the item now at that sequence, so a lane truncated
    and refilled under the offset is an error, not a silent skip. ``not_before_ms`` and ``high`` (optional, written
    by ``nack``: ``meteor_spark.groups.redelivery``): the lane is not read by the group before that wall-clock instant
    (a delayed redelivery), and ``high`` is one past the furthest record the group delivered on the lane (the
    distance ``dead_letter_after`` measures against; kept by later confirms while they are below it).
    ``txn`` (optional, written by ``GroupMember.stage``: ``meteor_spark.groups.txn_offsets``):
    ``{"key": <transaction key>, "offset": ..., "mark": ...}``, an offset staged in a transaction: it becomes the
    lane's offset exactly when that transaction commits (Kafka's ``sendOffsetsToTransaction``).

    Key ``["<stream>","<group>","@settings"]``: an exclusive group's stored settings
    (``meteor_spark.groups.exclusive_settings``), written only for a group given ``dead_letter_after``.
``meteor.group.members``
    key ``["<stream>","<group>","<member id>"]`` -> a heartbeat, rewritten every renewal period with a TTL of two
    lease periods (so dead members disappear by themselves)::

        {"beat":12,"host":"worker-3","lease_ms":5000,"member":"worker-3-4711-1a2b3c4d","pid":4711,
         "renewed_ms":1700000000000,"v":1,"want":"balanced"}

The protocol that writes these values is ``meteor_spark.groups.exclusive``; the tools that read and reset them from
outside a group are in ``meteor_spark.groups.admin``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from meteor_spark.grid.item_marks import ItemMark
from meteor_spark.groups.leases import canonical, decode_entry

if TYPE_CHECKING:  # pragma: no cover
    from meteor_spark.grid.client import GridMap
LEASES_MAP = "meteor.group.leases"
OFFSETS_MAP = "meteor.group.offsets"
MEMBERS_MAP = "meteor.group.members"

#: Version of the offsets and member value layouts.
GROUP_FORMAT = 1

#: A CAS loop that keeps losing to writers is bounded; only concurrent confirms of one member can make it spin.
MAX_CAS_ATTEMPTS = 100


def lane_key(stream: str, group: str, lane: int) -> str:
    """Key of a lane's lease and confirmed offset."""
    return canonical([stream, group, lane])


def member_key(stream: str, group: str, member_id: str) -> str:
    """Key of a member's heartbeat."""
    return canonical([stream, group, member_id])


#: Last part of the membership generation's key in ``meteor.group.leases`` (never a lane number).
GENERATION = "@generation"


def generation_key(stream: str, group: str) -> str:
    """Key of a group's membership generation (``meteor.group.leases``): rewritten on every join and leave."""
    return canonical([stream, group, GENERATION])


def generation_value(member: str, change: str) -> str:
    """A new membership generation written by ``member`` (``change``: ``join`` or ``leave``); unique every time,
    since readers only compare texts."""
    return canonical({"v": GROUP_FORMAT, "by": member, "change": change, "id": uuid.uuid4().hex[:16]})


def parse_key(key: str) -> tuple[str, str, Any] | None:
    """``(stream, group, lane or member id)`` of a group key, None for a key something else wrote."""
    try:
        parts = json.loads(key)
    except ValueError:
        return None
    if isinstance(parts, list) and len(parts) == 3 and isinstance(parts[0], str) and isinstance(parts[1], str):
        return parts[0], parts[1], parts[2]
    return None


@dataclass(frozen=True, eq=False)
class Assignment(Mapping[int, int]):
    """The lanes a member holds, as ``{lane: epoch}`` (read-only, hashable, equal to an equal dict).

    Examples:
        >>> a = Assignment.of({2: 7, 0: 3})
        >>> sorted(a), a[2], 1 in a, a == {0: 3, 2: 7}
        ([0, 2], 7, False, True)
    """

    epochs: tuple[tuple[int, int], ...] = ()

    @classmethod
    def of(cls, epochs: Mapping[int, int]) -> Assignment:
        return cls(tuple(sorted(epochs.items())))

    @property
    def lanes(self) -> frozenset[int]:
        return frozenset(lane for lane, _ in self.epochs)

    def __getitem__(self, lane: int) -> int:
        for held_lane, epoch in self.epochs:
            if held_lane == lane:
                return epoch
        raise KeyError(lane)

    def __iter__(self) -> Iterator[int]:
        return (lane for lane, _ in self.epochs)

    def __len__(self) -> int:
        return len(self.epochs)

    def __hash__(self) -> int:
        return hash(self.epochs)

    def __repr__(self) -> str:
        return f"Assignment({dict(self.epochs)})"


@dataclass(frozen=True)
class StagedOffset:
    """An offset staged in a transaction: the lane's offset once transaction ``key`` commits, never if it aborts."""

    key: str
    offset: int
    mark: ItemMark | None = None

    def to_dict(self) -> dict[str, Any]:
        value: dict[str, Any] = {"key": self.key, "offset": self.offset}
        if self.mark is not None:
            value["mark"] = self.mark.encode()
        return value

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> StagedOffset:
        return cls(str(raw["key"]), int(raw["offset"]), ItemMark.decode(raw.get("mark")))


@dataclass(frozen=True)
class ConfirmedOffset:
    """A lane's stored confirmed offset.

    Attributes:
        epoch: the fencing epoch of the last holder that wrote (or fenced) the entry.
        offset: the next record to read, or None when never confirmed.
        by: member id of the last writer.
        updated_ms: the writer's wall clock at the last write (display only).
        mark: the item the offset was taken after (``meteor_spark.grid.item_marks``), None when not known.
        not_before_ms: the group does not read the lane before this wall-clock instant (0: no pause).
        high: one past the furthest record the group delivered on the lane, when above ``offset`` (None: unknown).
        txn: an offset staged in a transaction, applied when it commits (``meteor_spark.groups.txn_offsets``).
    """

    epoch: int
    offset: int | None
    by: str | None = None
    updated_ms: int = 0
    mark: ItemMark | None = None
    not_before_ms: int = 0
    high: int | None = None
    txn: StagedOffset | None = None

    def encode(self) -> str:
        value: dict[str, Any] = {
            "v": GROUP_FORMAT,
            "epoch": self.epoch,
            "offset": self.offset,
            "by": self.by,
            "updated_ms": self.updated_ms,
        }
        if self.mark is not None:
            value["mark"] = self.mark.encode()
        if self.not_before_ms:
            value["not_before_ms"] = self.not_before_ms
        if self.high is not None:
            value["high"] = self.high
        if self.txn is not None:
            value["txn"] = self.txn.to_dict()
        return canonical(value)

    @classmethod
    def decode(cls, text: str, where: str) -> ConfirmedOffset:
        return decode_entry(text, f"confirmed offset {where}", "offset entry", "group", GROUP_FORMAT, cls._build)

    @classmethod
    def _build(cls, raw: dict[str, Any]) -> ConfirmedOffset:
        offset = raw["offset"]
        return cls(
            epoch=int(raw["epoch"]),
            offset=None if offset is None else int(offset),
            by=raw.get("by"),
            updated_ms=int(raw.get("updated_ms", 0)),
            mark=None if offset is None else ItemMark.decode(raw.get("mark")),
            not_before_ms=int(raw.get("not_before_ms", 0)),
            high=None if raw.get("high") is None else int(raw["high"]),
            txn=None if raw.get("txn") is None else StagedOffset.from_dict(raw["txn"]),
        )


@dataclass(frozen=True)
class MemberEntry:
    """A member's heartbeat value."""

    member: str
    want: str
    beat: int
    lease_ms: int
    renewed_ms: int
    host: str
    pid: int

    def encode(self) -> str:
        return canonical(
            {
                "v": GROUP_FORMAT,
                "member": self.member,
                "want": self.want,
                "beat": self.beat,
                "lease_ms": self.lease_ms,
                "renewed_ms": self.renewed_ms,
                "host": self.host,
                "pid": self.pid,
            }
        )

    @classmethod
    def decode(cls, text: str, where: str) -> MemberEntry:
        return decode_entry(text, f"group member entry {where}", "heartbeat", "group", GROUP_FORMAT, cls._build)

    @classmethod
    def _build(cls, raw: dict[str, Any]) -> MemberEntry:
        return cls(
            member=str(raw["member"]),
            want=str(raw["want"]),
            beat=int(raw["beat"]),
            lease_ms=int(raw["lease_ms"]),
            renewed_ms=int(raw.get("renewed_ms", 0)),
            host=str(raw.get("host", "")),
            pid=int(raw.get("pid", 0)),
        )


def read_offset(offsets: GridMap, stream: str, group: str, lane: int) -> ConfirmedOffset | None:
    """The stored confirmed offset of a lane, None when there is no entry."""
    key = lane_key(stream, group, lane)
    text = offsets.get(key)
    return None if text is None else ConfirmedOffset.decode(text, f"{key} in map {OFFSETS_MAP!r}")
