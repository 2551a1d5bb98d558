"""Subscriber groups: fenced per-lane leases, lane balancing across live members, fenced confirmed offsets.

A group reads a stream exclusively per lane: at most one member holds a lane's lease at a time, and only the holder
may move the lane's confirmed offset. Lanes are spread evenly over the group's live members and move when a member
joins, leaves (``close``) or dies (stops renewing).

The protocol:

- **Acquire**: ``put_if_absent`` on a missing lease, or ``replace_if_same`` on the exact bytes of a vacant or
  expired one, with ``epoch + 1``. Then the new holder **fences** the lane: it compare-and-sets the offsets entry to
  carry its epoch (keeping the offset). Only after that is the lane part of the member's ``assignment()``, and the
  offset it reads from then on can no longer be moved by anyone with an older epoch.
- **Confirm / seek**: the offsets entry is compare-and-set, from the exact text this member fenced or last wrote,
  only while its stored epoch is not greater than ours. A newer holder stamps its epoch on the entry before it
  reads the offset, so once it has, a deposed holder always gets ``FencedError`` and the offset stays where the
  new holder found it, even while the deposed one still believes its lease is live, and also after it noticed (a
  lane lost to another member stays fenced, it does not become "not assigned"). The lease is not read first: that
  read would cost a round trip per confirm and prove nothing, since a takeover can follow it at once; the CAS is
  what fences. A reader passes the epoch its records were read under, so records read before a lane was lost are
  never confirmed under a later epoch of the same member (one that got the lane back). A confirm below the stored
  offset is **ignored** (logged at debug level, without a grid call): late, out-of-order confirms from several
  threads are normal in at-least-once processing and must not move the group back. ``seek`` is the explicit way
  back.
- **Stage / apply** (consume-transform-produce): ``stage`` puts an offset in the entry's ``txn`` field under a
  transaction, fenced like a confirm; it becomes the offset when the transaction commits (``apply_staged``, or
  settled by a new holder while it fences the lane, or by ``settle_staged``): ``meteor_spark.groups.txn_offsets``.
- **Renew**: each member's background thread rewrites its leases (``beat + 1``) and its heartbeat every
  ``renew_every_ms`` (default ``lease_ms / 3``).
- **Expiry and clocks**: see ``meteor_spark.groups.leases``. In short, safety (no two holders moving an offset) rests
only
  on compare-and-set with the epoch; clocks only decide how fast a dead holder is replaced. Expiry is judged by
  observed non-renewal on each observer's monotonic clock, so wall-clock skew between hosts does not matter.
- **Liveness** is the member's background thread: a member is alive while that thread renews its heartbeat and
  leases, and until ``close()``. A process that stops reading but keeps the thread running keeps its lanes;
  a process that dies (or is SIGKILLed) loses them one lease period after an observer last saw them renewed.
  Owners re-validate with ``is_current(lane)`` before delivering records: the member's own judgement (renewed
  within a lease period by its monotonic clock, thread alive), which ends before any observer can take the lane.
- **Balancing**: every member computes the same target from the sorted ids of the live ``want="balanced"``
  members: lane ``i`` goes to member ``i mod n`` (4 lanes over 3 members -> 2/1/1). A member releases the lanes it
  should no longer hold (calling ``on_change`` first so its owner can confirm what it read) and takes the free or
  expired lanes it should hold. It never takes a lane whose lease is live: the holder gives it up itself. A member
  that joins or leaves (``start``, ``close``) rewrites the group's membership generation after its heartbeat, and
  the balanced members read that one entry every 100 ms, so they recompute the target and give lanes up at once
  instead of at their next renewal (a dead member is still noticed by its heartbeat and leases expiring). A
  ``want="all"`` member (the Spark driver) tries to hold every lane; lanes held live by others are waited for
  (standby) and never stolen. Mixing both kinds in one group makes them compete for free lanes.

Costs per member and renewal period: one heartbeat write, one scan of the members map (only heartbeats of live
members are in it), one ``get_all`` of the group's lane leases and one CAS per held lane; a balanced member also
reads the membership generation every 100 ms (one ``get``; a change adds one members scan and one ``get_all``).
A member waiting for lanes (a joiner while the holders give lanes up: every 100 ms; a ``want="all"`` standby: every
200 ms) also reads just those leases, so a released lane changes hands within that; lanes move to a joiner within
about 0.2 s plus the grid calls of the handover; a dead holder's lanes move one lease period after they were last
seen renewed. Moving an offset costs one CAS (none when it does not move); ``is_current`` costs nothing.

Stored values and keys: ``meteor_spark.groups.store``; tools acting from outside a group (state, lag, seek,
forget): ``meteor_spark.groups.admin``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from meteor_spark.errors import ConfigError, GroupError
from meteor_spark.format.offsets import InitialOffsetScheme, resolve_initial
from meteor_spark.grid.client import Grid, GridMap
from meteor_spark.grid.item_marks import ItemMark
from meteor_spark.grid.steps import drive
from meteor_spark.grid.streams import StreamInfo
from meteor_spark.groups.balancing import LaneBalancer, MemberSettings
from meteor_spark.groups.protocol import check_lane
from meteor_spark.groups.store import LEASES_MAP, MEMBERS_MAP, OFFSETS_MAP, Assignment, read_offset

__all__ = ["GroupMember"]

logger = logging.getLogger(__name__)


class GroupMember(LaneBalancer):
    """One member of a subscriber group on one stream: holds lane leases and moves the group's offsets.

    Args:
        grid: the grid connection.
        info: the stream (``open_stream``'s result).
        group: the group name.
        member_id: this member's id (default ``<host>-<pid>-<random>``). A member started with the id of one that
            died takes its lanes at once when it starts, instead of after a lease period. Two live members must
            not share an id.
        lease_ms: how long a lease lives without renewal (default 5 s): the failover time after a crash.
        renew_every_ms: renewal and rebalancing period (default ``lease_ms / 3``).
        want: ``"balanced"`` (share the lanes with the group's other members) or ``"all"`` (hold every lane; stand
            by for lanes others hold).
        on_change: called with the new ``Assignment`` whenever it changes, on the member's background thread (and
            on the caller's thread inside ``start()`` and ``close()``). Before lanes are *given up* (rebalance,
            close) it is called while they are still held, so the owner can ``confirm`` what it read; lanes *lost*
            (taken over after this member failed to renew) are reported after the fact. Exceptions are logged.

    Examples:
        >>> member = GroupMember(grid, info, "billing")        # doctest: +SKIP
        >>> member.start()                                       # doctest: +SKIP
        >>> for lane in member.assignment():                    # doctest: +SKIP
        ...     start = member.confirmed(lane)
    """

    def __init__(
        self,
        grid: Grid,
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
            info, MemberSettings.parse(group, member_id, lease_ms, renew_every_ms, want), on_change, threading.Lock()
        )
        self._lease_map: GridMap = grid.map(LEASES_MAP)
        self._grid = grid
        self._offsets: GridMap = grid.map(OFFSETS_MAP)
        self._members: GridMap = grid.map(MEMBERS_MAP)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle ----------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Join the group: announce this member, take what it should hold now, start renewing in the background."""
        if self._closed:
            raise GroupError(f"group member {self.member_id!r} was closed; create a new GroupMember to rejoin")
        if self._thread is not None:
            return
        self._tick()
        self._announce_safely("join")
        self._thread = threading.Thread(
            target=self._run, name=f"meteor-group-{self.group}-{self.member_id}", daemon=True
        )
        self._thread.start()
        logger.info(
            "member %r joined group %r of stream %r (want=%s, lease %d ms), holding lanes %s",
            self.member_id,
            self.group,
            self.stream,
            self._settings.want,
            self.lease_ms,
            sorted(self.assignment()),
        )

    def close(self) -> None:
        """Leave the group: stop renewing, tell the owner (``on_change``), release the leases, drop the heartbeat.

        Confirm what was read before calling this (or from ``on_change``): the next holder resumes at the
        confirmed offset. Idempotent. Grid errors are logged: leases that cannot be released expire by themselves.
        """
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=max(10.0, 2 * self.lease_ms / 1000.0))
        with self._lock:
            held = dict(self._held)
        if held:
            self._notify(Assignment())
        drive(self._leave_steps(held))
        logger.info("member %r left group %r of stream %r", self.member_id, self.group, self.stream)

    def __enter__(self) -> GroupMember:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- queries ------------------------------------------------------------------------------------------------

    def is_current(self, lane: int) -> bool:
        """True when this member still holds ``lane`` by its own judgement: renewed within a lease period by this
        process's monotonic clock, background thread alive, not closed. Check before delivering.

        No grid read: the background renewal compare-and-sets every held lease each period and drops a lane the
        moment a renewal fails, and the holder's lease ends locally before any observer can take it over
        (``meteor_spark.groups.leases``). Safety does not rest on this check: a deposed holder's confirm is fenced."""
        with self._lock:
            held = self._held.get(lane)
        if held is None or self._closed or self._thread is None or not self._thread.is_alive():
            return False
        return held.live_locally(time.monotonic())

    def confirmed(self, lane: int) -> int | None:
        """The group's confirmed offset of ``lane`` (the next record to read), None when never confirmed."""
        self._check_lane(lane)
        stored = read_offset(self._offsets, self.stream, self.group, lane)
        return None if stored is None else stored.offset

    def known_offsets(self, lanes: Sequence[int] | range | None = None) -> dict[int, int | None]:
        """The confirmed offsets of ``lanes`` (default: all), at most one grid call.

        A held lane's offset is the one this member fenced or last wrote: only the holder moves it, so it is
        taken from memory. The others (held by other members, or vacant) are read with one ``get_all``.
        """
        wanted = range(self.lanes) if lanes is None else lanes
        for lane in wanted:
            self._check_lane(lane)
        return drive(self._known_offsets_steps(wanted))

    def initial_offset(self, lane: int, scheme: InitialOffsetScheme | str, head_seq: int, next_seq: int) -> int:
        """Where to start reading a held lane: its confirmed offset, else ``scheme`` resolved now.

        A position resolved from the scheme is confirmed at once, so a member that takes the lane over later
        resumes at the same point instead of resolving LATEST again (which would skip what arrived in between).

        Raises:
            NotAssignedError: the lane is not held. FencedError: it was lost meanwhile. GroupError: NONE without a
            confirmed offset.
        """
        self._epoch_of(lane)
        confirmed = self.confirmed(lane)
        offset = resolve_initial(scheme, True, confirmed, head_seq, next_seq, where=self._where(lane))
        if confirmed is None:
            self.confirm(lane, offset)
        return offset

    # -- offsets ------------------------------------------------------------------------------------------------

    def confirm(self, lane: int, offset: int, *, epoch: int | None = None, mark: ItemMark | None = None) -> None:
        """Record that every record of ``lane`` before ``offset`` was processed (``offset`` = next to read).

        A confirm at or below the stored offset is ignored: offsets never go backwards by accident (use ``seek``).
        ``epoch``: the epoch the records were read under (a reader passes it, so records read before the lane
        was lost are never confirmed under a later epoch of the same member). ``mark``: the item the offset was
        taken after (``meteor_spark.grid.item_marks``; a reader has it in hand), stored with the offset so that whoever
        resumes the lane there can tell a lane truncated and refilled under it (the ``Subscriber`` checks it when it
        takes a lane up).

        Raises:
            NotAssignedError: this member does not hold ``lane`` (and never lost it to another member).
            FencedError: the lane was taken over by a newer holder (or ``epoch`` is not the current one);
                nothing was written.
            ConfigError: a negative offset.
        """
        drive(self._write_offset_steps(lane, offset, backwards=False, read_epoch=epoch, mark=mark))

    def seek(self, lane: int, offset: int) -> None:
        """Set the group's offset of a held lane, forwards or backwards (the explicit way back). Fenced like
        ``confirm``."""
        drive(self._write_offset_steps(lane, offset, backwards=True))

    def hold(self, lane: int, offset: int, *, not_before_ms: int, high: int | None, epoch: int | None) -> None:
        """Rewind a held lane to ``offset`` (a ``nack``): the group reads it again from there, not before the
        wall-clock instant ``not_before_ms`` (0: at once), and ``high`` (one past the furthest record delivered)
        is kept for ``dead_letter_after``. Stored in the lane's offsets entry, so the pause holds for whichever
        member reads the lane next. Fenced like ``confirm`` (``epoch``: the one the records were read under)."""
        drive(
            self._write_offset_steps(
                lane, offset, backwards=True, read_epoch=epoch, not_before_ms=not_before_ms, high=high
            )
        )

    def stage(
        self, lane: int, offset: int, txn: str, *, epoch: int | None = None, mark: ItemMark | None = None
    ) -> None:
        """Stage ``offset`` on a held lane in transaction ``txn``: it becomes the group's offset exactly when ``txn``
        commits (``apply_staged``, or whoever settles it: ``meteor_spark.groups.txn_offsets``), never if it aborts.
        An offset staged by an earlier transaction is settled first. Fenced like ``confirm``.

        Raises:
            NotAssignedError, FencedError: as ``confirm``. GroupError: an earlier transaction's staged offset on the
            lane is still open (one transaction at a time per lane: commit or abort it first).
        """
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ConfigError(f"stage: offset {offset!r} on {self._where(lane)} is invalid; offsets are integers >= 0")
        drive(self._stage_steps(lane, offset, txn, epoch, mark))

    def apply_staged(self, lane: int, txn: str) -> None:
        """After ``txn`` committed: move the lane's offset to the one staged by ``txn`` (nothing when another
        transaction's, or nothing, is staged). Fenced: once the lane was taken over, its new holder has settled it."""
        drive(self._apply_steps(lane, txn))

    def settle_staged(self, lane: int, txn: str | None = None) -> None:
        """Settle the offset staged on a held lane (by ``txn``, or by any transaction when None) once its
        transaction is decided: rolled forward if it committed, dropped if it aborted; left while it is open."""
        drive(self._settle_steps(lane, txn))

    def _check_lane(self, lane: int) -> None:
        check_lane(lane, self.lanes, self.stream)
