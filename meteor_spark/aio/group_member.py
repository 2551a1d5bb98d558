"""AsyncGroupMember: a member of an exclusive subscriber group on the caller's event loop (no threads).

The same protocol as the threaded ``meteor_spark.groups.exclusive.GroupMember``, with the same stored values, so
threaded and asyncio members share one group: every decision (the lease values written, whether a lease may be
taken, the live members and the target lanes, fencing a lane taken, what a confirm writes or why it is refused,
the errors) is ``meteor_spark.groups.protocol``'s, and every grid call is made by the threaded member's own steps
(``meteor_spark.groups.member_steps`` and ``member_offsets``), driven here with ``drive_async`` on the
``AsyncGridMap``s of ``meteor_spark.grid.aio_client``. The renewal that the threaded member runs on a thread is a
task on the loop: a member is alive while that task renews its heartbeat and leases.

It has the threaded member's whole offset API: ``confirm`` / ``seek``, ``hold`` (a ``nack``), and ``stage`` /
``apply_staged`` / ``settle_staged`` (``txn_offsets``' decisions, transaction states read or decided by
``meteor_spark.aio.txn_grid``); taking a lane whose offset an open transaction staged aborts it first, and
``want="all"`` (hold every lane, stand by for lanes held by others) is the threaded one's too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from meteor_spark.aio import txn_grid
from meteor_spark.errors import GroupError
from meteor_spark.format.offsets import InitialOffsetScheme, resolve_initial
from meteor_spark.grid.aio_client import AsyncGrid, AsyncGridMap
from meteor_spark.grid.item_marks import ItemMark
from meteor_spark.grid.steps import drive_async
from meteor_spark.grid.streams import StreamInfo
from meteor_spark.groups.balancing import MemberSettings
from meteor_spark.groups.member_steps import MemberSteps
from meteor_spark.groups.protocol import check_offset
from meteor_spark.groups.store import LEASES_MAP, MEMBERS_MAP, OFFSETS_MAP, Assignment

__all__ = ["AsyncGroupMember"]

logger = logging.getLogger(__name__)


class AsyncGroupMember(MemberSteps):
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
        super().__init__(
            info,
            MemberSettings.parse(group, member_id, lease_ms, renew_every_ms, want),
            on_change,
            threading.Lock(),  # never contended on one loop; a C lock costs less per use than a nullcontext
        )
        self._grid = grid
        self._task: asyncio.Task[None] | None = None
        self._opened = False  # the maps were opened: close has something to release
        self._is_joining = True

    @staticmethod
    def check(group: str, member_id: str | None, lease_ms: int, want: str = "balanced") -> None:
        """The member's arguments checked (``ConfigError`` naming the one at fault), before anything connects."""
        MemberSettings.parse(group, member_id, lease_ms, None, want)

    # -- lifecycle ----------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Join: take what this member should hold now, announce it, start the renewal task on the loop."""
        if self._closed:
            raise GroupError(f"group member {self.member_id!r} was closed; create a new one to rejoin")
        if self._task is not None:
            return
        self._lease_map: AsyncGridMap = await self._grid.map(LEASES_MAP)
        self._offsets: AsyncGridMap = await self._grid.map(OFFSETS_MAP)
        self._members: AsyncGridMap = await self._grid.map(MEMBERS_MAP)
        self._opened = True
        await drive_async(self._tick_steps())
        self._is_joining = False
        await drive_async(self._announce_steps("join"))
        self._task = asyncio.get_running_loop().create_task(
            drive_async(self._run_steps()), name=f"meteor-group-{self.member_id}"
        )
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
        await drive_async(self._leave_steps(held))
        logger.info("member %r left group %r of stream %r", self.member_id, self.group, self.stream)

    # -- queries ------------------------------------------------------------------------------------------------

    def is_current(self, lane: int) -> bool:
        """Held by this member's own judgement (renewed within a lease period, renewal task alive)."""
        held = self._held.get(lane)
        if held is None or self._closed or self._task is None or self._task.done():
            return False
        return held.live_locally(time.monotonic())

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
        return await drive_async(self._known_offsets_steps(lanes))

    # -- offsets ------------------------------------------------------------------------------------------------

    async def confirm(self, lane: int, offset: int, *, epoch: int | None = None, mark: ItemMark | None = None) -> None:
        """``GroupMember.confirm``: fenced, a confirm at or below the stored offset ignored (same errors)."""
        await drive_async(self._write_offset_steps(lane, offset, backwards=False, read_epoch=epoch, mark=mark))

    async def seek(self, lane: int, offset: int) -> None:
        """``GroupMember.seek``: set a held lane's offset, forwards or backwards, fenced."""
        await drive_async(self._write_offset_steps(lane, offset, backwards=True))

    async def hold(self, lane: int, offset: int, *, not_before_ms: int, high: int | None, epoch: int | None) -> None:
        """``GroupMember.hold``: rewind a held lane to ``offset`` (a ``nack``), paused until the wall-clock instant
        ``not_before_ms`` for whichever member reads it next; ``high`` kept for ``dead_letter_after``."""
        await drive_async(
            self._write_offset_steps(
                lane, offset, backwards=True, read_epoch=epoch, not_before_ms=not_before_ms, high=high
            )
        )

    async def stage(
        self, lane: int, offset: int, txn: str, *, epoch: int | None = None, mark: ItemMark | None = None
    ) -> None:
        """``GroupMember.stage``: ``offset`` staged on a held lane in transaction ``txn`` (same errors)."""
        check_offset("stage", offset, self._where(lane))
        await drive_async(self._stage_steps(lane, offset, txn, epoch, mark))

    async def apply_staged(self, lane: int, txn: str) -> None:
        """``GroupMember.apply_staged``: after ``txn`` committed, the lane's offset moved to the one it staged."""
        await drive_async(self._apply_steps(lane, txn))

    async def settle_staged(self, lane: int, txn: str | None = None) -> None:
        """``GroupMember.settle_staged``: the offset staged on a held lane (by ``txn``, or any) settled once its
        transaction is decided (``txn_offsets.settled_with``); left while it is open."""
        await drive_async(self._settle_steps(lane, txn))

    # -- the shell's hooks ----------------------------------------------------------------------------------------

    _RUNNER = "task"

    def _stopping(self) -> bool:
        return self._closed

    def _joining(self) -> bool:
        return self._is_joining

    async def _pause(self, seconds: float) -> bool:
        await asyncio.sleep(seconds)
        return False

    def _txn_state(self, key: str) -> Any:
        return txn_grid.state_of(self._grid, key)

    def _txn_abort(self, key: str, reason: str) -> Any:
        return txn_grid.abort(self._grid, key, reason)

    def _drop_heartbeat(self, key: str) -> Any:
        return self._members.remove(key)
