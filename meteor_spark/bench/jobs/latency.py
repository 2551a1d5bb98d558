"""The Spark side of ``meteor bench spark --latency``: publish -> row latency of a streaming query with the
default trigger, next to the same query over a source that costs nothing, measured in the same run.

Setup: an embedded grid in its own process, a local[2] SparkSession with the packaged ``spark_conf``, a stream of
one lane, 100-byte records.

* **meteor**: ``readStream.format("meteor")`` (``startingOffsets=latest``), **no trigger set** (Spark starts the
  next micro-batch as soon as the previous one ends and finds new data), into the latency sink below. A publisher
  thread publishes single records (``publish_async``) at a steady ``RATE`` per second; the record's ``timestamp``
  column is its publish time.
* **ceiling**: the same query shape over ``bench-clock``, a Python stream source that reads nothing: row ``i``
  "is published" at ``start + i / RATE``, ``latestOffset`` returns the rows published by now, and ``read`` builds
  them in memory with that time as their ``timestamp``. What it measures is Spark's own cost of a micro-batch of a
  Python source into this sink. It runs after the meteor query, while the grid and the publisher thread still run
  (publishing into the stream, unread), so both queries share the machine with the same background work.

The sink is a Python Arrow stream writer (``bench-latency``). Its ``write`` runs on the executor and notes, per
row, ``seen - timestamp`` (the time the row reached the sink; ``seen`` is taken per Arrow batch); its ``commit``
(Spark's commit worker, once the batch's tasks succeeded) writes the batch's rows, their latencies and the commit
time to a file per batch id, which the benchmark reads. A Python writer rather than ``foreachBatch``: the row
reaches it on the executor inside the micro-batch, as it reaches a user's sink, with no extra Spark job (a
``foreachBatch`` would have to ``collect`` to see the rows, a second job per batch) and no Py4J callback, and its
``commit`` tells when the batch is done. Reported per row: publish -> seen by the sink, and publish -> its batch
committed (the row is visible then).

Figures are taken from the rows published in a window that starts after the query's first batch and a warm-up
(the first batches start Python workers and connect grid clients) and lasts ``seconds``; every record published in
the window must reach the sink (a missing one fails the run: no latency figure may hide a lost record). Each
micro-batch that read rows of the window contributes its ``durationMs`` (Spark's breakdown: latestOffset,
queryPlanning, addBatch, walCommit, commitOffsets, triggerExecution); medians are reported. The load average before
and after is printed next to the table (a shared 2-core machine varies by tens of percent between runs).

Issue target on 2 cores: p50 <= 250 ms, p99 <= 400 ms publish -> row.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)

from meteor_spark.bench.jobs.session import bench_session
from meteor_spark.bench.jobs.throughput import RowRange
from meteor_spark.config import grid_options
from meteor_spark.format.arrow_columns import ARROW_SCHEMA
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.streams import StreamConfig, open_stream
from meteor_spark.groups.admin import delete_stream
from meteor_spark.producer.publisher import Publisher
from meteor_spark.spark.datasource import SOURCE_SCHEMA
from meteor_spark.tables import render_table

#: Records published per second, one ``publish_async`` each.
RATE = 200
RECORD_BYTES = 100
TARGET_P50_MS = 250
TARGET_P99_MS = 400
#: Spark's ``durationMs`` entries reported, in the order a micro-batch runs them.
PHASES = ("latestOffset", "queryPlanning", "addBatch", "walCommit", "commitOffsets", "triggerExecution")
#: How long the first micro-batch with rows may take (starting Python workers on a loaded machine).
FIRST_BATCH_TIMEOUT_S = 180.0
#: How long the rows published in the window may take to reach the sink after the window closed.
DRAIN_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class LatencyRun:
    """One query's figures. Latencies in milliseconds, over the rows published in the measured window."""

    rows: int
    seen_ms: dict[str, float]
    committed_ms: dict[str, float]
    batches: int
    phases_ms: dict[str, float]

    def as_dict(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "seen_ms": self.seen_ms,
            "committed_ms": self.committed_ms,
            "batches": self.batches,
            "phases_ms": self.phases_ms,
        }


def run(seconds: float, warm_up_s: float) -> dict[str, Any]:
    """Measure both queries (meteor, then the ceiling) and return their figures; ``render`` prints them."""
    load_before = os.getloadavg()
    with bench_session("meteor-bench-spark-latency") as (spark, settings):
        spark.dataSource.register(ClockSource)
        spark.dataSource.register(LatencySink)
        with Grid(settings) as grid:
            name = f"bench-latency-{uuid.uuid4().hex[:6]}"
            open_stream(grid, StreamConfig(name, lanes=1))
            try:
                # The publisher and the grid run during both measurements: the ceiling shares their load.
                with _Publishing(grid, name) as publishing:
                    meteor = _measure_meteor(spark, settings, name, publishing, seconds, warm_up_s)
                    ceiling = _measure_ceiling(spark, seconds, warm_up_s)
            finally:
                delete_stream(grid, name)
        return {
            "seconds": seconds,
            "rate": RATE,
            "meteor": meteor.as_dict(),
            "ceiling": ceiling.as_dict(),
            "load_average": (load_before[0], os.getloadavg()[0]),
        }


class _Publishing:
    """A thread publishing single records (``publish_async``) to ``stream`` at ``RATE`` per second."""

    def __init__(self, grid: Grid, stream: str) -> None:
        self._grid = grid
        self._stream = stream
        self._published: list[tuple[float, Any]] = []  # (publish call time, future of the record's offset)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._publish, name="bench-latency-publisher", daemon=True)

    def __enter__(self) -> _Publishing:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def offsets_between(self, low: float, high: float) -> set[int]:
        """The offsets of the records published in ``[low, high)`` (epoch seconds), once they are stored."""
        return {future.result(30) for at, future in list(self._published) if low <= at < high}

    def _publish(self) -> None:
        with Publisher(self._grid, self._stream) as publisher:
            value = b"x" * RECORD_BYTES
            due = time.monotonic()
            while not self._stop.is_set():
                self._published.append((time.time(), publisher.publish_async(value)))
                due += 1 / RATE
                self._stop.wait(max(0.0, due - time.monotonic()))
            publisher.flush()


def _measure_meteor(
    spark: Any, settings: GridSettings, name: str, publishing: _Publishing, seconds: float, warm_up_s: float
) -> LatencyRun:
    df = (
        spark.readStream.format("meteor")
        .options(**grid_options(settings))
        .option("stream", name)
        .option("startingOffsets", "latest")
        .load()
    )
    with _SinkRun(df) as sink:
        low, high = sink.window(seconds, warm_up_s)
        return sink.figures(publishing.offsets_between(low, high))


def _measure_ceiling(spark: Any, seconds: float, warm_up_s: float) -> LatencyRun:
    start = time.time()
    df = spark.readStream.format("bench-clock").option("start", repr(start)).load()
    with _SinkRun(df) as sink:
        low, high = sink.window(seconds, warm_up_s)
        # Row i is published at start + i / RATE.
        expected = set(range(int((low - start) * RATE) + 1, int((high - start) * RATE) + 1))
        return sink.figures(expected)


class _SinkRun:
    """A query of ``df`` into the latency sink (default trigger), and reading what the sink committed."""

    def __init__(self, df: Any) -> None:
        self._df = df
        self._dir = Path(tempfile.mkdtemp(prefix="meteor-bench-latency-"))
        self._query: Any = None
        self._progress: dict[int, dict[str, Any]] = {}

    def __enter__(self) -> _SinkRun:
        (self._dir / "batches").mkdir()
        self._query = (
            self._df.writeStream.format("bench-latency")
            .option("dir", str(self._dir / "batches"))
            .option("checkpointLocation", str(self._dir / "checkpoint"))
            .start()
        )
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self._query is not None:
                # Stopping cancels the batch under way (the clock source never runs dry); Spark logs that
                # cancellation as an ERROR with a stack trace, which says nothing here.
                context = self._df.sparkSession.sparkContext
                context.setLogLevel("OFF")
                try:
                    self._query.stop()
                finally:
                    context.setLogLevel("ERROR")
        finally:
            import shutil

            shutil.rmtree(self._dir, ignore_errors=True)

    def window(self, seconds: float, warm_up_s: float) -> tuple[float, float]:
        """Wait for the first batch with rows, then ``warm_up_s``; return the measured window (epoch seconds)
        after ``seconds`` more."""
        self._wait(lambda: any(self._batches()), FIRST_BATCH_TIMEOUT_S, "the first micro-batch with rows")
        self._pause(warm_up_s)
        low = time.time()
        self._pause(seconds)
        return low, time.time()

    def figures(self, expected: set[int]) -> LatencyRun:
        """The latencies of the ``expected`` rows (by offset), once every one of them reached the sink."""
        rows: dict[int, tuple[float, float]] = {}
        batch_ids: set[int] = set()

        def arrived() -> bool:
            for batch_id, batch in self._batches().items():
                for offset, seen_ms, committed_ms in batch:
                    if offset in expected:
                        rows[offset] = (seen_ms, committed_ms)
                        batch_ids.add(batch_id)
            return len(rows) == len(expected)

        self._wait(arrived, DRAIN_TIMEOUT_S, f"{len(expected)} rows published in the window")
        self._wait(lambda: batch_ids <= set(self._collect_progress()), DRAIN_TIMEOUT_S, "the batches' progress")
        progress = [self._progress[batch_id] for batch_id in sorted(batch_ids)]
        return LatencyRun(
            rows=len(rows),
            seen_ms=_percentiles([seen for seen, _ in rows.values()]),
            committed_ms=_percentiles([committed for _, committed in rows.values()]),
            batches=len(progress),
            phases_ms={
                phase: statistics.median(float(p["durationMs"].get(phase, 0)) for p in progress) for phase in PHASES
            },
        )

    def _batches(self) -> dict[int, list[tuple[int, float, float]]]:
        """What the sink committed: per batch id, (offset, seen ms, committed ms) per row."""
        out = {}
        for path in self._dir.joinpath("batches").glob("*.json"):
            out[int(path.stem)] = [(int(o), float(s), float(c)) for o, s, c in json.loads(path.read_text())["rows"]]
        return out

    def _collect_progress(self) -> dict[int, dict[str, Any]]:
        # recentProgress keeps the last 100 batches only: collect as the query runs.
        for progress in self._query.recentProgress:
            self._progress.setdefault(int(progress["batchId"]), progress)
        return self._progress

    def _check(self) -> None:
        error = self._query.exception()
        if error is not None:
            raise RuntimeError(f"the latency query failed: {error}")

    def _pause(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self._collect_progress()
            self._check()
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))

    def _wait(self, condition: Any, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            self._collect_progress()
            self._check()
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {timeout_s:.0f} s waiting for {what}")
            time.sleep(0.2)


def _percentiles(values: Sequence[float]) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        raise RuntimeError("no row was published in the measured window; measure for longer")

    def at(fraction: float) -> float:
        return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]

    return {"p50": at(0.50), "p99": at(0.99), "max": ordered[-1]}


def render(figures: dict[str, Any]) -> str:
    """The figures of ``run`` as the tables ``meteor bench spark --latency`` prints."""
    rows = []
    for label, key in (("meteor", "meteor"), ("ceiling (bench-clock)", "ceiling")):
        f = figures[key]
        seen, committed = f["seen_ms"], f["committed_ms"]
        rows.append(
            [
                label,
                f"{f['rows']:,}",
                f"{seen['p50']:.0f}",
                f"{seen['p99']:.0f}",
                f"{seen['max']:.0f}",
                f"{committed['p50']:.0f}",
                f"{committed['p99']:.0f}",
                f"{f['phases_ms']['triggerExecution']:.0f}",
            ]
        )
    phases = [
        [label, *(f"{figures[key]['phases_ms'][p]:.0f}" for p in PHASES), str(figures[key]["batches"])]
        for label, key in (("meteor", "meteor"), ("ceiling (bench-clock)", "ceiling"))
    ]
    before, after = figures["load_average"]
    return "\n".join(
        [
            f"meteor bench spark --latency: publish -> row, default trigger, {figures['rate']} records/s of "
            f"{RECORD_BYTES} bytes for {figures['seconds']:g} s, 1 lane, local[2] (ms; target p50 <= {TARGET_P50_MS}, "
            f"p99 <= {TARGET_P99_MS})",
            render_table(
                ["QUERY", "ROWS", "P50", "P99", "MAX", "COMMIT P50", "COMMIT P99", "BATCH P50"],
                rows,
                right=list(range(1, 8)),
            ),
            "median durationMs of the micro-batches that read those rows:",
            render_table(["QUERY", *PHASES, "BATCHES"], phases, right=list(range(1, len(PHASES) + 2))),
            f"load average {before:.2f} before, {after:.2f} after",
        ]
    )


# ---------------------------------------------------------------------------------------------- source and sink


class ClockSource(DataSource):
    """A stream of rows that cost nothing to read, with meteor's schema: row ``i`` is published at
    ``start + i / RATE`` (option ``start``, epoch seconds), its ``timestamp`` column."""

    @classmethod
    def name(cls) -> str:
        return "bench-clock"

    def schema(self) -> Any:
        return SOURCE_SCHEMA

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return _ClockReader(float(self.options["start"]))


class _ClockReader(DataSourceStreamReader):
    def __init__(self, start: float) -> None:
        self.start = start

    def _published(self) -> int:
        return int((time.time() - self.start) * RATE)

    def initialOffset(self) -> dict:
        return {"rows": self._published()}

    def latestOffset(self, start: dict, limit: Any) -> dict:
        return {"rows": self._published()}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return [RowRange(start["rows"], end["rows"])]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        import pyarrow as pa

        assert isinstance(partition, RowRange)
        # Offset i is row i + 1 (offsets count rows published up to and including it).
        offsets = list(range(partition.start + 1, partition.end + 1))
        n = len(offsets)
        yield pa.RecordBatch.from_arrays(
            [
                pa.nulls(n, pa.binary()),
                pa.array([b"x" * RECORD_BYTES] * n, pa.binary()),
                pa.array(["clock"] * n, pa.string()),
                pa.array([0] * n, pa.int32()),
                pa.array(offsets, pa.int64()),
                pa.array([int((self.start + i / RATE) * 1_000_000) for i in offsets], pa.timestamp("us", tz="UTC")),
            ],
            schema=ARROW_SCHEMA,
        )


@dataclass(frozen=True)
class _Seen(WriterCommitMessage):
    #: (offset, publish time in epoch microseconds, seen by the sink in epoch seconds) per row.
    rows: list[tuple[int, int, float]]


class LatencySink(DataSource):
    """A Python Arrow stream writer that notes when each row reached it (option ``dir``: where ``commit`` writes
    one JSON file per batch id: ``[offset, seen - timestamp, committed - timestamp]`` per row, in ms)."""

    @classmethod
    def name(cls) -> str:
        return "bench-latency"

    def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamArrowWriter:
        return _LatencyWriter(self.options["dir"])


class _LatencyWriter(DataSourceStreamArrowWriter):
    def __init__(self, directory: str) -> None:
        self.directory = directory

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        rows: list[tuple[int, int, float]] = []
        for batch in iterator:
            seen = time.time()
            stamps = batch.column("timestamp").cast("int64").to_pylist()
            rows.extend(
                (offset, stamp, seen) for offset, stamp in zip(batch.column("offset").to_pylist(), stamps, strict=True)
            )
        return _Seen(rows)

    def commit(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        committed = time.time()
        rows = [
            [offset, seen * 1000 - stamp / 1000, committed * 1000 - stamp / 1000]
            for message in messages
            if isinstance(message, _Seen)
            for offset, stamp, seen in message.rows
        ]
        # Written whole, then renamed: the benchmark never reads half a file. A replayed batch id overwrites.
        path = Path(self.directory) / f"{batchId}.json"
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps({"rows": rows}))
        temporary.replace(path)
