"""Message-id deduplication windows: a stream with ``dedup_window_ms`` > 0 refuses a record whose ``message_id``
was already used on it within that window (``DuplicateMessageError``), whichever publisher or process sent it.

The claims live in the grid, in the map ``meteor.dedup::<stream>`` keyed by message id, every entry put with a
per-entry TTL of the window (Hazelcast's ``put(key, value, ttl)``): the map holds at most the ids used in one
window, and an id is accepted again once its entry expired. Records without a message id never come here.

Claim, write, confirm, so a publisher that dies between claiming and writing loses nothing:

1. ``putIfAbsent(id, pending)`` with TTL = the window. ``pending`` names the lane the record goes to, a ring
   sequence at or below where it will land there (``from``: the publisher's lower bound for its next write in that
   lane), the producer id, the claim time and the claim's lease (``lease``, ms).
2. The publisher writes the record.
3. Once it is stored, ``replace(id, pending, written)`` (the same entry, state written, with the offset), then
   ``setTtl`` to what is left of the window: Hazelcast (and the embedded member alike) drops an entry's TTL when
   ``replace`` updates it. Should the publisher die between the two, the entry would stay; so every reader treats
   an entry whose claim time ``at`` lies a window back as gone (removes it by compare-and-set and claims afresh):
   the window holds, and such an entry lives only until its id is used again.

Another publish of the same id finds the entry:

- ``written``: ``DuplicateMessageError`` naming the first copy's offset;
- ``pending``: the claimer may have stored the record and died or exited before marking it. The lane is searched
  from ``from`` to its tail for a record carrying the id (a bounded scan: the claim names where to start). Found:
  the claim is completed with that offset and the copy refused, at once. Not found and the lease still running:
  the claimer may be writing; it polls (every ``POLL_S``, searching again) until the entry turns ``written``,
  disappears or its lease passes, up to the publisher's ``max_block_ms`` (``PublishTimeoutError`` then, nothing
  queued). Not found and the lease over: the claimer died or stalled before writing: the claim is taken over by
  compare-and-set (``replace(id, old, new)``) and the record written, so a retry after a crash succeeds exactly
  once. ``Publisher.close`` waits for its claims to be marked written, so a process that exits cleanly leaves
  none pending.

The lease is the claimer's ``delivery_timeout_ms`` + ``max_block_ms`` + ``linger_ms`` (``claim_lease_ms``): the
longest a live publisher takes from claim to a stored or failed write, short of a grid stalled beyond its own
delivery timeout. A claimer whose write settles after its claim was taken over knows a duplicate may exist: it logs
an error and counts it (``Publisher.metrics()["dedup_lease_lost"]``). A write that failed for sure (refused)
releases its claim (``remove(id, pending)``); a write whose outcome is unknown leaves it to the lease and the scan.
Claim times are wall-clock milliseconds: publishers on hosts whose clocks differ by more than a lease see leases
end early or late.

Claims of transactional publishers (the Spark sink) name their transaction, and may name an owner
(``<transaction>#<partition>``). Another publisher takes such a claim over at once when the transaction aborted,
is no longer recorded, or committed without the claimer's producer (its records never count for
``read_committed`` readers), and waits while the transaction is open (aborting it once past its deadline, as
readers do). A claim with this publisher's own owner is an earlier attempt of the same task: taken over.

A keyless record with a message id and no explicit lane goes to the lane its id hashes to (``lane_for_key``), so a
retry lands where the first copy did. Several ids (``publish_many``, ``publish_arrow``) are claimed with one
``putIfAbsent`` each, all in flight at once; only the conflicts are resolved one at a time.

The rules are written once, for the threaded and the asyncio publisher alike (``DedupRules``): claiming and
resolving a conflict are generators that yield the grid steps they need (``meteor_spark.producer.dedup_steps``) and
get each one's result back (or its error thrown in). ``DedupWindow`` carries the steps out with synchronous calls
(``drive``); ``meteor_spark.aio.claims`` awaits them.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from meteor_spark.errors import (
    DuplicateMessageError,
    FormatError,
    GridError,
    GridOperationError,
    MeteorError,
    PublishTimeoutError,
)
from meteor_spark.format.records import decode_batch
from meteor_spark.grid import transactions
from meteor_spark.grid.client import Grid, GridMap, Ring, result
from meteor_spark.grid.steps import Steps, drive
from meteor_spark.producer.dedup_steps import (
    ClaimAllStep,
    MapStep,
    PauseStep,
    ReleaseStep,
    RingStep,
    TxnStep,
)
from meteor_spark.producer.idempotence import STALE_SEQUENCE, outcome_unknown

logger = logging.getLogger("meteor_spark.producer.publisher")

DEDUP_MAP_PREFIX = "meteor.dedup::"
#: How often a publish waiting for a young pending claim looks at it again.
POLL_S = 0.05
#: Ring items read at a time while searching a lane for a lapsed claim's record.
SCAN_CHUNK = 100

PENDING = "pending"
WRITTEN = "written"
TAKE = "take"
WAIT = "wait"
CHECK = "check"


def dedup_map_name(stream: str) -> str:
    """The map holding a stream's message-id claims."""
    return DEDUP_MAP_PREFIX + stream


def claim_lease_ms(delivery_timeout_ms: float, max_block_ms: float, linger_ms: float) -> int:
    """How long another publisher trusts a pending claim before it searches the lane and may take it over."""
    return int(delivery_timeout_ms + max_block_ms + linger_ms)


def _text(entry: dict[str, Any]) -> str:
    """Canonical JSON: the grid's compare-and-set compares bytes."""
    return json.dumps(entry, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class Claim:
    """A claim this publisher holds: the id, its lane and the exact pending text (the compare-and-set's old value)."""

    message_id: str
    lane: int
    text: str
    at_ms: int


class DedupRules:
    """One publisher's side of a stream's deduplication window, without the grid calls (module docstring): what it
    claims, how a conflict resolves, what settling writes. Arguments as ``DedupWindow``'s."""

    def __init__(
        self,
        stream: str,
        window_ms: int,
        *,
        producer_id: int,
        lease_ms: int,
        wait_ms: float,
        lane_floor: Callable[[int], int],
        transactional: bool = False,
        owner: str | None = None,
    ) -> None:
        self._transactional = transactional
        self._txn: str | None = None
        self.owner = owner
        self.stream = stream
        self.map_name = dedup_map_name(stream)
        self.window_ms = window_ms
        self.window_s = window_ms / 1000.0
        self.producer_id = producer_id
        self.lease_ms = lease_ms
        self.wait_s = wait_ms / 1000.0
        self._lane_floor = lane_floor
        self.refused = 0  # copies refused as duplicates
        self.taken_over = 0  # lapsed claims of other publishers taken over after a scan found nothing
        self.lease_lost = 0  # own claims taken over before the write settled (a duplicate may exist)

    # ------------------------------------------------------------------------------------------------ claiming

    def _pending(self, lane: int, at_ms: int) -> str:
        entry: dict[str, Any] = {
            "at": at_ms,
            "by": self.producer_id,
            "from": self._lane_floor(lane),
            "lane": lane,
            "lease": self.lease_ms,
            "state": PENDING,
        }
        if self._transactional:
            assert self._txn is not None, "a transactional publisher's transaction is read before it claims"
            entry["txn"] = self._txn
        if self.owner is not None:
            entry["owner"] = self.owner
        return _text(entry)

    def claim_steps(
        self, wanted: Sequence[tuple[str, int]], *, skip_duplicates: bool = False
    ) -> Steps[list[Claim | None]]:
        """Claim every ``(message id, lane)`` (ids distinct), all ``putIfAbsent`` calls in flight at once; the
        claims in the order of ``wanted``.

        All or nothing: on the first duplicate (or any error) the claims taken by this call are released and the
        error raised. ``skip_duplicates``: a duplicate is None in the list instead (counted in ``refused``).

        Raises:
            DuplicateMessageError: an id was used within the window. PublishTimeoutError: another publisher's
            claim stayed pending (lease running) for longer than this publisher waits. GridError.
        """
        now = _now_ms()
        texts = [self._pending(lane, now) for _, lane in wanted]
        pairs = tuple((mid, text) for (mid, _), text in zip(wanted, texts, strict=True))
        results = yield ClaimAllStep(pairs, self.window_s)
        claims: list[Claim | None] = [None] * len(wanted)
        conflicts: list[tuple[int, str]] = []
        error: BaseException | None = None
        for position, found in enumerate(results):
            mid, lane = wanted[position]
            if isinstance(found, BaseException):
                error = error or found
            elif found is None:
                claims[position] = Claim(mid, lane, texts[position], now)
            else:
                conflicts.append((position, found))
        try:
            if error is not None:
                raise error
            for position, found in conflicts:
                mid, lane = wanted[position]
                try:
                    claims[position] = yield from self._resolve(mid, lane, found)
                except DuplicateMessageError:
                    if not skip_duplicates:
                        raise
        except BaseException:
            yield ReleaseStep(tuple(claim for claim in claims if claim is not None))
            raise
        return claims

    def _resolve(self, message_id: str, lane: int, found: str | None) -> Steps[Claim]:
        """Claim an id whose entry exists (``found``): wait for a young pending claim, search the lane behind a
        lapsed one, refuse a written one."""
        deadline = time.monotonic() + self.wait_s
        searched: tuple[str, int] | None = None  # a pending entry's text and where its lane's next search starts
        while True:
            if found is None:
                now = _now_ms()
                text = self._pending(lane, now)
                found = yield MapStep("put_if_absent", (message_id, text, self.window_s))
                if found is None:
                    return Claim(message_id, lane, text, now)
                continue
            entry = self._parsed(message_id, found)
            if _now_ms() - entry["at"] >= self.window_ms:
                # outlived its window (its TTL was lost: module docstring): gone
                yield MapStep("remove_if_same", (message_id, found))
                found = yield MapStep("get", (message_id,))
                continue
            verdict = yield from self._verdict(entry)
            if verdict == TAKE:
                claim = yield from self._take_over(message_id, lane, found, entry, "its writer's attempt failed")
                if claim is not None:
                    return claim
                found = yield MapStep("get", (message_id,))
                continue
            if verdict == WAIT:
                if time.monotonic() >= deadline:
                    raise PublishTimeoutError(
                        f"message id {message_id!r} on stream {self.stream!r} is claimed by transaction "
                        f"{entry.get('txn')!r}, still open after {self.wait_s:g} s; nothing was queued: retry later"
                    )
                yield PauseStep(POLL_S)
                found = yield MapStep("get", (message_id,))
                continue
            if entry.get("state") == WRITTEN:
                self.refused += 1
                raise DuplicateMessageError(message_id, self.stream, entry.get("offset"))
            start = searched[1] if searched is not None and searched[0] == found else entry["from"]
            searched = (found, (yield from self._refuse_if_stored(message_id, found, entry, start)))
            age_ms = _now_ms() - entry["at"]
            if age_ms >= entry["lease"]:
                claim = yield from self._after_lapse(message_id, lane, found, entry)
                if claim is not None:
                    return claim
            elif time.monotonic() >= deadline:
                raise PublishTimeoutError(
                    f"message id {message_id!r} on stream {self.stream!r} is claimed by producer {entry['by']:x} "
                    f"whose write has not settled after {self.wait_s:g} s (its lease ends in "
                    f"{(entry['lease'] - age_ms) / 1000:.1f} s); nothing was queued: retry later"
                )
            else:
                yield PauseStep(POLL_S)
            found = yield MapStep("get", (message_id,))

    def _refuse_if_stored(self, message_id: str, found: str, entry: dict[str, Any], start: int) -> Steps[int]:
        """A pending claim's record may be stored already (its publisher died or exited before marking it
        written): its lane is searched from ``start`` (the claim's ``from``, or where the previous poll's search
        ended), and a record found there completes the claim and refuses this copy at once, whatever the claim's
        lease. Returns where the next search of the same claim starts."""
        offset, searched_to = yield from find_message_steps(entry["lane"], start, message_id, self.stream)
        if offset is None:
            return searched_to
        done = _text({**entry, "offset": offset, "state": WRITTEN})
        if (yield MapStep("replace_if_same", (message_id, found, done))):
            yield MapStep("set_ttl", (message_id, self.left_s(entry["at"])))
        self.refused += 1
        raise DuplicateMessageError(
            message_id, self.stream, offset, detail=" (found in its lane; the first publisher had not marked it)"
        )

    def _after_lapse(self, message_id: str, lane: int, found: str, entry: dict[str, Any]) -> Steps[Claim | None]:
        """A pending claim whose lease is over and whose record is not in its lane (``_refuse_if_stored`` looked):
        taken over. Returns the claim, or None when the entry changed meanwhile (look again)."""
        return (
            yield from self._take_over(
                message_id, lane, found, entry, f"never written: its lease of {entry['lease']} ms is over"
            )
        )

    def _take_over(
        self, message_id: str, lane: int, found: str, entry: dict[str, Any], why: str
    ) -> Steps[Claim | None]:
        """Replace another publisher's claim ``found`` by one of this publisher's (compare-and-set); None when the
        entry changed meanwhile."""
        now = _now_ms()
        text = self._pending(lane, now)
        if not (yield MapStep("replace_if_same", (message_id, found, text))):
            return None
        yield MapStep("set_ttl", (message_id, self.window_s))
        self.taken_over += 1
        logger.warning(
            "stream %r: message id %r was claimed by producer %x at %d ms and %s; this publisher takes the claim over",
            self.stream,
            message_id,
            entry["by"],
            entry["at"],
            why,
        )
        return Claim(message_id, lane, text, now)

    def _verdict(self, entry: dict[str, Any]) -> Steps[str]:
        """What a claim of another publisher means here: ``TAKE`` (an earlier attempt of this publisher's own work,
        or a transaction whose records never count), ``WAIT`` (its transaction is still open) or ``CHECK`` (by
        its state: written, pending)."""
        if entry["by"] == self.producer_id:
            return CHECK
        if self.owner is not None and entry.get("owner") == self.owner:
            return TAKE
        txn = entry.get("txn")
        if txn is None or txn == self._txn:
            return CHECK
        state = (yield TxnStep(txn)) if txn else None
        if state is None or (state.decided and not state.delivers(entry["by"])):
            return TAKE
        return CHECK if state.decided else WAIT

    def _parsed(self, message_id: str, found: str) -> dict[str, Any]:
        """A claim entry as stored, or a ``MeteorError`` naming map and key when another program wrote it."""
        try:
            entry = json.loads(found)
            if isinstance(entry, dict) and all(k in entry for k in ("at", "by", "state")):
                return entry
        except ValueError:
            pass
        raise MeteorError(
            f"message id {message_id!r} has an unreadable claim in map {self.map_name!r}: {found[:200]!r}; was it "
            f"written by another program? Remove the entry (or the map) to free the id"
        )

    def left_s(self, at_ms: int) -> float:
        """What is left of the window of a claim made at ``at_ms`` (at least a millisecond), in seconds."""
        return max(1, self.window_ms - (_now_ms() - at_ms)) / 1000.0

    # ------------------------------------------------------------------------------------------------ settling

    @staticmethod
    def releases(error: BaseException) -> bool:
        """Whether a claimed record's failed write frees its claim: only when it certainly stored nothing (a
        timeout or a lost answer may have stored it: the lease and the lane search decide then)."""
        return not isinstance(error, PublishTimeoutError) and not outcome_unknown(error)

    @staticmethod
    def written_text(claim: Claim, offset: int | None) -> str:
        """The entry of a claim whose record is stored at ``offset``."""
        return _text({**json.loads(claim.text), "offset": offset, "state": WRITTEN})

    def lost_lease(self, claim: Claim) -> None:
        """Marking ``claim`` written found another claim in its place: count it and say a duplicate may exist."""
        self.lease_lost += 1
        logger.error(
            "stream %r: the claim of message id %r lapsed before its record was stored; another publisher may "
            "have stored a second copy (the write took longer than the claim lease of %d ms)",
            self.stream,
            claim.message_id,
            self.lease_ms,
        )


class DedupWindow(DedupRules):
    """One publisher's side of a stream's deduplication window (module docstring), with synchronous grid calls.

    Args:
        grid: the grid connection.
        stream: the stream's name.
        window_ms: the stream's ``dedup_window_ms`` (> 0): each claim's TTL.
        producer_id: the publisher's id, named in its claims.
        lease_ms: this publisher's claim lease (``claim_lease_ms``).
        wait_ms: how long a publish waits for another publisher's young claim to resolve.
        lane_floor: ``lane_floor(lane)``: a ring sequence at or below where the publisher's next write in ``lane``
            lands (the publisher's narrow view of its sender).
        rings: the stream's lanes, searched when a lapsed claim is found.
        transactional: the publisher's records count only once its transaction commits: its claims name that
            transaction (read from ``meteor.txn.producers`` at the first claim), and a claim of a transaction
            that aborted (or left its producer out) is taken over.
        owner: who the claims are made for beyond this publisher (the Spark sink: ``<transaction>#<partition>``):
            a claim of an earlier publisher with the same owner is an earlier attempt of the same work (a retried
            Spark task) and is taken over.
    """

    def __init__(
        self,
        grid: Grid,
        stream: str,
        window_ms: int,
        *,
        producer_id: int,
        lease_ms: int,
        wait_ms: float,
        lane_floor: Callable[[int], int],
        rings: Sequence[Ring],
        transactional: bool = False,
        owner: str | None = None,
    ) -> None:
        super().__init__(
            stream,
            window_ms,
            producer_id=producer_id,
            lease_ms=lease_ms,
            wait_ms=wait_ms,
            lane_floor=lane_floor,
            transactional=transactional,
            owner=owner,
        )
        self._grid = grid
        self.rings = rings
        self._map: GridMap = grid.map(self.map_name)
        self._settling = 0  # claims being marked written (replace, then setTtl) right now
        self._settled = threading.Condition()

    def claim(self, message_id: str, lane: int) -> Claim:
        """Claim one id for a record going to ``lane`` (``claim_steps``' errors)."""
        claim = self.claim_many([(message_id, lane)])[0]
        assert claim is not None
        return claim

    def claim_many(self, wanted: Sequence[tuple[str, int]], *, skip_duplicates: bool = False) -> list[Claim | None]:
        """``claim_steps``, carried out with synchronous grid calls."""
        if self._transactional and self._txn is None:
            self._txn = transactions.transaction_of_producer(self._grid, self.producer_id) or ""
        return drive(self.claim_steps(wanted, skip_duplicates=skip_duplicates), self._do)

    def _do(self, step: Any) -> Any:
        """One grid step of the rules, synchronously."""
        if isinstance(step, MapStep):
            return getattr(self._map, step.method)(*step.args)
        if isinstance(step, RingStep):
            return getattr(self.rings[step.lane], step.method)(*step.args)
        if isinstance(step, ClaimAllStep):
            futures = [self._map.put_if_absent_async(mid, text, step.ttl_s) for mid, text in step.pairs]
            out: list[Any] = []
            for (mid, _), future in zip(step.pairs, futures, strict=True):
                try:
                    out.append(result(future, f"claim message id {mid!r} on map {self._map.name!r}"))
                except GridError as exc:
                    out.append(exc)
            return out
        if isinstance(step, ReleaseStep):
            self.release_all(step.claims)
            return None
        if isinstance(step, PauseStep):
            time.sleep(step.seconds)
            return None
        if isinstance(step, TxnStep):
            state = transactions.state_of(self._grid, step.txn)
            if state is not None and not state.decided:
                state = transactions.abort_expired(self._grid, step.txn)
            return state
        raise AssertionError(f"unknown deduplication step {step!r}")

    # ------------------------------------------------------------------------------------------------ settling

    def settled(self, claim: Claim, offset: int | None, error: BaseException | None) -> None:
        """The write of a claimed record settled (the completion thread): mark the claim written, or release it
        when the write certainly stored nothing. Never blocks on the grid."""
        if error is not None:
            if self.releases(error):
                self._map.remove_if_same_async(claim.message_id, claim.text)
            return
        done = self.written_text(claim, offset)
        with self._settled:
            self._settling += 1
        future = self._map.replace_if_same_async(claim.message_id, claim.text, done)
        future.add_done_callback(lambda f: self._confirmed(claim, f))

    def _confirmed(self, claim: Claim, future: Any) -> None:
        try:
            replaced = future.result()
            if replaced:
                ttl = self._map.set_ttl_async(claim.message_id, self.left_s(claim.at_ms))
                ttl.add_done_callback(lambda _: self._settle_one())
            else:
                self._settle_one()
        except Exception as exc:
            self._settle_one()
            logger.warning("stream %r: marking message id %r written failed: %s", self.stream, claim.message_id, exc)
            return
        if not replaced:
            self.lost_lease(claim)

    def _settle_one(self) -> None:
        with self._settled:
            self._settling -= 1
            self._settled.notify_all()

    def drain(self, timeout_s: float | None) -> bool:
        """Wait until the claims of the records stored so far are marked written (``Publisher.close``: a process
        that exits right after its last publish leaves no claim pending for others to wait on); False when
        ``timeout_s`` passed first."""
        with self._settled:
            return self._settled.wait_for(lambda: self._settling == 0, timeout_s)

    def release_all(self, claims: Sequence[Claim]) -> None:
        """Give claims back (their records were not queued)."""
        for claim in claims:
            self._map.remove_if_same_async(claim.message_id, claim.text)


def _now_ms() -> int:
    return int(time.time() * 1000)


def find_message_steps(lane: int, start: int, message_id: str, stream: str) -> Steps[tuple[int | None, int]]:
    """The offset of the first record carrying ``message_id`` in ``lane`` from sequence ``start`` to its tail (or
    None), and the sequence after the last item searched. Items overwritten before they were read are passed over
    (the claim is then older than the ring holds); undecodable items carry no id this search can see."""
    tail = yield RingStep(lane, "tail")
    seq = max(start, (yield RingStep(lane, "head")))
    while seq <= tail:
        try:
            batch = yield RingStep(lane, "read_many", (seq, 0, min(SCAN_CHUNK, tail - seq + 1)))
        except GridOperationError as exc:
            if exc.code != STALE_SEQUENCE:
                raise
            seq = max(seq + 1, (yield RingStep(lane, "head")))  # overwritten while searched: on from the new head
            continue
        if not batch.items:
            break
        for item, sequence in zip(batch.items, batch.sequences, strict=True):
            try:
                records = decode_batch(item, stream=stream, lane=lane, sequence=sequence)
            except FormatError:
                continue
            for record in records:
                if record.message_id == message_id:
                    return record.offset, sequence
        seq = batch.next_sequence
    return None, seq


def find_message(ring: Ring, start: int, message_id: str, stream: str, lane: int) -> tuple[int | None, int]:
    """``find_message_steps`` on ``ring`` (lane ``lane``), with synchronous reads."""
    return drive(
        find_message_steps(lane, start, message_id, stream), lambda step: getattr(ring, step.method)(*step.args)
    )
