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

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial

from meteor_spark.errors import MeteorError, TransactionAbortedError
from meteor_spark.grid.client import Grid, result
from meteor_spark.grid.steps import drive
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
from meteor_spark.grid.txn_decisions import timeout_reason
from meteor_spark.grid.txn_steps import (
    TxnCalls,
    abort_steps,
    begin_steps,
    clear_open_steps,
    commit_steps,
    due,
    sweep_steps,
)
from meteor_spark.grid.txn_steps import now_ms as _now_ms

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

#: At most one sweep per this many seconds per process and grid (``sweep_if_due``).
SWEEP_INTERVAL_S = 30.0

#: Attempts at taking a batch over while other runs of the query race for it.
_TAKE_ATTEMPTS = 100


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
    drive(begin_steps(grid, _CALLS, key, producer_id, timeout_ms, stream))


class BatchCommittedError(TransactionAbortedError):
    """Another run of the query already committed this batch: the caller publishes nothing (a replay)."""


def take_batch(grid: Grid, batch_key: str, key: str) -> None:
    """Make transaction ``key`` the owner of ``batch_key``; another run's open transaction of it is aborted.

    Raises:
        BatchCommittedError: another run already committed the batch (publish nothing: a replay).
    """
    batches = grid.map(BATCHES_MAP)
    for _ in range(_TAKE_ATTEMPTS):
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
    sweep = partial(sweep_if_due, grid, sweep_interval_s)
    return drive(commit_steps(grid, _CALLS, key, frozenset(producers), offsets, sweep))


def abort(grid: Grid, key: str, reason: str, *, only_expired_at_ms: int | None = None) -> TxnState | None:
    """Decide ``key`` aborted unless it is decided already; returns the final state (None: no such transaction).

    ``only_expired_at_ms``: abort only if the deadline lies before this time (a reader's timeout abort).
    """
    return drive(abort_steps(grid, _CALLS, key, reason, only_expired_at_ms))


def abort_expired(grid: Grid, key: str, now_ms: int | None = None) -> TxnState | None:
    """A reader's timeout: abort ``key`` if it is still open past its deadline; returns the final state."""
    now = _now_ms() if now_ms is None else now_ms
    return abort(grid, key, timeout_reason(now), only_expired_at_ms=now)


def open_in(grid: Grid, stream: str, *, abort_expired: bool = True) -> bool:
    """Whether a transaction may still be open with records in ``stream`` (one ``keys()`` of ``meteor.txn.open``;
    entries of transactions found decided, left behind by a decider that died, are removed here, and transactions
    found open past their deadline are aborted, unless ``abort_expired`` is False: a tool that only looks). False
    means every transactional item stored in ``stream`` before the call is decided."""
    return drive(clear_open_steps(grid, _CALLS, stream, abort_expired=abort_expired))


def clear_stale_if_due(grid: Grid) -> None:
    """What a ``read_committed`` reader does now and then (at most every ``SWEEP_INTERVAL_S`` per process and
    grid): go through ``meteor.txn.open`` once, aborting transactions open past their deadline and removing the
    entries of decided ones, so stale entries are cleared by every kind of reader, not only by Spark planning.
    Never raises (logged, tried again at the next interval)."""
    if not due(_last_clear, grid, SWEEP_INTERVAL_S):
        return
    try:
        drive(clear_open_steps(grid, _CALLS, None, abort_expired=True))
    except MeteorError as exc:
        logger.warning("clearing stale open transactions failed: %s; tried again in %.0f s", exc, SWEEP_INTERVAL_S)


def _tails(grid: Grid, stream: str) -> list[int]:
    """Every lane's tail of ``stream``, read in parallel (empty when the stream has no metadata)."""
    text = grid.map(STREAMS_MAP).get(stream)
    if text is None:
        return []
    rings = [grid.ring(name) for name in parse_metadata(stream, text).ring_names]
    futures = [ring.tail_async() for ring in rings]
    return [result(future, f"tail of ring {ring.name!r}") for ring, future in zip(rings, futures, strict=True)]


def _open_keys(grid: Grid) -> list[str]:
    """Every key of ``meteor.txn.open`` (one ``keys()``: the values are read only for the entries wanted)."""
    return grid.map(OPEN_MAP).keys()


def _open_entries(grid: Grid, key: str) -> dict[str, str]:
    """The ``meteor.txn.open`` entries of transaction ``key``: entry key -> value."""
    entries = grid.map(OPEN_MAP)
    mine = [entry for entry in entries.keys() if entry.rpartition("\t")[0] == key]  # noqa: SIM118
    return {} if not mine else {k: v for k, v in entries.get_all(mine).items() if v is not None}


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
    if not due(_last_sweep, grid, interval_s):
        return None
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
    counts = drive(sweep_steps(grid, _CALLS, _now_ms() if now_ms is None else now_ms, _absent_before))
    report = SweepReport(
        counts.committed,
        counts.aborted,
        counts.producers,
        counts.batches,
        counts.open_entries,
        {name: grid.map(name).size() for name in (TXNS_MAP, PRODUCERS_MAP, BATCHES_MAP, OPEN_MAP)},
    )
    if counts.committed or counts.aborted or counts.producers or counts.batches or counts.open_entries:
        logger.info("transaction maps swept: %s", report)
    return report


def swept(grid: Grid) -> bool:
    """Whether transactions were ever removed from this grid's maps (the marker ``sweep`` leaves): a reader that
    finds a transactional item's producer or transaction missing then knows it was removed, not lost."""
    return grid.map(PRODUCERS_MAP).get(SWEPT_KEY) is not None


#: The calls the steps of ``txn_steps`` leave to this client: tails read with parallel futures, the open entries
#: listed by ``keys()`` and read with one ``get_all``.
_CALLS = TxnCalls(tails=_tails, open_entries=_open_entries, open_keys=_open_keys, sweep_if_due=sweep_if_due)
