"""The transaction steps of ``meteor_spark.grid.transactions`` with awaited grid calls, for the asyncio clients.

Every decision (what ``begin`` writes, whether a ``commit`` may go on, what an ``abort`` writes, which lane ranges a
commit records, when a reader aborts an expired transaction) is ``meteor_spark.grid.txn_decisions``'s, shared with
the synchronous steps; this module only reads and compare-and-sets the same map entries, awaited, so asyncio and
threaded transactions and readers decide each other's transactions by the same rules.

The sweep (``transactions.sweep``: decided transactions removed once no reader can need them, their producers, old
batch ids, stale open entries) runs here too, awaited, by asyncio committers and aborters at most every
``SWEEP_INTERVAL_S`` per connection (``sweep_if_due``), by the same rules (``txn_decisions``' ``retention_verdict``,
``moved_past``, ``late_open_entries``, ``producers_to_remove``, ``batches_to_remove``, ``txn_retention.names_staged``),
reading the same snapshots in the same order and removing by ``remove_if_same``: the maps stay bounded by what the
rings hold with asyncio writers alone.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from meteor_spark.errors import MeteorError
from meteor_spark.grid.aio_client import AsyncGrid
from meteor_spark.grid.reading import oldest_steps
from meteor_spark.grid.steps import drive_async
from meteor_spark.grid.streams import STREAMS_MAP, parse_metadata
from meteor_spark.grid.transaction_state import (
    BATCHES_MAP,
    COMMITTED,
    OPEN_MAP,
    PRODUCERS_MAP,
    SWEPT_KEY,
    TXNS_MAP,
    TxnState,
)
from meteor_spark.grid.transactions import SWEEP_INTERVAL_S
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
from meteor_spark.grid.txn_retention import STAGED_OFFSETS_MAP, names_staged

__all__ = ["abort", "abort_expired", "begin", "clear_stale_if_due", "commit", "state_of", "sweep", "sweep_if_due"]

logger = logging.getLogger(__name__)

_CAS_ATTEMPTS = 100
_last_clear: dict[int, float] = {}


def _now_ms() -> int:
    return int(time.time() * 1000)


async def state_of(grid: AsyncGrid, key: str) -> TxnState | None:
    """``transactions.state_of``, awaited."""
    text = await (await grid.map(TXNS_MAP)).get(key)
    return None if text is None else TxnState.parse(key, text)


async def _tails(grid: AsyncGrid, stream: str) -> list[int]:
    text = await (await grid.map(STREAMS_MAP)).get(stream)
    if text is None:
        return []
    rings = [await grid.ring(name) for name in parse_metadata(stream, text).ring_names]
    return list(await asyncio.gather(*(ring.tail() for ring in rings)))


async def begin(grid: AsyncGrid, key: str, producer_id: int, timeout_ms: int, *, stream: str) -> None:
    """``transactions.begin`` (without a Spark batch key), awaited: the open entry with the stream's tails, the
    transaction open with its deadline, then the producer registered."""
    entries = await grid.map(OPEN_MAP)
    entry = open_entry(key, stream)
    if await entries.get(entry) is None:
        await entries.put_if_absent(entry, open_entry_value(stream, await _tails(grid, stream)))
    txns = await grid.map(TXNS_MAP)
    for _ in range(_CAS_ATTEMPTS):
        current = await txns.get(key)
        write = begin_step(key, current, _now_ms() + timeout_ms)
        if write is None:
            break
        if current is None:
            if await txns.put_if_absent(key, write) is None:
                break
        elif await txns.replace_if_same(key, current, write):
            break
    else:
        raise MeteorError(f"could not register a producer under transaction {key!r}: too many concurrent updates")
    await (await grid.map(PRODUCERS_MAP)).put(str(producer_id), key)


async def _open_entries(grid: AsyncGrid, key: str) -> dict[str, str]:
    entries = await (await grid.map(OPEN_MAP)).entries()
    return {entry: value for entry, value in entries.items() if entry.rpartition("\t")[0] == key}


async def _forget_open(grid: AsyncGrid, key: str, opened: dict[str, str] | None = None) -> None:
    entries = await grid.map(OPEN_MAP)
    for entry in opened if opened is not None else await _open_entries(grid, key):
        await entries.remove(entry)


async def commit(grid: AsyncGrid, key: str, producers: list[int], *, offsets: list[str]) -> TxnState:
    """``transactions.commit``, awaited (same errors: ``TransactionAbortedError`` when decided first)."""
    wanted = frozenset(producers)
    txns = await grid.map(TXNS_MAP)
    for _ in range(_CAS_ATTEMPTS):
        current = await txns.get(key)
        state = commit_check(key, current, wanted)
        if state.decided:
            return state
        opened = await _open_entries(grid, key)
        streams = {entry.rpartition("\t")[2] for entry in opened}
        tails = {stream: await _tails(grid, stream) for stream in streams}
        decided = committed_state(state, wanted, _now_ms(), committed_lanes(opened, tails), offsets)
        assert current is not None
        if await txns.replace_if_same(key, current, decided.to_json()):
            await _forget_open(grid, key, opened)
            await sweep_if_due(grid)
            return decided
    raise MeteorError(f"could not commit transaction {key!r}: too many concurrent updates")


async def abort(grid: AsyncGrid, key: str, reason: str, *, only_expired_at_ms: int | None = None) -> TxnState | None:
    """``transactions.abort``, awaited: the final state (None: no such transaction)."""
    txns = await grid.map(TXNS_MAP)
    for _ in range(_CAS_ATTEMPTS):
        current = await txns.get(key)
        step = abort_step(key, current, reason, _now_ms(), only_expired_at_ms)
        if step.write is None:
            return step.final
        assert current is not None
        if await txns.replace_if_same(key, current, step.write.to_json()):
            logger.info("transaction %r aborted: %s", key, reason)
            await _forget_open(grid, key)
            if only_expired_at_ms is None:
                await sweep_if_due(grid)
            return step.write
    raise MeteorError(f"could not abort transaction {key!r}: too many concurrent updates")


async def abort_expired(grid: AsyncGrid, key: str) -> TxnState | None:
    """A reader's timeout: abort ``key`` if still open past its deadline (``transactions.abort_expired``)."""
    now = _now_ms()
    return await abort(grid, key, timeout_reason(now), only_expired_at_ms=now)


async def clear_stale_if_due(grid: AsyncGrid) -> None:
    """``transactions.clear_stale_if_due``, awaited: at most every ``SWEEP_INTERVAL_S`` per grid, abort the
    transactions of ``meteor.txn.open`` open past their deadline and remove the entries of decided ones. Never
    raises (logged, tried again at the next interval)."""
    now = time.monotonic()
    last = _last_clear.get(id(grid))
    if last is not None and now - last < SWEEP_INTERVAL_S:
        return
    _last_clear[id(grid)] = now
    try:
        entries = await grid.map(OPEN_MAP)
        for entry in await entries.entries():
            key = entry.rpartition("\t")[0]
            state = await state_of(grid, key)
            if expired(state, _now_ms()):
                state = await abort_expired(grid, key)
            if state is not None and state.decided:
                await entries.remove(entry)
    except MeteorError as exc:
        logger.warning("clearing stale open transactions failed: %s; tried again in %.0f s", exc, SWEEP_INTERVAL_S)


# --------------------------------------------------------------------------------------------------- the sweep

_last_sweep: dict[int, float] = {}
_absent_before: dict[int, set[str]] = {}


async def sweep_if_due(grid: AsyncGrid) -> None:
    """``sweep`` unless this process swept this connection within ``SWEEP_INTERVAL_S``; never raises (logged, tried
    again at the next interval)."""
    now = time.monotonic()
    last = _last_sweep.get(id(grid))
    if last is not None and now - last < SWEEP_INTERVAL_S:
        return
    _last_sweep[id(grid)] = now
    try:
        await sweep(grid)
    except MeteorError as exc:
        logger.warning("removing decided transactions failed: %s; tried again in %.0f s", exc, SWEEP_INTERVAL_S)


async def sweep(grid: AsyncGrid, *, now_ms: int | None = None) -> int:
    """Remove what no reader can still need from the transaction maps; returns the transactions removed."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    producers_map, open_map = await grid.map(PRODUCERS_MAP), await grid.map(OPEN_MAP)
    batches_map, txns_map = await grid.map(BATCHES_MAP), await grid.map(TXNS_MAP)
    producers = await producers_map.entries()
    batches = await batches_map.entries()
    open_keys = list(await open_map.entries())
    raw = await txns_map.entries()
    states = parse_states(raw)
    absent, late = late_open_entries(open_keys, states, _absent_before.get(id(grid), set()))
    for entry in late:
        await open_map.remove(entry)
    _absent_before[id(grid)] = absent
    for entry in open_keys:
        key = entry.rpartition("\t")[0]
        state = states.get(key)
        if state is not None and expired(state, now):
            state = await abort(grid, key, timeout_reason(now), only_expired_at_ms=now) or state
            states[key], raw[key] = state, state.to_json()
        elif state is not None and state.decided:
            await open_map.remove(entry)
    oldest: dict[tuple[str, int], int | None] = {}
    removable = [key for key, state in states.items() if await _removable(grid, state, now, oldest)]
    if removable and producers.get(SWEPT_KEY) is None:
        await producers_map.put(SWEPT_KEY, json.dumps({"first_ms": now}))
    removed = {key for key in removable if await txns_map.remove_if_same(key, raw[key])}
    for producer, key in producers_to_remove(producers, raw, removed):
        await producers_map.remove_if_same(producer, key)
    for batch_key, key in batches_to_remove(batches, states, removed):
        await batches_map.remove_if_same(batch_key, key)
    if removed:
        committed = sum(1 for key in removed if states[key].state == COMMITTED)
        logger.info(
            "transaction maps swept (asyncio): %d committed, %d aborted removed", committed, len(removed) - committed
        )
    return len(removed)


async def _removable(grid: AsyncGrid, state: TxnState, now: int, oldest: dict[tuple[str, int], int | None]) -> bool:
    verdict = retention_verdict(state, now)
    if verdict is not None:
        return verdict
    assert state.lanes is not None
    if state.offsets:
        texts = await (await grid.map(STAGED_OFFSETS_MAP)).get_all(list(state.offsets))
        if names_staged(texts.values(), state.key):
            return False
    for stream, lane, _, last in state.lanes:
        where = (stream, lane)
        if where not in oldest:
            oldest[where] = await _lane_oldest(grid, stream, lane)
        if not moved_past(oldest[where], last):
            return False
    return True


async def _lane_oldest(grid: AsyncGrid, stream: str, lane: int) -> int | None:
    """``txn_retention.lane_oldest``, awaited: the lane's oldest servable sequence (``reading.oldest_steps``), None
    when the stream or lane no longer exists."""
    text = await (await grid.map(STREAMS_MAP)).get(stream)
    if text is None:
        return None
    names = parse_metadata(stream, text).ring_names
    if lane >= len(names):
        return None
    ring = await grid.ring(names[lane])
    return await drive_async(oldest_steps(ring))
