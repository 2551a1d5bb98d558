"""What each transaction step writes, decided from what was read: the one source of truth for the synchronous steps
(``meteor_spark.grid.transactions``) and the awaited ones (``meteor_spark.aio.txn_grid``), which only make the grid
calls around these functions.

Every function here is pure: it takes the stored text (or the values read) and the caller's clock reading, and
returns what to write, or raises the step's error. The compare-and-set loops, and which map holds what, are the
callers'; the rules (a decision is final, whichever compare-and-set lands first decides, a reader aborts only past
the deadline, which lane ranges a commit records) are here, once.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from meteor_spark.errors import MeteorError, TransactionAbortedError
from meteor_spark.grid.transaction_state import (
    ABORTED,
    ABORTED_RETENTION_MS,
    COMMITTED,
    KEEP_BATCHES,
    LEGACY_RETENTION_MS,
    OPEN,
    SWEPT_KEY,
    TXNS_MAP,
    TxnState,
)
from meteor_spark.grid.txn_retention import old_batches

logger = logging.getLogger("meteor_spark.grid.transactions")

__all__ = [
    "AbortStep",
    "abort_step",
    "batches_to_remove",
    "because",
    "begin_step",
    "commit_check",
    "committed_lanes",
    "committed_state",
    "expired",
    "late_open_entries",
    "moved_past",
    "open_entry",
    "open_entry_value",
    "parse_states",
    "producers_to_remove",
    "retention_verdict",
    "timeout_reason",
]


def because(state: TxnState) -> str:
    return f" ({state.reason})" if state.reason else ""


def open_entry(key: str, stream: str) -> str:
    """The ``meteor.txn.open`` key of transaction ``key`` in ``stream``."""
    return f"{key}\t{stream}"


def open_entry_value(stream: str, tails: list[int]) -> str:
    """The ``meteor.txn.open`` value: the stream's lane tails read just before the transaction's first record."""
    return json.dumps({"stream": stream, "tails": tails}, separators=(",", ":"))


def begin_step(key: str, current: str | None, deadline_ms: int) -> str | None:
    """What ``begin`` writes to the transaction's entry: the open state with ``deadline_ms`` (``put_if_absent`` when
    ``current`` is None, else compare-and-set against ``current``); None when the stored deadline is already later.

    Raises:
        TransactionAbortedError: the transaction is decided already (a task attempt cannot join it).
    """
    if current is None:
        return TxnState(key, OPEN, deadline_ms).to_json()
    state = TxnState.parse(key, current)
    if state.decided:
        raise TransactionAbortedError(
            f"transaction {key!r} is already {state.state}{because(state)}; a task attempt cannot join it. "
            f"Spark retries the batch under a new transaction once this one fails"
        )
    return None if state.deadline_ms >= deadline_ms else TxnState(key, OPEN, deadline_ms).to_json()


def commit_check(key: str, current: str | None, producers: frozenset[int]) -> TxnState:
    """The stored state ``commit`` may go on from: open (to be committed), or committed already with the same
    producers (a retried commit: nothing to write).

    Raises:
        MeteorError: no such transaction. TransactionAbortedError: decided first (aborted, or committed with other
            producers).
    """
    if current is None:
        raise MeteorError(f"cannot commit transaction {key!r}: it does not exist in map {TXNS_MAP!r}")
    state = TxnState.parse(key, current)
    if state.decided and not (state.state == COMMITTED and state.producers == producers):
        raise TransactionAbortedError(
            f"cannot commit transaction {key!r}: it was {state.state} first{because(state)}; its records are "
            f"not delivered to read_committed readers. The batch fails; a restart replays it under a new "
            f"transaction (raise transactionTimeoutMs if batches take longer than it)"
        )
    return state


def committed_state(
    state: TxnState,
    producers: frozenset[int],
    now_ms: int,
    lanes: tuple[tuple[str, int, int, int], ...] | None,
    offsets: Iterable[str],
) -> TxnState:
    """What ``commit`` writes over the open ``state``: committed with ``producers``, the lane ranges it may occupy
    and the group offsets it staged (kept by the sweep until they are applied)."""
    staged = tuple(sorted(set(offsets)))
    return TxnState(state.key, COMMITTED, state.deadline_ms, producers, "", now_ms, lanes, staged)


@dataclass(frozen=True)
class AbortStep:
    """``abort``'s verdict: ``write`` the aborted state (compare-and-set), or nothing (``final`` is the state)."""

    final: TxnState | None
    write: TxnState | None


def abort_step(key: str, current: str | None, reason: str, now_ms: int, only_expired_at_ms: int | None) -> AbortStep:
    """Abort unless decided already (or, with ``only_expired_at_ms``, unless the deadline is not before it)."""
    if current is None:
        return AbortStep(None, None)
    state = TxnState.parse(key, current)
    if state.decided or (only_expired_at_ms is not None and state.deadline_ms >= only_expired_at_ms):
        return AbortStep(state, None)
    return AbortStep(None, TxnState(key, ABORTED, state.deadline_ms, reason=reason, decided_ms=now_ms))


def expired(state: TxnState | None, now_ms: int) -> bool:
    """An open transaction past its deadline: a reader aborts it."""
    return state is not None and not state.decided and state.deadline_ms < now_ms


def timeout_reason(now_ms: int) -> str:
    return f"timed out (open past its deadline, seen at {now_ms} ms)"


def committed_lanes(
    opened: Mapping[str, str], tails_of: Mapping[str, list[int]]
) -> tuple[tuple[str, int, int, int], ...] | None:
    """Per lane of each stream the transaction noted (``opened``: its ``meteor.txn.open`` entries), the sequences
    ``(after, last]`` its items can occupy: above the tails noted at ``begin``, up to the tails now (``tails_of``:
    stream -> tails read at commit). Lanes that did not move drop out. None when an entry predates the noted tails."""
    lanes: list[tuple[str, int, int, int]] = []
    for entry, value in opened.items():
        stream = entry.rpartition("\t")[2]
        try:
            noted = json.loads(value)["tails"]
        except (ValueError, KeyError, TypeError):
            return None
        for lane, last in enumerate(tails_of.get(stream, [])):
            after = int(noted[lane]) if lane < len(noted) else -1  # a lane not noted: from its start
            if last > after:
                lanes.append((stream, lane, after, last))
    return tuple(lanes)


# --------------------------------------------------------------------------------------------------- the sweep


def parse_states(raw: Mapping[str, str]) -> dict[str, TxnState]:
    """The transactions of a snapshot of map ``meteor.txns``; one that does not parse is logged and left in place:
    the sweep removes only what it can judge."""
    states: dict[str, TxnState] = {}
    for key, text in raw.items():
        try:
            states[key] = TxnState.parse(key, text)
        except MeteorError as exc:
            logger.warning("%s; left in place", exc)
    return states


def late_open_entries(
    open_keys: Iterable[str], states: Mapping[str, TxnState], absent_before: set[str]
) -> tuple[set[str], set[str]]:
    """``meteor.txn.open`` entries whose transaction is missing now, and those missing at the previous sweep too:
    not a ``begin`` between its two writes, but an entry written for a transaction already decided and removed (a
    late task attempt), to remove."""
    absent = {entry for entry in open_keys if entry.rpartition("\t")[0] not in states}
    return absent, absent & absent_before


def retention_verdict(state: TxnState, now_ms: int) -> bool | None:
    """Whether the sweep may remove ``state`` by its state and age alone; None for a committed transaction with
    recorded lanes: removable once no staged offset names it and every lane it wrote moved past it (``moved_past``)."""
    if state.state == ABORTED:
        return now_ms - (state.decided_ms or state.deadline_ms) >= ABORTED_RETENTION_MS
    if state.state != COMMITTED:
        return False
    if state.lanes is None:
        return now_ms - state.deadline_ms >= LEGACY_RETENTION_MS
    return None


def moved_past(oldest: int | None, last: int) -> bool:
    """A lane whose oldest servable sequence is ``oldest`` (None: the lane is gone) no longer serves sequence
    ``last``."""
    return oldest is None or oldest > last


def producers_to_remove(
    producers: Mapping[str, str], raw: Mapping[str, str], removed: set[str]
) -> list[tuple[str, str]]:
    """``(producer, transaction key)`` entries of ``meteor.txn.producers`` whose transaction is gone."""
    return [(p, key) for p, key in producers.items() if p != SWEPT_KEY and (key not in raw or key in removed)]


def batches_to_remove(
    batches: Mapping[str, str], states: Mapping[str, TxnState], removed: set[str]
) -> list[tuple[str, str]]:
    """``(batch key, transaction key)`` entries of ``meteor.txn.batches`` beyond the last ``KEEP_BATCHES`` of their
    sink and query whose transaction is decided or gone."""
    out = []
    for batch_key in old_batches(dict(batches), KEEP_BATCHES):
        key = batches[batch_key]
        state = states.get(key)
        if state is None or state.decided or key in removed:
            out.append((batch_key, key))
    return out
