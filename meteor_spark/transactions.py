"""Transactions: records of several producers that readers see all or nothing of (Kafka's KIP-98, in grid maps).

A transaction is one execution of one unit of work (a Spark micro-batch by one query run, or one ``df.write``
job). Every task attempt of it publishes through its own producer (its ``Publisher``'s producer id) with the
items flagged transactional (``wire`` flag 0x10). State, all in grid maps, every change by compare-and-set:

* ``meteor.txns``: transaction key -> JSON ``{"state": "open"|"committed"|"aborted", "deadline_ms": ...,
  "producers": [committed producer ids], "reason": ...}``. ``open`` is the only state that changes; a decision
  (committed or aborted) is final, so readers cache it for good.
* ``meteor.txn.producers``: producer id (decimal) -> transaction key. Written before the producer publishes, so a
  reader finds the transaction of any transactional item from its header alone.
* ``meteor.txn.batches``: ``<sink>/<query id>/<batch id>`` -> the transaction key of the run that owns the batch
  (zombie fencing: a new run of the query takes the batch over and aborts the old run's open transaction at once,
  instead of readers waiting for its timeout).
* ``meteor.txn.open``: ``<transaction key>\t<stream>`` -> stream, for every transaction that may still be open
  with records in that stream: written before the producer's first record, removed once the transaction is
  decided. A reader that read a lane's end *before* finding no entry for its stream knows every transactional item
  below that end is decided, without reading them (``open_in``).

Decisions: ``commit`` moves open -> committed with the list of producer ids whose records count (the successful
task attempts); every other producer registered under the transaction (failed or superseded attempts) is aborted
by that same write. ``abort`` moves open -> aborted. A reader that finds a transaction open past its deadline
aborts it (``abort_expired``); whichever CAS lands first, commit or abort, is the decision. Deadlines are wall
clock (ms since the epoch) of the writer's host, compared with the reader's clock: keep clocks in sync (NTP), and
the timeout well above their skew.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

from meteor_spark.errors import MeteorError, TransactionAbortedError
from meteor_spark.grid import Grid

logger = logging.getLogger(__name__)

TXNS_MAP = "meteor.txns"
PRODUCERS_MAP = "meteor.txn.producers"
BATCHES_MAP = "meteor.txn.batches"
OPEN_MAP = "meteor.txn.open"

OPEN = "open"
COMMITTED = "committed"
ABORTED = "aborted"

#: Kafka's transaction.timeout.ms default.
DEFAULT_TIMEOUT_MS = 60_000

_CAS_ATTEMPTS = 100


@dataclass(frozen=True)
class TxnState:
    """One transaction record as stored.

    Attributes:
        key: the transaction key.
        state: ``open``, ``committed`` or ``aborted``.
        deadline_ms: wall-clock ms after which readers abort the transaction if still open.
        producers: committed: the producer ids whose records count; empty otherwise.
        reason: why it was aborted (empty otherwise).
    """

    key: str
    state: str
    deadline_ms: int
    producers: frozenset[int] = frozenset()
    reason: str = ""

    @property
    def decided(self) -> bool:
        return self.state != OPEN

    def delivers(self, producer_id: int) -> bool:
        """Whether a ``read_committed`` reader delivers the records of ``producer_id`` (decided transactions)."""
        return self.state == COMMITTED and producer_id in self.producers

    def to_json(self) -> str:
        return json.dumps(
            {"state": self.state, "deadline_ms": self.deadline_ms, "producers": sorted(self.producers),
             "reason": self.reason},
            sort_keys=True, separators=(",", ":"),
        )

    @classmethod
    def parse(cls, key: str, text: str) -> TxnState:
        try:
            data = json.loads(text)
            return cls(key, str(data["state"]), int(data["deadline_ms"]),
                       frozenset(int(p) for p in data.get("producers", ())), str(data.get("reason", "")))
        except (ValueError, KeyError, TypeError) as exc:
            raise MeteorError(f"transaction {key!r} in map {TXNS_MAP!r} has an unreadable value {text!r} ({exc}); "
                              f"was it written by another program?") from None


def _now_ms() -> int:
    return int(time.time() * 1000)


def state_of(grid: Grid, key: str) -> TxnState | None:
    """The stored transaction ``key``; None when it does not exist."""
    text = grid.map(TXNS_MAP).get(key)
    return None if text is None else TxnState.parse(key, text)


def transaction_of_producer(grid: Grid, producer_id: int) -> str | None:
    """The key of the transaction ``producer_id`` was registered under; None for an unregistered producer."""
    return grid.map(PRODUCERS_MAP).get(str(producer_id))


def begin(grid: Grid, key: str, producer_id: int, timeout_ms: int, *, stream: str,
          batch_key: str | None = None) -> None:
    """Register ``producer_id`` under transaction ``key`` before it publishes to ``stream``: the transaction is
    noted open in ``stream`` (``meteor.txn.open``), created open (or its deadline moved to now + ``timeout_ms``),
    then the producer is registered.

    ``batch_key`` (streaming sinks): take the batch over for this transaction first: another run's open
    transaction of the same batch is aborted (fenced) at once.

    Raises:
        TransactionAbortedError: the transaction was already decided (aborted: timed out or fenced; committed: a
            task attempt that starts after the commit), or another run already committed the batch
            (``BatchCommittedError``).
    """
    if batch_key is not None:
        take_batch(grid, batch_key, key)
    grid.map(OPEN_MAP).put(f"{key}\t{stream}", stream)
    txns = grid.map(TXNS_MAP)
    for _ in range(_CAS_ATTEMPTS):
        deadline = _now_ms() + timeout_ms
        current = txns.get(key)
        if current is None:
            if txns.put_if_absent(key, TxnState(key, OPEN, deadline).to_json()) is None:
                break
            continue
        state = TxnState.parse(key, current)
        if state.decided:
            raise TransactionAbortedError(
                f"transaction {key!r} is already {state.state}{_because(state)}; a task attempt cannot join it. "
                f"Spark retries the batch under a new transaction once this one fails"
            )
        if state.deadline_ms >= deadline or txns.replace_if_same(
            key, current, TxnState(key, OPEN, deadline).to_json()
        ):
            break
    else:
        raise MeteorError(f"could not register a producer under transaction {key!r}: too many concurrent updates")
    grid.map(PRODUCERS_MAP).put(str(producer_id), key)


class BatchCommittedError(TransactionAbortedError):
    """Another run of the query already committed this batch: the caller publishes nothing (a replay)."""


def take_batch(grid: Grid, batch_key: str, key: str) -> None:
    """Make transaction ``key`` the owner of ``batch_key``; another run's open transaction of it is aborted.

    Raises:
        BatchCommittedError: another run already committed the batch (publish nothing: a replay).
    """
    batches = grid.map(BATCHES_MAP)
    for _ in range(_CAS_ATTEMPTS):
        owner = batches.get(batch_key)
        if owner == key:
            return
        if owner is None:
            if batches.put_if_absent(batch_key, key) is None:
                return
            continue
        previous = abort(grid, owner, f"fenced: batch {batch_key!r} was taken over by transaction {key!r}")
        if previous is not None and previous.state == COMMITTED:
            raise BatchCommittedError(f"batch {batch_key!r} was already committed by transaction {owner!r}")
        if batches.replace_if_same(batch_key, owner, key):
            return
    raise MeteorError(f"could not take batch {batch_key!r} over: too many concurrent runs of that query")


def commit(grid: Grid, key: str, producers: Iterable[int]) -> TxnState:
    """Decide ``key`` committed with the records of ``producers`` (one CAS: open -> committed); producers
    registered under the transaction but not listed are aborted by the same write. Committing again with the
    same producers is a no-op (a retried commit).

    Raises:
        TransactionAbortedError: the transaction was aborted first (timeout, fencing), or committed with other
            producers; nothing of it is delivered to ``read_committed`` readers.
        MeteorError: no such transaction.
    """
    wanted = frozenset(producers)
    txns = grid.map(TXNS_MAP)
    for _ in range(_CAS_ATTEMPTS):
        current = txns.get(key)
        if current is None:
            raise MeteorError(f"cannot commit transaction {key!r}: it does not exist in map {TXNS_MAP!r}")
        state = TxnState.parse(key, current)
        if state.state == COMMITTED and state.producers == wanted:
            return state
        if state.decided:
            raise TransactionAbortedError(
                f"cannot commit transaction {key!r}: it was {state.state} first{_because(state)}; its records are "
                f"not delivered to read_committed readers. The batch fails; a restart replays it under a new "
                f"transaction (raise transactionTimeoutMs if batches take longer than it)"
            )
        decided = TxnState(key, COMMITTED, state.deadline_ms, wanted)
        if txns.replace_if_same(key, current, decided.to_json()):
            _forget_open(grid, key)
            return decided
    raise MeteorError(f"could not commit transaction {key!r}: too many concurrent updates")


def abort(grid: Grid, key: str, reason: str, *, only_expired_at_ms: int | None = None) -> TxnState | None:
    """Decide ``key`` aborted unless it is decided already; returns the final state (None: no such transaction).

    ``only_expired_at_ms``: abort only if the deadline lies before this time (a reader's timeout abort).
    """
    txns = grid.map(TXNS_MAP)
    for _ in range(_CAS_ATTEMPTS):
        current = txns.get(key)
        if current is None:
            return None
        state = TxnState.parse(key, current)
        if state.decided or (only_expired_at_ms is not None and state.deadline_ms >= only_expired_at_ms):
            return state
        decided = TxnState(key, ABORTED, state.deadline_ms, reason=reason)
        if txns.replace_if_same(key, current, decided.to_json()):
            logger.info("transaction %r aborted: %s", key, reason)
            _forget_open(grid, key)
            return decided
    raise MeteorError(f"could not abort transaction {key!r}: too many concurrent updates")


def abort_expired(grid: Grid, key: str, now_ms: int | None = None) -> TxnState | None:
    """A reader's timeout: abort ``key`` if it is still open past its deadline; returns the final state."""
    now = _now_ms() if now_ms is None else now_ms
    return abort(grid, key, f"timed out (open past its deadline, seen at {now} ms)", only_expired_at_ms=now)


def open_in(grid: Grid, stream: str) -> bool:
    """Whether a transaction may still be open with records in ``stream`` (one ``keys()`` of ``meteor.txn.open``;
    entries of transactions found decided, left behind by a decider that died, are removed here). False means every
    transactional item stored in ``stream`` before the call is decided."""
    entries = grid.map(OPEN_MAP)
    found = False
    for entry in entries.keys():  # noqa: SIM118 - GridMap.keys() is the grid call
        key, _, entry_stream = entry.rpartition("\t")
        if entry_stream != stream:
            continue
        state = state_of(grid, key)
        if state is not None and state.decided:
            entries.remove(entry)
            continue
        found = True
    return found


def _forget_open(grid: Grid, key: str) -> None:
    """Remove the ``meteor.txn.open`` entries of a decided transaction."""
    entries = grid.map(OPEN_MAP)
    for entry in entries.keys():  # noqa: SIM118 - GridMap.keys() is the grid call
        if entry.rpartition("\t")[0] == key:
            entries.remove(entry)


def _because(state: TxnState) -> str:
    return f" ({state.reason})" if state.reason else ""
