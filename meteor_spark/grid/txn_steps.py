"""A transaction's grid work as steps: one copy for the threaded and the asyncio clients.

Begin, commit, abort, clearing stale open entries and the sweep each talk to the grid many times; they are written
once here as generators yielding each call (``meteor_spark.grid.steps``): ``meteor_spark.grid.transactions`` drives
them with ``drive`` on the caller's thread, ``meteor_spark.aio.txn_grid`` with ``drive_async`` on the loop, so
threaded and asyncio writers and readers decide each other's transactions by one piece of code. What each step
writes is decided by ``meteor_spark.grid.txn_decisions``; what the sweep reads to judge removal is
``meteor_spark.grid.txn_retention``'s.

A step is a zero-argument callable on the grid (``map``, ``ring``: a ``Grid`` or an ``AsyncGrid``) or on one of its
maps (``GridMap`` / ``AsyncGridMap``, whose methods share names), or one of the few calls each client makes its own
way (``TxnCalls``: reading a stream's tails in parallel, listing the open entries).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

from meteor_spark.errors import MeteorError
from meteor_spark.grid.reading import oldest_steps
from meteor_spark.grid.steps import Steps
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

__all__ = [
    "SweepCounts",
    "TxnCalls",
    "abort_steps",
    "begin_steps",
    "clear_open_steps",
    "commit_steps",
    "due",
    "state_steps",
    "sweep_steps",
]

logger = logging.getLogger(__name__)

_CAS_ATTEMPTS = 100


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class TxnCalls:
    """The calls a client makes its own way, each returning the value or an awaitable of it.

    Attributes:
        tails: ``tails(grid, stream)``: every lane's tail of ``stream``, read in parallel (empty without metadata).
        open_entries: ``open_entries(grid, key)``: the ``meteor.txn.open`` entries of transaction ``key``.
        open_keys: ``open_keys(grid)``: every key of ``meteor.txn.open``.
        sweep_if_due: ``sweep_if_due(grid)``: the rationed sweep, after an abort.
    """

    tails: Callable[[Any, str], Any]
    open_entries: Callable[[Any, str], Any]
    open_keys: Callable[[Any], Any]
    sweep_if_due: Callable[[Any], Any]


def due(last: dict[int, float], grid: object, interval_s: float) -> bool:
    """Whether work rationed to once per ``interval_s`` per process and grid is due now (``last`` notes it)."""
    now = time.monotonic()
    previous = last.get(id(grid))
    if previous is not None and now - previous < interval_s:
        return False
    last[id(grid)] = now
    return True


def state_steps(grid: Any, key: str) -> Steps[TxnState | None]:
    """The stored transaction ``key``; None when it does not exist."""
    txns = yield partial(grid.map, TXNS_MAP)
    text = yield partial(txns.get, key)
    return None if text is None else TxnState.parse(key, text)


def begin_steps(grid: Any, calls: TxnCalls, key: str, producer_id: int, timeout_ms: int, stream: str) -> Steps[None]:
    """``transactions.begin`` without its batch take-over: the open entry with the stream's tails (the first
    producer in a stream notes them: the transaction's items there lie above them), the transaction open with its
    deadline, then the producer registered."""
    entries = yield partial(grid.map, OPEN_MAP)
    entry = open_entry(key, stream)
    if (yield partial(entries.get, entry)) is None:
        tails = yield partial(calls.tails, grid, stream)
        yield partial(entries.put_if_absent, entry, open_entry_value(stream, tails))
    txns = yield partial(grid.map, TXNS_MAP)
    for _ in range(_CAS_ATTEMPTS):
        current = yield partial(txns.get, key)
        write = begin_step(key, current, now_ms() + timeout_ms)
        if write is None:
            break
        if current is None:
            if (yield partial(txns.put_if_absent, key, write)) is None:
                break
        elif (yield partial(txns.replace_if_same, key, current, write)):
            break
    else:
        raise MeteorError(f"could not register a producer under transaction {key!r}: too many concurrent updates")
    producers = yield partial(grid.map, PRODUCERS_MAP)
    yield partial(producers.put, str(producer_id), key)


def commit_steps(
    grid: Any, calls: TxnCalls, key: str, wanted: frozenset[int], offsets: Iterable[str], sweep: Callable[[], Any]
) -> Steps[TxnState]:
    """``transactions.commit``: one CAS open -> committed with the lane ranges read now (every producer of a commit
    has flushed), then the open entries forgotten and ``sweep`` called (rationed by the caller)."""
    txns = yield partial(grid.map, TXNS_MAP)
    for _ in range(_CAS_ATTEMPTS):
        current = yield partial(txns.get, key)
        state = commit_check(key, current, wanted)
        if state.decided:
            return state  # committed already with these producers: a retried commit
        opened = yield partial(calls.open_entries, grid, key)
        tails = {}
        for stream in {entry.rpartition("\t")[2] for entry in opened}:
            tails[stream] = yield partial(calls.tails, grid, stream)
        decided = committed_state(state, wanted, now_ms(), committed_lanes(opened, tails), offsets)
        assert current is not None
        if (yield partial(txns.replace_if_same, key, current, decided.to_json())):
            yield from _forget_open_steps(grid, calls, key, opened)
            yield sweep
            return decided
    raise MeteorError(f"could not commit transaction {key!r}: too many concurrent updates")


def abort_steps(
    grid: Any, calls: TxnCalls, key: str, reason: str, only_expired_at_ms: int | None = None
) -> Steps[TxnState | None]:
    """``transactions.abort``: decide ``key`` aborted unless it is decided already; the final state (None: no such
    transaction). ``only_expired_at_ms``: only if its deadline lies before then (a reader's timeout abort)."""
    txns = yield partial(grid.map, TXNS_MAP)
    for _ in range(_CAS_ATTEMPTS):
        current = yield partial(txns.get, key)
        step = abort_step(key, current, reason, now_ms(), only_expired_at_ms)
        decided = step.write
        if decided is None:
            return step.final
        assert current is not None
        if (yield partial(txns.replace_if_same, key, current, decided.to_json())):
            logger.info("transaction %r aborted: %s", key, reason)
            yield from _forget_open_steps(grid, calls, key)
            if only_expired_at_ms is None:
                yield partial(calls.sweep_if_due, grid)
            return decided
    raise MeteorError(f"could not abort transaction {key!r}: too many concurrent updates")


def _forget_open_steps(grid: Any, calls: TxnCalls, key: str, opened: Iterable[str] | None = None) -> Steps[None]:
    """Remove the ``meteor.txn.open`` entries of a decided transaction."""
    entries = yield partial(grid.map, OPEN_MAP)
    if opened is None:
        opened = yield partial(calls.open_entries, grid, key)
    for entry in opened:
        yield partial(entries.remove, entry)


def clear_open_steps(grid: Any, calls: TxnCalls, stream: str | None, *, abort_expired: bool) -> Steps[bool]:
    """Go through ``meteor.txn.open`` for ``stream`` (None: every stream): entries of decided transactions removed,
    transactions open past their deadline aborted (unless ``abort_expired`` is False); True when an entry of a
    transaction still open within its deadline remains."""
    entries = yield partial(grid.map, OPEN_MAP)
    found = False
    now = now_ms()
    for entry in (yield partial(calls.open_keys, grid)):
        key, _, entry_stream = entry.rpartition("\t")
        if stream is not None and entry_stream != stream:
            continue
        state = yield from state_steps(grid, key)
        if abort_expired and expired(state, now):
            state = yield from abort_steps(grid, calls, key, timeout_reason(now), only_expired_at_ms=now)
        if state is not None and state.decided:
            yield partial(entries.remove, entry)
            continue
        found = True
    return found


# --------------------------------------------------------------------------------------------------- the sweep


@dataclass(frozen=True)
class SweepCounts:
    """What one sweep removed: transactions (committed, aborted), producers, batch ids, open entries."""

    committed: int
    aborted: int
    producers: int
    batches: int
    open_entries: int


def sweep_steps(grid: Any, calls: TxnCalls, now: int, absent_before: dict[int, set[str]]) -> Steps[SweepCounts]:
    """Remove what no reader can still need from the four transaction maps (``transactions``' module docs); every
    removal is conditional on the value read (``remove_if_same``), so a concurrent change is never undone.

    The snapshots are taken producers and open entries first, transactions last: a transaction is created before
    its producers are registered, so a producer whose transaction is missing from the later snapshot was removed.
    ``absent_before``: per grid, the open entries whose transaction the previous sweep did not find.
    """
    producers_map = yield partial(grid.map, PRODUCERS_MAP)
    batches_map = yield partial(grid.map, BATCHES_MAP)
    txns_map = yield partial(grid.map, TXNS_MAP)
    producers = yield producers_map.entries
    batches = yield batches_map.entries
    open_keys = yield partial(calls.open_keys, grid)
    raw = yield txns_map.entries
    states = parse_states(raw)
    open_removed = yield from _sweep_open_steps(grid, calls, open_keys, states, raw, now, absent_before)
    oldest: dict[tuple[str, int], int | None] = {}
    removable = []
    for key, state in states.items():
        if (yield from _removable_steps(grid, state, now, oldest)):
            removable.append(key)
    if removable and producers.get(SWEPT_KEY) is None:
        yield partial(producers_map.put, SWEPT_KEY, json.dumps({"first_ms": now}))
    removed = set()
    for key in removable:
        if (yield partial(txns_map.remove_if_same, key, raw[key])):
            removed.add(key)
    producers_removed = 0
    for producer, key in producers_to_remove(producers, raw, removed):
        producers_removed += bool((yield partial(producers_map.remove_if_same, producer, key)))
    batches_removed = 0
    for batch_key, key in batches_to_remove(batches, states, removed):
        batches_removed += bool((yield partial(batches_map.remove_if_same, batch_key, key)))
    committed = sum(1 for key in removed if states[key].state == COMMITTED)
    return SweepCounts(committed, len(removed) - committed, producers_removed, batches_removed, open_removed)


def _sweep_open_steps(
    grid: Any,
    calls: TxnCalls,
    open_keys: list[str],
    states: dict[str, TxnState],
    raw: dict[str, str],
    now: int,
    absent_before: dict[int, set[str]],
) -> Steps[int]:
    """Sweep map ``meteor.txn.open`` (one entry per open transaction and task); returns the entries removed.

    An entry whose transaction is missing twice in a row is a late task attempt's, written after its transaction was
    decided and removed. An entry of an expired undecided transaction aborts it (``states`` and ``raw`` then hold
    the aborted record, so this sweep can already count it); one of a decided transaction is no longer needed.
    """
    open_map = yield partial(grid.map, OPEN_MAP)
    open_removed = 0
    absent, late = late_open_entries(open_keys, states, absent_before.get(id(grid), set()))
    for entry in late:
        if (yield partial(open_map.remove, entry)) is not None:
            open_removed += 1
    absent_before[id(grid)] = absent
    for entry in open_keys:
        key = entry.rpartition("\t")[0]
        state = states.get(key)
        if state is None:
            continue
        if expired(state, now):
            state = (yield from abort_steps(grid, calls, key, timeout_reason(now), only_expired_at_ms=now)) or state
            states[key] = state
            raw[key] = state.to_json()
            open_removed += 1
        elif state.decided and (yield partial(open_map.remove, entry)) is not None:
            open_removed += 1
    return open_removed


def _removable_steps(grid: Any, state: TxnState, now: int, oldest: dict[tuple[str, int], int | None]) -> Steps[bool]:
    """Whether the sweep may remove ``state``: its retention verdict, else no group offset still staged by it and
    every lane it wrote moved past it (``oldest``: the lanes' oldest servable sequences, read once per sweep)."""
    verdict = retention_verdict(state, now)
    if verdict is not None:
        return verdict
    assert state.lanes is not None
    if state.offsets:
        staged = yield partial(grid.map, STAGED_OFFSETS_MAP)
        texts = yield partial(staged.get_all, list(state.offsets))
        if names_staged(texts.values(), state.key):
            return False
    for stream, lane, _, last in state.lanes:
        where = (stream, lane)
        if where not in oldest:
            oldest[where] = yield from _lane_oldest_steps(grid, stream, lane)
        if not moved_past(oldest[where], last):
            return False
    return True


def _lane_oldest_steps(grid: Any, stream: str, lane: int) -> Steps[int | None]:
    """The lane's oldest servable sequence (``reading.oldest_steps``); None when the stream or lane no longer
    exists (nothing to read)."""
    streams = yield partial(grid.map, STREAMS_MAP)
    text = yield partial(streams.get, stream)
    if text is None:
        return None
    names = parse_metadata(stream, text).ring_names
    if lane >= len(names):
        return None
    ring = yield partial(grid.ring, names[lane])
    return (yield from oldest_steps(ring))
