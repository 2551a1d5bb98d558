"""The transaction steps of ``meteor_spark.grid.transactions`` with awaited grid calls, for the asyncio clients.

Every decision (what ``begin`` writes, whether a ``commit`` may go on, what an ``abort`` writes, which lane ranges a
commit records, when a reader aborts an expired transaction) is ``meteor_spark.grid.txn_decisions``'s, shared with
the synchronous steps; this module only reads and compare-and-sets the same map entries, awaited, so asyncio and
threaded transactions and readers decide each other's transactions by the same rules.

Left to the synchronous side: the sweep that removes decided transactions (``transactions.sweep``, run by threaded
committers and aborters, every ``read_committed`` threaded reader and Spark planning); an asyncio-only deployment
keeps its decided transactions in the maps until one of those runs.
"""

from __future__ import annotations

import asyncio
import logging
import time

from meteor_spark.errors import MeteorError
from meteor_spark.grid.aio_client import AsyncGrid
from meteor_spark.grid.streams import STREAMS_MAP, parse_metadata
from meteor_spark.grid.transaction_state import OPEN_MAP, PRODUCERS_MAP, TXNS_MAP, TxnState
from meteor_spark.grid.transactions import SWEEP_INTERVAL_S
from meteor_spark.grid.txn_decisions import (
    abort_step,
    begin_step,
    commit_check,
    committed_lanes,
    committed_state,
    expired,
    open_entry,
    open_entry_value,
    timeout_reason,
)

__all__ = ["abort", "abort_expired", "begin", "clear_stale_if_due", "commit", "state_of"]

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
