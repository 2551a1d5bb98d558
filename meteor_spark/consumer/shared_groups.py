"""Shared groups: queue semantics over a stream (Kafka 4's share groups, KIP-932; Redis Streams' XPENDING/XCLAIM).

``SharedSubscriber(grid, stream, group=...)`` makes a member (a type of its own, not a ``Subscriber``: see
``Subscriber.__new__``). Any number of members share
every lane of the stream (more members than lanes all get work): a ``poll`` *acquires* records for a bounded time
(``acquisition_timeout_ms``, KIP-932's record lock duration, default 30 s) and hands them out; the member then
settles each record:

- ``ack(records)``: done (KIP-932 ACCEPT); never delivered again;
- ``nack(records)``: released (RELEASE): available again at once, to any member, delivery count kept;
  ``nack(records, delay_ms=...)``: available again no earlier than ``delay_ms`` from now (the instant is stored in
  the lane's entry, so it holds when this member dies; the other records of the lane keep flowing meanwhile;
  ``meteor_spark.groups.redelivery``);
- ``reject(records)``: given up on (REJECT): published to the dead-letter stream at once and never delivered again;
- ``renew(records)``: the lock of records still being processed starts again (RENEW, KIP-1222), so a slow record
  stays with its holder.

The lock duration (``acquisition_timeout_ms``), the delivery limit (``max_deliveries``) and the dead-letter stream
are the group's settings (KIP-932's ``share.record.lock.duration.ms`` and ``share.delivery.count.limit`` are group
configs): the group's first member stores them with the group (``share_state.GroupSettings``), later members use
them, and a member that asks for other values is refused with a ``ConfigError`` naming both. Every member thus
judges timeouts with the same lock duration: records a dead member held come back after the group's lock time,
whichever members are left.

An acquisition that is neither acknowledged nor released in time (a crashed, stuck or slow member) times out and
its records become available again: any member may acquire them. Each delivery counts: a record handed out
carries ``delivery_count`` (1 on the first delivery; ``SharedRecord``). A record that was delivered
``max_deliveries`` times (KIP-932's default: 5) without being acknowledged is archived: published to
``dead_letter_stream`` (headers name stream, lane, offset, group, delivery count and the reason;
``corrupt.dead_letter_for_delivery``) and never delivered again. With the group setting ``dead_letter_after=N``, an
available record (released, timed out or delayed) that has fallen more than ``N`` records behind the most recently
acquired one of its lane is archived the same way when a member next acquires on the lane
(``meteor_spark.consumer.shared_archive``), so a poison record cannot hold the lane's window for ever.

Guarantees: **at-least-once per acquisition**. A record is processed again when its acquisition timed out or was
released before it was acknowledged, and only then; an acknowledgement is accepted exactly once (an ``ack`` of a
record whose acquisition timed out and was taken by another member is refused with ``FencedError``: nothing is
written for it, and it cannot be acknowledged twice). An acquisition that timed out but was not taken by anyone yet
can still be acknowledged. Records are handed out in offset order per acquisition, but with several members
there is no order across them (as with any queue). A dead letter is published before the record is marked done,
so a member dying between the two publishes it again (at-least-once in the dead-letter stream).

State: one entry per lane in the grid map ``meteor.share.lanes`` (``meteor_spark.groups.shared_state``: the start
offset, the first offset never acquired, and a few ranges in between), changed only by compare-and-set on the exact text
read, so a real Hazelcast cluster and the embedded grid behave alike and no lock or lease is held. Steps of a poll,
per lane: read the entry; judge other acquisitions' timeouts; read the ring items of the records to hand out
(cached: ring items never change); write the new entry (records acquired under a fresh token) with one
compare-and-set, retried from a fresh read when another member won; hand the records out. An ack, nack or reject
is one compare-and-set per lane.

Timeouts are judged like lease expiry (``meteor_spark.groups.leases.ExpiryObserver``): a member treats an acquisition as
timed out once it has seen that acquisition unchanged in the entry for ``acquisition_timeout_ms`` of its own
monotonic time, so wall clocks of different hosts are never compared and safety rests on compare-and-set alone.
Idle members look at the entries every ``RECHECK_S`` (and when new items arrive), so a crashed member's records
are redelivered about ``acquisition_timeout_ms`` after it acquired them (a member that only starts watching later
waits a full timeout from its first look).

In flight: a lane acquires no fresh records while its start offset is ``MAX_WINDOW_ITEMS`` ring items or more
behind the first offset never acquired (KIP-932 bounds its in-flight records the same way): a record that is
never acknowledged holds the window until it is dead-lettered (``max_deliveries``) or, without a dead-letter
stream, until it is acknowledged.

Undecodable items and refused records (deserializers) follow the member's ``on_corrupt`` as for an exclusive
subscriber: ``error`` (default) raises ``FormatError`` / ``DeserializationError`` (the records before it are handed
out first; a refused record is released, so ``max_deliveries`` ends one that always fails); ``skip`` and
``dead_letter`` (to the group's dead-letter stream) acquire the item or record like any other, pass it over and
mark it done for the whole group, counted in ``refusals``: one bad item never blocks a lane for ever.

Not supported by a shared member (a ``ConfigError`` names them): ``confirm``/``seek`` (there is no position to
confirm: records are settled one by one), ``auto_confirm``. A lost range (the ring overwrote records before they
were settled) raises ``DataLossError``, and a group position past the lane's end (the stream was re-created under
the group's state) ``OffsetOutOfRangeError``; each stops the lane for every member. A lane truncated and refilled
under the group's position (a member restart that lost the lane's tail) is found when a member takes the lane up
(``meteor_spark.consumer.shared_takeup``): ``LaneTruncatedError``, or with ``skip_data_loss=True`` the lane's entry
is reset to its oldest record (delivered again, never skipped) and counted in ``truncated_lanes``.
Deleting a stream
(``admin.delete_stream`` / ``forget_groups``) removes its shared groups' entries too.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from meteor_spark.consumer.shared_takeup import SharedTakeUp
from meteor_spark.errors import (
    ConfigError,
    FencedError,
    FormatError,
    GroupError,
)
from meteor_spark.format.corrupt import CORRUPT_MODES, CorruptItemPolicy, dead_letter_for_delivery
from meteor_spark.format.offsets import (
    InitialOffsetScheme,
    resolve_initial,
    sequence_of,
)
from meteor_spark.format.records import Record
from meteor_spark.format.wire import ItemView
from meteor_spark.grid.reading import oldest_steps
from meteor_spark.grid.steps import Steps
from meteor_spark.groups.leases import ExpiryObserver
from meteor_spark.groups.redelivery import check_dead_letter_after, check_delay, not_before
from meteor_spark.groups.shared_state import AVAILABLE, DONE, SHARE_MAP, GroupSettings, LaneShare, settings_key
from meteor_spark.groups.store import MAX_CAS_ATTEMPTS

logger = logging.getLogger(__name__)

__all__ = ["HeldSpan", "SharedBookkeeping", "SharedRecord", "UndecodableItem", "corrupt_mode", "corrupt_policy"]

#: How often an idle member looks at the lane entries for released or timed-out records (s).
RECHECK_S = 0.1

#: The record lock duration of a group whose first member gave none (KIP-932's default, 30 s).
DEFAULT_ACQUISITION_TIMEOUT_MS = 30_000

#: The delivery limit of a group with a dead-letter stream whose first member gave none (KIP-932's default).
DEFAULT_MAX_DELIVERIES = 5

#: Fresh records are acquired only while the window [start, next) spans fewer ring items than this.
MAX_WINDOW_ITEMS = 1000


def corrupt_mode(on_corrupt: str | None) -> str:
    """A shared member's ``on_corrupt`` mode, checked before anything is written to the grid."""
    if on_corrupt is None:
        return "error"
    if not isinstance(on_corrupt, str) or on_corrupt.strip().lower() not in CORRUPT_MODES:
        raise ConfigError(f"on_corrupt must be one of {', '.join(CORRUPT_MODES)}, got {on_corrupt!r}")
    return on_corrupt.strip().lower()


def corrupt_policy(mode: str, dead_letter_stream: str | None) -> CorruptItemPolicy:
    """The policy of ``mode``; ``dead_letter`` sends to the group's dead-letter stream."""
    if mode != "dead_letter":
        return CorruptItemPolicy(mode)
    if dead_letter_stream is None:
        raise ConfigError(
            "on_corrupt='dead_letter' needs the group's dead_letter_stream: give dead_letter_stream=... (or join a "
            "group created with one)"
        )
    return CorruptItemPolicy(mode, dead_letter_stream)


@dataclass(frozen=True, slots=True)
class SharedRecord(Record):
    """A record handed out by a shared group: a ``Record`` plus how often it was delivered (1 the first time)."""

    delivery_count: int = 1


def shared_record(record: Record, delivery_count: int) -> SharedRecord:
    """``record`` as handed out by a shared group, delivered ``delivery_count`` times."""
    r = record
    return SharedRecord(
        r.value, r.key, r.headers, r.timestamp_ms, r.offset, r.lane, r.stream, r.topic, r.message_id, delivery_count
    )


@dataclass(frozen=True)
class UndecodableItem:
    """A ring item that does not decode: its bytes and why (cached like a decoded item)."""

    raw: bytes
    error: FormatError


@dataclass(frozen=True)
class HeldSpan:
    """A record this member holds: its acquisition and where its span ends (the next record's offset)."""

    token: str
    end: int
    deliveries: int


class SharedBookkeeping(SharedTakeUp):
    """A shared member's side of the group's state: the lane entries (read, compare-and-set, timeouts judged by
    observation), the group settings, and settling records (``ack``, ``nack``, ``reject``, ``renew``, dead
    letters). A base class of ``meteor_spark.consumer.shared_subscriber.SharedSubscriber``, which acquires and hands
    out; it holds no state of its own: the attributes it declares are the ``SharedSubscriber``'s."""

    stream: str
    group: str
    member_id: str
    scheme: InitialOffsetScheme
    acquisition_timeout_ms: int
    dead_letter_stream: str | None
    acked_records: int
    released_records: int
    rejected_records: int
    dead_lettered_records: int
    refused_records: int
    renewed_records: int
    delayed_records: int
    _keys: list[str]
    _lock: Any  # an RLock over the entries' texts and what this member holds
    _texts: dict[int, str]  # lane -> entry text last read or written
    _own_write: dict[int, bool]  # lane -> this member's last step on the entry was a write
    _observers: dict[int, ExpiryObserver]
    _items: dict[int, OrderedDict[int, ItemView | UndecodableItem]]
    _held: dict[int, dict[int, HeldSpan]]
    _incarnation: str
    _acquisitions: int
    _dead_letters: Any  # the dead-letter publisher, None without a dead-letter stream

    def _publish_letters(self, records: list[Record]) -> Any:  # pragma: no cover - the members'
        """Publish ``records`` to the dead-letter stream and return once the grid acknowledged them (or an
        awaitable doing so): the one call whose client differs between the threaded and the asyncio member."""
        raise NotImplementedError

    def _where(self, lane: int) -> str:
        return f"stream {self.stream!r} lane {lane} of shared group {self.group!r}"

    def _group_settings(
        self,
        acquisition_timeout_ms: int | None,
        max_deliveries: int | None,
        dead_letter_stream: str | None,
        dead_letter_after: int | None = None,
    ) -> Steps[GroupSettings]:
        """The group's stored settings; the first member stores its own (defaults for what it leaves out). A value
        this member gives that differs from the stored one is refused: a lock duration per member would let
        records of a dead member come back after whichever survivor's timeout."""
        if max_deliveries is not None and dead_letter_stream is None:
            raise ConfigError(
                f"max_deliveries={max_deliveries!r} needs a dead_letter_stream: the stream records delivered that "
                f"often go to (without one, records are delivered until they are acknowledged)"
            )
        check_dead_letter_after(dead_letter_after, dead_letter_stream)
        if dead_letter_stream == self.stream:
            raise ConfigError(
                f"dead_letter_stream={self.stream!r} is the stream being read: dead letters would be delivered "
                f"again; name another stream"
            )
        key = settings_key(self.stream, self.group)
        where = f"{key} in map {SHARE_MAP!r}"
        wanted = GroupSettings(
            DEFAULT_ACQUISITION_TIMEOUT_MS if acquisition_timeout_ms is None else acquisition_timeout_ms,
            max_deliveries if max_deliveries is not None else (DEFAULT_MAX_DELIVERIES if dead_letter_stream else None),
            dead_letter_stream,
            dead_letter_after,
        )
        text = yield lambda: self._map.get(key)
        if text is None:
            text = yield lambda: self._map.put_if_absent(key, wanted.encode())
            if text is None:
                logger.info("shared group %r of stream %r created with %s", self.group, self.stream, wanted)
                return wanted
        stored = GroupSettings.decode(text, where)
        given = {
            "acquisition_timeout_ms": acquisition_timeout_ms,
            "max_deliveries": max_deliveries,
            "dead_letter_stream": dead_letter_stream,
            "dead_letter_after": dead_letter_after,
        }
        clashes = [
            f"{name}={value!r} (the group has {getattr(stored, name)!r})"
            for name, value in given.items()
            if value is not None and value != getattr(stored, name)
        ]
        if clashes:
            raise ConfigError(
                f"shared group {self.group!r} of stream {self.stream!r} has other settings than this member asks "
                f"for: {'; '.join(clashes)}. They are group settings, stored by the group's first member: leave "
                f"them out to use the group's, or forget the group's state "
                f"(meteor_spark.groups.admin.forget_groups(grid, {self.stream!r}, {self.group!r})) to start it "
                "again with new ones"
            )
        return stored

    def _read(self, lane: int, *, own_write: bool = False) -> Steps[tuple[str, LaneShare]]:
        """The lane's entry: with ``own_write``, the text this member wrote last if its last step on the lane was a
        successful write (the compare-and-set then checks it is still current); else read from the grid. A lane not
        taken up since the grid last lost a connection is read from the grid and checked against the ring first
        (``SharedTakeUp._take_up``: truncated and refilled, or past the lane's end)."""
        key = self._keys[lane]
        taken_up = self._taken_up(lane)
        with self._lock:
            mine = self._texts.get(lane) if own_write and taken_up and self._own_write.get(lane) else None
        if mine is not None:
            return mine, LaneShare.decode(mine, f"{key} in map {SHARE_MAP!r}")
        text, share = yield from self._fetch(lane)
        return (text, share) if taken_up else (yield from self._take_up(lane, text, share))

    def _fetch(self, lane: int) -> Steps[tuple[str, LaneShare]]:
        """The lane's entry read from the grid (created at the initial offset scheme's offset when missing)."""
        key = self._keys[lane]
        text = yield lambda: self._map.get(key)
        if text is None:
            ring = self._rings[lane]
            nxt = (yield lambda: ring.tail()) + 1
            oldest = min((yield from oldest_steps(ring)), nxt)
            start = resolve_initial(self.scheme, True, None, lambda: oldest, nxt, where=self._where(lane))
            fresh = LaneShare.initial(start).encode()
            text = (yield lambda: self._map.put_if_absent(key, fresh)) or fresh
        with self._lock:
            self._texts[lane] = text
            self._own_write[lane] = False
        return text, LaneShare.decode(text, f"{key} in map {SHARE_MAP!r}")

    def _write(self, lane: int, key: str, text: str, share: LaneShare) -> Steps[bool]:
        new = share.encode()
        if new == text:
            return True
        if not (yield lambda: self._map.replace_if_same(key, text, new)):
            with self._lock:
                self._own_write[lane] = False
            return False
        with self._lock:
            self._texts[lane] = new
            self._own_write[lane] = True
        self._evict(lane, share.start)
        return True

    def _timed_out(self, lane: int, share: LaneShare) -> set[str]:
        """The acquisitions of ``lane`` this member has seen unchanged for ``acquisition_timeout_ms``."""
        tokens = share.tokens()
        observer = self._observers[lane]
        observer.forget_except(tokens)
        return {token for token in tokens if observer.expired(token, token, self.acquisition_timeout_ms)}

    def _evict(self, lane: int, start: int) -> None:
        """Forget cached items wholly below the lane's start offset (settled for good)."""
        cache = self._items[lane]
        below = sequence_of(start)
        with self._lock:
            for seq in [s for s in cache if s < below]:
                del cache[seq]

    def _archive(self, records: list[SharedRecord], reason: str) -> Steps[None]:
        """Publish ``records`` to the dead-letter stream (acknowledged by the grid), then mark them done."""
        assert self._dead_letters is not None
        letters: list[Record] = [
            dead_letter_for_delivery(r, group=self.group, deliveries=r.delivery_count, reason=reason) for r in records
        ]
        yield lambda: self._publish_letters(letters)
        self.dead_lettered_records += len(records)
        logger.warning(
            "stream %r group %r: %d record(s) dead-lettered to %r: %s (first: lane %d offset %d)",
            self.stream,
            self.group,
            len(records),
            self.dead_letter_stream,
            reason,
            records[0].lane,
            records[0].offset,
        )
        yield from self._settle(records, DONE, "archive")

    # ------------------------------------------------------------------------------------------------ settling

    def _ack(self, records: Record | Iterable[Record]) -> Steps[None]:
        """``ack``'s steps (the members' ``ack`` documents it)."""
        self.acked_records += yield from self._settle(records, DONE, "ack")

    def _nack(self, records: Record | Iterable[Record], delay_ms: int) -> Steps[None]:
        """``nack``'s steps: the delay checked before anything is written."""
        delay = check_delay(delay_ms)
        settled = yield from self._settle(records, AVAILABLE, "nack", not_before(delay))
        self.released_records += settled
        if delay:
            self.delayed_records += settled

    def _reject(self, records: Record | Iterable[Record]) -> Steps[None]:
        """``reject``'s steps: archived (dead letter first) with the delivery count each record was handed out with."""
        chosen = self._records(records, "reject")
        if self._dead_letters is None:
            raise ConfigError(
                f"reject needs a dead_letter_stream (the stream rejected records go to); create the shared "
                f"subscriber of stream {self.stream!r} with dead_letter_stream=..., or nack/ack the records"
            )
        self._check_held(chosen, "reject")
        with self._lock:
            letters = [
                r if isinstance(r, SharedRecord) else shared_record(r, self._held[r.lane][r.offset].deliveries)
                for r in chosen
            ]
        yield from self._archive(letters, "rejected by member " + self.member_id)
        self.rejected_records += len(chosen)

    def _renew(self, records: Record | Iterable[Record]) -> Steps[None]:
        """``renew``'s steps: one compare-and-set per lane moving the records to a fresh token of this member."""
        chosen = self._records(records, "renew")
        self._check_held(chosen, "renew")
        by_lane = self._spans_by_lane(chosen)
        refused: dict[int, list[tuple[int, int]]] = {}
        for lane, spans in sorted(by_lane.items()):
            self._acquisitions += 1
            token = f"{self.member_id}:{self._incarnation}:{self._acquisitions}"
            lost = yield from self._change_lane(
                lane, spans, lambda share, runs, old, new=token: share.renew(runs, old, new)
            )
            self._observers[lane].see(token, token)
            with self._lock:
                held_lane = self._held[lane]
                for offset, _, _ in spans:
                    held = held_lane[offset]
                    if any(f <= offset < e for f, e in lost):
                        held_lane.pop(offset, None)
                    else:
                        held_lane[offset] = HeldSpan(token, held.end, held.deliveries)
            if lost:
                refused[lane] = lost
        if refused:
            count = sum(
                1
                for lane, spans in by_lane.items()
                for offset, _, _ in spans
                if any(f <= offset < e for f, e in refused.get(lane, ()))
            )
            self.refused_records += count
            raise FencedError(
                f"renew refused for {count} record(s) of stream {self.stream!r} shared group {self.group!r} "
                f"(lane -> offset ranges {refused}): member {self.member_id!r} no longer holds them (their lock "
                f"ended after {self.acquisition_timeout_ms} ms and they were released or taken by another member); "
                f"they are delivered again"
            )
        self.renewed_records += len(chosen) - sum(
            1
            for lane, spans in by_lane.items()
            for offset, _, _ in spans
            if any(f <= offset < e for f, e in refused.get(lane, ()))
        )

    def hand_over(self, records: Iterable[Record]) -> list[tuple[int, int, int, int, str]]:
        """Hand records this member holds over to a holder that outlives it (a Spark batch logged in its
        checkpoint): where they lie in the group's state, ``(lane, offset, end, deliveries, token)`` each, for
        ``settle_spans`` later. This member forgets them: ``close`` does not release them (they stay acquired until
        settled or timed out)."""
        with self._lock:
            spans = [
                (r.lane, r.offset, h.end, h.deliveries, h.token)
                for r in records
                for h in [self._held[r.lane][r.offset]]
            ]
            for lane, offset, _, _, _ in spans:
                del self._held[lane][offset]
        return spans

    def _settle_spans(self, lane: int, spans: list[tuple[int, int, str]], state: str) -> Steps[list[tuple[int, int]]]:
        """Settle the records ``[first, end)`` acquired under ``token`` (``(first, end, token)`` each, from
        ``hand_over``, possibly by an earlier member) to ``DONE`` or ``AVAILABLE``, with one compare-and-set; this
        member forgets them. Returns the ranges refused: not held by that acquisition any more (settled already,
        or timed out and released or taken by another member)."""
        if state not in (DONE, AVAILABLE):
            raise ValueError(f"settle_spans takes DONE or AVAILABLE, got {state!r}")
        lost = yield from self._settle_lane(lane, spans, state)
        with self._lock:
            held = self._held[lane]
            for first, end, _ in spans:
                for offset in [o for o in held if first <= o < end]:
                    del held[offset]
        return lost

    def _records(self, records: Record | Iterable[Record], what: str) -> list[Record]:
        if isinstance(records, Record):
            return [records]
        try:
            chosen = list(records)
        except TypeError:
            raise ConfigError(f"{what} takes a record, a batch or an iterable of records, got {records!r}") from None
        for record in chosen:
            if not isinstance(record, Record):
                raise ConfigError(f"{what} takes records handed out by poll, got {record!r}")
        return chosen

    def _spans_by_lane(self, records: list[Record]) -> dict[int, list[tuple[int, int, str]]]:
        """The held spans of ``records`` per lane: (offset, end of its held range, the lock's token)."""
        by_lane: dict[int, list[tuple[int, int, str]]] = {}
        with self._lock:
            for record in records:
                held = self._held[record.lane][record.offset]
                by_lane.setdefault(record.lane, []).append((record.offset, held.end, held.token))
        return by_lane

    def _check_held(self, records: list[Record], what: str) -> None:
        with self._lock:
            missing = [r for r in records if r.stream != self.stream or r.offset not in self._held.get(r.lane, {})]
        if missing:
            first = missing[0]
            raise ConfigError(
                f"{what}: {len(missing)} record(s) are not held by member {self.member_id!r} of shared group "
                f"{self.group!r} (first: stream {first.stream!r} lane {first.lane} offset {first.offset}): never "
                f"handed out to it, or settled already; nothing was written"
            )

    def _settle(self, records: Record | Iterable[Record], state: str, what: str, later: int = 0) -> Steps[int]:
        """Move held records to ``state`` (one compare-and-set per lane; released ones not available before the
        wall-clock instant ``later`` when it is set); returns how many were settled."""
        chosen = self._records(records, what)
        self._check_held(chosen, what)
        by_lane = self._spans_by_lane(chosen)
        refused: dict[int, list[tuple[int, int]]] = {}
        settled = 0
        for lane, spans in sorted(by_lane.items()):
            lost = yield from self._settle_lane(lane, spans, state, later)
            with self._lock:
                for offset, _, _ in spans:
                    self._held[lane].pop(offset, None)
            settled += len(spans)
            if lost:
                refused[lane] = lost
                settled -= sum(1 for offset, _, _ in spans if any(f <= offset < e for f, e in lost))
        if refused:
            count = len(chosen) - settled
            self.refused_records += count
            raise FencedError(
                f"{what} refused for {count} record(s) of stream {self.stream!r} shared group {self.group!r} "
                f"(lane -> offset ranges {refused}): member {self.member_id!r} no longer holds them (their "
                f"acquisition timed out after {self.acquisition_timeout_ms} ms and they were released or taken by "
                f"another member); nothing was written for them, and they are delivered again"
            )
        return settled

    def _settle_lane(
        self, lane: int, spans: list[tuple[int, int, str]], state: str, later: int = 0
    ) -> Steps[list[tuple[int, int]]]:
        """One compare-and-set on ``lane``'s entry; returns the ranges refused (no longer held)."""
        return (
            yield from self._change_lane(
                lane, spans, lambda share, runs, token: share.settle(runs, token, state, later)
            )
        )

    def _change_lane(self, lane: int, spans: list[tuple[int, int, str]], step: Any) -> Steps[list[tuple[int, int]]]:
        """Apply ``step(share, runs, token) -> (share, refused)`` to the records ``spans`` (``(first, end,
        token)``) of ``lane`` with one compare-and-set; returns the ranges refused (no longer held)."""
        by_token: dict[str, list[tuple[int, int]]] = {}
        for first, end, token in sorted(spans):
            runs = by_token.setdefault(token, [])
            if runs and runs[-1][1] == first:
                runs[-1] = (runs[-1][0], end)
            else:
                runs.append((first, end))
        key = self._keys[lane]
        with self._lock:
            text = self._texts.get(lane)
        for _ in range(MAX_CAS_ATTEMPTS):
            if text is None:
                text, share = yield from self._read(lane)
            else:
                share = LaneShare.decode(text, f"{key} in map {SHARE_MAP!r}")
            refused: list[tuple[int, int]] = []
            for token, runs in by_token.items():
                share, lost = step(share, runs, token)
                for first, end in lost:  # a run partly lost: settle record by record what is still held
                    singles = [(f, e) for f, e, t in spans if t == token and first <= f < end]
                    share, lost_singles = step(share, singles, token)
                    refused.extend(lost_singles)
            if (yield from self._write(lane, key, text, share)):
                return refused
            text = None
        raise GroupError(
            f"settling records of {self._where(lane)} lost the compare-and-set {MAX_CAS_ATTEMPTS} times in a row to "
            f"other members; try again"
        )
