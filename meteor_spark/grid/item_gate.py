"""The item gate: which decoded ring items a reader passes on (isolation and duplicate filtering, one place).

Used by the core ``Subscriber`` (on every item it buffers) and by Spark's executors and driver. Per item, from its
header alone (``wire.ItemProducer``):

1. **Isolation.** ``read_uncommitted`` (default, Kafka's default too) passes every item. ``read_committed`` passes
   a transactional item (wire flag 0x10) only when its transaction committed its producer id; an item of an
   aborted transaction, or of a producer the commit left out (a failed or superseded task attempt), is
   dropped (``aborted_items`` / ``aborted_records``). At an item of a transaction still open the lane waits
   (``WAIT``): nothing at or after it is passed on until the transaction is decided (the lane's *last stable
   offset*, Kafka's LSO). A transaction open past its deadline is aborted by the reader (``transactions``).
   Decided transactions are cached for good (a decision never changes); open ones are looked up again at most
   every ``RECHECK_S``. Items without the flag pass as they are.
2. **Duplicates.** Per lane, per producer id, the highest ``producer_seq`` passed on is remembered; an item whose
   ``producer_seq`` is not above it is a re-sent copy (a publisher retry that had in fact been stored) and is
   dropped (``duplicate_items`` / ``duplicate_records``). Producer id 0 (version 0 items, unknown writer) is never
   deduplicated. The memory is per gate and lane: the Subscriber's lives as long as the subscriber, a Spark
   task's covers the ring items the task reads. When a lane's reader moves back (a seek, a lane assigned again at
   the group's confirmed offset: a ring sequence not above the last one checked), the lane's memory is dropped,
   so records a reader is *meant* to read again are not taken for copies. A lane remembers at most
   ``PRODUCERS_PER_LANE`` producers, the ones that passed an item most recently: a producer id names one
   publisher (one Spark task attempt), and a re-sent copy follows its original within the publisher's delivery
   timeout, so a producer that many others have written after is one the reader can no longer meet again.

A transactional item whose producer or transaction is missing from the grid's maps is dropped as aborted when the
maps were swept (``transactions.sweep`` removes a committed transaction only once none of its items can be read,
so only aborted ones can be missing); otherwise it is an error (the grid lost the maps). A ``read_committed``
gate also clears stale open-transaction entries now and then (``transactions.clear_stale_if_due``): they are
cleared by every kind of reader, not only by Spark planning.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Protocol

from meteor_spark.errors import ConfigError, FormatError, MeteorError
from meteor_spark.format.item_header import item_producer
from meteor_spark.grid import transactions
from meteor_spark.grid.client import Grid
from meteor_spark.grid.reading import read_range
from meteor_spark.grid.streams import StreamInfo
from meteor_spark.grid.transactions import TxnState

logger = logging.getLogger(__name__)

READ_UNCOMMITTED = "read_uncommitted"
READ_COMMITTED = "read_committed"
ISOLATIONS = (READ_UNCOMMITTED, READ_COMMITTED)

DELIVER = "deliver"
ABORTED = "aborted"
DUPLICATE = "duplicate"
WAIT = "wait"

#: How often an open transaction is looked up again while a lane waits at it.
RECHECK_S = 0.05

#: Producers a gate remembers per lane for spotting re-sent copies (the most recent ones).
PRODUCERS_PER_LANE = 1024


class ProducerFields(Protocol):
    """What the gate reads of an item: ``wire.ItemProducer`` (header only) or a decoded ``wire.ItemView``."""

    @property
    def producer_id(self) -> int: ...
    @property
    def producer_seq(self) -> int: ...
    @property
    def transactional(self) -> bool: ...
    @property
    def count(self) -> int: ...


def parse_isolation(value: str | None, name: str = "isolation") -> str:
    """``read_committed`` or ``read_uncommitted`` (None: the default, ``read_uncommitted``).

    Raises:
        ConfigError: any other value (named, with the accepted ones).
    """
    if value is None:
        return READ_UNCOMMITTED
    if not isinstance(value, str) or value.strip().lower() not in ISOLATIONS:
        raise ConfigError(f"{name} {value!r} is not supported; use one of {', '.join(ISOLATIONS)}")
    return value.strip().lower()


class KnownTransactions:
    """What never changes once known: producer id -> transaction key, and decided transactions. Shared by the
    gates of one process that read one grid (Spark tasks of a Python worker), so each producer's transaction is
    looked up once per process, not once per task. Forgotten wholesale past ``limit`` entries."""

    def __init__(self, limit: int = 100_000) -> None:
        self.limit = limit
        self.txn_of: dict[int, str] = {}
        self.decided: dict[str, TxnState] = {}

    def trim(self) -> None:
        if len(self.txn_of) + len(self.decided) > self.limit:
            self.txn_of.clear()
            self.decided.clear()


class ItemGate:
    """Decides, item by item, what a reader passes on (see the module docs). Not thread-safe: one reader's.

    Attributes:
        isolation: ``read_committed`` or ``read_uncommitted``.
        aborted_items, aborted_records: dropped as aborted (read_committed only).
        duplicate_items, duplicate_records: dropped as re-sent copies.
    """

    def __init__(
        self,
        grid: Grid,
        isolation: str | None = READ_UNCOMMITTED,
        *,
        clock: Callable[[], float] = time.monotonic,
        abort_expired: bool = True,
        known: KnownTransactions | None = None,
    ) -> None:
        self._grid = grid
        self._abort_expired = abort_expired  # False for tools that only look (lag reports)
        self.isolation = parse_isolation(isolation)
        self.read_committed = self.isolation == READ_COMMITTED
        self._clock = clock
        self._known = known if known is not None else KnownTransactions()
        self._known.trim()
        self._txn_of = self._known.txn_of  # producer id -> transaction key (never changes)
        self._decided = self._known.decided  # transaction key -> final state
        self._open: dict[str, tuple[float, TxnState]] = {}  # transaction key -> (when looked up, state)
        # Lanes are keys: a lane number (one stream), or (stream, lane) for a reader of several streams.
        # lane -> producer id -> highest producer_seq passed on (most recent last)
        self._last_seq: dict[Hashable, OrderedDict[int, int]] = {}
        self._last_checked: dict[Hashable, int] = {}  # lane -> ring sequence of the last item decided
        self._held: dict[Hashable, float] = {}  # lane -> clock time until which it waits at an open transaction
        self.aborted_items = 0
        self.aborted_records = 0
        self.duplicate_items = 0
        self.duplicate_records = 0

    # ------------------------------------------------------------------------------------------------ verdicts

    def check(self, lane: Hashable, sequence: int, producer: ProducerFields) -> str:
        """``DELIVER``, ``ABORTED``, ``DUPLICATE`` or ``WAIT`` for the item at ring ``sequence`` of ``lane``; what
        is passed on is remembered (duplicates), what is dropped is counted.

        Raises:
            MeteorError: a transactional item whose producer is registered under no transaction (the grid lost
                the transaction maps, e.g. a restart without persistence); read it ``read_uncommitted``.
        """
        state: TxnState | None = None
        if self.read_committed and self._abort_expired:
            transactions.clear_stale_if_due(self._grid)
        if self.read_committed and producer.transactional:
            state = self.transaction(producer.producer_id)
            if not state.decided:
                return WAIT
        last_checked = self._last_checked.get(lane)
        if last_checked is not None and sequence <= last_checked:
            self._last_seq.pop(lane, None)  # the reader moved back: it means to read these items again
        self._last_checked[lane] = sequence
        if state is not None and not state.delivers(producer.producer_id):
            self.aborted_items += 1
            self.aborted_records += producer.count
            return ABORTED
        if producer.producer_id == 0:
            return DELIVER
        seen = self._last_seq.get(lane)
        if seen is None:
            seen = self._last_seq[lane] = OrderedDict()
        last = seen.get(producer.producer_id)
        if last is not None and producer.producer_seq <= last:
            self.duplicate_items += 1
            self.duplicate_records += producer.count
            # Logged, not only counted: a writer that broke the rising-sequence rule would lose records here.
            logger.warning(
                "lane %s: dropped the ring item at sequence %d (%d records) as a re-sent copy: its producer %d "
                "sequence %d is not above %d, already passed on",
                lane,
                sequence,
                producer.count,
                producer.producer_id,
                producer.producer_seq,
                last,
            )
            return DUPLICATE
        seen[producer.producer_id] = producer.producer_seq
        seen.move_to_end(producer.producer_id)
        if len(seen) > PRODUCERS_PER_LANE:
            seen.popitem(last=False)
        return DELIVER

    # ------------------------------------------------------------------------------------------------ waiting

    def hold(self, lane: Hashable) -> None:
        """``lane`` met an open transaction: its reader reads it again after ``RECHECK_S`` (``held``)."""
        self._held[lane] = self._clock() + RECHECK_S

    def held(self, lane: Hashable) -> bool:
        until = self._held.get(lane)
        if until is None:
            return False
        if self._clock() >= until:
            del self._held[lane]
            return False
        return True

    def hold_left(self) -> float:
        """Seconds until the first held lane may be read again (infinity when none is held)."""
        if not self._held:
            return float("inf")
        return max(0.0, min(self._held.values()) - self._clock())

    # ------------------------------------------------------------------------------------------------ transactions

    def transaction(self, producer_id: int) -> TxnState:
        """The state of the transaction of ``producer_id``: decided (cached for good) or open (looked up again
        after ``RECHECK_S``); an open one past its deadline is aborted here."""
        key = self._txn_of.get(producer_id)
        if key is None:
            key = transactions.transaction_of_producer(self._grid, producer_id)
            if key is None:
                if transactions.swept(self._grid):
                    return self._removed(producer_id, f"producer {producer_id}")
                raise MeteorError(
                    f"a transactional ring item of producer {producer_id} has no transaction: the producer is not "
                    f"registered in map {transactions.PRODUCERS_MAP!r} (was the grid restarted without "
                    f"persistence?). Its records cannot be read read_committed; read them with "
                    f"isolation=read_uncommitted"
                )
            self._txn_of[producer_id] = key
        decided = self._decided.get(key)
        if decided is not None:
            return decided
        now = self._clock()
        seen = self._open.get(key)
        if seen is not None and now - seen[0] < RECHECK_S:
            return seen[1]
        state = transactions.state_of(self._grid, key)
        if state is None:
            if transactions.swept(self._grid):
                return self._removed(producer_id, f"transaction {key!r}")
            raise MeteorError(
                f"transaction {key!r} of producer {producer_id} is missing from map {transactions.TXNS_MAP!r} (was "
                f"the grid restarted without persistence?); read with isolation=read_uncommitted"
            )
        if self._abort_expired and not state.decided and state.deadline_ms < int(time.time() * 1000):
            state = transactions.abort_expired(self._grid, key) or state
        if state.decided:
            self._open.pop(key, None)
            self._decided[key] = state
        else:
            self._open[key] = (now, state)
        return state

    def _removed(self, producer_id: int, what: str) -> TxnState:
        """The stand-in decision for an item whose transaction the maps no longer hold: aborted (see the module
        docs), cached like any decision."""
        key = f"(removed: producer {producer_id})"
        state = TxnState(key, transactions.ABORTED, 0, reason=f"{what} was removed from the transaction maps")
        self._txn_of[producer_id] = key
        self._decided[key] = state
        return state

    @property
    def aborts_expired(self) -> bool:
        """False for tools that only look: they never abort a transaction or sweep the maps."""
        return self._abort_expired

    def counters(self) -> dict[str, int]:
        return {
            "aborted_items": self.aborted_items,
            "aborted_records": self.aborted_records,
            "duplicate_items": self.duplicate_items,
            "duplicate_records": self.duplicate_records,
        }


def stable_end(
    gate: ItemGate, grid: Grid, info: StreamInfo, lane: int, start: int, end: int, *, items_per_read: int = 256
) -> int:
    """The lane's last stable sequence in ``[start, end)``: the first ring item of a transaction still open (or
    ``end`` when there is none), from the items' headers. With ``read_uncommitted``, ``end`` (nothing read); also
    when no transaction is open in the stream (``transactions.open_in``; ``end`` must have been read before this
    call), so a stream without open transactions costs one map listing, not a scan.

    Items below ``start`` that the grid no longer serves, and undecodable items, are passed over (the reader
    reports them itself).
    """
    if (
        not gate.read_committed
        or start >= end
        or not transactions.open_in(grid, info.name, abort_expired=gate.aborts_expired)
    ):
        return end
    for items, sequences in read_range(
        grid, info, lane, start, end, max_items_per_call=items_per_read, skip_data_loss=True
    ):
        for item, sequence in zip(items, sequences, strict=True):
            try:
                producer = item_producer(item, stream=info.name, lane=lane, sequence=sequence)
            except FormatError:
                continue  # the reader's corrupt-item policy deals with it
            if producer.transactional and not gate.transaction(producer.producer_id).decided:
                return sequence
    return end
