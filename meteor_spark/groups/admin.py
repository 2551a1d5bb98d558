"""Tools that look at and reset streams and groups from outside a group: what ``meteor groups`` and
``meteor streams`` show and do.

- ``group_state``, ``group_members``: each lane's holder, epoch and confirmed offset; each member's heartbeat.
- ``lag`` and ``lag_report``: how far a group is behind per lane (items, and records when counted).
- ``list_groups``: every group with state in the grid.
- ``seek_group``: move a stopped group's offsets (to replay, or past a stale position).
- ``forget_groups``, ``delete_stream``, ``list_streams``: stream lifecycle, which takes its groups along.

These build on the stream metadata (``streams``), the stored group values (``group_store``) and reading
(``reading``); nothing in the data path imports this module.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from meteor_spark.errors import ConfigError, GroupError, OffsetOutOfRangeError
from meteor_spark.format.offsets import first_offset_of, index_of, sequence_of
from meteor_spark.grid.client import Grid
from meteor_spark.grid.item_gate import READ_COMMITTED, ItemGate, stable_end
from meteor_spark.grid.reading import oldest_in, oldest_sequence, tally_records
from meteor_spark.grid.streams import STREAMS_MAP, StreamInfo, lane_bounds, parse_metadata
from meteor_spark.groups.leases import Lease, LeaseMap, wall_ms
from meteor_spark.groups.shared_state import SHARE_MAP, LaneShare
from meteor_spark.groups.store import (
    LEASES_MAP,
    MAX_CAS_ATTEMPTS,
    MEMBERS_MAP,
    OFFSETS_MAP,
    ConfirmedOffset,
    MemberEntry,
    lane_key,
    parse_key,
    read_offset,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GroupLaneState:
    """What tools show for one lane of a group.

    Attributes:
        lane: lane number.
        holder: member id holding the lease, or None when vacant.
        epoch: current fencing epoch (0 when the lane was never assigned).
        lease_expires_ms: wall-clock ms at which the lease runs out unless renewed, by the holder's clock (an
            estimate for display; expiry is decided by observed non-renewal), None when vacant.
        confirmed: the confirmed offset (next record to read), None when never confirmed.
    """

    lane: int
    holder: str | None
    epoch: int
    lease_expires_ms: int | None
    confirmed: int | None


@dataclass(frozen=True)
class MemberState:
    """A member's last heartbeat, for tools."""

    member: str
    want: str
    host: str
    pid: int
    renewed_ms: int
    lease_ms: int


@dataclass(frozen=True)
class LaneLag:
    """How far a reader is behind on one lane: a group (``lag_report``, from the grid) or a streaming query
    (``spark.lag.lag_from_progress``, from its progress report).

    Attributes:
        lane: lane number.
        confirmed: the reader's position, the next record to read (a group's confirmed offset; for a query, the
            first record of the item its last batch stopped before); None when never confirmed (then nothing else
            is computed).
        next_sequence: the lane's next ring sequence (tail + 1; for a query, when its last batch was planned).
        items: ring items not yet fully read (the item holding the confirmed offset counts when partly read).
        records: records not yet read, when counted (``count_records=True`` and at most ``max_items`` items
            behind, none lost); else None. Undecodable items count as 0 records (see ``corrupt_items``).
        lost_items: items behind that the grid can no longer serve (overwritten, or quarantined on a persistent
            member): the group will hit DataLossError there.
        past_end: the confirmed offset lies past the lane's end (the stream was re-created, the lane truncated or
            the grid restarted without persistence); the group's members get OffsetOutOfRangeError until the lane
            is sought. ``items`` and ``records`` are None then.
        corrupt_items: undecodable items among those counted (counted as 0 records).
        stream: the stream's name.
        records_estimate: ``items`` x records per item of a query's last batch (a query's lag only; an estimate,
            named so), None when there is nothing to estimate from.
        stable_sequence: the lane's last stable offset as a ring sequence (the first item of a transaction still
            open) when it lies before ``next_sequence``: ``read_committed`` readers wait there. Computed with
            ``count_records`` (from the same items' headers); None otherwise.
    """

    lane: int
    confirmed: int | None
    next_sequence: int
    items: int | None
    records: int | None = None
    lost_items: int = 0
    past_end: bool = False
    corrupt_items: int = 0
    stream: str = ""
    records_estimate: float | None = None
    stable_sequence: int | None = None

    @property
    def processed(self) -> int:
        """The ring sequence reading resumes at (the item holding ``confirmed``; 0 when never confirmed)."""
        return 0 if self.confirmed is None else sequence_of(self.confirmed)

    @property
    def items_behind(self) -> int:
        """``items``, 0 when not computed."""
        return self.items or 0


@dataclass(frozen=True)
class GroupSummary:
    """One group of one stream, as ``list_groups`` finds it."""

    stream: str
    group: str
    members: int
    held_lanes: int
    confirmed_lanes: int


def group_state(grid: Grid, info: StreamInfo, group: str) -> list[GroupLaneState]:
    """Holder, epoch, lease expiry estimate and confirmed offset of every lane of ``group`` on ``info``'s stream."""
    stream = info.config.name
    keys = [lane_key(stream, group, lane) for lane in range(info.config.lanes)]
    leases = grid.map(LEASES_MAP).get_all(keys)
    offsets = grid.map(OFFSETS_MAP).get_all(keys)
    states = []
    for lane, key in enumerate(keys):
        lease = Lease.decode(leases[key], f"{key} in map {LEASES_MAP!r}") if key in leases else None
        stored = ConfirmedOffset.decode(offsets[key], f"{key} in map {OFFSETS_MAP!r}") if key in offsets else None
        holder = None if lease is None else lease.holder
        epoch = max(lease.epoch if lease else 0, stored.epoch if stored else 0)
        expires = None if lease is None or holder is None else lease.renewed_ms + lease.lease_ms
        states.append(GroupLaneState(lane, holder, epoch, expires, None if stored is None else stored.offset))
    return states


def group_members(grid: Grid, info: StreamInfo, group: str) -> list[MemberState]:
    """The heartbeats of ``group``'s members on ``info``'s stream (members that stopped renewing drop out after
    two lease periods)."""
    stream = info.config.name
    members = []
    for key, text in grid.map(MEMBERS_MAP).entries().items():
        parsed = parse_key(key)
        if parsed is None or parsed[0] != stream or parsed[1] != group:
            continue
        entry = MemberEntry.decode(text, f"{key} in map {MEMBERS_MAP!r}")
        members.append(MemberState(entry.member, entry.want, entry.host, entry.pid, entry.renewed_ms, entry.lease_ms))
    return sorted(members, key=lambda m: m.member)


def lag(grid: Grid, info: StreamInfo, group: str) -> dict[int, int]:
    """Ring items each lane of ``group`` still has to read, from offsets (lanes never confirmed, and lanes whose
    confirmed offset lies past their end, are left out; ``lag_report`` says which).

    The item holding the confirmed offset counts while partly read. For record counts use ``lag_report``.
    """
    return {entry.lane: entry.items for entry in lag_report(grid, info, group) if entry.items is not None}


def lag_report(
    grid: Grid, info: StreamInfo, group: str, *, count_records: bool = False, max_items: int = 1000
) -> list[LaneLag]:
    """Per-lane lag of ``group``: items behind, items already overwritten, and records behind when counted.

    Counting records reads the unread items (at most ``max_items`` per lane) and their batch headers; it never
    multiplies items by an average. Items below the ring's head that the grid still serves (a persistent member,
    a RingbufferStore) are behind, not lost.
    """
    bounds = lane_bounds(grid, info)
    offsets = grid.map(OFFSETS_MAP)
    report = []
    for lane in range(info.config.lanes):
        head, next_seq = bounds[lane]
        stored = read_offset(offsets, info.config.name, group, lane)
        if stored is None or stored.offset is None:
            report.append(LaneLag(lane, None, next_seq, None, stream=info.config.name))
            continue
        if stored.offset > first_offset_of(next_seq):
            report.append(LaneLag(lane, stored.offset, next_seq, None, past_end=True, stream=info.config.name))
            continue
        start = sequence_of(stored.offset)
        items = max(0, next_seq - start)
        oldest = head if start >= head else oldest_sequence(grid, info, lane)
        lost = max(0, min(oldest, next_seq) - start)
        records = None
        corrupt = 0
        stable = None
        if count_records and lost == 0 and items <= max_items:
            tally = tally_records(grid, info, lane, start, next_seq)
            corrupt = len(tally.corrupt_sequences)
            partly_read = index_of(stored.offset) if items and start not in tally.corrupt_sequences else 0
            records = tally.records - partly_read
            gate = ItemGate(grid, READ_COMMITTED, abort_expired=False)
            stable = stable_end(gate, grid, info, lane, start, next_seq)
        report.append(
            LaneLag(
                lane,
                stored.offset,
                next_seq,
                items,
                records,
                lost,
                corrupt_items=corrupt,
                stream=info.config.name,
                stable_sequence=stable if stable is not None and stable < next_seq else None,
            )
        )
    return report


def list_groups(grid: Grid, stream: str | None = None) -> list[GroupSummary]:
    """Every group with state in the grid (leases, offsets or heartbeats), optionally of one stream only."""
    members: dict[tuple[str, str], int] = {}
    held: dict[tuple[str, str], int] = {}
    confirmed: dict[tuple[str, str], int] = {}
    # What counts per map: any heartbeat; a lease with a holder; an offsets entry with an offset.
    for name, counts, counted_field in (
        (MEMBERS_MAP, members, None),
        (LEASES_MAP, held, "holder"),
        (OFFSETS_MAP, confirmed, "offset"),
    ):
        for key, text in grid.map(name).entries().items():
            parsed = parse_key(key)
            if parsed is None or (stream is not None and parsed[0] != stream):
                continue
            pair = (parsed[0], parsed[1])
            counts.setdefault(pair, 0)
            if counted_field is None or _has_field(text, counted_field):
                counts[pair] += 1
    pairs = sorted(set(members) | set(held) | set(confirmed))
    return [GroupSummary(s, g, members.get((s, g), 0), held.get((s, g), 0), confirmed.get((s, g), 0)) for s, g in pairs]


def _has_field(text: str, name: str) -> bool:
    try:
        value: Any = json.loads(text)
        return isinstance(value, dict) and value.get(name) is not None
    except ValueError:
        return False


def seek_group(grid: Grid, info: StreamInfo, group: str, offsets: Mapping[int, int]) -> None:
    """Set a group's offsets from outside the group (tools), e.g. to replay. Refuses lanes a member holds: stop
    the group's members first (their leases must be released or expired-and-taken).

    Raises:
        GroupError: a lane is held. ConfigError: a lane or offset is invalid. OffsetOutOfRangeError: an offset past
        the lane's end.
    """
    stream = info.config.name
    lease_map = LeaseMap(grid.map(LEASES_MAP))
    offset_map = grid.map(OFFSETS_MAP)
    for lane, offset in sorted(offsets.items()):
        if isinstance(lane, bool) or not isinstance(lane, int) or not 0 <= lane < info.config.lanes:
            raise ConfigError(
                f"lane {lane!r} does not exist on stream {stream!r}; it has lanes 0..{info.config.lanes - 1}"
            )
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ConfigError(f"offset {offset!r} for lane {lane} is invalid; offsets are integers >= 0")
        ring = grid.ring(info.ring_names[lane])
        end = ring.tail() + 1
        if offset > first_offset_of(end):
            raise OffsetOutOfRangeError(
                stream,
                lane,
                offset,
                first_offset_of(min(oldest_in(ring), end)),
                first_offset_of(end),
                hint="Seek the group to a position inside the range, or to the end to read only new records.",
            )
        key = lane_key(stream, group, lane)
        for _ in range(MAX_CAS_ATTEMPTS):
            _, lease = lease_map.read(key)
            if lease is not None and lease.holder is not None:
                raise GroupError(
                    f"cannot seek stream {stream!r} lane {lane} of group {group!r}: member {lease.holder!r} holds it "
                    f"(epoch {lease.epoch}); close the group's members first, or seek from the holder"
                )
            text = offset_map.get(key)
            epoch = lease.epoch if lease is not None else 0
            if text is None:
                if offset_map.put_if_absent(key, ConfirmedOffset(epoch, offset, None, wall_ms()).encode()) is None:
                    break
                continue
            stored = ConfirmedOffset.decode(text, f"{key} in map {OFFSETS_MAP!r}")
            new = ConfirmedOffset(max(epoch, stored.epoch), offset, None, wall_ms()).encode()
            if offset_map.replace_if_same(key, text, new):
                break
        else:
            raise GroupError(f"seek of stream {stream!r} lane {lane} of group {group!r} kept losing to other writers")
        logger.info("group %r of stream %r: lane %d set to offset %d", group, stream, lane, offset)


def forget_groups(grid: Grid, stream: str, group: str | None = None) -> int:
    """Remove every lease, offset and heartbeat of ``stream`` (or of one of its groups), shared groups' lane entries
    included; returns entries removed.

    Meant for deleting a stream: a stream re-created under the same name must not inherit old offsets. Members
    still running lose their lanes (their next renewal fails and their confirms raise FencedError).
    """
    removed = 0
    for name in (MEMBERS_MAP, LEASES_MAP, OFFSETS_MAP, SHARE_MAP):
        grid_map = grid.map(name)
        for key in grid_map.keys():  # noqa: SIM118 - GridMap.keys() is a grid call, not a dict view
            parsed = parse_key(key)
            if parsed is None or parsed[0] != stream or (group is not None and parsed[1] != group):
                continue
            grid_map.delete(key)
            removed += 1
    return removed


def list_streams(grid: Grid) -> list[StreamInfo]:
    """Every stream with stored metadata, by name."""
    entries = grid.map(STREAMS_MAP).entries()
    return [parse_metadata(name, text) for name, text in sorted(entries.items())]


def delete_stream(grid: Grid, name: str) -> bool:
    """Destroy the stream's lanes, its groups' leases and confirmed offsets, and its metadata; False when it did
    not exist. A stream re-created under the same name starts clean: it never inherits old group offsets.
    """
    metadata = grid.map(STREAMS_MAP)
    stored = metadata.get(name)
    if stored is None:
        return False
    info = parse_metadata(name, stored)
    # The metadata goes first, in one map call: a reader (a Spark pattern query listing streams, a driver reading
    # bounds) sees the stream either whole or gone, never listed with its lanes already destroyed (which read as
    # empty and would look like positions past the end). Should destroying fail, the metadata is put back so that
    # deleting again finds the stream.
    if not metadata.remove_if_same(name, stored):
        return delete_stream(grid, name)  # changed meanwhile: start again from what is stored now
    try:
        for ring in info.ring_names:
            grid.ring(ring).destroy()
        forget_groups(grid, name)
    except BaseException:
        metadata.put_if_absent(name, stored)
        raise
    logger.info("deleted stream %r", name)
    return True


# ---------------------------------------------------------------------------------------------------- shared groups


@dataclass(frozen=True)
class SharedLaneState:
    """One lane of a shared group, as stored.

    Attributes:
        lane: the lane.
        start: the start offset (every record below it was acknowledged or archived); None before any member read.
        next: the first offset never acquired.
        acquired_ranges: offset ranges acquired now; available_ranges: released or timed out, not acquired again.
        acquisitions: distinct acquisitions (member polls) holding records.
    """

    lane: int
    start: int | None
    next: int | None
    acquired_ranges: int
    available_ranges: int
    acquisitions: int


def shared_group_state(grid: Grid, info: StreamInfo, group: str) -> list[SharedLaneState]:
    """Every lane's stored state of shared ``group`` on ``info``'s stream (one ``get_all``)."""
    keys = [lane_key(info.name, group, lane) for lane in range(info.lanes)]
    stored = grid.map(SHARE_MAP).get_all(keys)
    out = []
    for lane, key in enumerate(keys):
        text = stored.get(key)
        if text is None:
            out.append(SharedLaneState(lane, None, None, 0, 0, 0))
            continue
        share = LaneShare.decode(text, f"{key} in map {SHARE_MAP!r}")
        out.append(
            SharedLaneState(
                lane,
                share.start,
                share.next,
                sum(1 for s in share.spans if s.state == "a"),
                len(share.available()),
                len(share.tokens()),
            )
        )
    return out


def list_shared_groups(grid: Grid, stream: str) -> list[str]:
    """The shared groups with state on ``stream`` (one scan of the map's keys)."""
    names = set()
    keys = grid.map(SHARE_MAP).keys()
    for key in keys:
        parsed = parse_key(key)
        if parsed is not None and parsed[0] == stream:
            names.add(parsed[1])
    return sorted(names)
