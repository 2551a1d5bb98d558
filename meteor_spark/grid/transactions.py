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
* ``meteor.txn.open``: ``<transaction key>\t<stream>`` -> JSON ``{"stream": ..., "tails": [per lane]}``, for every
  transaction that may still be open with records in that stream: written before the producer's first record (by
  the first producer of the transaction in that stream, with the lanes' tails it read just before: every item of
  the transaction in that stream lies above them), removed once the transaction is decided. A reader that read a
  lane's end *before* finding no entry for its stream knows every transactional item below that end is decided,
  without reading them (``open_in``).

Decisions: ``commit`` moves open -> committed with the list of producer ids whose records count (the successful
task attempts); every other producer registered under the transaction (failed or superseded attempts) is aborted
by that same write. ``abort`` moves open -> aborted. A reader that finds a transaction open past its deadline
aborts it (``abort_expired``); whichever CAS lands first, commit or abort, is the decision. Deadlines are wall
clock (ms since the epoch) of the writer's host, compared with the reader's clock: keep clocks in sync (NTP), and
the timeout well above their skew.

Bounded state (``sweep``, run at most every ``SWEEP_INTERVAL_S`` per process by whoever commits or aborts: the
writers' side, which makes the state grow): a decided transaction is removed, with its producers, once no reader
can still need it:

* committed: once every lane it wrote has moved past it. The commit stores, per lane of each stream it wrote,
  the range of ring sequences its items can occupy (from the tails noted at ``begin`` to the tails at commit;
  lanes it did not write drop out); it is removed when the grid's oldest servable item of each such lane
  (``reading.oldest_sequence``: ring head, or lower where history is kept) lies above that range. No reader can
  then meet one of its items, so its record answers nobody. The number of committed transactions kept is thus
  bounded by what the rings hold, whatever the run time.
* aborted: after ``ABORTED_RETENTION_MS``. A reader meeting an item of a removed transaction finds its producer
  missing while the sweep marker (``@swept`` in ``meteor.txn.producers``) is present, and drops the item as
  aborted: a committed transaction is never removed while its items can be read, so only aborted ones (or
  attempts the commit left out) can be missing. Without the marker a missing producer stays an error (the grid
  lost the maps, e.g. a restart without persistence). The retention keeps the clear "aborted first" message for
  a late ``commit`` or task attempt.
* ``meteor.txn.open`` entries of decided transactions are removed, and those of transactions open past their
  deadline abort them (``abort_expired``), by whoever lists them: ``open_in`` (Spark planning), ``sweep``, and
  every ``read_committed`` reader at most every ``SWEEP_INTERVAL_S`` (``clear_stale_if_due``).
* ``meteor.txn.batches`` keeps the last ``KEEP_BATCHES`` batch ids of each sink and query (Spark replays only
  the batch it was running), and any batch whose transaction is still open.

* a committed transaction that staged group offsets (``commit(..., offsets=...)``: consume-transform-produce,
  ``meteor_spark.groups.txn_offsets``) is also kept while any of those ``meteor.group.offsets`` entries still names
  it as staged (not yet applied), so whoever settles the entry later still finds it committed.

A ``read_committed`` reader's memory (``item_gate``) is bounded separately.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

from meteor_spark.errors import MeteorError, TransactionAbortedError
from meteor_spark.grid.client import Grid, result
from meteor_spark.grid.streams import STREAMS_MAP, parse_metadata
from meteor_spark.grid.transaction_state import (
    ABORTED,
    ABORTED_RETENTION_MS,
    BATCHES_MAP,
    COMMITTED,
    KEEP_BATCHES,
    LEGACY_RETENTION_MS,
    OPEN,
    OPEN_MAP,
    PRODUCERS_MAP,
    SWEPT_KEY,
    TXNS_MAP,
    TxnState,
)
from meteor_spark.grid.txn_decisions import (
    abort_step,
    batches_to_remove,
    begin_step,
    commit_check,
    committed_lanes,
    committed_state,
    expired,
    late_open_entries,
    moved_past,
    open_entry,
    open_entry_value,
    parse_states,
    producers_to_remove,
    retention_verdict,
    timeout_reason,
)
from meteor_spark.grid.txn_retention import lane_oldest, still_staged

__all__ = [  # the stored record and the maps' names are transaction_state's, named from here too
    "ABORTED",
    "ABORTED_RETENTION_MS",
    "BATCHES_MAP",
    "COMMITTED",
    "DEFAULT_TIMEOUT_MS",
    "KEEP_BATCHES",
    "LEGACY_RETENTION_MS",
    "OPEN",
    "OPEN_MAP",
    "PRODUCERS_MAP",
    "SWEEP_INTERVAL_S",
    "SWEPT_KEY",
    "TXNS_MAP",
    "BatchCommittedError",
    "SweepReport",
    "TxnState",
    "abort",
    "abort_expired",
    "begin",
    "clear_stale_if_due",
    "commit",
    "open_in",
    "state_of",
    "sweep",
    "sweep_if_due",
    "swept",
    "take_batch",
    "transaction_of_producer",
]

logger = logging.getLogger(__name__)

#: Kafka's transaction.timeout.ms default.
DEFAULT_TIMEOUT_MS = 60_000

_CAS_ATTEMPTS = 100

#: At most one sweep per this many seconds per process and grid (``sweep_if_due``).
SWEEP_INTERVAL_S = 30.0


def _now_ms() -> int:
    return int(time.time() * 1000)


def state_of(grid: Grid, key: str) -> TxnState | None:
    """The stored transaction ``key``; None when it does not exist."""
    text = grid.map(TXNS_MAP).get(key)
    return None if text is None else TxnState.parse(key, text)


def transaction_of_producer(grid: Grid, producer_id: int) -> str | None:
    """The key of the transaction ``producer_id`` was registered under; None for an unregistered producer."""
    return grid.map(PRODUCERS_MAP).get(str(producer_id))


def begin(
    grid: Grid, key: str, producer_id: int, timeout_ms: int, *, stream: str, batch_key: str | None = None
) -> None:
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
    entries = grid.map(OPEN_MAP)
    entry = open_entry(key, stream)
    if entries.get(entry) is None:
        # The first producer in this stream notes the lanes' tails: the transaction's items there lie above them.
        entries.put_if_absent(entry, open_entry_value(stream, _tails(grid, stream)))
    txns = grid.map(TXNS_MAP)
    for _ in range(_CAS_ATTEMPTS):
        current = txns.get(key)
        write = begin_step(key, current, _now_ms() + timeout_ms)
        if write is None:
            break
        if current is None:
            if txns.put_if_absent(key, write) is None:
                break
        elif txns.replace_if_same(key, current, write):
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


def commit(
    grid: Grid,
    key: str,
    producers: Iterable[int],
    *,
    offsets: Iterable[str] = (),
    sweep_interval_s: float = SWEEP_INTERVAL_S,
) -> TxnState:
    """Decide ``key`` committed with the records of ``producers`` (one CAS: open -> committed); producers
    registered under the transaction but not listed are aborted by the same write. Committing again with the
    same producers is a no-op (a retried commit). ``offsets``: the ``meteor.group.offsets`` keys where the
    transaction staged group offsets (kept by the sweep until they are applied). ``sweep_interval_s``: see
    ``sweep_if_due``.

    Raises:
        TransactionAbortedError: the transaction was aborted first (timeout, fencing), or committed with other
            producers; nothing of it is delivered to ``read_committed`` readers.
        MeteorError: no such transaction.
    """
    wanted = frozenset(producers)
    txns = grid.map(TXNS_MAP)
    for _ in range(_CAS_ATTEMPTS):
        current = txns.get(key)
        state = commit_check(key, current, wanted)
        if state.decided:
            return state  # committed already with these producers: a retried commit
        opened = _open_entries(grid, key)
        decided = committed_state(state, wanted, _now_ms(), _lanes(grid, opened), offsets)
        assert current is not None
        if txns.replace_if_same(key, current, decided.to_json()):
            _forget_open(grid, key, opened)
            sweep_if_due(grid, sweep_interval_s)
            return decided
    raise MeteorError(f"could not commit transaction {key!r}: too many concurrent updates")


def abort(grid: Grid, key: str, reason: str, *, only_expired_at_ms: int | None = None) -> TxnState | None:
    """Decide ``key`` aborted unless it is decided already; returns the final state (None: no such transaction).

    ``only_expired_at_ms``: abort only if the deadline lies before this time (a reader's timeout abort).
    """
    txns = grid.map(TXNS_MAP)
    for _ in range(_CAS_ATTEMPTS):
        current = txns.get(key)
        step = abort_step(key, current, reason, _now_ms(), only_expired_at_ms)
        decided = step.write
        if decided is None:
            return step.final
        assert current is not None
        if txns.replace_if_same(key, current, decided.to_json()):
            logger.info("transaction %r aborted: %s", key, reason)
            _forget_open(grid, key)
            if only_expired_at_ms is None:
                sweep_if_due(grid)
            return decided
    raise MeteorError(f"could not abort transaction {key!r}: too many concurrent updates")


def abort_expired(grid: Grid, key: str, now_ms: int | None = None) -> TxnState | None:
    """A reader's timeout: abort ``key`` if it is still open past its deadline; returns the final state."""
    now = _now_ms() if now_ms is None else now_ms
    return abort(grid, key, timeout_reason(now), only_expired_at_ms=now)


def open_in(grid: Grid, stream: str, *, abort_expired: bool = True) -> bool:
    """Whether a transaction may still be open with records in ``stream`` (one ``keys()`` of ``meteor.txn.open``;
    entries of transactions found decided, left behind by a decider that died, are removed here, and transactions
    found open past their deadline are aborted, unless ``abort_expired`` is False: a tool that only looks). False
    means every transactional item stored in ``stream`` before the call is decided."""
    return _clear_open(grid, stream, abort_expired=abort_expired)


def clear_stale_if_due(grid: Grid) -> None:
    """What a ``read_committed`` reader does now and then (at most every ``SWEEP_INTERVAL_S`` per process and
    grid): go through ``meteor.txn.open`` once, aborting transactions open past their deadline and removing the
    entries of decided ones, so stale entries are cleared by every kind of reader, not only by Spark planning.
    Never raises (logged, tried again at the next interval)."""
    now = time.monotonic()
    last = _last_clear.get(id(grid))
    if last is not None and now - last < SWEEP_INTERVAL_S:
        return
    _last_clear[id(grid)] = now
    try:
        _clear_open(grid, None, abort_expired=True)
    except MeteorError as exc:
        logger.warning("clearing stale open transactions failed: %s; tried again in %.0f s", exc, SWEEP_INTERVAL_S)


def _clear_open(grid: Grid, stream: str | None, *, abort_expired: bool) -> bool:
    """``open_in`` for ``stream``, or for every stream (None); True when an entry of a transaction still open
    within its deadline remains."""
    entries = grid.map(OPEN_MAP)
    found = False
    now = _now_ms()
    for entry in entries.keys():  # noqa: SIM118 - GridMap.keys() is the grid call
        key, _, entry_stream = entry.rpartition("\t")
        if stream is not None and entry_stream != stream:
            continue
        state = state_of(grid, key)
        if abort_expired and expired(state, now):
            state = abort(grid, key, timeout_reason(now), only_expired_at_ms=now)
        if state is not None and state.decided:
            entries.remove(entry)
            continue
        found = True
    return found


def _tails(grid: Grid, stream: str) -> list[int]:
    """Every lane's tail of ``stream``, read in parallel (empty when the stream has no metadata)."""
    text = grid.map(STREAMS_MAP).get(stream)
    if text is None:
        return []
    rings = [grid.ring(name) for name in parse_metadata(stream, text).ring_names]
    futures = [ring.tail_async() for ring in rings]
    return [result(future, f"tail of ring {ring.name!r}") for ring, future in zip(rings, futures, strict=True)]


def _open_entries(grid: Grid, key: str) -> dict[str, str]:
    """The ``meteor.txn.open`` entries of transaction ``key``: entry key -> value."""
    entries = grid.map(OPEN_MAP)
    mine = [entry for entry in entries.keys() if entry.rpartition("\t")[0] == key]  # noqa: SIM118
    return {} if not mine else {k: v for k, v in entries.get_all(mine).items() if v is not None}


def _lanes(grid: Grid, opened: dict[str, str]) -> tuple[tuple[str, int, int, int], ...] | None:
    """``txn_decisions.committed_lanes`` with the tails of each stream the transaction noted, read now (every
    producer of a commit has flushed)."""
    streams = {entry.rpartition("\t")[2] for entry in opened}
    return committed_lanes(opened, {stream: _tails(grid, stream) for stream in streams})


def _forget_open(grid: Grid, key: str, opened: dict[str, str] | None = None) -> None:
    """Remove the ``meteor.txn.open`` entries of a decided transaction."""
    entries = grid.map(OPEN_MAP)
    for entry in opened if opened is not None else _open_entries(grid, key):
        entries.remove(entry)


# --------------------------------------------------------------------------------------------------- bounded state


@dataclass(frozen=True)
class SweepReport:
    """What one ``sweep`` removed, and the sizes of the four maps after it."""

    committed: int
    aborted: int
    producers: int
    batches: int
    open_entries: int
    sizes: dict[str, int]


_last_sweep: dict[int, float] = {}
_last_clear: dict[int, float] = {}
_absent_before: dict[int, set[str]] = {}  # grid -> open entries whose transaction the last sweep did not find


def sweep_if_due(grid: Grid, interval_s: float = SWEEP_INTERVAL_S) -> SweepReport | None:
    """``sweep`` when this process has not swept this grid for ``interval_s`` (a sweep lists the maps, so it is
    rationed; a shorter interval keeps them nearer their bound, e.g. for a soak run); never raises (a failed sweep
    is logged and tried again at the next interval)."""
    now = time.monotonic()
    last = _last_sweep.get(id(grid))
    if last is not None and now - last < interval_s:
        return None
    _last_sweep[id(grid)] = now
    try:
        return sweep(grid)
    except MeteorError as exc:
        logger.warning("removing decided transactions failed: %s; tried again in %.0f s", exc, interval_s)
        return None


def sweep(grid: Grid, *, now_ms: int | None = None) -> SweepReport:
    """Remove what no reader can still need from the four transaction maps (rules in the module docs); every
    removal is conditional on the value read (``remove_if_same``), so a concurrent change is never undone.

    The snapshots are taken producers and open entries first, transactions last: a transaction is created before
    its producers are registered, so a producer whose transaction is missing from the later snapshot was removed.
    """
    now = _now_ms() if now_ms is None else now_ms
    producers_map, open_map, batches_map, txns_map = (
        grid.map(PRODUCERS_MAP),
        grid.map(OPEN_MAP),
        grid.map(BATCHES_MAP),
        grid.map(TXNS_MAP),
    )
    producers = producers_map.entries()
    batches = batches_map.entries()
    open_keys = open_map.keys()
    raw = txns_map.entries()
    states = parse_states(raw)
    open_removed = _sweep_open_entries(grid, open_keys, states, raw, now)
    oldest: dict[tuple[str, int], int | None] = {}
    removable = [key for key, state in states.items() if _removable(grid, state, now, oldest)]
    if removable and producers.get(SWEPT_KEY) is None:
        producers_map.put(SWEPT_KEY, json.dumps({"first_ms": now}))
    removed = {key for key in removable if txns_map.remove_if_same(key, raw[key])}
    producers_removed = 0
    for producer, key in producers_to_remove(producers, raw, removed):
        producers_removed += producers_map.remove_if_same(producer, key)
    batches_removed = 0
    for batch_key, key in batches_to_remove(batches, states, removed):
        batches_removed += batches_map.remove_if_same(batch_key, key)
    committed = sum(1 for key in removed if states[key].state == COMMITTED)
    report = SweepReport(
        committed,
        len(removed) - committed,
        producers_removed,
        batches_removed,
        open_removed,
        {name: grid.map(name).size() for name in (TXNS_MAP, PRODUCERS_MAP, BATCHES_MAP, OPEN_MAP)},
    )
    if removed or producers_removed or batches_removed or open_removed:
        logger.info("transaction maps swept: %s", report)
    return report


def _sweep_open_entries(
    grid: Grid, open_keys: list[str], states: dict[str, TxnState], raw: dict[str, str], now: int
) -> int:
    """Sweep map ``meteor.txn.open`` (one entry per open transaction and task); returns the entries removed.

    An entry whose transaction is missing twice in a row is a late task attempt's, written after its transaction was
    decided and removed. An entry of an expired undecided transaction aborts it (``states`` and ``raw`` then hold
    the aborted record, so this sweep can already count it); one of a decided transaction is no longer needed.
    """
    open_map = grid.map(OPEN_MAP)
    open_removed = 0
    absent, late = late_open_entries(open_keys, states, _absent_before.get(id(grid), set()))
    for entry in late:
        if open_map.remove(entry) is not None:
            open_removed += 1
    _absent_before[id(grid)] = absent
    for entry in open_keys:
        key = entry.rpartition("\t")[0]
        state = states.get(key)
        if state is None:
            continue
        if expired(state, now):
            state = abort_expired(grid, key, now) or state
            states[key] = state
            raw[key] = state.to_json()
            open_removed += 1
        elif state.decided and open_map.remove(entry) is not None:
            open_removed += 1
    return open_removed


def _removable(grid: Grid, state: TxnState, now: int, oldest: dict[tuple[str, int], int | None]) -> bool:
    verdict = retention_verdict(state, now)
    if verdict is not None:
        return verdict
    assert state.lanes is not None
    if state.offsets and still_staged(grid, state.key, state.offsets):
        return False
    for stream, lane, _, last in state.lanes:
        where = (stream, lane)
        if where not in oldest:
            oldest[where] = lane_oldest(grid, stream, lane)
        if not moved_past(oldest[where], last):
            return False
    return True


def swept(grid: Grid) -> bool:
    """Whether transactions were ever removed from this grid's maps (the marker ``sweep`` leaves): a reader that
    finds a transactional item's producer or transaction missing then knows it was removed, not lost."""
    return grid.map(PRODUCERS_MAP).get(SWEPT_KEY) is not None
