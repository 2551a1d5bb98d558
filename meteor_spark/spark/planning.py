"""Planning a batch's Spark tasks: split lane ranges, group small ones, and admission control (``rate_limit`` in
ring items, ``byte_limit`` in estimated bytes).

Pure functions of their inputs (no grid, no Spark), so equal inputs give equal plans: a replayed batch reads
exactly the same ring items in the same tasks.

Tasks (``plan_tasks``): a lane range is split when large, so one busy lane keeps every core reading (by default
into as many tasks as the driver has CPUs, the local cores in local mode), and small ranges are grouped into one
task, because each Python task costs Spark ~0.1 s to start: four lanes on two cores read fastest as two tasks.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import os
from collections.abc import Sequence

from meteor_spark.spark.options import SourceOptions

logger = logging.getLogger(__name__)

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
        heap: list[tuple[float, int]] = [(-(hi - lo), index) for index, (_, _, lo, hi) in enumerate(cut)]
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
    for (stream, lane, lo, hi), k in zip(cut, parts, strict=True):
        size = hi - lo
        bounds = [lo + (j * size) // k for j in range(k + 1)]
        pieces.extend((stream, lane, a, b) for a, b in itertools.pairwise(bounds))
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
        fits = [i for i in range(len(loads)) if max_items_per_task is None or loads[i] + size <= max_items_per_task]
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
    target = min_partitions if min_partitions is not None else (cpus or default_partitions())
    if max_partitions is not None:
        target = min(target, max_partitions)  # splitting beyond the cap would only be grouped back, scattered
    pieces = plan_partitions(
        ranges,
        min_partitions=target,
        max_items_per_partition=max_items_per_partition,
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


def byte_limit(
    start: dict[tuple[str, int], int],
    latest: dict[tuple[str, int], int],
    item_bytes: dict[tuple[str, int], float],
    *,
    max_bytes: int | None,
    max_lane_bytes: int | None,
) -> dict[tuple[str, int], int]:
    """Ends that admit about ``max_bytes`` over all lanes and ``max_lane_bytes`` per lane, given each lane's
    estimated bytes per ring item (``item_bytes``; a lane without an estimate is not limited).

    The global budget is split in proportion to each lane's backlog in bytes, like ``rate_limit``. Every lane with
    a backlog admits at least one item, so a lane of items larger than its share cannot stall; a batch may
    therefore exceed a cap by up to one item per lane (and by the error of the estimate).
    """
    backlog = {key: max(0, latest[key] - start[key]) for key in latest}
    take = dict(backlog)
    for key, items in backlog.items():
        size = item_bytes.get(key)
        if items and size and max_lane_bytes is not None:
            take[key] = min(take[key], max(1, math.floor(max_lane_bytes / size)))
    if max_bytes is not None:
        lane_bytes = {key: take[key] * item_bytes.get(key, 0.0) for key in take}
        total = sum(lane_bytes.values())
        if total > max_bytes:
            for key, items in take.items():
                size = item_bytes.get(key)
                if items and size:
                    share = max_bytes * lane_bytes[key] / total
                    take[key] = min(items, max(1, math.floor(share / size)))
    return {key: start[key] + take[key] for key in backlog}


def plan_for(options: SourceOptions, ranges: Sequence[Piece]) -> list[tuple[Piece, ...]]:
    """``plan_tasks`` with the query's partitioning options."""
    tasks = plan_tasks(
        ranges,
        min_partitions=options.min_partitions,
        max_partitions=options.max_partitions,
        max_items_per_partition=options.max_offsets_per_partition,
    )
    logger.debug("planned %d Spark task(s) for %d lane range(s): %s", len(tasks), len(ranges), tasks)
    return tasks


def by_stream(flat: dict[tuple[str, int], int]) -> dict[str, dict[int, int]]:
    """``{(stream, lane): sequence}`` nested as ``{stream: {lane: sequence}}`` (the shape of a Spark offset)."""
    nested: dict[str, dict[int, int]] = {}
    for (stream, lane), sequence in flat.items():
        nested.setdefault(stream, {})[lane] = sequence
    return nested
