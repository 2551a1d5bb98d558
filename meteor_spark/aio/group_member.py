"""AsyncGroupMember: a member of an exclusive subscriber group on the caller's event loop (no threads).

The same protocol as the threaded ``meteor_spark.groups.exclusive.GroupMember``, with the same stored values, so
threaded and asyncio members share one group: every decision (the lease values written, whether a lease may be
taken, the live members and the target lanes, fencing a lane taken, what a confirm writes or why it is refused,
the errors) is ``meteor_spark.groups.protocol``'s; this module only makes the grid calls, awaited, through
``meteor_spark.grid.aio_client``. The renewal that the threaded member runs on a thread is a task on the loop:
a member is alive while that task renews its heartbeat and leases.

It has the threaded member's whole offset API: ``confirm`` / ``seek``, ``hold`` (a ``nack``), and ``stage`` /
``apply_staged`` / ``settle_staged`` (``txn_offsets``' decisions, transaction states read or decided by
``meteor_spark.aio.txn_grid``); taking a lane whose offset an open transaction staged aborts it first, and
``want="all"`` (hold every lane, stand by for lanes held by others) is the threaded one's too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable, Sequence

from meteor_spark.aio import txn_grid
from meteor_spark.errors import FencedError, FormatError, GridError, GroupError
from meteor_spark.format.offsets import InitialOffsetScheme, resolve_initial
from meteor_spark.grid.aio_client import AsyncGrid, AsyncGridMap
from meteor_spark.grid.item_marks import ItemMark
from meteor_spark.grid.streams import StreamInfo
from meteor_spark.groups.balancing import MemberSettings
from meteor_spark.groups.leases import ExpiryObserver, Held, Lease
from meteor_spark.groups.protocol import (
    acquired,
    check_lane,
    check_offset,
    contended_error,
    fence_step,
    fenced_error,
    fenced_value,
    heartbeat,
    live_members,
    may_take,
    not_assigned_error,
    offset_step,
    renewed,
    target_lanes,
    vacated,
)
from meteor_spark.groups.store import (
    LEASES_MAP,
    MAX_CAS_ATTEMPTS,
    MEMBERS_MAP,
    OFFSETS_MAP,
    Assignment,
    ConfirmedOffset,
    MemberEntry,
    generation_key,
    generation_value,
    lane_key,
    member_key,
)
from meteor_spark.groups.txn_offsets import (
    StateChange,
    applying,
    contended,
    fenced_write,
    given,
    settled_with,
    settling,
    staged_onto,
)

__all__ = ["AsyncGroupMember"]

logger = logging.getLogger(__name__)

#: How often a member reads the group's membership generation and probes the lanes it waits for between renewals
#: (the threaded member's ``_WATCH_EVERY_S``).
_WATCH_EVERY_S = 0.1
#: How often a ``want="all"`` standby probes the lanes it waits for (the threaded member's ``_PROBE_EVERY_S``).
_PROBE_EVERY_S = 0.2


class AsyncGroupMember:
    """One balanced member of an exclusive group on one stream, on the event loop (see the module docs).

    Args:
        grid: the asyncio grid connection.
        info: the stream.
        group, member_id, lease_ms, renew_every_ms, want: as ``GroupMember``'s (same checks).
        on_change: called (on the loop) with the new ``Assignment`` whenever it changes; exceptions are logged.
    """

    def __init__(
        self,
        grid: AsyncGrid,
        info: StreamInfo,
        group: str,
        *,
        member_id: str | None = None,
        lease_ms: int = 5000,
        renew_every_ms: int | None = None,
        want: str = "balanced",
        on_change: Callable[[Assignment], None] | None = None,
    ) -> None:
        self._settings = MemberSettings.parse(group, member_id, lease_ms, renew_every_ms, want)
        self._grid = grid
        self.info = info
        self.stream = info.config.name
        self.lanes = info.config.lanes
        self._on_change = on_change
        self._lease_observer = ExpiryObserver()
        self._member_observer = ExpiryObserver()
        self._held: dict[int, Held] = {}
        self._offset_texts: dict[int, str] = {}
        self._deposed: dict[int, int] = {}
        self._target: frozenset[int] = frozenset()
        self._notified = Assignment()
        self._generation: str | None = None
        self._beat = 0
        self._task: asyncio.Task[None] | None = None
        self._opened = False  # the maps were opened: close has something to release
        self._joining = True
        self._closed = False
        self._host = socket.gethostname()
        self.lease_acquisitions = 0
        self.lease_losses = 0
        self.fencing_refusals = 0

    @staticmethod
    def check(group: str, member_id: str | None, lease_ms: int, want: str = "balanced") -> None:
        """The member's arguments checked (``ConfigError`` naming the one at fault), before anything connects."""
        MemberSettings.parse(group, member_id, lease_ms, None, want)

    @property
    def group(self) -> str:
        return self._settings.group

    @property
    def member_id(self) -> str:
        return self._settings.member_id

    @property
    def lease_ms(self) -> int:
        return self._settings.lease_ms

    def _where(self, lane: int) -> str:
        return f"stream {self.stream!r} lane {lane} of group {self.group!r}"

    # -- lifecycle ----------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Join: take what this member should hold now, announce it, start the renewal task on the loop."""
        if self._closed:
            raise GroupError(f"group member {self.member_id!r} was closed; create a new one to rejoin")
        if self._task is not None:
            return
        self._leases: AsyncGridMap = await self._grid.map(LEASES_MAP)
        self._offsets: AsyncGridMap = await self._grid.map(OFFSETS_MAP)
        self._members: AsyncGridMap = await self._grid.map(MEMBERS_MAP)
        self._opened = True
        await self._tick()
        self._joining = False
        await self._announce_safely("join")
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"meteor-group-{self.member_id}")
        logger.info(
            "member %r joined group %r of stream %r (asyncio, lease %d ms), holding lanes %s",
            self.member_id,
            self.group,
            self.stream,
            self.lease_ms,
            sorted(self._held),
        )

    async def close(self) -> None:
        """Leave: stop renewing, tell the owner, release the leases, drop the heartbeat, announce the leave.
        Idempotent; grid errors are logged (leases that cannot be released expire by themselves)."""
        if self._closed:
            return
        self._closed = True
        if not self._opened:
            return
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        held, self._held = dict(self._held), {}
        if held:
            self._notify(Assignment())
        for lane, lease in held.items():
            try:
                await self._leases.replace_if_same(
                    lane_key(self.stream, self.group, lane), lease.text, vacated(lease).encode()
                )
            except GridError as exc:
                logger.warning("could not release %s on close (it will expire): %s", self._where(lane), exc)
        self._offset_texts.clear()
        try:
            await self._members.remove(member_key(self.stream, self.group, self.member_id))
        except GridError as exc:
            logger.warning("could not remove heartbeat of member %r on close: %s", self.member_id, exc)
        await self._announce_safely("leave")
        logger.info("member %r left group %r of stream %r", self.member_id, self.group, self.stream)

    async def _announce_safely(self, change: str) -> None:
        """Rewrite the membership generation, so the others rebalance at once (else at their next renewal); a
        ``want="all"`` member changes no one's target and announces nothing (``LaneBalancer._announce``)."""
        if self._settings.want != "balanced":
            return
        text = generation_value(self.member_id, change)
        try:
            await self._leases.set(generation_key(self.stream, self.group), text, ttl_s=2 * self.lease_ms / 1000.0)
            self._generation = text
        except GridError as exc:
            logger.warning("member %r could not announce its %s: %s", self.member_id, change, exc)

    # -- queries ------------------------------------------------------------------------------------------------

    def assignment(self) -> Assignment:
        """The lanes held now, ``{lane: epoch}``."""
        return Assignment.of({lane: held.lease.epoch for lane, held in self._held.items()})

    def is_current(self, lane: int) -> bool:
        """Held by this member's own judgement (renewed within a lease period, renewal task alive)."""
        held = self._held.get(lane)
        if held is None or self._closed or self._task is None or self._task.done():
            return False
        return held.live_locally(time.monotonic())

    def metrics(self) -> dict[str, int]:
        """``GroupMember.metrics``' counters."""
        return {
            "lease_acquisitions": self.lease_acquisitions,
            "lease_losses": self.lease_losses,
            "fencing_refusals": self.fencing_refusals,
            "lanes_held": len(self._held),
        }

    def _stored(self, lane: int) -> ConfirmedOffset | None:
        text = self._offset_texts.get(lane)
        key = lane_key(self.stream, self.group, lane)
        return None if text is None else ConfirmedOffset.decode(text, f"{key} in map {OFFSETS_MAP!r}")

    def confirmed_mark(self, lane: int) -> ItemMark | None:
        """The item mark stored with a held lane's offset (from the text this member fenced or last wrote)."""
        stored = self._stored(lane)
        return None if stored is None else stored.mark

    def hold_of(self, lane: int) -> tuple[int, int | None]:
        """``(not_before_ms, high)`` stored with a held lane's offset (a threaded member's nack pauses the lane)."""
        stored = self._stored(lane)
        return (0, None) if stored is None else (stored.not_before_ms, stored.high)

    async def initial_offset(self, lane: int, scheme: InitialOffsetScheme | str, head_seq: int, next_seq: int) -> int:
        """``GroupMember.initial_offset``: the held lane's confirmed offset, else ``scheme`` resolved and confirmed."""
        self._epoch_of(lane)
        stored = self._stored(lane)
        confirmed = None if stored is None else stored.offset
        offset = resolve_initial(scheme, True, confirmed, head_seq, next_seq, where=self._where(lane))
        if confirmed is None:
            await self.confirm(lane, offset)
        return offset

    async def known_offsets(self, lanes: Sequence[int]) -> dict[int, int | None]:
        """Confirmed offsets of ``lanes``: held ones from memory, the others with one ``get_all``."""
        out = {lane: stored.offset for lane in lanes if (stored := self._stored(lane)) is not None}
        missing = {lane: lane_key(self.stream, self.group, lane) for lane in lanes if lane not in out}
        if missing:
            texts = await self._offsets.get_all(list(missing.values()))
            for lane, key in missing.items():
                text = texts.get(key)
                where = f"{key} in map {OFFSETS_MAP!r}"
                out[lane] = None if text is None else ConfirmedOffset.decode(text, where).offset
        return out

    # -- offsets ------------------------------------------------------------------------------------------------

    async def confirm(self, lane: int, offset: int, *, epoch: int | None = None, mark: ItemMark | None = None) -> None:
        """``GroupMember.confirm``: fenced, a confirm at or below the stored offset ignored (same errors)."""
        await self._write_offset(lane, offset, backwards=False, read_epoch=epoch, mark=mark)

    async def seek(self, lane: int, offset: int) -> None:
        """``GroupMember.seek``: set a held lane's offset, forwards or backwards, fenced."""
        await self._write_offset(lane, offset, backwards=True)

    async def hold(self, lane: int, offset: int, *, not_before_ms: int, high: int | None, epoch: int | None) -> None:
        """``GroupMember.hold``: rewind a held lane to ``offset`` (a ``nack``), paused until the wall-clock instant
        ``not_before_ms`` for whichever member reads it next; ``high`` kept for ``dead_letter_after``."""
        await self._write_offset(lane, offset, backwards=True, read_epoch=epoch, not_before_ms=not_before_ms, high=high)

    async def stage(
        self, lane: int, offset: int, txn: str, *, epoch: int | None = None, mark: ItemMark | None = None
    ) -> None:
        """``GroupMember.stage``: ``offset`` staged on a held lane in transaction ``txn`` (same errors)."""
        check_offset("stage", offset, self._where(lane))
        where = self._where(lane)
        await self._update_entry(lane, "stage", epoch, lambda s, other: staged_onto(s, txn, offset, mark, where, other))

    async def apply_staged(self, lane: int, txn: str) -> None:
        """``GroupMember.apply_staged``: after ``txn`` committed, the lane's offset moved to the one it staged."""
        await self._update_entry(lane, "apply", None, lambda s, _state: applying(txn)(s), staged_state=False)

    async def settle_staged(self, lane: int, txn: str | None = None) -> None:
        """``GroupMember.settle_staged``: the offset staged on a held lane (by ``txn``, or any) settled once its
        transaction is decided (``txn_offsets.settled_with``); left while it is open."""
        await self._update_entry(lane, "settle", None, settling(txn, self._where(lane)))

    async def _update_entry(
        self,
        lane: int,
        what: str,
        read_epoch: int | None,
        change: StateChange,
        *,
        staged_state: bool = True,
    ) -> None:
        """``GroupMember._update_entry`` awaited (``txn_offsets.fenced_write``); ``change`` also gets the state of
        the transaction of an offset staged on the entry, read at each attempt (unless ``staged_state`` is False)."""
        epoch = self._epoch_of(lane)
        if read_epoch is not None and read_epoch != epoch:
            raise self._fenced(what, lane, -1, read_epoch, self.member_id, epoch)
        key = lane_key(self.stream, self.group, lane)

        def fenced(stored: ConfirmedOffset | None) -> FencedError:
            return self._fenced(what, lane, -1, epoch, stored.by if stored else None, stored.epoch if stored else None)

        text = self._offset_texts.get(lane)
        for _ in range(MAX_CAS_ATTEMPTS):
            if text is None:
                text = await self._offsets.get(key)
            if text is None:
                raise fenced(None)
            staged = ConfirmedOffset.decode(text, f"{key} in map {OFFSETS_MAP!r}").txn
            state = None
            if staged_state and staged is not None:
                state = await txn_grid.state_of(self._grid, staged.key)
            new = fenced_write(text, key, epoch=epoch, by=self.member_id, change=given(change, state), fenced=fenced)
            if new is None:
                return
            if await self._offsets.replace_if_same(key, text, new):
                self._remember(lane, new)
                return
            text = None
        raise contended(f"{what} on {self._where(lane)}", key)

    async def _write_offset(
        self,
        lane: int,
        offset: int,
        *,
        backwards: bool,
        read_epoch: int | None = None,
        mark: ItemMark | None = None,
        not_before_ms: int = 0,
        high: int | None = None,
    ) -> None:
        what = "seek" if backwards else "confirm"
        check_offset(what, offset, self._where(lane))
        check_lane(lane, self.lanes, self.stream)
        key = lane_key(self.stream, self.group, lane)
        deposed = self._deposed.get(lane)
        if lane not in self._held and deposed is not None:
            text = await self._leases.get(key)
            lease = None if text is None else Lease.decode(text, f"{key} in map {LEASES_MAP!r}")
            raise self._fenced(
                what, lane, offset, deposed, lease.holder if lease else None, lease.epoch if lease else None
            )
        epoch = self._epoch_of(lane)
        if read_epoch is not None and read_epoch != epoch:
            raise self._fenced(what, lane, offset, read_epoch, self.member_id, epoch)
        where = f"{key} in map {OFFSETS_MAP!r}"
        text = self._offset_texts.get(lane)
        for _ in range(MAX_CAS_ATTEMPTS):
            if text is None:
                text = await self._offsets.get(key)
            if text is None:
                raise self._fenced(what, lane, offset, epoch, None, None)
            step = offset_step(
                text,
                where,
                epoch=epoch,
                offset=offset,
                member_id=self.member_id,
                backwards=backwards,
                mark=mark,
                not_before_ms=not_before_ms,
                high=high,
            )
            if step.fenced:
                raise self._fenced(what, lane, offset, epoch, step.stored.by, step.stored.epoch)
            if step.ignored:
                self._remember(lane, text)
                return
            assert step.write is not None
            if await self._offsets.replace_if_same(key, text, step.write):
                self._remember(lane, step.write)
                return
            text = None
        raise contended_error(what, offset, self._where(lane), MAX_CAS_ATTEMPTS, "task")

    def _remember(self, lane: int, text: str) -> None:
        if lane in self._held:
            self._offset_texts[lane] = text

    def _fenced(
        self, what: str, lane: int, offset: int, epoch: int, holder: str | None, their_epoch: int | None
    ) -> FencedError:
        self.fencing_refusals += 1
        return fenced_error(self.member_id, what, self._where(lane), offset, epoch, holder, their_epoch)

    def _epoch_of(self, lane: int) -> int:
        check_lane(lane, self.lanes, self.stream)
        held = self._held.get(lane)
        if held is None:
            raise not_assigned_error(self.member_id, self._where(lane), self.assignment())
        return held.lease.epoch

    # -- the renewal task ---------------------------------------------------------------------------------------

    async def _run(self) -> None:
        """Renew every ``renew_every_ms``; between renewals watch the membership generation and probe the lanes
        waited for. Grid errors are logged once per outage: the lanes expire if it lasts a lease period."""
        period = self._settings.renew_every_ms / 1000.0
        watching = self._settings.want == "balanced"
        next_tick = time.monotonic() + period
        failing = False
        while True:
            wake_s = _WATCH_EVERY_S if watching else _PROBE_EVERY_S
            await asyncio.sleep(max(0.0, min(next_tick - time.monotonic(), wake_s)))
            try:
                if time.monotonic() >= next_tick:
                    next_tick = max(next_tick + period, time.monotonic())
                    await self._tick()
                elif watching and await self._membership_changed():
                    await self._rebalance()
                elif self._target - set(self._held):
                    await self._acquire(self._target, sorted(self._target - set(self._held)))
                if failing:
                    logger.info("member %r of group %r reaches the grid again", self.member_id, self.group)
                failing = False
            except GridError as exc:
                if not failing:
                    logger.warning(
                        "member %r of group %r cannot renew (its lanes expire after %d ms without renewal): %s",
                        self.member_id,
                        self.group,
                        self.lease_ms,
                        exc,
                    )
                failing = True
            except asyncio.CancelledError:
                raise
            except Exception:  # the renewal task is the liveness: it must survive anything
                logger.exception("member %r of group %r: unexpected error while renewing", self.member_id, self.group)

    async def _tick(self) -> None:
        self._beat += 1
        entry = heartbeat(self.member_id, self._settings.want, self._beat, self.lease_ms, self._host)
        await self._members.set(
            member_key(self.stream, self.group, self.member_id), entry.encode(), ttl_s=2 * self.lease_ms / 1000.0
        )
        await self._renew()
        await self._rebalance()

    async def _membership_changed(self) -> bool:
        text = await self._leases.get(generation_key(self.stream, self.group))
        if text == self._generation:
            return False
        self._generation = text
        return True

    async def _renew(self) -> None:
        for lane, lease in list(self._held.items()):
            fresh = renewed(lease)
            sent = time.monotonic()
            text = fresh.encode()
            if await self._leases.replace_if_same(lane_key(self.stream, self.group, lane), lease.text, text):
                if lane in self._held:
                    self._held[lane] = Held(fresh, text, sent)
                continue
            self._held.pop(lane, None)
            self._offset_texts.pop(lane, None)
            self._deposed[lane] = lease.lease.epoch
            self.lease_losses += 1
            logger.warning(
                "member %r lost %s (epoch %d): another member took it over after the lease was not seen renewed "
                "for %d ms",
                self.member_id,
                self._where(lane),
                lease.lease.epoch,
                self.lease_ms,
            )

    async def _rebalance(self) -> None:
        own = MemberEntry(self.member_id, self._settings.want, self._beat, self.lease_ms, 0, self._host, os.getpid())
        warnings: list[str] = []
        entries = await self._members.entries()
        live = live_members(entries, self.stream, self.group, own, self._member_observer, warnings)
        for warning in warnings:
            logger.warning("ignoring group member entry: %s", warning)
        target = target_lanes(self._settings.want, live, self.lanes, self.member_id)
        surplus = {lane: held for lane, held in self._held.items() if lane not in target}
        if surplus:
            self._notify(Assignment.of({lane: h.lease.epoch for lane, h in self._held.items() if lane in target}))
            for lane, held in surplus.items():
                self._held.pop(lane, None)
                self._offset_texts.pop(lane, None)
                key = lane_key(self.stream, self.group, lane)
                released = await self._leases.replace_if_same(key, held.text, vacated(held).encode())
                logger.info(
                    "member %r %s %s (epoch %d) to rebalance",
                    self.member_id,
                    "released" if released else "had already lost",
                    self._where(lane),
                    held.lease.epoch,
                )
        await self._acquire(target, range(self.lanes))

    async def _acquire(self, target: frozenset[int], lanes: Sequence[int] | range) -> None:
        keys = {lane: lane_key(self.stream, self.group, lane) for lane in lanes}
        texts = await self._leases.get_all(list(keys.values()))
        for key in keys.values():
            self._lease_observer.see(key, texts.get(key))
        for lane in sorted(target & frozenset(keys)):
            if lane in self._held or self._closed:
                continue
            try:
                await self._try_acquire(lane, keys[lane], texts.get(keys[lane]))
            except FormatError as exc:
                logger.warning("member %r cannot take %s: %s", self.member_id, self._where(lane), exc)
        self._target = target
        self._notify(self.assignment())

    async def _try_acquire(self, lane: int, key: str, text: str | None) -> None:
        lease = None if text is None else Lease.decode(text, f"{key} in map {LEASES_MAP!r}")
        if not may_take(lease, text, key, self.member_id, self._joining, self._lease_observer):
            return
        floor = 0
        if lease is None:
            stored_text = await self._offsets.get(key)
            where = f"{key} in map {OFFSETS_MAP!r}"
            floor = 0 if stored_text is None else ConfirmedOffset.decode(stored_text, where).epoch
        sent = time.monotonic()
        new = acquired(self.member_id, self.lease_ms, lease, floor)
        new_text = new.encode()
        if text is None or lease is None:
            won = await self._leases.put_if_absent(key, new_text) is None
        else:
            won = await self._leases.replace_if_same(key, text, new_text)
        if not won:
            return
        fenced = await self._fence(lane, key, new.epoch)
        if fenced is None:
            logger.info("member %r: %s was not fenced (a newer holder, or an open transaction)", self.member_id, key)
            return
        self._held[lane] = Held(new, new_text, sent)
        self._offset_texts[lane] = fenced
        self._deposed.pop(lane, None)
        self.lease_acquisitions += 1
        previous = "nobody" if lease is None or lease.vacant else repr(lease.holder)
        logger.info("member %r took %s with epoch %d (from %s)", self.member_id, self._where(lane), new.epoch, previous)

    async def _fence(self, lane: int, key: str, epoch: int) -> str | None:
        """Stamp the epoch on the lane's offsets entry (``protocol.fence_step``), settling a staged offset in the same
        compare-and-set; None when a newer epoch is there."""
        where = f"{key} in map {OFFSETS_MAP!r}"
        for _ in range(MAX_CAS_ATTEMPTS):
            step = fence_step(await self._offsets.get(key), where, epoch, self.member_id)
            if step.create is not None:
                if await self._offsets.put_if_absent(key, step.create) is None:
                    return step.create
                continue
            if step.newer or step.keep is not None:
                return step.keep
            assert step.stored is not None and step.text is not None
            settled = step.stored
            if settled.txn is not None:
                # txn_offsets.settle(..., abort_open=True): the previous holder's open transaction is aborted first
                state = await txn_grid.state_of(self._grid, settled.txn.key)
                if state is not None and not state.decided:
                    reason = f"fenced: {self._where(lane)} was taken over while the transaction held its offset"
                    state = await txn_grid.abort(self._grid, settled.txn.key, reason)
                settled = settled_with(settled, state, self._where(lane))
            fenced = fenced_value(settled, epoch, self.member_id)
            if await self._offsets.replace_if_same(key, step.text, fenced):
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
        except Exception:  # an owner's bug must not stop renewals
            logger.exception("on_change callback of group member %r failed", self.member_id)
