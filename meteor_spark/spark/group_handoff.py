"""Group offsets committed in a transactional meteor sink's transaction (sink option ``groupOffsets``): a grouped
meteor source and a meteor sink of the same query, exactly once through the group (Kafka's
``sendOffsetsToTransaction``, here for a Spark query).

What the sink's commit needs, per lane the micro-batch read from an exclusive group: the batch's end (the group's
next offset once the batch is done), the lease epoch the source runner held the lane with when it planned the
batch, and the source runner's member id. It stages those offsets under the batch's transaction
(``meteor_spark.groups.txn_offsets.stage_as``, fenced by the epoch), commits the transaction naming them
(``transactions.commit(offsets=...)``: records and offsets in one decision), then applies them (``apply_as``).

Why through the grid, and why from the read tasks: Spark runs the source runner and the sink's commit in two
different Python processes, and the source runner never learns the query id or the batch id. The read tasks do
(local properties of the batch's job: ``sql.streaming.queryId``, ``streaming.sql.batchId``, and the run id
``spark.jobGroup.id``, which the sink's tasks see too) and they carry what the source runner planned
(``LaneRange.handoff``). So each read task records its lanes before it hands out a row, in map
``meteor.group.handoff`` under ``<query id>/<run id>``::

    {"batch": 7, "lanes": [["orders", "billing", 0, 1245184, 3, "spark-host-4711-1a2b", [18, 2868764981]]]}

(stream, group, lane, end offset, epoch, member id, item mark of the item before the end). Every task of the
batch merges into the one entry (compare-and-set); the first task of a later batch replaces it. The sink's commit
runs after every task of the batch succeeded, so the entry is complete when it reads it, and removes it once the
batch is committed. Bounded: one entry per query run, with a TTL (``HANDOFF_TTL_S``) for runs that never commit
(a query whose sink is not meteor, a killed driver). The run id in the key keeps a replay of the same batch by a
later run of the query (new epochs) apart from the entry of the run that died.

Fencing: a lane taken over since the batch was planned (a standby query, or the query restarted with a new
checkpoint, took it) carries a newer epoch; staging is refused, the transaction is aborted and the commit fails
with ``FencedError`` (Kafka's ``ProducerFencedException``): nothing of the batch reaches ``read_committed``
readers, and the new holder reads those records from the group's offset. A holder that takes the lane over after
the offsets were staged aborts the still-open transaction itself (``txn_offsets.settle``), or rolls a committed
one forward: nothing is read twice, nothing lost.

The source's own confirm of the batch (``DriverState.confirm`` in ``latestOffset`` and ``commit``) comes after the
sink's commit and finds the offset applied already: confirms only move forward, so it writes nothing.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from meteor_spark.errors import ConfigError, FencedError, GridError, GroupError, MeteorError
from meteor_spark.grid import transactions
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.item_marks import ItemMark
from meteor_spark.groups.txn_offsets import apply_as, stage_as
from meteor_spark.spark.clients import grid_for

logger = logging.getLogger(__name__)

HANDOFF_MAP = "meteor.group.handoff"
#: An entry nobody commits (the sink is not meteor, or the run died) leaves this long after its last batch.
HANDOFF_TTL_S = 24 * 3600
#: ``groupOffsets`` values: stage when the batch read a grouped meteor source; require it; never.
MODES = ("auto", "true", "false")

_CAS_ATTEMPTS = 100


def parse_mode(value: str | None, transactional: bool) -> str:
    """The sink option ``groupOffsets`` checked against ``transactional``.

    Raises:
        ConfigError: an unknown value, or ``true`` on a sink with ``transactional=false``.
    """
    mode = "auto" if value is None else value.strip().lower()
    if mode not in MODES:
        raise ConfigError(f"option 'groupOffsets': expected {' | '.join(MODES)}, got {value!r}")
    if mode == "true" and not transactional:
        raise ConfigError(
            "option 'groupOffsets=true' needs transactional=true: a group's offsets are committed in the sink's "
            "transaction. Drop one of the two options"
        )
    return mode if transactional else "false"


@dataclass(frozen=True)
class LaneHandoff:
    """One lane of a micro-batch read from an exclusive group, as the source runner planned it.

    Attributes:
        stream, group, lane: where.
        offset: the record offset the group's offset moves to once the batch is done (its end).
        epoch: the lease epoch the source runner held the lane with; None: not held when the batch was planned.
        member: the source runner's member id (the writer named in the offsets entry).
        mark: the item mark of the item before the end (stored with the offset), None when unknown.
    """

    stream: str
    group: str
    lane: int
    offset: int
    epoch: int | None
    member: str
    mark: ItemMark | None = None

    def encode(self) -> list[Any]:
        mark = None if self.mark is None else self.mark.encode()
        return [self.stream, self.group, self.lane, self.offset, self.epoch, self.member, mark]

    @classmethod
    def decode(cls, raw: Sequence[Any]) -> LaneHandoff:
        stream, group, lane, offset, epoch, member, mark = raw
        return cls(
            str(stream),
            str(group),
            int(lane),
            int(offset),
            None if epoch is None else int(epoch),
            str(member),
            ItemMark.decode(mark),
        )

    @property
    def where(self) -> str:
        return f"lane {self.lane} of stream {self.stream!r} in group {self.group!r}"


def _key(query_id: str, run_id: str) -> str:
    return f"{query_id}/{run_id}"


def _dumps(batch: int, lanes: Iterable[LaneHandoff]) -> str:
    unique = {(h.stream, h.group, h.lane): h for h in lanes}
    body = {"batch": batch, "lanes": [unique[k].encode() for k in sorted(unique)]}
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def _loads(text: str) -> tuple[int, list[LaneHandoff]]:
    try:
        body = json.loads(text)
        return int(body["batch"]), [LaneHandoff.decode(raw) for raw in body["lanes"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise MeteorError(f"an entry of map {HANDOFF_MAP!r} is unreadable ({exc}): {text[:200]!r}") from None


def record_task(settings: GridSettings, lanes: Sequence[LaneHandoff]) -> None:
    """What a read task calls before it hands out rows: records ``lanes`` under its query run and micro-batch
    (Spark's local properties of the task's job). Nothing outside a streaming query (no batch id there)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None or not lanes:
        return
    query_id = context.getLocalProperty("sql.streaming.queryId")
    run_id = context.getLocalProperty("spark.jobGroup.id")
    batch = context.getLocalProperty("streaming.sql.batchId")
    if query_id is None or run_id is None or batch is None:
        return
    record(grid_for(settings), lanes, query_id, run_id, int(batch))


def record(grid: Grid, lanes: Sequence[LaneHandoff], query_id: str, run_id: str, batch: int) -> None:
    """A read task of micro-batch ``batch`` records the group lanes it reads (merged with its batch's other
    tasks; an entry of an earlier batch is replaced, one of a later batch left alone: a late task)."""
    handoffs = grid.map(HANDOFF_MAP)
    key = _key(query_id, run_id)
    for _ in range(_CAS_ATTEMPTS):
        current = handoffs.get(key)
        if current is None:
            if handoffs.put_if_absent(key, _dumps(batch, lanes), HANDOFF_TTL_S) is None:
                return
            continue
        known_batch, known = _loads(current)
        if known_batch > batch:
            return
        merged = _dumps(batch, [*known, *lanes] if known_batch == batch else lanes)
        if merged == current:
            return
        if handoffs.replace_if_same(key, current, merged):
            handoffs.set_ttl(key, HANDOFF_TTL_S)
            return
    raise MeteorError(f"could not record micro-batch {batch}'s group lanes under {key!r}: too many concurrent tasks")


def lanes_for(
    grid: Grid, mode: str, query_id: str | None, run_id: str | None, batch: int, published: bool
) -> tuple[LaneHandoff, ...]:
    """The group lanes micro-batch ``batch`` read, whose offsets its transaction commits (empty with
    ``groupOffsets=false``, or when the batch read no grouped meteor source).

    Raises:
        ConfigError: ``groupOffsets=true`` and the batch published rows without reading a grouped meteor source.
    """
    if mode == "false" or query_id is None or run_id is None:
        lanes: list[LaneHandoff] = []
    else:
        text = grid.map(HANDOFF_MAP).get(_key(query_id, run_id))
        known_batch, lanes = (-1, []) if text is None else _loads(text)
        lanes = lanes if known_batch == batch else []
    if mode == "true" and published and not lanes:
        raise ConfigError(
            f"groupOffsets=true, but micro-batch {batch} published rows without reading an exclusive group of a "
            f"meteor stream in this query (option 'group' on the meteor source, without shared=true); set "
            f"groupOffsets=auto or false for this query"
        )
    return tuple(lanes)


def commit(
    grid: Grid, txn: str, producers: Sequence[int], lanes: Sequence[LaneHandoff], batch: int, sweep_s: float
) -> None:
    """Commit ``txn`` with ``producers`` and the group offsets of ``lanes``: staged (fenced), committed with the
    records in one decision, then applied.

    Raises:
        FencedError: see ``stage``. TransactionAbortedError: ``txn`` was aborted first (timed out, fenced by a newer
            run of the query, or by a lane's new holder that found its offsets staged).
    """
    offsets = stage(grid, txn, lanes, batch)
    decided = transactions.commit(grid, txn, producers, offsets=offsets, sweep_interval_s=sweep_s)
    apply(grid, txn, lanes)
    note = f" and the offsets of {describe(lanes)}" if lanes else ""
    logger.info("transaction %r committed with %d producers%s", txn, len(decided.producers), note)


def stage(grid: Grid, txn: str, lanes: Sequence[LaneHandoff], batch: int) -> list[str]:
    """Stage each lane's end under ``txn``; returns the offsets entries' keys for ``transactions.commit``.

    Raises:
        FencedError: a lane was taken over since the batch was planned (or was not held then); ``txn`` is
            aborted first, so nothing of the batch is delivered to ``read_committed`` readers.
    """
    keys = []
    for handoff in lanes:
        try:
            if handoff.epoch is None:
                raise FencedError(
                    f"member {handoff.member!r} did not hold {handoff.where} when it planned the batch (another "
                    f"member held it)"
                )
            keys.append(
                stage_as(
                    grid,
                    handoff.stream,
                    handoff.group,
                    handoff.lane,
                    handoff.offset,
                    txn,
                    epoch=handoff.epoch,
                    member=handoff.member,
                    mark=handoff.mark,
                )
            )
        except GroupError as exc:
            transactions.abort(grid, txn, f"fenced: its group offsets could not be staged ({exc})")
            raise FencedError(
                f"micro-batch {batch}: transaction {txn!r} aborted, its records are never delivered to "
                f"read_committed readers: {exc}. The lane's current holder reads them from the group's offset; "
                f"this query stops (restart it to follow the group again)"
            ) from exc
    return keys


def apply(grid: Grid, txn: str, lanes: Sequence[LaneHandoff]) -> None:
    """After ``txn`` committed: move each lane's offset to its staged end. A failure loses nothing (logged): the
    lane's next holder, or the next staging on it, rolls the committed offset forward."""
    for handoff in lanes:
        assert handoff.epoch is not None  # stage() refused the batch otherwise
        try:
            apply_as(grid, handoff.stream, handoff.group, handoff.lane, txn, epoch=handoff.epoch, member=handoff.member)
        except (GroupError, GridError) as exc:
            logger.info("offset of committed transaction %r on %s left to roll forward: %s", txn, handoff.where, exc)


def forget(grid: Grid, query_id: str | None, run_id: str | None, batch: int) -> None:
    """Remove the entry of a committed micro-batch (left when a later batch already replaced it)."""
    if query_id is None or run_id is None:
        return
    handoffs = grid.map(HANDOFF_MAP)
    key = _key(query_id, run_id)
    text = handoffs.get(key)
    if text is not None and _loads(text)[0] == batch:
        handoffs.remove_if_same(key, text)


def describe(lanes: Sequence[LaneHandoff]) -> str:
    """The group offsets a commit carried, for its log line."""
    by_group: dict[tuple[str, str], list[str]] = {}
    for h in lanes:
        by_group.setdefault((h.stream, h.group), []).append(f"{h.lane}->{h.offset}")
    return "; ".join(f"group {g!r} of {s!r} lanes {', '.join(parts)}" for (s, g), parts in sorted(by_group.items()))
