"""The executor side of a read: Spark tasks (``LaneRange``, ``LaneRanges``) and reading them into Arrow.

A task depends only on its partition: replays read exactly the same ring items. Each Python worker keeps one grid
client (``clients.grid_for``) for all its tasks.

Corrupt items (``onCorrupt`` / ``deadLetterStream``, one ``CorruptItemPolicy``): by default a task fails with the
``FormatError`` naming stream, lane and sequence. ``skip`` leaves the item out (counted and logged in the executor's
log); ``dead_letter`` publishes ``corrupt.dead_letter_record`` to the dead-letter stream, waiting until it is stored
before the task hands Spark the rows that follow the item. A retried task publishes it again: dead letters are
at-least-once.

Isolation and duplicates (``isolation``; ``meteor_spark.grid.item_gate``, one gate per task, the transactions it learns
shared by the tasks of a Python worker since decisions never change): items of aborted transactions
(``read_committed``) and re-sent copies of an item already read in the task (same producer id and sequence, within
the task's ranges; no look-back before a range's start) are left out before conversion. The driver plans
``read_committed`` ranges only up to each lane's last stable offset, so every transactional item a task meets is
decided and replays stay deterministic; a task that meets an open one all the same waits for its decision, bounded
by the transaction's timeout.

Truncated lanes under a running query (``LaneRange.expect``, ``_checked_start``): a member restart can lose a lane's
tail while the query runs, and new records then take the lost sequences below the query's position. A range
starting where its batch starts reads the item before it (one single-item read, sent with the range's first read)
and compares it with the mark the driver recorded for the previous batch's end: another item fails the task with
``LaneTruncatedError``, or with ``failOnDataLoss=false`` the lane is read from its oldest item (re-delivered, never
skipped). A replayed task checks again and decides the same while the lane holds the same items.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from pyspark.sql.datasource import InputPartition

from meteor_spark.consumer.refusals import Refusals
from meteor_spark.errors import FormatError, LaneTruncatedError, StreamDeletedError
from meteor_spark.format.arrow_columns import headers_to_map, items_to_arrow
from meteor_spark.format.corrupt import CorruptItemPolicy
from meteor_spark.format.item_header import item_producer
from meteor_spark.format.offsets import sequence_of
from meteor_spark.format.routing import TOPIC_HEADER, TopicMatcher
from meteor_spark.format.wire import decode_item
from meteor_spark.grid.client import GridSettings, Ring, result
from meteor_spark.grid.item_gate import DELIVER, READ_UNCOMMITTED, RECHECK_S, WAIT, ItemGate, KnownTransactions
from meteor_spark.grid.item_marks import CHANGED, GONE, SAME, ItemMark, verdict_of
from meteor_spark.grid.reading import oldest_in
from meteor_spark.grid.streams import STREAMS_MAP
from meteor_spark.spark.clients import grid_for
from meteor_spark.spark.group_handoff import LaneHandoff, record_task
from meteor_spark.spark.pushdown import keep_keys
from meteor_spark.spark.read_ahead import read_ahead
from meteor_spark.spark.typed_columns import decode_values

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

#: Ring items per grid read of an executor (each item up to a publisher batch, ~100 KB for 1000 x 100 bytes).
ITEMS_PER_READ = 32

#: Transactions known to this Python worker, per grid: shared by its tasks (decisions never change).
_KNOWN: dict[GridSettings, KnownTransactions] = {}

#: Lane ranges this Python worker found truncated and refilled under the query's position and read again from
#: their oldest item (``failOnDataLoss=false``; ``_checked_start``).
TRUNCATED_RANGES = 0

#: A ring item as a read hands it on: a memoryview of the grid's answer (``read_ahead``), or ``bytes``.
Item = bytes | memoryview

#: Rows per Arrow batch handed to Spark: 8k-64k rows measured best (reference §5); aim for the upper end.
TARGET_ROWS_PER_BATCH = 65_536


@dataclass(frozen=True)
class LaneRange(InputPartition):
    """One Spark task: ring items ``[start, end)`` of one lane.

    Attributes:
        stream: stream name.
        lane: lane number.
        start: first ring sequence to read.
        end: ring sequence to stop before (exclusive).
        grid: how the executor reaches the grid.
        info: the stream's metadata (ring names, format), so executors need no metadata lookup.
        include_headers: produce the ``headers`` column.
        fail_on_data_loss: raise ``DataLossError`` (True) or skip overwritten items (False).
        first_offset: drop the records of the first item before this record offset (a group member outside
            Spark confirmed a position inside an item); None = read whole items.
        corrupt: what to do with an undecodable ring item (error, skip, dead_letter).
        headers_as_map: the ``headers`` column as ``map<string, binary>`` (``headersAsMap``).
        stop_offset: drop the records of the last item from this record offset on (a batch read ending by time
            inside an item); None = read whole items.
        isolation: ``read_uncommitted`` or ``read_committed`` (``meteor_spark.grid.item_gate``).
        expect: the item mark the driver recorded for item ``start - 1`` (the end of the query's previous batch),
            compared with the item there before the range is read (``_checked_start``); None = not checked.
        topics: AMQP topic patterns the rows must match (``topics``); None = every row.
        keys: the keys a pushed ``key`` predicate keeps (``pushdown``); None = every row.
        value_version: ``valueFormat=avro``: the schema version the ``value`` column is decoded into
            (``typed_columns``); None = the stored bytes.
        handoff: the batch's end and lease epoch of a lane read from an exclusive group, recorded by the task for
            a meteor sink that commits the group's offsets in its transaction (``group_handoff``); None otherwise.
    """

    stream: str
    lane: int
    start: int
    end: int
    grid: GridSettings
    info: Any
    include_headers: bool = False
    fail_on_data_loss: bool = True
    first_offset: int | None = None
    corrupt: CorruptItemPolicy = CorruptItemPolicy()  # noqa: RUF009 - frozen, so one shared default is safe
    headers_as_map: bool = False
    stop_offset: int | None = None
    isolation: str = READ_UNCOMMITTED
    expect: ItemMark | None = None
    topics: tuple[str, ...] | None = None
    keys: tuple[bytes, ...] | None = None
    value_version: int | None = None
    handoff: LaneHandoff | None = None

    @property
    def items(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class LaneRanges(InputPartition):
    """One Spark task: lane ranges read one after another (``plan_tasks`` groups small ranges into one task).

    Attributes:
        ranges: the ranges, in stream, lane, start order.
    """

    ranges: tuple[LaneRange, ...]

    @property
    def items(self) -> int:
        return sum(r.items for r in self.ranges)


class ReadsLaneRanges:
    """``read()`` shared by the streaming and batch readers: runs on executors, depends only on the partition."""

    def read(self, partition: InputPartition) -> Iterator[pyarrow.RecordBatch]:
        """The rows of one task. A plan with no task (a batch read whose range is empty in every lane) reaches
        here as Spark's one placeholder partition, ``InputPartition(None)``: it holds no rows."""
        if isinstance(partition, (LaneRange, LaneRanges)):
            ranges = (partition,) if isinstance(partition, LaneRange) else partition.ranges
            handoffs = [r.handoff for r in ranges if r.handoff is not None]
            if handoffs:  # before any row is handed out: the sink's commit comes after every task's rows
                record_task(ranges[0].grid, handoffs)
            return read_lane_ranges(ranges)
        if getattr(partition, "value", None) is None:
            return iter(())
        raise TypeError(f"not a meteor read task: {partition!r}")


def read_lane_ranges(ranges: Sequence[LaneRange]) -> Iterator[pyarrow.RecordBatch]:
    """Read exactly the ring items of each range, in order, as Arrow record batches of up to ~64k rows.

    One prefetch thread reads ahead across range boundaries, so a task of several small ranges keeps the network
    busy while it decodes. A batch never mixes two ranges (``items_to_arrow`` converts items of one lane).

    An undecodable item fails the task (``FormatError`` naming stream, lane and sequence) unless the range's
    corrupt-item policy says otherwise; items are validated one by one only when a conversion failed, so good
    data pays nothing for the policy.
    """
    task = _TaskRows(ranges)
    try:
        yield from task.batches()
    finally:
        task.close()


class _TaskRows:
    """The rows of one task: its ranges' items, passed through the isolation gate, converted in batches sized
    from the rows per item seen so far."""

    def __init__(self, ranges: Sequence[LaneRange]) -> None:
        self.ranges = ranges
        self.gates: dict[tuple[GridSettings, str], ItemGate] = {}
        self.items_per_batch = 64  # adapted after each batch, from the rows per item actually seen
        self.part: LaneRange | None = ranges[0] if ranges else None
        self.first_offset: int | None = None
        self.pending_items: list[Item] = []
        self.pending_sequences: list[int] = []
        self.refused = _RefusedItems()

    def batches(self) -> Iterator[pyarrow.RecordBatch]:
        current = -1
        for index, items, sequences in _prefetched(self._chunks()):
            if index != current:
                if self.pending_items:
                    yield from self._nonempty(self._convert(len(self.pending_items)))  # the previous range's rest
                current, self.part = index, self.ranges[index]
                self.first_offset = self.part.first_offset
                # The item holding first_offset may have been skipped as overwritten (failOnDataLoss=false).
                if self.first_offset is not None and sequences[0] != sequence_of(self.first_offset):
                    self.first_offset = None
            self.pending_items.extend(items)
            self.pending_sequences.extend(sequences)
            while len(self.pending_items) >= self.items_per_batch:
                count = self.items_per_batch
                batch = self._convert(count)
                if batch is None:
                    continue
                self.items_per_batch = _items_for_target(batch.num_rows, count)
                yield from self._nonempty(batch)
        if self.pending_items:
            yield from self._nonempty(self._convert(len(self.pending_items)))

    def close(self) -> None:
        self.refused.close()
        for gate in self.gates.values():
            if gate.aborted_items or gate.duplicate_items:
                logger.info(
                    "left out %d records of aborted transactions and %d records re-sent (%d and %d ring items)",
                    gate.aborted_records,
                    gate.duplicate_records,
                    gate.aborted_items,
                    gate.duplicate_items,
                )

    def _chunks(self) -> Iterator[tuple[int, list[Item], list[int]]]:
        """(range index, items, sequences) of every grid read, the items the isolation gate passes only. The item
        before each range with an expected mark is read at the start, all at once (``_mark_reads``)."""
        checks = _mark_reads(self.ranges)
        for index, part in enumerate(self.ranges):
            gate = self.gates.get((part.grid, part.isolation))
            if gate is None:
                known = _KNOWN.setdefault(part.grid, KnownTransactions())
                gate = self.gates[(part.grid, part.isolation)] = ItemGate(
                    grid_for(part.grid), part.isolation, known=known
                )
            for items, sequences in _range_reads(part, checks.get(index)):
                items, sequences = _passed(gate, part, items, sequences)
                if items:
                    yield index, items, sequences

    @staticmethod
    def _nonempty(batch: pyarrow.RecordBatch | None) -> Iterator[pyarrow.RecordBatch]:
        if batch is not None and batch.num_rows:
            yield batch

    def _convert(self, count: int) -> pyarrow.RecordBatch | None:
        """The next ``count`` pending items as rows, cut at the range's stop offset, headers shaped as asked."""
        part = self.part
        assert part is not None
        batch = self._decode(count)
        if batch is None:
            return None
        if part.value_version is not None:
            refusals = None if part.corrupt.is_error else self.refused.refusals_for(part)
            keep = part.include_headers or part.topics is not None
            batch = decode_values(batch, grid_for(part.grid), part, refusals, keep_headers=keep)
        if part.stop_offset is not None:
            import pyarrow.compute as pc

            batch = batch.filter(pc.less(batch.column("offset"), part.stop_offset))
        if part.keys is not None:
            batch = keep_keys(batch, frozenset(part.keys))
        if part.topics is not None:
            batch = matching_rows(batch, TopicMatcher(part.topics), keep_headers=part.include_headers)
        if part.include_headers and part.headers_as_map:
            batch = headers_to_map(batch)
        return batch

    def _decode(self, count: int) -> pyarrow.RecordBatch | None:
        """Decode the next ``count`` pending items; on a ``FormatError`` the range's corrupt-item policy settles
        the refused items (skipped or dead-lettered, and stored, before the rows after them are handed on)."""
        part = self.part
        assert part is not None
        items, sequences = self.pending_items[:count], self.pending_sequences[:count]
        del self.pending_items[:count], self.pending_sequences[:count]
        first, self.first_offset = self.first_offset, None
        try:
            return items_to_arrow(
                items,
                sequences,
                stream=part.stream,
                lane=part.lane,
                include_headers=part.include_headers or part.topics is not None or part.value_version is not None,
                first_offset=first,
            )
        except FormatError:
            if part.corrupt.is_error:
                raise
        good_items, good_sequences = self.refused.keep_decodable(part, items, sequences)
        if not good_items:
            return None
        if first is not None and good_sequences[0] != sequences[0]:
            first = None  # the item holding the resume offset was refused
        return items_to_arrow(
            good_items,
            good_sequences,
            stream=part.stream,
            lane=part.lane,
            include_headers=part.include_headers or part.topics is not None or part.value_version is not None,
            first_offset=first,
        )


def matching_rows(batch: pyarrow.RecordBatch, matcher: TopicMatcher, *, keep_headers: bool) -> pyarrow.RecordBatch:
    """The rows of ``batch`` whose topic (the ``meteor.topic`` entry of their ``headers``) ``matcher`` matches;
    the ``headers`` column dropped unless ``keep_headers`` (it was decoded only to find the topics)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    headers = batch.column("headers")
    entries = headers.flatten()
    is_topic = pc.equal(entries.field("key"), TOPIC_HEADER)
    rows = pc.filter(pc.list_parent_indices(headers), is_topic).to_pylist()
    values = pc.filter(entries.field("value"), is_topic).to_pylist()
    topics = [""] * batch.num_rows
    for row, value in zip(rows, values, strict=True):
        topics[row] = value.decode("utf-8", "replace")
    mask = [matcher.matches(topic) for topic in topics]
    if not all(mask):
        batch = batch.filter(pa.array(mask, pa.bool_()))
    if not keep_headers:
        batch = batch.drop_columns(["headers"])
    return batch


def _mark_reads(ranges: Sequence[LaneRange]) -> dict[int, Any]:
    """One single-item read of the item before each range the driver gave an expected mark, all issued at once
    (they travel with the first range's reads), keyed by range index."""
    reads: dict[int, Any] = {}
    for index, part in enumerate(ranges):
        if part.expect is not None and part.expect.sequence == part.start - 1:
            ring = grid_for(part.grid).ring(part.info.ring_names[part.lane])
            reads[index] = ring.read_many_async(part.expect.sequence, 0, 1)
    return reads


def _reader(part: LaneRange, start: int, end: int) -> Iterator[tuple[list[Item], list[int]]]:
    """The grid reads of ``[start, end)`` with the next ones already sent (``read_ahead``; ``read_range``'s
    answers, data loss and errors included)."""
    return read_ahead(
        grid_for(part.grid),
        part.info,
        part.lane,
        start,
        end,
        items_per_read=ITEMS_PER_READ,
        skip_data_loss=not part.fail_on_data_loss,
    )


def _range_reads(part: LaneRange, check: Any) -> Iterator[tuple[list[Item], list[int]]]:
    """The grid reads of one range. With a mark check under way, the range's first read is sent before the check's
    answer is looked at (the two travel together); nothing is handed on, and no error of that first read raised,
    before the check passed, since a truncated lane explains them (a range now past the lane's end)."""
    reader = _reader(part, part.start, part.end)
    if check is None:
        yield from reader
        return
    failure: Exception | None = None
    try:
        first = next(reader, None)
    except Exception as exc:  # the check decides first; re-raised when the lane was not truncated
        first, failure = None, exc
    start, end = _checked_start(part, check)
    if (start, end) != (part.start, part.end):
        yield from _reader(part, start, end)
        return
    if failure is not None:
        raise failure
    if first is not None:
        yield first
    yield from reader


def _checked_start(part: LaneRange, read: Any) -> tuple[int, int]:
    """Where the range is read: ``[start, end)``, unless the item before it is no longer the one the driver marked
    at the end of the previous batch (a member restart lost the lane's tail and new records took the lost sequences
    while the query ran, so the records below ``start`` are new ones this query has not read).

    Then ``LaneTruncatedError`` (``failOnDataLoss=true``), or the lane is read again from its oldest item up to the
    range's end (no further than the lane's end), logged as a WARNING and counted in ``TRUNCATED_RANGES``: records
    read before the truncation may be read again, none is skipped. An item before the range that is gone
    (overwritten) is no truncation: the range's own read reports any loss."""
    if read is None or part.expect is None:
        return part.start, part.end
    mark = part.expect
    batch = Ring.to_batch(result(read, f"read the item before stream {part.stream!r} lane {part.lane}'s range"))
    verdict = verdict_of(mark, batch.items, batch.sequences)
    if verdict in (SAME, GONE):
        return part.start, part.end
    if grid_for(part.grid).map(STREAMS_MAP).get(part.stream) is None:
        return _deleted_under(part)
    ring = grid_for(part.grid).ring(part.info.ring_names[part.lane])
    oldest = oldest_in(ring)
    whose = "the running query's position"
    if part.fail_on_data_loss:
        raise LaneTruncatedError(
            part.stream,
            part.lane,
            part.start,
            oldest,
            mark.sequence,
            unit="sequence",
            whose=whose,
            fix=f"Restart the query with a fresh checkpointLocation (the lane's oldest sequence is {oldest}), or "
            "set failOnDataLoss=false to read the lane again from its oldest item.",
        )
    global TRUNCATED_RANGES
    TRUNCATED_RANGES += 1
    end = min(part.end, ring.tail() + 1)
    logger.warning(
        "stream %r lane %d was truncated and refilled under %s (sequence %d: the item at sequence %d is %s); "
        "failOnDataLoss=false: this task reads the lane again from its oldest item, sequences %d..%d (items read "
        "before the truncation may be read again); %d such range(s) in this worker",
        part.stream,
        part.lane,
        whose,
        part.start,
        mark.sequence,
        "another one" if verdict == CHANGED else "past the lane's end",
        oldest,
        end - 1,
        TRUNCATED_RANGES,
    )
    return oldest, max(oldest, end)


def _deleted_under(part: LaneRange) -> tuple[int, int]:
    """The range's stream was deleted after its batch was planned (a ``streamPattern`` query's stream dropped while
    the batch ran): the driver's data loss (``StreamDeletedError``), or with ``failOnDataLoss=false`` nothing read,
    logged, as the driver does for a stream it finds gone."""
    if part.fail_on_data_loss:
        raise StreamDeletedError(part.stream, part.lane, part.start, part.end)
    logger.warning(
        "stream %r was deleted while this batch read it; skipping lane %d sequences %d..%d (failOnDataLoss=false)",
        part.stream,
        part.lane,
        part.start,
        part.end - 1,
    )
    return part.start, part.start


def _passed(gate: ItemGate, part: LaneRange, items: list[Item], sequences: list[int]) -> tuple[list[Item], list[int]]:
    """The items of one read the gate passes on (undecodable ones too: the corrupt-item policy sees them)."""
    kept: list[Item] = []
    kept_sequences: list[int] = []
    for item, sequence in zip(items, sequences, strict=True):
        try:
            producer = item_producer(item, stream=part.stream, lane=part.lane, sequence=sequence)
        except FormatError:
            kept.append(item)
            kept_sequences.append(sequence)
            continue
        verdict = gate.check((part.stream, part.lane), sequence, producer)
        while verdict == WAIT:
            time.sleep(RECHECK_S)  # bounded: the gate aborts the transaction once its deadline passed
            verdict = gate.check((part.stream, part.lane), sequence, producer)
        if verdict == DELIVER:
            kept.append(item)
            kept_sequences.append(sequence)
    if len(kept) == len(items):
        return items, sequences
    return kept, kept_sequences


class _RefusedItems:
    """The undecodable items of one task, settled by their range's policy through the core ``Refusals`` of their
    stream: skipped (counted, logged) or published to the dead-letter stream (which the driver checked exists) on
    the worker's shared grid client."""

    def __init__(self) -> None:
        self._by_stream: dict[tuple[GridSettings, str], Refusals] = {}

    def keep_decodable(
        self, part: LaneRange, items: Sequence[Item], sequences: Sequence[int]
    ) -> tuple[list[Item], list[int]]:
        good_items: list[Item] = []
        good_sequences: list[int] = []
        for item, sequence in zip(items, sequences, strict=True):
            try:
                decode_item(item, stream=part.stream, lane=part.lane, sequence=sequence)
            except FormatError as exc:
                self._refuse(part, item, sequence, exc)
                continue
            good_items.append(item)
            good_sequences.append(sequence)
        return good_items, good_sequences

    def refusals_for(self, part: LaneRange) -> Refusals:
        """The refusals of ``part``'s stream (one dead-letter publisher per stream and task)."""
        key = (part.grid, part.stream)
        refusals = self._by_stream.get(key)
        if refusals is None:
            refusals = self._by_stream[key] = Refusals(grid_for(part.grid), part.stream, part.corrupt)
        return refusals

    def _refuse(self, part: LaneRange, item: Item, sequence: int, error: FormatError) -> None:
        refusals = self.refusals_for(part)
        # Returns once a dead letter is stored: the task hands on no row after the item before that.
        refusals.dead_letter_item(part.lane, sequence, bytes(item), error)
        refusals.passed_item(part.lane, sequence, error)

    def close(self) -> None:
        for refusals in self._by_stream.values():
            refusals.close()


def _prefetched(chunks: Iterator[_T], depth: int = 2) -> Iterator[_T]:
    """Iterate ``chunks`` with the next grid reads already under way while the caller decodes and Spark
    serialises (network and Arrow work overlap). Errors (DataLossError) are re-raised in the caller's thread."""
    done = object()
    slots: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def hand_over(value: Any) -> bool:
        # Bounded waits: a consumer that stopped early (a Spark limit) must not leave this thread blocked forever.
        while not stop.is_set():
            try:
                slots.put(value, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for chunk in chunks:
                if not hand_over(chunk):
                    return
            hand_over(done)
        except BaseException as exc:  # handed to the consuming thread
            hand_over(exc)

    thread = threading.Thread(target=produce, name="meteor-read-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            chunk = slots.get()
            if chunk is done:
                return
            if isinstance(chunk, BaseException):
                raise chunk
            yield chunk
    finally:
        stop.set()


def _items_for_target(rows: int, items: int) -> int:
    if rows <= 0:
        return min(items * 4, 4096)
    per_item = rows / items
    return max(1, min(4096, int(TARGET_ROWS_PER_BATCH / per_item)))
