"""An exclusive group member's offsets as steps: confirm, seek, hold, and the offsets staged in transactions.

``OffsetSteps`` is the base of ``meteor_spark.groups.member_steps.MemberSteps`` (and so of the threaded
``GroupMember`` and the ``AsyncGroupMember``): the member's identity, what it holds in memory (the offsets entry
text it fenced or last wrote per lane, the epochs it was deposed at), and every offset write as a generator of grid
steps (``meteor_spark.grid.steps``), driven by ``drive`` or ``drive_async``. The decisions are
``meteor_spark.groups.protocol``'s (``offset_step``) and ``txn_offsets``' (staging, applying, settling).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from meteor_spark.errors import FencedError
from meteor_spark.grid.item_marks import ItemMark
from meteor_spark.grid.steps import Steps
from meteor_spark.grid.transaction_state import TxnState
from meteor_spark.groups.leases import Held, Lease
from meteor_spark.groups.protocol import (
    check_lane,
    check_offset,
    contended_error,
    fenced_error,
    not_assigned_error,
    offset_step,
)
from meteor_spark.groups.store import LEASES_MAP, MAX_CAS_ATTEMPTS, OFFSETS_MAP, Assignment, ConfirmedOffset, lane_key
from meteor_spark.groups.txn_offsets import (
    StateChange,
    applying,
    contended,
    fenced_write,
    given,
    settling,
    staged_onto,
)

__all__ = ["NeedsState", "OffsetSteps"]

logger = logging.getLogger(__name__)

#: Whether an offsets entry update needs the state of the transaction that staged the stored entry's offset.
NeedsState = Callable[[ConfirmedOffset], bool]


class OffsetSteps:
    """A group member's identity, local state and offset writes (see the module docs); the attributes are the
    member's (``MemberSteps.__init__`` and the shell set them)."""

    stream: str
    lanes: int
    fencing_refusals: int
    _settings: Any  # MemberSettings
    _offsets: Any  # GridMap or AsyncGridMap of OFFSETS_MAP
    _lease_map: Any  # ... of LEASES_MAP
    _lock: Any  # a context manager over what this member holds
    _held: dict[int, Held]
    _offset_texts: dict[int, str]  # lane -> offsets entry text this member fenced or last wrote
    _deposed: dict[int, int]  # lane -> epoch this member held it with until another member took it
    #: What runs the renewals ("thread" or "task"), for the contention error.
    _RUNNER = "thread"

    def _txn_state(self, key: str) -> Any:
        """The stored state of transaction ``key`` (a ``TxnState`` or None), or an awaitable of it."""
        raise NotImplementedError

    # -- identity and local state ---------------------------------------------------------------------------------

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

    def _key(self, lane: int) -> str:
        return lane_key(self.stream, self.group, lane)

    def assignment(self) -> Assignment:
        """The lanes held now, ``{lane: epoch}`` (local view, kept by the background renewal)."""
        with self._lock:
            return Assignment.of({lane: held.lease.epoch for lane, held in self._held.items()})

    def _stored(self, lane: int) -> ConfirmedOffset | None:
        """A held lane's offsets entry, from the text this member fenced or last wrote."""
        with self._lock:
            text = self._offset_texts.get(lane)
        return None if text is None else ConfirmedOffset.decode(text, f"{self._key(lane)} in map {OFFSETS_MAP!r}")

    def confirmed_mark(self, lane: int) -> ItemMark | None:
        """The item mark stored with a held lane's confirmed offset (from memory: the text this member fenced or
        last wrote), None when the lane is not held or its offset carries no mark."""
        stored = self._stored(lane)
        return None if stored is None else stored.mark

    def hold_of(self, lane: int) -> tuple[int, int | None]:
        """``(not_before_ms, high)`` stored with a held lane's offset (from memory: the text this member fenced or
        last wrote); ``(0, None)`` when the lane is not held or none is stored."""
        stored = self._stored(lane)
        return (0, None) if stored is None else (stored.not_before_ms, stored.high)

    def _remember_offset_text(self, lane: int, text: str) -> None:
        with self._lock:
            if lane in self._held:
                self._offset_texts[lane] = text

    def _fenced(
        self, what: str, lane: int, offset: int, epoch: int, holder: str | None, their_epoch: int | None
    ) -> FencedError:
        self.fencing_refusals += 1
        return fenced_error(self.member_id, what, self._where(lane), offset, epoch, holder, their_epoch)

    def _epoch_of(self, lane: int) -> int:
        check_lane(lane, self.lanes, self.stream)
        with self._lock:
            held = self._held.get(lane)
        if held is None:
            raise not_assigned_error(self.member_id, self._where(lane), self.assignment())
        return held.lease.epoch

    def _known_offsets_steps(self, lanes: Sequence[int] | range) -> Steps[dict[int, int | None]]:
        """The confirmed offsets of ``lanes``, at most one grid call: a held lane's is the one this member fenced or
        last wrote (only the holder moves it), the others (held by other members, or vacant) one ``get_all``."""
        with self._lock:
            texts = {lane: self._offset_texts[lane] for lane in lanes if lane in self._offset_texts}
        keys = {lane: self._key(lane) for lane in lanes if lane not in texts}
        if keys:
            stored = yield partial(self._offsets.get_all, list(keys.values()))
            texts.update({lane: stored[key] for lane, key in keys.items() if key in stored})
        out: dict[int, int | None] = {}
        for lane in lanes:
            text = texts.get(lane)
            out[lane] = (
                None
                if text is None
                else ConfirmedOffset.decode(text, f"{self._key(lane)} in map {OFFSETS_MAP!r}").offset
            )
        return out

    # -- offsets ----------------------------------------------------------------------------------------------------

    def _write_offset_steps(
        self,
        lane: int,
        offset: int,
        *,
        backwards: bool,
        read_epoch: int | None = None,
        mark: ItemMark | None = None,
        not_before_ms: int = 0,
        high: int | None = None,
    ) -> Steps[None]:
        """A confirm (``backwards`` False), seek or hold: compare-and-set from the text this member last wrote,
        read again only when that fails. No lease read first: the entry carries the epoch of whoever fenced it
        last, so a newer holder (which fences before it reads) makes the write fail; a lease read would cost a
        round trip and still race with a takeover right after it."""
        what = "seek" if backwards else "confirm"
        epoch, text = self._write_epoch(what, lane, offset, read_epoch)
        if epoch is None:
            yield from self._deposed_steps(what, lane, offset)
            return
        key = lane_key(self.stream, self._settings.group, lane)
        where = f"{key} in map {OFFSETS_MAP!r}"
        for _ in range(MAX_CAS_ATTEMPTS):
            if text is None:
                text = yield partial(self._offsets.get, key)
            if text is None:
                # The holder fenced the entry when it took the lane, so it only goes missing when the group was
                # forgotten (the stream deleted): that ends this member's claim as surely as a newer epoch.
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
                self._remember_offset_text(lane, text)
                if step.below:
                    logger.debug(
                        "ignored confirm of offset %d on %s: the group already confirmed %s",
                        offset,
                        self._where(lane),
                        step.stored.offset,
                    )
                return
            assert step.write is not None
            if (yield partial(self._offsets.replace_if_same, key, text, step.write)):
                self._remember_offset_text(lane, step.write)
                return
            text = None
        raise contended_error(what, offset, self._where(lane), MAX_CAS_ATTEMPTS, self._RUNNER)

    def _write_epoch(self, what: str, lane: int, offset: int, read_epoch: int | None) -> tuple[int | None, str | None]:
        """The epoch an offset write on ``lane`` goes under (None when the lane was lost to another member:
        refused by ``_deposed_steps``) and the entry text this member last wrote, read together; refused at once
        when the lane is not held, or the records were read under another epoch."""
        check_offset(what, offset, self._where(lane))
        check_lane(lane, self.lanes, self.stream)
        with self._lock:
            held = self._held.get(lane)
            deposed = self._deposed.get(lane)
            text = self._offset_texts.get(lane)
        if held is None:
            if deposed is not None:
                return None, None
            raise not_assigned_error(self.member_id, self._where(lane), self.assignment())
        epoch = held.lease.epoch
        if read_epoch is not None and read_epoch != epoch:
            raise self._fenced(what, lane, offset, read_epoch, self.member_id, epoch)
        return epoch, text

    def _deposed_steps(self, what: str, lane: int, offset: int) -> Steps[None]:
        """Refuse a write on a lane this member lost to another one, naming the holder (its lease read)."""
        key = self._key(lane)
        text = yield partial(self._lease_map.get, key)
        lease = None if text is None else Lease.decode(text, f"{key} in map {LEASES_MAP!r}")
        raise self._fenced(
            what, lane, offset, self._deposed[lane], lease.holder if lease else None, lease.epoch if lease else None
        )

    def _update_entry_steps(
        self,
        lane: int,
        what: str,
        read_epoch: int | None,
        change: StateChange,
        needs_state: NeedsState,
    ) -> Steps[None]:
        """Compare-and-set the lane's offsets entry to ``change(stored, state)`` (None: leave it), fenced like a
        confirm; ``state`` is the stored state of the transaction that staged the entry's offset, read at each
        attempt when ``needs_state(stored)``, else None."""
        epoch = self._epoch_of(lane)
        if read_epoch is not None and read_epoch != epoch:
            raise self._fenced(what, lane, -1, read_epoch, self.member_id, epoch)
        key = self._key(lane)

        def fenced(stored: ConfirmedOffset | None) -> FencedError:
            return self._fenced(what, lane, -1, epoch, stored.by if stored else None, stored.epoch if stored else None)

        with self._lock:
            text = self._offset_texts.get(lane)
        for _ in range(MAX_CAS_ATTEMPTS):
            if text is None:
                text = yield partial(self._offsets.get, key)
            if text is None:
                raise fenced(None)
            stored = ConfirmedOffset.decode(text, f"{key} in map {OFFSETS_MAP!r}")
            state = None
            if stored.txn is not None and needs_state(stored):
                state = yield partial(self._txn_state, stored.txn.key)
            new = fenced_write(text, key, epoch=epoch, by=self.member_id, change=given(change, state), fenced=fenced)
            if new is None:
                return
            if (yield partial(self._offsets.replace_if_same, key, text, new)):
                self._remember_offset_text(lane, new)
                return
            text = None
        raise contended(f"{what} on {self._where(lane)}", key)

    def _stage_steps(self, lane: int, offset: int, txn: str, epoch: int | None, mark: ItemMark | None) -> Steps[None]:
        """``offset`` staged on a held lane under ``txn``; an earlier transaction's staged offset is settled first
        (its state read only then), GroupError while that one is still open."""
        where = self._where(lane)

        def change(stored: ConfirmedOffset, other: TxnState | None) -> ConfirmedOffset | None:
            return staged_onto(stored, txn, offset, mark, where, other)

        def needs_state(stored: ConfirmedOffset) -> bool:
            return stored.txn is not None and stored.txn.key != txn

        yield from self._update_entry_steps(lane, "stage", epoch, change, needs_state)

    def _apply_steps(self, lane: int, txn: str) -> Steps[None]:
        """After ``txn`` committed: the lane's offset moved to the one ``txn`` staged (no state read)."""
        apply = applying(txn)
        yield from self._update_entry_steps(lane, "apply", None, lambda s, _state: apply(s), lambda _s: False)

    def _settle_steps(self, lane: int, txn: str | None) -> Steps[None]:
        """The offset staged on a held lane (by ``txn``, or any) settled once its transaction is decided."""
        yield from self._update_entry_steps(lane, "settle", None, settling(txn, self._where(lane)), lambda _s: True)
