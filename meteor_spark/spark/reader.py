"""Readers of ``format("meteor")``: streaming (admission control, AvailableNow, groups) and batch.

What runs where (PySpark 4.3, see the module docstring of ``datasource``):

* ``MeteorStreamReader`` #1 lives in Spark's **source runner**, one long-lived Python process per query run on the
  driver. Only it talks to the grid on the driver side: lane bounds, the group's leases and confirmed offsets.
  Its grid connection and group members are created on first use (``_driver()``), never in ``__init__``, and are
  dropped when the reader is pickled.
* ``MeteorStreamReader`` #2 is pickled into the read UDF once per query run; its ``read(partition)`` runs in
  executor workers and depends only on the partition (replays read exactly the same ring items).

Offsets (``meteor_spark.spark.offsets``): per lane, the next ring sequence; a batch reads ``[start, end)``.

Tasks (``plan_tasks``): a lane range is split when large, so one busy lane keeps every core reading (by default
into as many tasks as the driver has CPUs, the local cores in local mode), and small ranges are grouped into one
task, because each Python task costs Spark ~0.1 s to start: four lanes on two cores read fastest as two tasks.

Groups. With option ``group`` the source runner holds the group's lane leases for the whole query
(``GroupMember(want="all")``, renewed by the member's background thread) and confirms offsets, fenced by the lease
epoch, **only for batches Spark has committed**:

1. in ``latestOffset(start, ...)``: Spark asks for the next batch's end only after the previous batch (which ended
   at ``start``) is in the commit log, so ``start`` is confirmed then. This is what makes confirmation timely:
   Spark's own ``commit(end)`` lags one batch, and an AvailableNow run never calls it for its last batch, but it
   does call ``latestOffset`` once more to learn there is nothing left, which confirms the last batch before the
   query stops;
2. in ``commit(end)``, which repeats it (and is what a restarted query calls first).

Confirmed offsets only move forward. A query that does not hold a lane (a standby: another query in the group
holds it) reads nothing from it; its checkpoint follows the group's confirmed offset for that lane with batches
that read no rows, so when it takes over (the holder stopped, or died and its lease expired) it starts where the
group stopped, without re-reading. Start position of a new query: the checkpoint, else the group's confirmed
offsets, else ``startingOffsets``.

Leases are released when the source runner ends: Spark terminates it with SIGTERM (``stop()`` is otherwise never
called in 4.3), so the first driver-side call installs a SIGTERM handler that raises ``SystemExit``; Spark's
runner then runs ``stop()``, and ``atexit`` covers a normal exit. A SIGKILLed driver cannot release anything: its
leases expire after ``groupLeaseMs``.

Positions are checked when a query starts (``initialOffset``; ``partitions`` for a batch read): a position past a
lane's end is an ``OffsetOutOfRangeError`` naming stream, lane, position and the valid range, a lane the stream does
not have is a ``ConfigError``, a missing stream a ``StreamNotFoundError``. A checkpointed position or a group's
confirmed offset past the lane's end (the stream was deleted and re-created, or the grid restarted without
persistence) is the same error, saying the checkpoint or group offset is stale. Nothing is ever skipped silently.

History: ``earliest`` means the oldest sequence the grid can serve (``reading.oldest_sequence``), below the ring's
head where the grid keeps history (a persistent embedded member, a RingbufferStore), and the loss check compares
positions with that sequence, not with the head.

Data loss (the ring overwrote items before this query read them) fails the query with ``DataLossError`` (stream,
lane, requested and oldest available sequence, how to fix) or, with ``failOnDataLoss=false``, is skipped **by the
driver when it plans a batch**: a lane whose position is below the oldest available sequence moves straight to it
(``maxOffsetsPerTrigger`` counts from there, so no batch is spent on a range known to be gone), the skip is logged
once, and the lost items are added to the lane's count carried in the batch's end offset (``SparkOffset.skipped``).
Spark checkpoints that offset and replays a batch with it, so every lost item is counted once per query, across
restarts; ``partitions`` starts the executors' ranges after the skipped items, so executors never count them again.
Items overwritten after a batch was planned (while it waits or is read, or before a replay) are skipped and logged
where they are found (``partitions``, or the task), outside that count.

Corrupt items (``onCorrupt`` / ``deadLetterStream``, one ``CorruptItemPolicy``): by default a task fails with the
``FormatError`` naming stream, lane and sequence. ``skip`` leaves the item out (counted and logged in the executor's
log); ``dead_letter`` publishes ``corrupt.dead_letter_record`` to the dead-letter stream, waiting until it is stored
before the task hands Spark the rows that follow the item. A retried task publishes it again: dead letters are
at-least-once.
"""

from __future__ import annotations

import atexit
import heapq
import logging
import math
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Sequence, TypeVar

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from meteor_spark import offsets as record_offsets
from meteor_spark.corrupt import CorruptItemPolicy
from meteor_spark.errors import (
    ConfigError,
    DataLossError,
    FencedError,
    FormatError,
    GroupError,
    NotAssignedError,
    OffsetOutOfRangeError,
    StreamNotFoundError,
)
from meteor_spark.grid import GridSettings
from meteor_spark.groups import GroupMember, default_member_id
from meteor_spark.spark.clients import grid_for
from meteor_spark.spark.offsets import SparkOffset
from meteor_spark.spark.options import (
    EARLIEST_SENTINEL,
    LATEST_SENTINEL,
    OffsetSpec,
    Position,
    SourceOptions,
)

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow

    from meteor_spark.grid import Grid
    from meteor_spark.streams import StreamInfo

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

#: Ring items per grid read of an executor (each item up to a publisher batch, ~100 KB for 1000 x 100 bytes).
ITEMS_PER_READ = 32

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
    corrupt: CorruptItemPolicy = CorruptItemPolicy()

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


#: Without an explicit ``minPartitions``, a lane range is split only into pieces of at least this many ring items:
#: splitting a small micro-batch costs more in task start-up than it saves.
AUTO_SPLIT_MIN_ITEMS = 64

#: Grouping keeps at least one task per this many ring items of the batch. A Python data source task costs about
#: 0.1 s of Spark-side start-up (measured on 2 cores), and 4096 items hold ~4M records at the default 1000 records
#: per item (~2 s of reading for one core): larger tasks gain nothing from grouping, smaller ones lose to start-up.
ITEMS_PER_GROUPED_TASK = 4096

#: ``(stream, lane, start, end)``: ring items ``[start, end)`` of one lane.
Piece = tuple[str, int, int, int]


def default_partitions() -> int:
    """The planning process's usable CPUs: Spark's local cores in local mode (the source runner and the planner run
    on the driver, which cannot ask Spark for its parallelism)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not on Linux
        return max(1, os.cpu_count() or 1)


def plan_partitions(
    ranges: Sequence[Piece],
    *,
    min_partitions: int | None,
    max_items_per_partition: int | None,
    min_piece_items: int = 1,
) -> list[Piece]:
    """Split lane ranges ``(stream, lane, start, end)`` into pieces, deterministically.

    Each range is cut into pieces of at most ``max_items_per_partition`` items; then, while there are fewer than
    ``min_partitions`` pieces, the piece with the most items per resulting part gets one more part (parts of a
    piece are equal to within one item), as long as every part keeps at least ``min_piece_items`` items. Pieces
    are returned in stream, lane, start order so that equal inputs give equal plans (replays).
    """
    cut: list[Piece] = []
    for stream, lane, start, end in ranges:
        if end <= start:
            continue
        step = max_items_per_partition or (end - start)
        for lo in range(start, end, step):
            cut.append((stream, lane, lo, min(end, lo + step)))
    parts = [1] * len(cut)
    if min_partitions and len(cut) < min_partitions:
        # Max-heap on items per part; ties go to the earlier piece, so the plan does not depend on heap internals.
        heap = [(-(hi - lo), index) for index, (_, _, lo, hi) in enumerate(cut)]
        heapq.heapify(heap)
        total = len(cut)
        while total < min_partitions and heap:
            _, index = heapq.heappop(heap)
            size = cut[index][3] - cut[index][2]
            if size // (parts[index] + 1) < max(1, min_piece_items):
                continue  # cannot be split further: drop it, other pieces may still split
            parts[index] += 1
            total += 1
            heapq.heappush(heap, (-(size / parts[index]), index))
    pieces: list[Piece] = []
    for (stream, lane, lo, hi), k in zip(cut, parts):
        size = hi - lo
        bounds = [lo + (j * size) // k for j in range(k + 1)]
        pieces.extend((stream, lane, a, b) for a, b in zip(bounds, bounds[1:]))
    return sorted(pieces)


def group_pieces(pieces: Sequence[Piece], *, tasks: int, max_items_per_task: int | None) -> list[tuple[Piece, ...]]:
    """Group pieces into about ``tasks`` Spark tasks of balanced size (largest first into the least loaded task).

    A task never exceeds ``max_items_per_task`` items (a piece that fits nowhere opens one more task). Inside a
    task, pieces are ordered by stream, lane and start, and adjacent pieces of one lane are merged.
    """
    if len(pieces) <= tasks:
        return [(piece,) for piece in sorted(pieces)]
    loads: list[int] = []
    members: list[list[Piece]] = []
    for piece in sorted(pieces, key=lambda p: (-(p[3] - p[2]), p)):
        size = piece[3] - piece[2]
        fits = [
            i for i in range(len(loads)) if max_items_per_task is None or loads[i] + size <= max_items_per_task
        ]
        if len(loads) < tasks or not fits:
            loads.append(size)
            members.append([piece])
            continue
        best = min(fits, key=lambda i: (loads[i], i))
        loads[best] += size
        members[best].append(piece)
    grouped = []
    for task in members:
        merged: list[Piece] = []
        for stream, lane, lo, hi in sorted(task):
            if merged and merged[-1][:2] == (stream, lane) and merged[-1][3] == lo:
                merged[-1] = (stream, lane, merged[-1][2], hi)
            else:
                merged.append((stream, lane, lo, hi))
        grouped.append(tuple(merged))
    return sorted(grouped)


def plan_tasks(
    ranges: Sequence[Piece],
    *,
    min_partitions: int | None,
    max_partitions: int | None,
    max_items_per_partition: int | None,
    cpus: int | None = None,
) -> list[tuple[Piece, ...]]:
    """The Spark tasks of one batch: each a tuple of lane ranges read one after another. Deterministic.

    1. Split: ranges are cut at ``max_items_per_partition``, then split until there are at least
       ``min_partitions`` pieces (default: ``cpus``, the driver's CPU count, splitting only into pieces of at
       least ``AUTO_SPLIT_MIN_ITEMS`` items), so one busy lane keeps every core reading.
    2. Group: with more pieces than ``min_partitions`` times ``ceil(total items / (min_partitions x
       ITEMS_PER_GROUPED_TASK))`` (a multiple of it, so the tasks fill the cores evenly; capped by
       ``max_partitions``), pieces are grouped into that many balanced tasks, because every Python task costs
       Spark-side start-up: four lanes on two cores read faster as two tasks. Large ranges keep one task each.
    """
    explicit = min_partitions is not None
    target = min_partitions if explicit else (cpus or default_partitions())
    if max_partitions is not None:
        target = min(target, max_partitions)  # splitting beyond the cap would only be grouped back, scattered
    pieces = plan_partitions(
        ranges, min_partitions=target, max_items_per_partition=max_items_per_partition,
        min_piece_items=1 if explicit else AUTO_SPLIT_MIN_ITEMS,
    )
    total = sum(hi - lo for _, _, lo, hi in pieces)
    tasks = target * max(1, -(-total // (target * ITEMS_PER_GROUPED_TASK)))
    if max_partitions is not None:
        tasks = min(tasks, max_partitions)
    return group_pieces(pieces, tasks=max(1, tasks), max_items_per_task=max_items_per_partition)


def rate_limit(
    start: dict[tuple[str, int], int], latest: dict[tuple[str, int], int], max_items: int
) -> dict[tuple[str, int], int]:
    """Ends that admit at most about ``max_items`` ring items over all lanes (Kafka's proportional split).

    Each lane gets a share proportional to its backlog, rounded down, except that a lane with any backlog gets at
    least one item: a batch can therefore exceed ``max_items`` by up to one item per lane, and small lanes are
    never starved.
    """
    backlog = {key: max(0, latest[key] - start[key]) for key in latest}
    total = sum(backlog.values())
    if total <= max_items:
        return dict(latest)
    ends = {}
    for key, items in backlog.items():
        share = max_items * items / total
        take = math.ceil(share) if share < 1 else math.floor(share)
        ends[key] = start[key] + min(items, take)
    return ends


@dataclass(frozen=True)
class LaneView:
    """What the driver knows about its lanes while it plans one batch.

    Attributes:
        bounds: (head, next) ring sequences per (stream, lane).
        confirmed: the group's confirmed record offset per (stream, lane), for lanes that have one (empty when
            the query reads without a group).
    """

    bounds: dict[tuple[str, int], tuple[int, int]]
    confirmed: dict[tuple[str, int], int]

    def confirmed_sequence(self, stream: str, lane: int) -> tuple[int, int] | None:
        """(sequence, record offset) of the group's confirmed offset for the lane, or None."""
        offset = self.confirmed.get((stream, lane))
        return None if offset is None else (record_offsets.sequence_of(offset), offset)


class _DriverState:
    """Driver-side connections of a stream reader (source runner process only; never pickled)."""

    def __init__(self, options: SourceOptions) -> None:
        from meteor_spark.streams import open_stream

        self.grid: Grid = grid_for(options.grid)
        self.infos: dict[str, StreamInfo] = {
            name: open_stream(self.grid, name, create=False) for name in options.streams
        }
        check_dead_letter_stream(self.grid, options)
        self.members: dict[str, GroupMember] = {}
        if options.group is not None:
            member_id = options.group_member_id or f"spark-{default_member_id()}"
            for name, info in self.infos.items():
                member = GroupMember(
                    self.grid, info, options.group, member_id=member_id, lease_ms=options.group_lease_ms, want="all"
                )
                member.start()
                self.members[name] = member
            logger.info("query reads stream(s) %s as member %r of group %r", ", ".join(options.streams), member_id,
                        options.group)
        self.available_now_target: SparkOffset | None = None
        self.latest: SparkOffset | None = None
        self.last_batch_mono = time.monotonic()
        self.standby_logged: set[tuple[str, int]] = set()
        self.initial: SparkOffset | None = None
        self.planned_skipped = 0
        self.late_skipped = 0
        self.closed = False
        self._planned: LaneView | None = None

    def lane_keys(self) -> list[tuple[str, int]]:
        """Every (stream, lane) read, from the stream metadata (no grid call)."""
        return [(name, lane) for name, info in self.infos.items() for lane in range(info.config.lanes)]

    def bounds(self) -> dict[tuple[str, int], tuple[int, int]]:
        """(head, next) ring sequences of every lane of every stream read: two grid calls per lane."""
        from meteor_spark.streams import lane_bounds

        result = {}
        for name, info in self.infos.items():
            for lane, (head, next_seq) in lane_bounds(self.grid, info).items():
                result[(name, lane)] = (head, next_seq)
        return result

    def view(self) -> "LaneView":
        """Lane bounds and the group's confirmed offsets, read once for the batch being planned; ``partitions``
        of the same batch reuses them (``planned``)."""
        self._planned = LaneView(self.bounds(), self.confirmed_offsets())
        return self._planned

    def planned(self) -> "LaneView":
        """The view ``latestOffset`` read for the batch it planned, else (a batch replayed after a restart, a
        second ``partitions`` call) a fresh one. Taken once: a later batch never plans on an old view."""
        planned, self._planned = self._planned, None
        return planned if planned is not None else LaneView(self.bounds(), self.confirmed_offsets())

    def confirmed_offsets(self) -> dict[tuple[str, int], int]:
        """The group's confirmed offset per lane, where one is stored: held lanes from the group member's memory
        (the holder is the only writer), the rest with one ``get_all`` per stream."""
        out: dict[tuple[str, int], int] = {}
        for stream, member in self.members.items():
            for lane, offset in member.known_offsets().items():
                if offset is not None:
                    out[(stream, lane)] = offset
        return out

    def oldest(self, stream: str, lane: int) -> int:
        """The oldest sequence the grid can serve for the lane (below the ring head where it keeps history)."""
        from meteor_spark.reading import oldest_sequence

        return oldest_sequence(self.grid, self.infos[stream], lane)

    def check_confirmed(
        self, stream: str, lane: int, confirmed: int | None, group: str | None, known_end: int
    ) -> None:
        """A group offset past the lane's end is stale (the stream was re-created under it): an error, not a skip.

        ``known_end`` is the lane's end as read before; past it, the end is read again (another member may have
        read and confirmed items published since), and only a confirm past that is stale."""
        if confirmed is None or record_offsets.sequence_of(confirmed) <= known_end:
            return
        sequence = record_offsets.sequence_of(confirmed)
        end = self.grid.ring(self.infos[stream].ring_names[lane]).tail() + 1
        if sequence > end:
            raise OffsetOutOfRangeError(
                stream, lane, sequence, self.oldest(stream, lane), end, unit="sequence",
                hint=f"The confirmed offset of group {group!r} is stale: it was written before the stream was "
                     f"deleted and re-created (or the grid restarted without persistence). Move the group with "
                     f"meteor_spark.admin.seek_group to a position inside the range, or read under a new group "
                     f"name.",
            )

    def held(self, stream: str, lane: int) -> bool:
        member = self.members.get(stream)
        return member is None or lane in member.assignment()

    def confirm(self, offset: SparkOffset) -> None:
        """Confirm ``offset`` (the end of a committed batch) for the lanes this query holds; forward only.

        The group member knows the offset it last wrote for each lane it holds, so a confirm that moves nothing
        costs no grid call and one that moves costs a single compare-and-set, fenced by the lease epoch."""
        for stream, lane, sequence in offset.positions:
            member = self.members.get(stream)
            if member is None or lane not in member.assignment():
                continue
            try:
                member.confirm(lane, record_offsets.first_offset_of(sequence))
            except (FencedError, NotAssignedError) as exc:
                # Another member took the lane over (our lease lapsed): its position wins; ours is not written.
                logger.warning("not confirming stream %r lane %d at sequence %d: %s", stream, lane, sequence, exc)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for name, member in self.members.items():
            try:
                member.close()
            except Exception:  # noqa: BLE001 - releasing is best effort; the lease expires anyway
                logger.warning("could not release the group leases of stream %r; they expire on their own", name,
                               exc_info=True)
        if self.members:
            logger.info("released the group's lane leases")


_STOP_HOOKS: list[Any] = []
_stopping = threading.Event()


def _install_stop_hooks(reader: "MeteorStreamReader") -> None:
    """Make ``stop()`` run when Spark ends the source runner (SIGTERM) or the process exits."""
    if not _STOP_HOOKS:
        atexit.register(_run_stop_hooks)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, _on_sigterm)
    _STOP_HOOKS.append(reader)


def _on_sigterm(signum: int, frame: Any) -> None:
    # Spark may signal more than once; a second SIGTERM must not interrupt the release the first one started.
    if _stopping.is_set():
        return
    _run_stop_hooks()
    raise SystemExit(128 + signum)


def _run_stop_hooks() -> None:
    _stopping.set()
    while _STOP_HOOKS:
        _STOP_HOOKS.pop().stop()


class _ReadsLaneRanges:
    """``read()`` shared by the streaming and batch readers: runs on executors, depends only on the partition."""

    def read(self, partition: InputPartition) -> Iterator["pyarrow.RecordBatch"]:
        if isinstance(partition, LaneRange):
            return read_lane_ranges((partition,))
        assert isinstance(partition, LaneRanges)
        return read_lane_ranges(partition.ranges)


def read_lane_range(partition: LaneRange) -> Iterator["pyarrow.RecordBatch"]:
    """Read exactly the ring items ``[start, end)`` of one lane as Arrow record batches of up to ~64k rows."""
    return read_lane_ranges((partition,))


def read_lane_ranges(ranges: Sequence[LaneRange]) -> Iterator["pyarrow.RecordBatch"]:
    """Read exactly the ring items of each range, in order, as Arrow record batches of up to ~64k rows.

    One prefetch thread reads ahead across range boundaries, so a task of several small ranges keeps the network
    busy while it decodes. A batch never mixes two ranges (``items_to_arrow`` converts items of one lane).

    An undecodable item fails the task (``FormatError`` naming stream, lane and sequence) unless the range's
    corrupt-item policy says otherwise; items are validated one by one only when a conversion failed, so good
    data pays nothing for the policy.
    """
    from meteor_spark.reading import read_range
    from meteor_spark.records import items_to_arrow

    def chunks() -> Iterator[tuple[int, list[bytes], list[int]]]:
        for index, part in enumerate(ranges):
            for items, sequences in read_range(
                grid_for(part.grid), part.info, part.lane, part.start, part.end,
                max_items_per_call=ITEMS_PER_READ, skip_data_loss=not part.fail_on_data_loss,
            ):
                yield index, items, sequences

    items_per_batch = 64  # adapted after each batch, from the rows per item actually seen
    current = -1
    part = ranges[0] if ranges else None
    first_offset: int | None = None
    pending_items: list[bytes] = []
    pending_sequences: list[int] = []
    refused = _RefusedItems()

    def convert(count: int) -> "pyarrow.RecordBatch | None":
        nonlocal first_offset
        assert part is not None
        items, sequences = pending_items[:count], pending_sequences[:count]
        del pending_items[:count], pending_sequences[:count]
        first, first_offset = first_offset, None
        try:
            return items_to_arrow(items, sequences, stream=part.stream, lane=part.lane,
                                  include_headers=part.include_headers, first_offset=first)
        except FormatError:
            if part.corrupt.is_error:
                raise
        # Refused items are skipped or dead-lettered (and stored) here, before the rows after them are handed on.
        good_items, good_sequences = refused.keep_decodable(part, items, sequences)
        if not good_items:
            return None
        if first is not None and good_sequences[0] != sequences[0]:
            first = None  # the item holding the resume offset was refused
        return items_to_arrow(good_items, good_sequences, stream=part.stream, lane=part.lane,
                              include_headers=part.include_headers, first_offset=first)

    try:
        for index, items, sequences in _prefetched(chunks()):
            if index != current:
                if pending_items:
                    batch = convert(len(pending_items))  # the rest of the previous range
                    if batch is not None and batch.num_rows:
                        yield batch
                current, part = index, ranges[index]
                first_offset = part.first_offset
                # The item holding first_offset may have been skipped as overwritten (failOnDataLoss=false).
                if first_offset is not None and sequences[0] != record_offsets.sequence_of(first_offset):
                    first_offset = None
            pending_items.extend(items)
            pending_sequences.extend(sequences)
            while len(pending_items) >= items_per_batch:
                count = items_per_batch
                batch = convert(count)
                if batch is None:
                    continue
                items_per_batch = _items_for_target(batch.num_rows, count)
                if batch.num_rows:
                    yield batch
        if pending_items:
            batch = convert(len(pending_items))
            if batch is not None and batch.num_rows:
                yield batch
    finally:
        refused.close()


class _RefusedItems:
    """The undecodable items of one task, handled by their range's policy: skipped (counted, logged) or published
    to the dead-letter stream through a core ``Publisher`` on the worker's shared grid client."""

    def __init__(self) -> None:
        self.skipped = 0
        self.dead_lettered = 0
        self._publishers: dict[tuple[GridSettings, str], Any] = {}

    def keep_decodable(
        self, part: LaneRange, items: Sequence[bytes], sequences: Sequence[int]
    ) -> tuple[list[bytes], list[int]]:
        from meteor_spark.records import decode_item

        good_items: list[bytes] = []
        good_sequences: list[int] = []
        for item, sequence in zip(items, sequences):
            try:
                decode_item(item, stream=part.stream, lane=part.lane, sequence=sequence)
            except FormatError as exc:
                self._refuse(part, item, sequence, exc)
                continue
            good_items.append(item)
            good_sequences.append(sequence)
        return good_items, good_sequences

    def _refuse(self, part: LaneRange, item: bytes, sequence: int, error: FormatError) -> None:
        if part.corrupt.mode == "skip":
            self.skipped += 1
            logger.warning("stream %r lane %d: skipping the undecodable ring item at sequence %d (onCorrupt=skip; "
                           "%d skipped by this task): %s", part.stream, part.lane, sequence, self.skipped, error)
            return
        from meteor_spark.corrupt import dead_letter_record
        from meteor_spark.publisher import Publisher

        target = part.corrupt.dead_letter_stream
        assert target is not None
        key = (part.grid, target)
        publisher = self._publishers.get(key)
        if publisher is None:
            publisher = self._publishers[key] = Publisher(grid_for(part.grid), target)
        # publish() returns once the record is stored: the task hands on no row after the item before that.
        publisher.publish(dead_letter_record(item, stream=part.stream, lane=part.lane, sequence=sequence, error=error))
        self.dead_lettered += 1
        logger.warning("stream %r lane %d: sent the undecodable ring item at sequence %d to dead-letter stream %r: "
                       "%s", part.stream, part.lane, sequence, target, error)

    def close(self) -> None:
        for publisher in self._publishers.values():
            publisher.close()


def _prefetched(chunks: Iterator[_T], depth: int = 2) -> Iterator[_T]:
    """Iterate ``chunks`` with the next grid reads already under way while the caller decodes and Spark
    serialises (network and Arrow work overlap). Errors (DataLossError) are re-raised in the caller's thread."""
    import queue

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
        except BaseException as exc:  # noqa: BLE001 - handed to the consuming thread
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


class MeteorStreamReader(_ReadsLaneRanges, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("meteor")``: micro-batches of ring items per lane, with admission control."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        self._state: _DriverState | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_state"] = None  # connections and leases stay in the source runner
        return state

    # -- driver side (source runner) ---------------------------------------------------------------------------

    def _driver(self) -> _DriverState:
        if self._state is None:
            self._state = _DriverState(self.options)
            _install_stop_hooks(self)
        return self._state

    @property
    def skipped_items(self) -> int:
        """Ring items skipped because they were overwritten before they were read (``failOnDataLoss=false``): the
        query's count as of the last batch this source runner planned (carried across restarts in the offsets), plus
        items lost between planning a batch and reading it."""
        return 0 if self._state is None else self._state.planned_skipped + self._state.late_skipped

    def prepareForTriggerAvailableNow(self) -> None:
        state = self._driver()
        state.available_now_target = SparkOffset.of(_by_stream({k: nxt for k, (_, nxt) in state.bounds().items()}))
        logger.info("Trigger.AvailableNow: reading up to %s", state.available_now_target.dumps())

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        if self.options.min_offsets_per_trigger is not None:
            return ReadMinRows(self.options.min_offsets_per_trigger)
        return ReadAllAvailable()

    def initialOffset(self) -> dict[str, Any]:
        state = self._driver()
        _check_lanes(self.options.starting, "startingOffsets", state.infos)
        view = state.view()
        start: dict[tuple[str, int], int] = {}
        for (stream, lane), (head, next_seq) in sorted(view.bounds.items()):
            confirmed = view.confirmed_sequence(stream, lane)
            if confirmed is not None:
                state.check_confirmed(stream, lane, confirmed[1], self.options.group, next_seq)
                start[(stream, lane)] = confirmed[0]
                continue
            start[(stream, lane)] = _resolve(
                self.options.starting, "startingOffsets", stream, lane, head, next_seq, group=self.options.group,
                oldest=lambda s=stream, l=lane: state.oldest(s, l),
            )
        offset = SparkOffset.of(_by_stream(start))
        state.initial = offset
        # A start resolved from startingOffsets is the group's position from now on: a member taking a lane over
        # before this query's first commit resumes there instead of resolving the option again.
        state.confirm(offset)
        logger.info("new query starts at %s", offset.dumps())
        return offset.to_json()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict[str, dict[str, int]]:
        state = self._driver()
        begin = SparkOffset.from_json(start)
        if state.available_now_target is not None and state.members:
            # An AvailableNow run stops at the first batch that finds nothing to read; give a holder that just died
            # (its lease not yet expired) the time to lose its lanes instead of ending without reading.
            self._await_lanes(state, 2 * self.options.group_lease_ms / 1000 + 1)
        # Spark asks for the next end only once the batch that ended at `start` is in its commit log.
        state.confirm(begin)
        view = state.view()
        bounds = view.bounds
        latest = {key: nxt for key, (_, nxt) in bounds.items()}
        state.latest = SparkOffset.of(_by_stream(latest))
        if state.available_now_target is not None:
            target = state.available_now_target.as_dict()
            latest = {key: min(nxt, target.get(key, nxt)) for key, nxt in latest.items()}
        current = begin.as_dict()
        for key, (head, _) in bounds.items():
            current.setdefault(key, head)  # a lane the checkpoint does not know yet starts at its oldest item
        for (stream, lane), position in current.items():
            if stream in state.infos and (stream, lane) not in bounds:
                raise ConfigError(
                    f"the query's checkpoint has a position for lane {lane} of stream {stream!r}, which has lanes "
                    f"0..{state.infos[stream].config.lanes - 1}: the checkpoint is stale (the stream was deleted and "
                    f"re-created with fewer lanes). Start the query with a fresh checkpointLocation"
                )
        for (stream, lane), position in current.items():
            if (stream, lane) in bounds and position > bounds[(stream, lane)][1]:
                raise OffsetOutOfRangeError(
                    stream, lane, position, state.oldest(stream, lane), bounds[(stream, lane)][1], unit="sequence",
                    hint="The query's checkpoint is stale: it was written before the stream was deleted and "
                         "re-created (or the grid restarted without persistence), and reading on from it would "
                         "skip every record up to that position. Start the query with a fresh checkpointLocation.",
                )
        skipped = begin.skipped_dict()
        state.planned_skipped = begin.skipped_items

        ends: dict[tuple[str, int], int] = {}
        candidates: dict[tuple[str, int], int] = {}
        for key, position in current.items():
            stream, lane = key
            confirmed = view.confirmed_sequence(stream, lane)
            state.check_confirmed(stream, lane, confirmed[1] if confirmed else None, self.options.group,
                                  bounds.get(key, (0, 0))[1])
            if not state.held(stream, lane):
                if key not in state.standby_logged:
                    state.standby_logged.add(key)
                    logger.info(
                        "standby: group %r lane %d of stream %r is held by another member; this query follows the "
                        "group's confirmed offset and reads nothing until the lane is free", self.options.group,
                        lane, stream,
                    )
                ends[key] = max(position, confirmed[0]) if confirmed is not None else position
            elif confirmed is not None and confirmed[0] > position:
                ends[key] = confirmed[0]  # taken over: skip what the group already processed
            else:
                if key in state.standby_logged:
                    state.standby_logged.discard(key)
                    logger.info("group %r: this query now holds lane %d of stream %r", self.options.group, lane,
                                stream)
                if key in bounds and position < bounds[key][0] and not self.options.fail_on_data_loss:
                    position = self._skip_lost(state, stream, lane, position, skipped)
                candidates[key] = position
        ends.update(self._admit(state, candidates, latest, limit))
        # A query's first batch records how many items it reads: its progress report has no start offset.
        first_batch = state.initial is not None and begin.positions == state.initial.positions and not begin.skipped
        end = SparkOffset.of(
            _by_stream(ends), skipped,
            sum(ends[key] - position for key, position in candidates.items()) if first_batch else None,
        )
        if end.positions == SparkOffset.of(_by_stream(current)).positions:
            return begin.to_json()
        state.planned_skipped = end.skipped_items
        state.last_batch_mono = time.monotonic()
        return end.to_json()

    def _skip_lost(
        self, state: _DriverState, stream: str, lane: int, position: int, skipped: dict[tuple[str, int], int]
    ) -> int:
        """Move a lane below the oldest servable sequence straight to it, counting the lost items into ``skipped``
        (the query's count per lane, carried in the end offset). Called only when ``position`` is below the ring
        head: the oldest servable sequence costs a grid read, the head is known anyway."""
        oldest = state.oldest(stream, lane)
        if position >= oldest:
            return position  # below the head, but the grid serves it from its store
        lost = oldest - position
        skipped[(stream, lane)] = skipped.get((stream, lane), 0) + lost
        logger.warning(
            "data loss on stream %r lane %d: ring items %d..%d were overwritten before this query read them; "
            "skipping %d items (failOnDataLoss=false); %d items of this lane lost since the query started",
            stream, lane, position, oldest - 1, lost, skipped[(stream, lane)],
        )
        return oldest

    def _admit(
        self, state: _DriverState, start: dict[tuple[str, int], int], latest: dict[tuple[str, int], int],
        limit: ReadLimit,
    ) -> dict[tuple[str, int], int]:
        available = {key: max(start[key], latest.get(key, start[key])) for key in start}
        if isinstance(limit, ReadAllAvailable) or not start:
            return available  # Trigger.Once (or a limit-less query) reads everything
        backlog = sum(available[key] - start[key] for key in start)
        minimum = self.options.min_offsets_per_trigger
        if minimum is not None and state.available_now_target is None and backlog < minimum:
            waited_ms = (time.monotonic() - state.last_batch_mono) * 1000
            if waited_ms < self.options.max_trigger_delay_ms:
                return dict(start)
        maximum = self.options.max_offsets_per_trigger
        if isinstance(limit, ReadMaxRows):
            maximum = limit.max_rows if maximum is None else min(maximum, limit.max_rows)
        if maximum is None:
            return available
        return rate_limit(start, available, maximum)

    def reportLatestOffset(self) -> dict[str, dict[str, int]] | None:
        state = self._state
        return None if state is None or state.latest is None else state.latest.to_json()

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        state = self._driver()
        begin, finish = SparkOffset.from_json(start), SparkOffset.from_json(end)
        view = state.planned()
        bounds = view.bounds
        ranges: list[tuple[str, int, int, int]] = []
        # (stream, lane) -> (first sequence, record offset inside that item to start at)
        first_offsets: dict[tuple[str, int], tuple[int, int]] = {}
        begin_at = begin.as_dict()
        skipped_before, skipped_after = begin.skipped_dict(), finish.skipped_dict()
        for stream, lane, end_seq in finish.positions:
            lo = begin_at.get((stream, lane), bounds.get((stream, lane), (0, 0))[0])
            # Items the driver skipped as lost when it planned this batch: counted there, never read or counted here.
            lo += skipped_after.get((stream, lane), 0) - skipped_before.get((stream, lane), 0)
            if end_seq <= lo:
                continue
            confirmed = view.confirmed_sequence(stream, lane)
            if confirmed is not None:
                confirmed_seq, confirmed_offset = confirmed
                if end_seq <= confirmed_seq:
                    continue  # the group already processed this range (catch-up batch of a standby or takeover)
                if confirmed_seq >= lo:
                    lo = confirmed_seq
                    if record_offsets.index_of(confirmed_offset):
                        first_offsets[(stream, lane)] = (lo, confirmed_offset)
            if not state.held(stream, lane):
                self._await_lane(state, stream, lane)
            lo = self._check_loss(state, stream, lane, lo, bounds.get((stream, lane)))
            if lo < end_seq:
                ranges.append((stream, lane, lo, end_seq))
        tasks = []
        for task in _plan(self.options, ranges):
            lane_ranges = []
            for stream, lane, lo, hi in task:
                first = first_offsets.get((stream, lane))
                lane_ranges.append(
                    LaneRange(
                        stream, lane, lo, hi, self.options.grid, state.infos[stream], self.options.include_headers,
                        self.options.fail_on_data_loss, first[1] if first is not None and first[0] == lo else None,
                        self.options.corrupt,
                    )
                )
            tasks.append(LaneRanges(tuple(lane_ranges)))
        return tasks

    def _await_lanes(self, state: _DriverState, timeout_s: float) -> None:
        lanes = state.lane_keys()
        if all(state.held(*key) for key in lanes):
            return
        logger.info("standby: waiting up to %.0f s for group %r's lanes held by another member", timeout_s,
                    self.options.group)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not all(state.held(*key) for key in lanes):
            time.sleep(0.05)

    def _await_lane(self, state: _DriverState, stream: str, lane: int) -> None:
        """A batch planned while holding the lane is being replayed: wait (bounded) until we hold it again."""
        deadline = time.monotonic() + 3 * self.options.group_lease_ms / 1000
        while time.monotonic() < deadline and not state.held(stream, lane):
            time.sleep(0.05)  # the group member's background thread acquires the lease; poll its local view
        if not state.held(stream, lane):
            logger.warning(
                "replaying a batch of stream %r lane %d without holding the group %r lease (another member holds "
                "it); its rows may also be read by that member", stream, lane, self.options.group,
            )

    def _check_loss(
        self, state: _DriverState, stream: str, lane: int, start: int, bounds: tuple[int, int] | None
    ) -> int:
        head = bounds[0] if bounds else start
        if start >= head:
            return start
        oldest = state.oldest(stream, lane)
        if start >= oldest:
            return start  # below the ring head, but the grid serves it from its store
        if self.options.fail_on_data_loss:
            raise DataLossError(stream, lane, requested=start, oldest_available=oldest, unit="sequence")
        # Lost after the batch was planned (or replayed after more was overwritten): the batch's end offset is
        # logged already, and the next batch's start is past these items, so they are logged and counted by this
        # source runner only (``skipped_items``), not in the query's count carried in the offsets.
        state.late_skipped += oldest - start
        logger.warning(
            "data loss on stream %r lane %d: ring items %d..%d were overwritten after this batch was planned; "
            "skipping %d items (failOnDataLoss=false)", stream, lane, start, oldest - 1, oldest - start,
        )
        return oldest

    def commit(self, end: dict) -> None:
        self._driver().confirm(SparkOffset.from_json(end))

    def stop(self) -> None:
        if self._state is not None:
            self._state.close()


class MeteorBatchReader(_ReadsLaneRanges, DataSourceReader):
    """``spark.read.format("meteor")``: the ring items between ``startingOffsets`` and ``endingOffsets``."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema

    def partitions(self) -> Sequence[InputPartition]:
        from meteor_spark.streams import lane_bounds, open_stream

        from meteor_spark.reading import oldest_sequence

        grid = grid_for(self.options.grid)
        ranges: list[tuple[str, int, int, int]] = []
        infos = {name: open_stream(grid, name, create=False) for name in self.options.streams}
        check_dead_letter_stream(grid, self.options)
        _check_lanes(self.options.starting, "startingOffsets", infos)
        _check_lanes(self.options.ending, "endingOffsets", infos)
        for name, info in infos.items():
            for lane, (head, next_seq) in sorted(lane_bounds(grid, info).items()):
                oldest = _Once(lambda i=info, l=lane: oldest_sequence(grid, i, l))
                lo = _resolve(self.options.starting, "startingOffsets", name, lane, head, next_seq, group=None,
                              oldest=oldest)
                hi = _resolve(self.options.ending, "endingOffsets", name, lane, head, next_seq, group=None,
                              oldest=oldest)
                if hi < lo:
                    raise ConfigError(
                        f"stream {name!r} lane {lane}: endingOffsets ({hi}) is before startingOffsets ({lo}); a "
                        f"batch read takes ring sequences [start, end)"
                    )
                if lo < head and lo < oldest():
                    if self.options.fail_on_data_loss:
                        raise DataLossError(name, lane, requested=lo, oldest_available=oldest(), unit="sequence")
                    logger.warning(
                        "data loss on stream %r lane %d: ring items %d..%d were overwritten; skipping %d items "
                        "(failOnDataLoss=false)", name, lane, lo, oldest() - 1, oldest() - lo,
                    )
                    lo = min(oldest(), hi)
                ranges.append((name, lane, lo, hi))
        return [
            LaneRanges(tuple(
                LaneRange(stream, lane, lo, hi, self.options.grid, infos[stream], self.options.include_headers,
                          self.options.fail_on_data_loss, corrupt=self.options.corrupt)
                for stream, lane, lo, hi in task
            ))
            for task in _plan(self.options, ranges)
        ]


def _plan(options: SourceOptions, ranges: Sequence[Piece]) -> list[tuple[Piece, ...]]:
    tasks = plan_tasks(
        ranges, min_partitions=options.min_partitions, max_partitions=options.max_partitions,
        max_items_per_partition=options.max_offsets_per_partition,
    )
    logger.debug("planned %d Spark task(s) for %d lane range(s): %s", len(tasks), len(ranges), tasks)
    return tasks


def _by_stream(flat: dict[tuple[str, int], int]) -> dict[str, dict[int, int]]:
    nested: dict[str, dict[int, int]] = {}
    for (stream, lane), sequence in flat.items():
        nested.setdefault(stream, {})[lane] = sequence
    return nested


class _Once:
    """A value computed on first use only (the oldest servable sequence costs a grid read)."""

    def __init__(self, compute: Any) -> None:
        self._compute = compute
        self._value: int | None = None

    def __call__(self) -> int:
        if self._value is None:
            self._value = int(self._compute())
        return self._value


def check_dead_letter_stream(grid: "Grid", options: SourceOptions) -> None:
    """The dead-letter stream must exist when the query starts, not when the first corrupt item turns up."""
    from meteor_spark.streams import open_stream

    name = options.corrupt.dead_letter_stream
    if name is None:
        return
    try:
        open_stream(grid, name, create=False)
    except StreamNotFoundError as exc:
        raise StreamNotFoundError(f"option 'deadLetterStream': {exc}") from None


def _check_lanes(position: Position, option: str, infos: "dict[str, StreamInfo]") -> None:
    """Per-lane positions may name only lanes the stream has."""
    for stream, lanes in position.lanes.items():
        count = infos[stream].config.lanes
        unknown = sorted(lane for lane in lanes if lane >= count)
        if unknown:
            raise ConfigError(
                f"{option} names lane(s) {', '.join(map(str, unknown))} of stream {stream!r}, which has lanes "
                f"0..{count - 1}; give positions for those lanes only"
            )


def _resolve(
    position: Position, option: str, stream: str, lane: int, head: int, next_seq: int, *, group: str | None,
    oldest: Any,
) -> int:
    """The ring sequence a symbolic or per-lane position means for one lane. ``oldest()`` gives the oldest sequence
    the grid can serve (called only when needed: it costs a grid read).

    Raises:
        OffsetOutOfRangeError: a per-lane position past the lane's end.
    """
    if position.spec is OffsetSpec.EARLIEST:
        return oldest()
    if position.spec is OffsetSpec.LATEST:
        return next_seq
    if position.spec is OffsetSpec.GROUP:
        raise GroupError(
            f"startingOffsets=group: group {group!r} has no confirmed offset for stream {stream!r} lane {lane}; "
            f"start it with startingOffsets=earliest or latest (lanes the group has confirmed still start there)"
        )
    lanes = position.lanes.get(stream)
    if lanes is None or lane not in lanes:
        given = ", ".join(str(k) for k in sorted(lanes or {}))
        raise ConfigError(
            f"{option} has no position for stream {stream!r} lane {lane} (given lanes: {given or 'none'}); give "
            f"every lane, e.g. {{\"{stream}\": {{\"{lane}\": {EARLIEST_SENTINEL}}}}} for its oldest item"
        )
    sequence = lanes[lane]
    if sequence == EARLIEST_SENTINEL:
        return oldest()
    if sequence == LATEST_SENTINEL:
        return next_seq
    if sequence > next_seq:
        raise OffsetOutOfRangeError(
            stream, lane, sequence, oldest(), next_seq, unit="sequence",
            hint=f"{option} asks for a ring sequence nothing was written at yet; give one inside the range, or -2 "
                 f"(earliest) / -1 (latest).",
        )
    return sequence
