"""The exclusive-group protocol's decisions, without grid calls: one source of truth for the threaded member
(``meteor_spark.groups.balancing`` / ``exclusive``) and the asyncio one (``meteor_spark.aio.group_member``).

Each function takes what was read from the grid (texts, decoded values, what a process observed) and returns what
to write, or what the answer means; the callers only make the calls, synchronously or awaited. The protocol itself
(acquire, fence, renew, expiry, balancing, confirm) is described in ``meteor_spark.groups.exclusive``:

- leases: ``acquired`` (the value a takeover writes), ``renewed``, ``vacated`` (kept in
  ``meteor_spark.groups.leases``, with the lease type), ``may_take`` (a lease free or expired for this observer);
- membership: ``heartbeat``, ``live_members``, ``target_lanes``;
- fencing a lane taken: ``fence_step`` (what the stored offsets entry asks for) and ``fenced_value`` (the entry
  stamped with the new epoch, its staged offset settled by the caller first);
- moving an offset: ``offset_step`` (refused, ignored, or the text to compare-and-set);
- the errors both members raise alike: ``fenced_error``, ``not_assigned_error``, ``check_lane``,
  ``unconfirmed_lost_error``, ``truncated_lane_error``, ``contended_error``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from meteor_spark.errors import (
    ConfigError,
    FencedError,
    FormatError,
    GroupError,
    LaneTruncatedError,
    NotAssignedError,
)
from meteor_spark.grid.item_marks import ItemMark
from meteor_spark.groups.leases import ExpiryObserver, Lease, acquired, renewed, vacated, wall_ms
from meteor_spark.groups.store import MEMBERS_MAP, Assignment, ConfirmedOffset, MemberEntry, parse_key

__all__ = [
    "FenceStep",
    "contended_error",
    "truncated_lane_error",
    "unconfirmed_lost_error",
    "OffsetStep",
    "acquired",
    "balance",
    "check_lane",
    "fence_step",
    "fenced_error",
    "fenced_value",
    "heartbeat",
    "live_members",
    "may_take",
    "not_assigned_error",
    "offset_step",
    "renewed",
    "target_lanes",
    "vacated",
]


def balance(members: Sequence[str], lanes: int) -> dict[str, frozenset[int]]:
    """The target assignment every member computes alike: lane ``i`` to the ``i mod n``-th sorted member id.

    Examples:
        >>> {m: sorted(l) for m, l in balance(["c", "a", "b"], 4).items()}
        {'a': [0, 3], 'b': [1], 'c': [2]}
    """
    ordered = sorted(set(members))
    return {member: frozenset(range(i, lanes, len(ordered))) for i, member in enumerate(ordered)}


# -- leases ------------------------------------------------------------------------------------------------------


def may_take(
    lease: Lease | None, text: str | None, key: str, member_id: str, joining: bool, observer: ExpiryObserver
) -> bool:
    """Whether a member may try to take a lease it read: absent, vacant, expired for this observer, or held in its
    own name by a previous incarnation (a restart with the same ``member_id``). The last only while ``joining``,
    so two live members sharing an id (a mistake) cannot keep snatching lanes from each other; afterwards such a
    lease has to expire like any other. A live holder gives its lane up itself: it is never stolen."""
    if lease is None or lease.vacant:
        return True
    if lease.holder == member_id and joining:
        return True
    return observer.expired(key, text or "", lease.lease_ms)


# -- membership --------------------------------------------------------------------------------------------------


def heartbeat(member_id: str, want: str, beat: int, lease_ms: int, host: str) -> MemberEntry:
    """A member's heartbeat value (``meteor.group.members``)."""
    return MemberEntry(
        member=member_id, want=want, beat=beat, lease_ms=lease_ms, renewed_ms=wall_ms(), host=host, pid=os.getpid()
    )


def live_members(
    entries: Mapping[str, str],
    stream: str,
    group: str,
    own: MemberEntry,
    observer: ExpiryObserver,
    warn: list[str] | None = None,
) -> dict[str, MemberEntry]:
    """The group's members whose heartbeat this process has seen change within their lease period, from the
    members map's ``entries`` (the member itself always counts). Unreadable entries are passed over (their
    errors appended to ``warn``); the observer forgets keys no longer in the map (bounded)."""
    live: dict[str, MemberEntry] = {}
    seen: set[str] = set()
    for key, text in entries.items():
        parsed = parse_key(key)
        if parsed is None or parsed[0] != stream or parsed[1] != group:
            continue
        seen.add(key)
        try:
            entry = MemberEntry.decode(text, f"{key} in map {MEMBERS_MAP!r}")
        except FormatError as exc:
            if warn is not None:
                warn.append(str(exc))
            continue
        observer.see(key, text)
        if entry.member == own.member or not observer.expired(key, text, entry.lease_ms):
            live[entry.member] = entry
    observer.forget_except(seen)
    live.setdefault(own.member, own)
    return live


def target_lanes(want: str, live: Mapping[str, MemberEntry], lanes: int, member_id: str) -> frozenset[int]:
    """The lanes a member should hold: every lane for ``want="all"``, else its share among the balanced members."""
    if want == "all":
        return frozenset(range(lanes))
    balanced = [member for member, entry in live.items() if entry.want == "balanced"]
    return balance(balanced, lanes).get(member_id, frozenset())


# -- fencing a lane taken ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FenceStep:
    """What the lane's offsets entry asks of a member fencing it with a new epoch.

    Attributes:
        keep: the entry already carries the epoch: this text is the member's copy.
        newer: a newer epoch is on the entry: the lane was taken by someone else meanwhile.
        create: no entry: ``put_if_absent`` this text.
        stored: the decoded entry to stamp (``fenced_value``) once its staged offset is settled.
        text: the stored text ``stored`` was read from (what the stamping compare-and-set compares against).
    """

    keep: str | None = None
    newer: bool = False
    create: str | None = None
    stored: ConfirmedOffset | None = None
    text: str | None = None


def fence_step(text: str | None, where: str, epoch: int, member_id: str) -> FenceStep:
    """Read the offsets entry ``text`` for a member that took the lane with ``epoch``."""
    if text is None:
        return FenceStep(create=ConfirmedOffset(epoch, None, member_id, wall_ms()).encode())
    stored = ConfirmedOffset.decode(text, where)
    if stored.epoch > epoch:
        return FenceStep(newer=True)
    if stored.epoch == epoch:
        return FenceStep(keep=text)
    return FenceStep(stored=stored, text=text)


def fenced_value(settled: ConfirmedOffset, epoch: int, member_id: str) -> str:
    """The entry stamped with the new holder's epoch: the offset, its mark and a nack's pause and high-water mark
    stay; only the epoch and the writer change (a staged offset was settled by the caller in ``settled``)."""
    return replace(settled, epoch=epoch, by=member_id, updated_ms=wall_ms()).encode()


# -- moving an offset ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OffsetStep:
    """What a confirm / seek / hold does given the stored entry.

    Attributes:
        fenced: the stored entry carries a newer epoch (raise ``fenced_error`` with it).
        ignored: a confirm at or below the stored offset: nothing to write (the stored text is still current).
        below: with ``ignored``: the confirm was strictly below (worth a debug line).
        write: the text to compare-and-set.
    """

    stored: ConfirmedOffset
    fenced: bool = False
    ignored: bool = False
    below: bool = False
    write: str | None = None


def offset_step(
    text: str,
    where: str,
    *,
    epoch: int,
    offset: int,
    member_id: str,
    backwards: bool,
    mark: ItemMark | None = None,
    not_before_ms: int = 0,
    high: int | None = None,
) -> OffsetStep:
    """Decide a fenced offset write against the stored entry ``text`` (a confirm never moves the offset back; a seek
    forgets the high-water mark; a staged offset is kept)."""
    stored = ConfirmedOffset.decode(text, where)
    if stored.epoch > epoch:
        return OffsetStep(stored, fenced=True)
    if not backwards and stored.offset is not None and offset <= stored.offset:
        return OffsetStep(stored, ignored=True, below=offset < stored.offset)
    kept_high = high if high is not None or backwards else stored.high
    kept_high = kept_high if kept_high is not None and kept_high > offset else None
    new = ConfirmedOffset(epoch, offset, member_id, wall_ms(), mark, not_before_ms, kept_high, stored.txn).encode()
    return OffsetStep(stored, write=new)


def check_offset(what: str, offset: object, where: str) -> int:
    """An offset argument of confirm / seek: an integer >= 0."""
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ConfigError(
            f"{what} offset {offset!r} on {where} is invalid; offsets are integers >= 0 "
            f"(use the offset of the next record to read)"
        )
    return offset


# -- errors --------------------------------------------------------------------------------------------------------


def fenced_error(
    member_id: str, what: str, where: str, offset: int, epoch: int, holder: str | None, their_epoch: int | None
) -> FencedError:
    """The error of a write refused by fencing (nothing was written)."""
    now = "is vacant" if holder is None else f"is held by {holder!r}"
    return FencedError(
        f"{what} of offset {offset} on {where} refused: member {member_id!r} held the lane "
        f"with epoch {epoch}, but the lane {now} with epoch {their_epoch}; nothing was written. The records "
        f"after the group's confirmed offset go to the lane's current holder; read the lane again only when "
        f"it is assigned back (on_change)"
    )


def not_assigned_error(member_id: str, where: str, assignment: Assignment) -> NotAssignedError:
    """The error of a write on a lane this member does not hold (and never lost to another member)."""
    return NotAssignedError(
        f"member {member_id!r} does not hold {where}; it holds lanes "
        f"{sorted(assignment)}. Confirm and seek only lanes in assignment()"
    )


def check_lane(lane: object, lanes: int, stream: str) -> int:
    """A lane argument: an integer in ``0..lanes-1``."""
    if isinstance(lane, bool) or not isinstance(lane, int) or not 0 <= lane < lanes:
        raise ConfigError(f"lane {lane!r} does not exist on stream {stream!r}; it has lanes 0..{lanes - 1}")
    return lane


def unconfirmed_lost_error(stream: str, group: str | None, lost: Mapping[int, int | None]) -> FencedError:
    """A confirm refused because lanes this member delivered unconfirmed records of were taken over (``lost``: lane
    -> the epoch it had)."""
    return FencedError(
        f"confirm refused for stream {stream!r} lane(s) {sorted(lost)} of group {group!r}: "
        f"this member lost them (epochs {[lost[lane] for lane in sorted(lost)]}) after delivering records "
        f"it had not confirmed; nothing was written for them, and the lanes' new holders read those "
        f"records again"
    )


def lost_in_transaction_error(stream: str, group: str | None, lost: Mapping[int, int | None]) -> FencedError:
    """What ``send_offsets`` says of lanes lost after delivering records not confirmed yet: their new holders read
    those records again, so the transaction must abort (threaded and asyncio subscribers)."""
    return FencedError(
        f"stream {stream!r} lane(s) {sorted(lost)} of group {group!r} were lost after delivering records not "
        f"confirmed yet; their new holders read them again: abort the transaction"
    )


def truncated_lane_error(
    stream: str, lane: int, group: str | None, confirmed: int, restart: int, sequence: int, seek: str
) -> LaneTruncatedError:
    """The group's offset of ``lane`` is past a truncation that new records refilled (its item mark at
    ``sequence`` changed); ``seek`` names the caller's way to move the lane."""
    return LaneTruncatedError(
        stream,
        lane,
        confirmed,
        restart,
        sequence,
        whose=f"group {group!r}'s offset",
        fix=(
            f"Decide where the group goes on: seek the lane ({seek}, or with the group stopped "
            f"`meteor groups STREAM GROUP --seek` or meteor_spark.groups.admin.seek_group), e.g. to the oldest record "
            f"{restart}; or opt in to skip_data_loss=True, which re-reads the lane from its oldest record and "
            f"counts it."
        ),
    )


def contended_error(what: str, offset: int, where: str, attempts: int, writers: str) -> GroupError:
    """An offset write that lost its compare-and-set ``attempts`` times in a row (``writers``: what the caller's
    unit of concurrency is, "thread" or "task")."""
    return GroupError(
        f"{what} of offset {offset} on {where} lost the compare-and-set {attempts} times in a row to concurrent "
        f"writers; confirm from one {writers} per lane"
    )
