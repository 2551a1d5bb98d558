"""Filter pushdown of the batch reader: the ``where`` predicates Spark hands ``pushFilters``, turned into what to
read (``Selection``) and applied where the read is planned.

What each predicate does (a batch read; the streaming source gets no filters from Spark):

* ``lane = n``, ``lane IN (...)``: only those lanes are planned. Exact, so reported to Spark as pushed.
* ``key = k``, ``key IN (...)``: only the keys' lanes (``partitioning.lane_for_key``) are planned and executors keep
  only the rows with those keys. Exact for records routed by their key (the publishers' rule); a record published
  with an explicit ``lane`` unlike its key's is not found, so streams written that way turn it off with
  ``keyLanes=false`` (executors still keep only the keys' rows). Reported as pushed.
* ``timestamp >= t``, ``> t``, ``= t``: each lane starts at the ring item holding its first record at or after
  ``t`` (``grid.timestamps.offset_for_timestamp``, the search of ``startingTimestamp``); a lane with none is empty.
  Every item before it holds only older records, so nothing matching is skipped. Item-granular: Spark re-checks.
* ``timestamp < t``, ``<= t``: narrow nothing. A record may carry its own (earlier) timestamp anywhere after the
  first newer one, and the item headers cannot say where; cutting there could drop matching rows.
* ``offset`` comparisons (``=``, ``>``, ``>=``, ``<``, ``<=``): every lane's range cut to the ring items holding
  those record offsets. Item-granular: Spark re-checks.

Everything else is left to Spark, which re-applies every filter not reported as pushed: a narrowed read is a
superset of the matching rows, never a subset. ``topic`` is no column of the source (it travels in the headers),
so no topic predicate reaches ``pushFilters``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from meteor_spark.format.offsets import sequence_of
from meteor_spark.format.partitioning import lane_for_key

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow
    from pyspark.sql.datasource import Filter


@dataclass(frozen=True)
class Selection:
    """What the pushed filters let a batch read skip. ``None`` fields select everything.

    Attributes:
        lanes: the lanes ``lane`` predicates allow.
        keys: the keys ``key`` predicates allow (rows with another key are dropped on the executors).
        since_ms: the lower timestamp bound (ms since the epoch, inclusive) lanes start at.
        offset_from: the lowest record offset asked for (inclusive).
        offset_to: the record offset asked for ranges stop before (exclusive).
        pushed: the filters reported to Spark as pushed (exact), for the log.
        narrowing: the filters that only narrow the ranges (Spark re-checks them), for the log.
    """

    lanes: frozenset[int] | None = None
    keys: frozenset[bytes] | None = None
    since_ms: int | None = None
    offset_from: int | None = None
    offset_to: int | None = None
    pushed: tuple[str, ...] = ()
    narrowing: tuple[str, ...] = field(default=())

    @property
    def empty(self) -> bool:
        """True when no filter was used."""
        return not self.pushed and not self.narrowing

    def lanes_of(self, lane_count: int, *, key_lanes: bool) -> list[int]:
        """The lanes of a stream of ``lane_count`` lanes this selection reads, in order."""
        lanes = set(range(lane_count))
        if self.lanes is not None:
            lanes &= self.lanes
        if self.keys is not None and key_lanes:
            lanes &= {lane_for_key(key, lane_count) for key in self.keys}
        return sorted(lanes)

    def offset_range(self, lo: int, hi: int) -> tuple[int, int]:
        """Ring items ``[lo, hi)`` cut to the items holding the record offsets asked for (empty as ``(hi, hi)``)."""
        if self.offset_from is not None:
            lo = max(lo, sequence_of(self.offset_from))
        if self.offset_to is not None:
            hi = min(hi, sequence_of(self.offset_to - 1) + 1 if self.offset_to > 0 else 0)
        return (lo, hi) if lo <= hi else (hi, hi)

    def describe(self) -> str:
        """The filters used, for the log line of the planned read."""
        parts = []
        if self.pushed:
            parts.append("pushed " + ", ".join(self.pushed))
        if self.narrowing:
            parts.append("narrowing (re-checked by Spark) " + ", ".join(self.narrowing))
        return "; ".join(parts) or "no filter used"


def select(filters: Iterable[Filter]) -> tuple[Selection, list[Filter]]:
    """The selection the ``filters`` (ANDed) make, and the filters Spark must still apply (every filter not exact
    here, by reference, as ``pushFilters`` must return them)."""
    builder = _Builder()
    remaining: list[Filter] = []
    for one in filters:
        verdict = builder.take(one)
        if verdict != _PUSHED:
            remaining.append(one)
    return builder.selection(), remaining


_PUSHED = "pushed"
_NARROWING = "narrowing"
_UNUSED = "unused"


class _Builder:
    """Folds filters into one ``Selection`` (intersections of lanes and keys, the tightest bounds)."""

    def __init__(self) -> None:
        self.lanes: frozenset[int] | None = None
        self.keys: frozenset[bytes] | None = None
        self.since_ms: int | None = None
        self.offset_from: int | None = None
        self.offset_to: int | None = None
        self.pushed: list[str] = []
        self.narrowing: list[str] = []

    def take(self, one: Filter) -> str:
        from pyspark.sql.datasource import EqualTo, GreaterThan, GreaterThanOrEqual, In

        path: tuple[str, ...] = getattr(one, "attribute", ())
        column = path[0] if len(path) == 1 else None
        values: tuple[Any, ...] | None = None
        if isinstance(one, EqualTo):
            values = (one.value,)
        elif isinstance(one, In):
            values = tuple(one.value)
        if column == "lane" and values is not None and all(_is_int(v) for v in values):
            self.lanes = _meet(self.lanes, frozenset(int(v) for v in values))
            return self._note(one, _PUSHED)
        if column == "key" and values is not None and all(isinstance(v, bytes) for v in values):
            self.keys = _meet(self.keys, frozenset(values))
            return self._note(one, _PUSHED)
        value = getattr(one, "value", None)
        if (
            column == "timestamp"
            and isinstance(one, (EqualTo, GreaterThan, GreaterThanOrEqual))
            and isinstance(value, datetime)
            and value.tzinfo is not None
        ):
            ms = int(value.timestamp() * 1000)  # > t: the records at or after t's millisecond, a superset
            self.since_ms = ms if self.since_ms is None else max(self.since_ms, ms)
            return self._note(one, _NARROWING)
        if column == "offset" and isinstance(value, int) and not isinstance(value, bool):
            return self._offset(one, value)
        return _UNUSED

    def _offset(self, one: Filter, value: int) -> str:
        from pyspark.sql.datasource import EqualTo, GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual

        low = {EqualTo: value, GreaterThanOrEqual: value, GreaterThan: value + 1}.get(type(one))
        high = {EqualTo: value + 1, LessThan: value, LessThanOrEqual: value + 1}.get(type(one))
        if low is None and high is None:
            return _UNUSED
        if low is not None:
            low = max(0, low)
            self.offset_from = low if self.offset_from is None else max(self.offset_from, low)
        if high is not None:
            high = max(0, high)
            self.offset_to = high if self.offset_to is None else min(self.offset_to, high)
        return self._note(one, _NARROWING)

    def _note(self, one: Filter, verdict: str) -> str:
        (self.pushed if verdict == _PUSHED else self.narrowing).append(_describe(one))
        return verdict

    def selection(self) -> Selection:
        return Selection(
            lanes=self.lanes,
            keys=self.keys,
            since_ms=self.since_ms,
            offset_from=self.offset_from,
            offset_to=self.offset_to,
            pushed=tuple(self.pushed),
            narrowing=tuple(self.narrowing),
        )


def _meet(current: frozenset[Any] | None, new: frozenset[Any]) -> frozenset[Any]:
    return new if current is None else current & new


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _describe(one: Filter) -> str:
    """``lane IN (1, 2)``-style text of a filter, for the log."""
    name = ".".join(getattr(one, "attribute", ()))
    operator = {
        "EqualTo": "=",
        "GreaterThan": ">",
        "GreaterThanOrEqual": ">=",
        "LessThan": "<",
        "LessThanOrEqual": "<=",
        "In": "IN",
    }.get(type(one).__name__, type(one).__name__)
    value = getattr(one, "value", None)
    if isinstance(value, (list, tuple)):
        return f"{name} IN ({', '.join(_show(v) for v in value)})"
    return f"{name} {operator} {_show(value)}"


def _show(value: object) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    return repr(value)


def keep_keys(batch: pyarrow.RecordBatch, keys: frozenset[bytes]) -> pyarrow.RecordBatch:
    """The rows of ``batch`` whose key is one of ``keys`` (the executors' per-record check of a pushed key)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    mask = pc.is_in(batch.column("key"), value_set=pa.array(sorted(keys), pa.binary()))
    return batch.filter(pc.fill_null(mask, False))
