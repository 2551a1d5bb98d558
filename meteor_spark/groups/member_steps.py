"""An exclusive group member's grid work as steps: the threaded ``GroupMember`` and the ``AsyncGroupMember`` share it.

``MemberSteps`` is the base of both. Every piece of the protocol that talks to the grid (the renewal loop, the
heartbeat, renewing, releasing and taking leases, fencing a lane taken, a confirm / seek / hold, a transaction's
staged offset, leaving) is a generator yielding each grid call (``meteor_spark.grid.steps``): the threaded member
runs it with ``drive`` on its thread, the asyncio member with ``drive_async`` on the loop, so the two cannot drift
apart. The decisions themselves are ``meteor_spark.groups.protocol``'s and ``txn_offsets``'.

The offsets (confirm, seek, hold, stage, apply, settle) are ``meteor_spark.groups.member_offsets.OffsetSteps``', its
base. A step is a zero-argument callable on one of the member's maps (``_lease_map``, ``_offsets``, ``_members``: a
``GridMap`` or an ``AsyncGridMap``, whose methods share names) or on one of the hooks a shell defines: pausing
between rounds, reading or aborting a transaction (the grid layer's ``transactions`` or the asyncio ``txn_grid``),
removing its heartbeat. ``_lock`` guards what the member holds against its owner's threads; it is never held
across a step.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from meteor_spark.errors import FormatError, GridError
from meteor_spark.grid.steps import Steps
from meteor_spark.grid.streams import StreamInfo
from meteor_spark.groups.leases import ExpiryObserver, Held, Lease
from meteor_spark.groups.member_offsets import NeedsState, OffsetSteps
from meteor_spark.groups.protocol import (
    acquired,
    fence_step,
    fenced_value,
    heartbeat,
    live_members,
    may_take,
    renewed,
    target_lanes,
    vacated,
)
from meteor_spark.groups.store import (
    LEASES_MAP,
    MAX_CAS_ATTEMPTS,
    OFFSETS_MAP,
    Assignment,
    ConfirmedOffset,
    MemberEntry,
    generation_key,
    generation_value,
    member_key,
)
from meteor_spark.groups.txn_offsets import (
    settled_with,
)

if TYPE_CHECKING:
    from meteor_spark.groups.balancing import MemberSettings

__all__ = ["PROBE_EVERY_S", "WATCH_EVERY_S", "MemberSteps", "NeedsState", "OffsetSteps"]

logger = logging.getLogger(__name__)


#: How often a member that waits for lanes (standby, or a rebalance in progress) looks at just those leases.
PROBE_EVERY_S = 0.2

#: How often a balanced member reads its group's membership generation between renewals (one ``get``), and probes
#: the lanes it waits for: a join or leave moves lanes within about two of these, not one renewal period.
WATCH_EVERY_S = 0.1


class MemberSteps(OffsetSteps):
    """The grid work of an exclusive group member (see the module docs); every attribute is the shell's."""

    info: StreamInfo
    lease_acquisitions: int
    lease_losses: int
    _settings: MemberSettings
    _on_change: Callable[[Assignment], None] | None
    _members: Any  # GridMap or AsyncGridMap of MEMBERS_MAP
    _lease_observer: ExpiryObserver
    _member_observer: ExpiryObserver
    _target_lanes: frozenset[int]
    _waiting_for: frozenset[int]  # target lanes held by others: probed between renewals
    _notified: Assignment
    _generation: str | None  # the membership generation's text this member last saw or wrote
    _beat: int
    _closed: bool
    _host: str

    def __init__(
        self, info: StreamInfo, settings: MemberSettings, on_change: Callable[[Assignment], None] | None, lock: Any
    ) -> None:
        """The member's state before it joins (the shell opens the maps and sets what runs it)."""
        self._settings = settings
        self.info = info
        self.stream = info.config.name
        self.lanes = info.config.lanes
        self._on_change = on_change
        self._lease_observer = ExpiryObserver()
        self._member_observer = ExpiryObserver()
        self._lock = lock
        self._held = {}
        self._offset_texts = {}
        self._deposed = {}
        self._target_lanes = frozenset()
        self._waiting_for = frozenset()
        self._notified = Assignment()
        self._generation = None
        self._beat = 0
        self._closed = False
        self._host = socket.gethostname()
        self.lease_acquisitions = 0
        self.lease_losses = 0
        self.fencing_refusals = 0

    # -- the shell's hooks ----------------------------------------------------------------------------------------

    def _stopping(self) -> bool:
        """True once the member is leaving: the renewal work stops taking lanes."""
        raise NotImplementedError

    def _joining(self) -> bool:
        """True while the member starts: it may take its own lanes back at once (``protocol.may_take``)."""
        raise NotImplementedError

    def _pause(self, seconds: float) -> Any:
        """Wait ``seconds`` between renewal rounds; True (or an awaitable of it) when the member stops."""
        raise NotImplementedError

    def _txn_abort(self, key: str, reason: str) -> Any:
        """Abort transaction ``key``; its state afterwards, or an awaitable of it."""
        raise NotImplementedError

    def _drop_heartbeat(self, key: str) -> Any:
        """Remove this member's heartbeat entry ``key``."""
        raise NotImplementedError

    # -- local state ---------------------------------------------------------------------------------------------------

    def metrics(self) -> dict[str, int]:
        """Counters since creation: leases taken and lost, confirms/seeks refused by fencing; lanes held now."""
        with self._lock:
            held = len(self._held)
        return {
            "lease_acquisitions": self.lease_acquisitions,
            "lease_losses": self.lease_losses,
            "fencing_refusals": self.fencing_refusals,
            "lanes_held": held,
        }

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

    # -- renewal ----------------------------------------------------------------------------------------------------

    def _run_steps(self) -> Steps[None]:
        """Renew every ``renew_every_ms``; between renewals watch the membership generation (balanced members) and
        probe the lanes waited for. Grid errors are logged once per outage: the lanes expire if it lasts a lease
        period. The renewal work is the member's liveness: it survives any error."""
        period = self._settings.renew_every_ms / 1000.0
        watching = self._settings.want == "balanced"
        next_tick = time.monotonic() + period
        failing = False
        while True:
            now = time.monotonic()
            wake_s = WATCH_EVERY_S if watching else PROBE_EVERY_S if self._waiting_for else period
            if (yield partial(self._pause, 0.0 if now >= next_tick else min(next_tick - now, wake_s, period))):
                return
            try:
                if time.monotonic() >= next_tick:
                    next_tick = max(next_tick + period, time.monotonic())
                    yield from self._tick_steps()
                elif watching and (yield from self._membership_changed_steps()):
                    yield from self._rebalance_steps()
                elif self._waiting_for:
                    yield from self._acquire_steps(self._target_lanes, sorted(self._waiting_for))
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
            except Exception:  # the renewal work IS the liveness: it must survive anything
                logger.exception("member %r of group %r: unexpected error while renewing", self.member_id, self.group)

    def _tick_steps(self) -> Steps[None]:
        """One renewal round: heartbeat, renew held leases, rebalance."""
        self._beat += 1
        entry = heartbeat(self.member_id, self._settings.want, self._beat, self.lease_ms, self._host)
        key = member_key(self.stream, self.group, self.member_id)
        yield partial(self._members.set, key, entry.encode(), ttl_s=2 * self.lease_ms / 1000.0)
        yield from self._renew_steps()
        if self._stopping():
            return
        yield from self._rebalance_steps()

    def _membership_changed_steps(self) -> Steps[bool]:
        """One ``get``: has a member joined or left since this member last looked (or wrote)?"""
        text = yield partial(self._lease_map.get, generation_key(self.stream, self.group))
        if text == self._generation:
            return False
        self._generation = text
        return True

    def _announce_steps(self, change: str) -> Steps[None]:
        """Rewrite the group's membership generation (after this member's heartbeat was written or removed), so
        the other balanced members recompute the assignment within ``WATCH_EVERY_S`` instead of at their next
        renewal; without it they still see the change at their next renewal, so a grid error is only logged. A
        ``want="all"`` member changes no one's target and announces nothing."""
        if self._settings.want != "balanced":
            return
        text = generation_value(self.member_id, change)
        try:
            key = generation_key(self.stream, self.group)
            yield partial(self._lease_map.set, key, text, ttl_s=2 * self.lease_ms / 1000.0)
            self._generation = text
        except GridError as exc:
            logger.warning(
                "member %r could not announce its %s to group %r (the others see it at their next renewal): %s",
                self.member_id,
                change,
                self.group,
                exc,
            )

    def _renew_steps(self) -> Steps[None]:
        with self._lock:
            held = dict(self._held)
        for lane, lease in held.items():
            fresh = renewed(lease)
            sent = time.monotonic()
            text = fresh.encode()
            won = yield partial(self._lease_map.replace_if_same, self._key(lane), lease.text, text)
            with self._lock:
                if won:
                    if lane in self._held:
                        self._held[lane] = Held(fresh, text, sent)
                    continue
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

    def _rebalance_steps(self) -> Steps[None]:
        """Compute the target from the live members, give up the surplus, take what is free of the target."""
        own = MemberEntry(self.member_id, self._settings.want, self._beat, self.lease_ms, 0, self._host, os.getpid())
        warnings: list[str] = []
        entries = yield self._members.entries
        live = live_members(entries, self.stream, self.group, own, self._member_observer, warnings)
        for warning in warnings:
            logger.warning("ignoring group member entry: %s", warning)
        target = target_lanes(self._settings.want, live, self.lanes, self.member_id)
        yield from self._release_surplus_steps(target)
        yield from self._acquire_steps(target, range(self.lanes))

    def _release_surplus_steps(self, target: frozenset[int]) -> Steps[None]:
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
            released = yield partial(
                self._lease_map.replace_if_same, self._key(lane), current.text, vacated(current).encode()
            )
            logger.info(
                "member %r %s %s (epoch %d) to rebalance",
                self.member_id,
                "released" if released else "had already lost",
                self._where(lane),
                current.lease.epoch,
            )

    def _leave_steps(self, held: dict[int, Held]) -> Steps[None]:
        """Release the ``held`` leases, drop the heartbeat, announce the leave; grid errors are logged (leases
        that cannot be released expire by themselves)."""
        for lane, lease in held.items():
            try:
                yield partial(self._lease_map.replace_if_same, self._key(lane), lease.text, vacated(lease).encode())
            except GridError as exc:
                logger.warning("could not release %s on close (it will expire): %s", self._where(lane), exc)
        with self._lock:
            self._held.clear()
            self._offset_texts.clear()
        try:
            yield partial(self._drop_heartbeat, member_key(self.stream, self.group, self.member_id))
        except GridError as exc:
            logger.warning("could not remove heartbeat of member %r on close: %s", self.member_id, exc)
        yield from self._announce_steps("leave")

    # -- taking lanes -----------------------------------------------------------------------------------------------

    def _acquire_steps(self, target: frozenset[int], lanes: Sequence[int] | range) -> Steps[None]:
        """Read the leases of ``lanes`` (one get_all) and take those of ``target`` that are free or expired."""
        keys = {lane: self._key(lane) for lane in lanes}
        texts = yield partial(self._lease_map.get_all, list(keys.values()))
        for key in keys.values():
            self._lease_observer.see(key, texts.get(key))
        for lane in sorted(target & frozenset(keys)):
            if self._stopping():
                break
            with self._lock:
                if lane in self._held:
                    continue
            try:
                yield from self._try_acquire_steps(lane, keys[lane], texts.get(keys[lane]))
            except FormatError as exc:
                logger.warning("member %r cannot take %s: %s", self.member_id, self._where(lane), exc)
        with self._lock:
            self._target_lanes = target
            self._waiting_for = frozenset(target - set(self._held))
        self._notify(self.assignment())

    def _try_acquire_steps(self, lane: int, key: str, text: str | None) -> Steps[None]:
        lease = None if text is None else Lease.decode(text, f"{key} in map {LEASES_MAP!r}")
        if not may_take(lease, text, key, self.member_id, self._joining(), self._lease_observer):
            return  # a live holder gives the lane up itself; never steal it
        floor = 0
        if lease is None:
            stored = yield partial(self._offsets.get, key)
            floor = 0 if stored is None else ConfirmedOffset.decode(stored, f"{key} in map {OFFSETS_MAP!r}").epoch
        sent = time.monotonic()
        new = acquired(self.member_id, self.lease_ms, lease, floor)
        new_text = new.encode()
        if text is None or lease is None:
            won = (yield partial(self._lease_map.put_if_absent, key, new_text)) is None
        else:
            won = yield partial(self._lease_map.replace_if_same, key, text, new_text)
        if not won:
            return
        fenced = yield from self._fence_steps(lane, key, new.epoch)
        if fenced is None:
            logger.info("member %r: %s was taken by a newer holder while fencing", self.member_id, self._where(lane))
            return
        with self._lock:
            self._held[lane] = Held(new, new_text, sent)
            self._offset_texts[lane] = fenced
            self._deposed.pop(lane, None)
            self.lease_acquisitions += 1
        previous = "nobody" if lease is None or lease.vacant else repr(lease.holder)
        logger.info("member %r took %s with epoch %d (from %s)", self.member_id, self._where(lane), new.epoch, previous)

    def _fence_steps(self, lane: int, key: str, epoch: int) -> Steps[str | None]:
        """Stamp our epoch on the lane's offsets entry (``protocol.fence_step``), keeping the offset and settling
        an offset a previous holder staged in a transaction in the same compare-and-set (its open transaction is
        aborted first, a committed one rolled forward); the stored text, or None when a newer epoch is there."""
        where = f"{key} in map {OFFSETS_MAP!r}"
        for _ in range(MAX_CAS_ATTEMPTS):
            step = fence_step((yield partial(self._offsets.get, key)), where, epoch, self.member_id)
            if step.create is not None:
                if (yield partial(self._offsets.put_if_absent, key, step.create)) is None:
                    return step.create
                continue
            if step.newer or step.keep is not None:
                return step.keep
            assert step.stored is not None and step.text is not None
            settled = step.stored
            if settled.txn is not None:
                state = yield partial(self._txn_state, settled.txn.key)
                if state is not None and not state.decided:
                    reason = f"fenced: {self._where(lane)} was taken over while the transaction held its offset"
                    state = yield partial(self._txn_abort, settled.txn.key, reason)
                settled = settled_with(settled, state, self._where(lane))
            fenced = fenced_value(settled, epoch, self.member_id)
            if (yield partial(self._offsets.replace_if_same, key, step.text, fenced)):
                return fenced
        return None
