"""How a group member keeps its lanes: the background work of a ``GroupMember`` (``LaneBalancer``, its base class).

The protocol is described in ``meteor_spark.groups.exclusive`` (acquire, fence, renew, expiry, liveness, balancing);
here is the part that runs on the member's background thread: the heartbeat, renewing held leases, computing the target
assignment from the live members (``balance``), giving up surplus lanes, and taking (and fencing) the lanes the
member should hold. ``GroupMember`` keeps the offsets (confirm, seek, fencing refusals) and the public API.
``LaneBalancer`` holds no state of its own: the attributes it declares are the ``GroupMember``'s.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from meteor_spark.errors import (
    ConfigError,
    FormatError,
    GridError,
    unknown_option,
)
from meteor_spark.grid.client import Grid, GridMap
from meteor_spark.groups.leases import ExpiryObserver, Held, Lease, LeaseMap
from meteor_spark.groups.protocol import (
    balance,
    fence_step,
    fenced_value,
    heartbeat,
    live_members,
    may_take,
    target_lanes,
)
from meteor_spark.groups.store import (
    MAX_CAS_ATTEMPTS,
    OFFSETS_MAP,
    Assignment,
    MemberEntry,
    generation_key,
    generation_value,
    lane_key,
    member_key,
    read_offset,
)
from meteor_spark.groups.txn_offsets import settle

__all__ = ["WANTS", "LaneBalancer", "MemberSettings", "balance", "default_member_id"]

logger = logging.getLogger(__name__)

#: Kinds of members: ``balanced`` shares the lanes; ``all`` (the Spark driver) holds every lane it can.
WANTS = ("balanced", "all")

#: How often a member that waits for lanes (standby, or a rebalance in progress) looks at just those leases.
_PROBE_EVERY_S = 0.2

#: How often a balanced member reads its group's membership generation between renewals (one ``get``), and probes
#: the lanes it waits for: a join or leave moves lanes within about two of these, not one renewal period.
_WATCH_EVERY_S = 0.1


def default_member_id() -> str:
    """``<host>-<pid>-<random>``: unique per member object, readable in tools."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class MemberSettings:
    group: str
    member_id: str
    lease_ms: int
    renew_every_ms: int
    want: str

    @classmethod
    def parse(
        cls, group: str, member_id: str | None, lease_ms: int, renew_every_ms: int | None, want: str
    ) -> MemberSettings:
        if not isinstance(group, str) or not group:
            raise ConfigError(f"group {group!r} is not a group name; give a non-empty string")
        if member_id is not None and (not isinstance(member_id, str) or not member_id):
            raise ConfigError(f"member_id {member_id!r} is not a member id; give a non-empty string or None")
        if isinstance(lease_ms, bool) or not isinstance(lease_ms, int) or lease_ms < 10:
            raise ConfigError(f"lease_ms={lease_ms!r} is invalid; give whole milliseconds >= 10 (default 5000)")
        renew = max(1, lease_ms // 3) if renew_every_ms is None else renew_every_ms
        if isinstance(renew, bool) or not isinstance(renew, int) or not 0 < renew < lease_ms:
            raise ConfigError(
                f"renew_every_ms={renew_every_ms!r} is invalid for lease_ms={lease_ms}: renew more often than the "
                f"lease lasts, e.g. renew_every_ms={max(1, lease_ms // 3)} (the default, lease_ms / 3)"
            )
        if want not in WANTS:
            raise unknown_option("want value", str(want), WANTS)
        return cls(group, member_id or default_member_id(), lease_ms, renew, want)


class LaneBalancer:
    """The background work of a ``GroupMember`` (see the module docs); every attribute is the ``GroupMember``'s."""

    stream: str
    lanes: int
    lease_acquisitions: int
    lease_losses: int
    _settings: MemberSettings
    _on_change: Callable[[Assignment], None] | None
    _leases: LeaseMap
    _grid: Grid
    _offsets: GridMap
    _members: GridMap
    _lease_observer: ExpiryObserver
    _member_observer: ExpiryObserver
    _lock: Any  # a Lock over what this member holds
    _held: dict[int, Held]
    _offset_texts: dict[int, str]  # lane -> offsets entry text this member last wrote
    _deposed: dict[int, int]  # lane -> epoch this member held it with until another member took it
    _target_lanes: frozenset[int]
    _waiting_for: frozenset[int]  # target lanes held by others: probed between renewals
    _notified: Assignment
    _generation: str | None  # the membership generation's text this member last saw or wrote
    _beat: int
    _stop: threading.Event
    _thread: threading.Thread | None
    _host: str

    # -- identity -----------------------------------------------------------------------------------------------

    @property
    def group(self) -> str:
        return self._settings.group

    @property
    def member_id(self) -> str:
        return self._settings.member_id

    @property
    def lease_ms(self) -> int:
        return self._settings.lease_ms

    def __repr__(self) -> str:
        return (
            f"GroupMember(stream={self.stream!r}, group={self.group!r}, member_id={self.member_id!r}, "
            f"want={self._settings.want!r}, assignment={self.assignment()!r})"
        )

    def _where(self, lane: int) -> str:
        return f"stream {self.stream!r} lane {lane} of group {self.group!r}"

    def assignment(self) -> Assignment:
        """The lanes held now, ``{lane: epoch}`` (local view, kept by the background renewal)."""
        with self._lock:
            return Assignment.of({lane: held.lease.epoch for lane, held in self._held.items()})

    def _run(self) -> None:
        period = self._settings.renew_every_ms / 1000.0
        watching = self._settings.want == "balanced"
        next_tick = time.monotonic() + period
        failing = False
        while True:
            now = time.monotonic()
            wake_s = _WATCH_EVERY_S if watching else _PROBE_EVERY_S if self._waiting_for else period
            wait_s = 0.0 if now >= next_tick else min(next_tick - now, wake_s, period)
            if self._stop.wait(wait_s):
                return
            try:
                if time.monotonic() >= next_tick:
                    next_tick = max(next_tick + period, time.monotonic())
                    self._tick()
                elif watching and self._membership_changed():
                    self._rebalance()
                elif self._waiting_for:
                    self._probe()
                if failing:
                    logger.info("member %r of group %r reaches the grid again", self.member_id, self.group)
                failing = False
            except GridError as exc:
                if not failing:
                    logger.warning(
                        "member %r of group %r cannot renew (will retry every %d ms; its lanes expire after "
                        "%d ms without renewal): %s",
                        self.member_id,
                        self.group,
                        self._settings.renew_every_ms,
                        self.lease_ms,
                        exc,
                    )
                failing = True
            except Exception:  # the renewal thread must survive anything, it IS the liveness
                logger.exception("member %r of group %r: unexpected error while renewing", self.member_id, self.group)

    def _tick(self) -> None:
        """One renewal round: heartbeat, renew held leases, rebalance."""
        self._heartbeat()
        self._renew()
        if self._stop.is_set():
            return
        self._rebalance()

    def _rebalance(self) -> None:
        """Compute the target from the live members, give up the surplus, take what is free of the target."""
        target = self._target(self._live_members())
        self._release_surplus(target)
        self._acquire(target, range(self.lanes))

    def _membership_changed(self) -> bool:
        """One ``get``: has a member joined or left since this member last looked (or wrote)?"""
        text = self._leases.map.get(generation_key(self.stream, self.group))
        if text == self._generation:
            return False
        self._generation = text
        return True

    def _announce(self, change: str) -> None:
        """Rewrite the group's membership generation (after this member's heartbeat was written or removed), so
        the other balanced members recompute the assignment within ``_WATCH_EVERY_S`` instead of at their next
        renewal. A ``want="all"`` member changes no one's target and announces nothing."""
        if self._settings.want != "balanced":
            return
        text = generation_value(self.member_id, change)
        self._leases.map.set(generation_key(self.stream, self.group), text, ttl_s=2 * self.lease_ms / 1000.0)
        self._generation = text

    def _probe(self) -> None:
        """Between renewals, look only at the lanes this member waits for, so a released lane is taken at once."""
        self._acquire(self._target_lanes, sorted(self._waiting_for))

    def _acquire(self, target: frozenset[int], lanes: Sequence[int] | range) -> None:
        """Read the leases of ``lanes`` (one get_all) and take those of ``target`` that are free or expired."""
        keys = {lane: lane_key(self.stream, self.group, lane) for lane in lanes}
        texts = self._leases.map.get_all(list(keys.values()))
        for key in keys.values():
            self._lease_observer.see(key, texts.get(key))
        for lane in sorted(target & frozenset(keys)):
            if self._stop.is_set():
                break
            with self._lock:
                if lane in self._held:
                    continue
            try:
                self._try_acquire(lane, keys[lane], texts.get(keys[lane]))
            except FormatError as exc:
                logger.warning("member %r cannot take %s: %s", self.member_id, self._where(lane), exc)
        with self._lock:
            self._target_lanes = target
            self._waiting_for = frozenset(target - set(self._held))
        self._notify(self.assignment())

    def _heartbeat(self) -> None:
        self._beat += 1
        entry = heartbeat(self.member_id, self._settings.want, self._beat, self.lease_ms, self._host)
        self._members.set(
            member_key(self.stream, self.group, self.member_id), entry.encode(), ttl_s=2 * self.lease_ms / 1000.0
        )

    def _renew(self) -> None:
        with self._lock:
            held = dict(self._held)
        for lane, lease in held.items():
            renewed = self._leases.renew(lane_key(self.stream, self.group, lane), lease)
            with self._lock:
                if renewed is None:
                    self._held.pop(lane, None)
                    self.lease_losses += 1
                    self._deposed[lane] = lease.lease.epoch
                    self._offset_texts.pop(lane, None)
                    logger.warning(
                        "member %r lost %s (epoch %d): another member took it over after the lease was not seen "
                        "renewed for %d ms",
                        self.member_id,
                        self._where(lane),
                        lease.lease.epoch,
                        self.lease_ms,
                    )
                else:
                    self._held[lane] = renewed

    def _live_members(self) -> dict[str, MemberEntry]:
        """Members of this group whose heartbeat this process has seen change within their lease period."""
        own = MemberEntry(self.member_id, self._settings.want, self._beat, self.lease_ms, 0, self._host, os.getpid())
        warnings: list[str] = []
        live = live_members(self._members.entries(), self.stream, self.group, own, self._member_observer, warnings)
        for warning in warnings:
            logger.warning("ignoring group member entry: %s", warning)
        return live

    def _target(self, live: Mapping[str, MemberEntry]) -> frozenset[int]:
        return target_lanes(self._settings.want, live, self.lanes, self.member_id)

    def _release_surplus(self, target: frozenset[int]) -> None:
        with self._lock:
            surplus = {lane: held for lane, held in self._held.items() if lane not in target}
            keep = {lane: held.lease.epoch for lane, held in self._held.items() if lane in target}
        if not surplus:
            return
        self._notify(Assignment.of(keep))
        for lane, held in surplus.items():
            with self._lock:
                current = self._held.pop(lane, held)
                self._offset_texts.pop(lane, None)
            released = self._leases.release(lane_key(self.stream, self.group, lane), current)
            logger.info(
                "member %r %s %s (epoch %d) to rebalance",
                self.member_id,
                "released" if released else "had already lost",
                self._where(lane),
                current.lease.epoch,
            )

    def _try_acquire(self, lane: int, key: str, text: str | None) -> None:
        lease = None if text is None else Lease.decode(text, self._leases.where(key))
        if not may_take(lease, text, key, self.member_id, self._thread is None, self._lease_observer):
            return  # a live holder gives the lane up itself; never steal it
        floor = 0
        if lease is None:
            stored = read_offset(self._offsets, self.stream, self.group, lane)
            floor = 0 if stored is None else stored.epoch
        held = self._leases.acquire(key, self.member_id, self.lease_ms, text, lease, floor)
        if held is None:
            return
        fenced = self._fence(lane, key, held.lease.epoch)
        if fenced is None:
            logger.info("member %r: %s was taken by a newer holder while fencing", self.member_id, self._where(lane))
            return
        with self._lock:
            self._held[lane] = held
            self._offset_texts[lane] = fenced
            self._deposed.pop(lane, None)
            self.lease_acquisitions += 1
        previous = "nobody" if lease is None or lease.vacant else repr(lease.holder)
        logger.info(
            "member %r took %s with epoch %d (from %s)",
            self.member_id,
            self._where(lane),
            held.lease.epoch,
            previous,
        )

    def _fence(self, lane: int, key: str, epoch: int) -> str | None:
        """Stamp our epoch on the lane's offsets entry, keeping the offset; returns the stored text, or None when
        a newer epoch is there."""
        where = f"{key} in map {OFFSETS_MAP!r}"
        for _ in range(MAX_CAS_ATTEMPTS):
            step = fence_step(self._offsets.get(key), where, epoch, self.member_id)
            if step.create is not None:
                if self._offsets.put_if_absent(key, step.create) is None:
                    return step.create
                continue
            if step.newer or step.keep is not None:
                return step.keep
            assert step.stored is not None
            # an offset a previous holder staged in a transaction is settled (txn_offsets: its open transaction
            # is aborted, a committed one rolled forward) in this same compare-and-set
            settled = settle(self._grid, step.stored, self._where(lane), abort_open=True) or step.stored
            fenced = fenced_value(settled, epoch, self.member_id)
            if self._offsets.replace_if_same(key, step.text or "", fenced):
                return fenced
        return None

    def _notify(self, assignment: Assignment) -> None:
        if assignment == self._notified:
            return
        self._notified = assignment
        if self._on_change is None:
            return
        try:
            self._on_change(assignment)
        except Exception:  # an owner's bug must not stop renewals (that would lose every lane)
            logger.exception("on_change callback of group member %r failed", self.member_id)
