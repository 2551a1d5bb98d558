"""The transactions of ``meteor_spark.grid.transactions`` on the event loop, for the asyncio clients.

Begin, commit, abort, a reader's timeout abort, clearing stale open entries and the sweep are
``meteor_spark.grid.txn_steps``' steps, the threaded client's own, driven with ``drive_async``: asyncio and threaded
transactions and readers decide each other's transactions by one piece of code, and the sweep (decided
transactions removed once no reader can need them, their producers, old batch ids, stale open entries) keeps the
maps bounded by what the rings hold with asyncio writers alone. Committers and aborters run it at most every
``SWEEP_INTERVAL_S`` per connection (``sweep_if_due``). This module makes only the calls each client makes its
own way (``TxnCalls``): a stream's tails read with ``asyncio.gather``, the open entries listed with ``entries()``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from functools import partial

from meteor_spark.errors import MeteorError
from meteor_spark.grid import txn_steps
from meteor_spark.grid.aio_client import AsyncGrid
from meteor_spark.grid.steps import drive_async
from meteor_spark.grid.streams import STREAMS_MAP, parse_metadata
from meteor_spark.grid.transaction_state import OPEN_MAP, TxnState
from meteor_spark.grid.transactions import SWEEP_INTERVAL_S
from meteor_spark.grid.txn_decisions import timeout_reason
from meteor_spark.grid.txn_steps import TxnCalls

__all__ = ["abort", "abort_expired", "begin", "clear_stale_if_due", "commit", "state_of", "sweep", "sweep_if_due"]

logger = logging.getLogger(__name__)

_last_clear: dict[int, float] = {}
_last_sweep: dict[int, float] = {}
_absent_before: dict[int, set[str]] = {}  # grid -> open entries whose transaction the last sweep did not find


async def state_of(grid: AsyncGrid, key: str) -> TxnState | None:
    """``transactions.state_of``, awaited."""
    return await drive_async(txn_steps.state_steps(grid, key))


async def begin(grid: AsyncGrid, key: str, producer_id: int, timeout_ms: int, *, stream: str) -> None:
    """``transactions.begin`` (without a Spark batch key), awaited: the open entry with the stream's tails, the
    transaction open with its deadline, then the producer registered."""
    await drive_async(txn_steps.begin_steps(grid, _CALLS, key, producer_id, timeout_ms, stream))


async def commit(grid: AsyncGrid, key: str, producers: list[int], *, offsets: list[str]) -> TxnState:
    """``transactions.commit``, awaited (same errors: ``TransactionAbortedError`` when decided first)."""
    return await drive_async(
        txn_steps.commit_steps(grid, _CALLS, key, frozenset(producers), offsets, partial(sweep_if_due, grid))
    )


async def abort(grid: AsyncGrid, key: str, reason: str, *, only_expired_at_ms: int | None = None) -> TxnState | None:
    """``transactions.abort``, awaited: the final state (None: no such transaction)."""
    return await drive_async(txn_steps.abort_steps(grid, _CALLS, key, reason, only_expired_at_ms))


async def abort_expired(grid: AsyncGrid, key: str) -> TxnState | None:
    """A reader's timeout: abort ``key`` if still open past its deadline (``transactions.abort_expired``)."""
    now = txn_steps.now_ms()
    return await abort(grid, key, timeout_reason(now), only_expired_at_ms=now)


async def clear_stale_if_due(grid: AsyncGrid) -> None:
    """``transactions.clear_stale_if_due``, awaited: at most every ``SWEEP_INTERVAL_S`` per grid, abort the
    transactions of ``meteor.txn.open`` open past their deadline and remove the entries of decided ones. Never
    raises (logged, tried again at the next interval)."""
    if not txn_steps.due(_last_clear, grid, SWEEP_INTERVAL_S):
        return
    try:
        await drive_async(txn_steps.clear_open_steps(grid, _CALLS, None, abort_expired=True))
    except MeteorError as exc:
        logger.warning("clearing stale open transactions failed: %s; tried again in %.0f s", exc, SWEEP_INTERVAL_S)


async def sweep_if_due(grid: AsyncGrid) -> None:
    """``sweep`` unless this process swept this connection within ``SWEEP_INTERVAL_S``; never raises (logged, tried
    again at the next interval)."""
    if not txn_steps.due(_last_sweep, grid, SWEEP_INTERVAL_S):
        return
    try:
        await sweep(grid)
    except MeteorError as exc:
        logger.warning("removing decided transactions failed: %s; tried again in %.0f s", exc, SWEEP_INTERVAL_S)


async def sweep(grid: AsyncGrid, *, now_ms: int | None = None) -> int:
    """Remove what no reader can still need from the transaction maps (``transactions.sweep``'s rules); returns the
    transactions removed."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    counts = await drive_async(txn_steps.sweep_steps(grid, _CALLS, now, _absent_before))
    removed = counts.committed + counts.aborted
    if removed:
        logger.info(
            "transaction maps swept (asyncio): %d committed, %d aborted removed", counts.committed, counts.aborted
        )
    return removed


async def _tails(grid: AsyncGrid, stream: str) -> list[int]:
    """Every lane's tail of ``stream``, read concurrently (empty when the stream has no metadata)."""
    text = await (await grid.map(STREAMS_MAP)).get(stream)
    if text is None:
        return []
    rings = [await grid.ring(name) for name in parse_metadata(stream, text).ring_names]
    return list(await asyncio.gather(*(ring.tail() for ring in rings)))


async def _open_keys(grid: AsyncGrid) -> list[str]:
    """Every key of ``meteor.txn.open`` (the asyncio map lists entries)."""
    return list(await (await grid.map(OPEN_MAP)).entries())


async def _open_entries(grid: AsyncGrid, key: str) -> dict[str, str]:
    """The ``meteor.txn.open`` entries of transaction ``key``: entry key -> value."""
    entries = await (await grid.map(OPEN_MAP)).entries()
    return {entry: value for entry, value in entries.items() if entry.rpartition("\t")[0] == key}


#: The calls the steps of ``txn_steps`` leave to this client.
_CALLS = TxnCalls(tails=_tails, open_entries=_open_entries, open_keys=_open_keys, sweep_if_due=sweep_if_due)
