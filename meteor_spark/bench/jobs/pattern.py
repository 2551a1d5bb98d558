"""The driver side of ``meteor bench spark --pattern``: what planning one micro-batch of a ``streamPattern`` query
costs as the number of matching streams grows (1, 10, 100, 1,000 by default).

No SparkSession: the stream reader's source-runner methods are called directly, in the order Spark calls them
(``latestOffset``, ``partitions``, ``commit``), as Spark's source runner would. Setup: an embedded grid in its
own process; per stream count, that many fresh one-lane streams under a prefix of their own (so the pattern
matches exactly them); before each timed micro-batch one ring item is appended to ``--moving`` of them (default
10: most streams of a pattern query are idle at any one time). Timed: ``latestOffset`` + ``partitions`` of each
micro-batch, on the planning thread; medians and the slowest of ``--repeat`` micro-batches after a warm-up (one
started every 50 ms at most, as a trigger interval would), the grid calls one micro-batch sends (counted on that
thread), and how long after it was appended an item became part of a micro-batch's end offset (idle lanes are
read less often: ``meteor_spark.spark.lane_watch``).

Target (issue 24): ``latestOffset`` + planning <= 50 ms per micro-batch at 1,000 streams.
"""

from __future__ import annotations

import os
import re
import statistics
import threading
import time
import uuid
from collections import Counter
from typing import Any, cast

from pyspark.sql.streaming.datasource import ReadAllAvailable

from meteor_spark.bench.harness import bench_grid
from meteor_spark.config import grid_options
from meteor_spark.format.records import Record, encode_batch
from meteor_spark.grid.client import Grid
from meteor_spark.grid.streams import StreamConfig, StreamInfo, open_stream
from meteor_spark.spark.datasource import SOURCE_SCHEMA
from meteor_spark.spark.options import SourceOptions
from meteor_spark.spark.reader import MeteorStreamReader
from meteor_spark.tables import render_table

COUNTS = (1, 10, 100, 1000)
#: Most a micro-batch may take at 1,000 streams (issue 24).
TARGET_MS = 50.0
#: Micro-batches start at most this often (a trigger interval), so idle lanes' refresh is measured in time.
PACE_S = 0.05


class CountingGrid:
    """A ``Grid`` whose maps and rings count the calls made from the planning thread (a group member's renewals
    run on threads of their own and are not planning work)."""

    def __init__(self, grid: Grid) -> None:
        self._grid = grid
        self.calls: Counter[str] = Counter()
        self.thread = threading.get_ident()

    def map(self, name: str) -> Any:
        return _Counting(self._grid.map(name), f"map {name}", self)

    def ring(self, name: str) -> Any:
        return _Counting(self._grid.ring(name), "ring", self)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)

    def total(self) -> int:
        return sum(self.calls.values())


class _Counting:
    def __init__(self, target: Any, label: str, counter: CountingGrid) -> None:
        self._target = target
        self._label = label
        self._counter = counter

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() == self._counter.thread:
                self._counter.calls[f"{self._label}.{name}"] += 1
            return attr(*args, **kwargs)

        return call


def run(counts: tuple[int, ...] = COUNTS, batches: int = 20, moving: int = 10) -> dict[str, Any]:
    """Create the streams and time ``batches`` micro-batches of a pattern query at each stream count."""
    points = []
    with bench_grid() as (grid, settings):
        for count in counts:
            prefix = f"bench-pattern-{uuid.uuid4().hex[:6]}-{count}-"
            infos = [open_stream(grid, StreamConfig(f"{prefix}{i:05d}", lanes=1, capacity=1000)) for i in range(count)]
            options = SourceOptions.parse(
                {
                    **grid_options(settings),
                    "streamPattern": re.escape(prefix) + ".*",
                    "startingOffsets": "earliest",
                }
            )
            for watched in (False, True):
                point = _measure(grid, options, infos, batches, min(moving, count), watched=watched)
                points.append(point | {"watched": watched})
    return {"batches": batches, "moving": moving, "points": points, "load": os.getloadavg()}


def _measure(
    grid: Grid, options: SourceOptions, infos: list[StreamInfo], batches: int, moving: int, *, watched: bool
) -> dict[str, Any]:
    """One side at one stream count: ``watched`` plans as the connector does (``lane_watch``), else every lane's
    bounds are read at every micro-batch (as before ``lane_watch``), for the ratio in the same run."""
    reader = MeteorStreamReader(options, SOURCE_SCHEMA)
    state = reader._driver()  # the source runner's state, as Spark's first call creates it
    counting = CountingGrid(state.grid)
    state.grid = cast(Grid, counting)
    if not watched:
        state.watch = None
    #: stream -> (when its item was appended, the lane end that makes it visible)
    pending: dict[str, tuple[float, int]] = {}
    seen_ms: list[float] = []
    try:
        started = time.perf_counter()
        start = reader.initialOffset()
        first_ms = (time.perf_counter() - started) * 1000
        took: list[float] = []
        calls: list[int] = []
        for batch in range(batches + 1):  # the first is a warm-up
            paced = time.perf_counter() + PACE_S
            for n in range(moving):
                info = infos[(batch * moving + n) % len(infos)]
                item = encode_batch([Record(b"x" * 100)], producer_id=7, producer_seq=batch)
                sequence = grid.ring(info.ring_names[0]).add_all([item])
                pending.setdefault(info.name, (time.perf_counter(), sequence + 1))
            counting.calls.clear()
            began = time.perf_counter()
            end = reader.latestOffset(start, ReadAllAvailable())
            reader.partitions(start, end)
            elapsed = (time.perf_counter() - began) * 1000
            ordered = counting.total()
            reader.commit(end)
            start = end
            _settle(pending, end, seen_ms)
            if batch:
                took.append(elapsed)
                calls.append(ordered)
            time.sleep(max(0.0, paced - time.perf_counter()))
        deadline = time.perf_counter() + 5
        while pending and time.perf_counter() < deadline:  # the last items published: when they became visible
            time.sleep(PACE_S)
            end = reader.latestOffset(start, ReadAllAvailable())
            reader.commit(end)
            start = end
            _settle(pending, end, seen_ms)
    finally:
        reader.stop()
    return {
        "streams": len(infos),
        "moving": moving,
        "first_ms": first_ms,
        "median_ms": statistics.median(took),
        "max_ms": max(took),
        "calls": statistics.median(calls),
        "max_calls": max(calls),
        "visible_max_ms": max(seen_ms) if seen_ms else None,
        "unseen": len(pending),
        "load": os.getloadavg()[0],
    }


def _settle(pending: dict[str, tuple[float, int]], end: dict[str, Any], seen_ms: list[float]) -> None:
    """Move the streams whose appended item the offset ``end`` covers from ``pending`` to ``seen_ms``."""
    now = time.perf_counter()
    for name, (appended, needed) in list(pending.items()):
        if int(end.get(name, {}).get("0", 0)) >= needed:
            seen_ms.append((now - appended) * 1000)
            del pending[name]


def render(figures: dict[str, Any]) -> str:
    """The figures of ``run`` as the table ``meteor bench spark --pattern`` prints."""
    points = figures["points"]
    rows = [
        [
            f"{p['streams']:,}",
            "idle lanes less often" if p["watched"] else "every lane, every batch",
            str(p["moving"]),
            f"{p['first_ms']:,.1f}",
            f"{p['median_ms']:.2f}",
            f"{p['max_ms']:.2f}",
            f"{p['median_ms'] / p['streams'] * 1000:,.0f}",
            f"{p['calls']:g} ({p['max_calls']})",
            "-" if p["visible_max_ms"] is None else f"{p['visible_max_ms']:,.0f}",
            str(p["unseen"]),
            f"{p['load']:.2f}",
        ]
        for p in points
    ]
    at_target = [p for p in points if p["streams"] >= 1000 and p["watched"]]
    verdict = (
        "not measured (no count of 1,000 streams or more)"
        if not at_target
        else ("met" if all(p["median_ms"] <= TARGET_MS for p in at_target) else "MISSED")
    )
    return "\n".join(
        [
            f"meteor bench spark --pattern: latestOffset + partitions of one micro-batch of a streamPattern query "
            f"(driver side, no Spark), one-lane streams, one new item in {figures['moving']} of them per batch, "
            f"{figures['batches']} batches after a warm-up",
            render_table(
                [
                    "STREAMS",
                    "BOUNDS READ",
                    "MOVING",
                    "FIRST (initialOffset) MS",
                    "MEDIAN MS",
                    "MAX MS",
                    "US/STREAM",
                    "GRID CALLS (MAX)",
                    "NEW ITEM SEEN AFTER MS (MAX)",
                    "UNSEEN",
                    "LOAD 1M",
                ],
                rows,
                right=[0, *range(2, 11)],
            ),
            f"target: median <= {TARGET_MS:.0f} ms per micro-batch at 1,000 streams: {verdict}",
        ]
    )
