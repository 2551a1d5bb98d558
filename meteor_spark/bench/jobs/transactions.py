"""The Spark side of ``meteor bench transactions``: what the transactional sink and ``read_committed`` cost, next
to the plain sink and ``read_uncommitted`` measured in the same run.

Setup: an embedded grid in its own process, a local[2] SparkSession (or the active one), a source stream of
100-byte records in 2 lanes.

* **write**: a streaming query meteor -> meteor (``Trigger.AvailableNow``, ``maxOffsetsPerTrigger`` cutting the
  source into ``--batches`` micro-batches, so the per-batch transaction work is paid that many times), once with
  ``transactional=true`` and once with ``false``, into fresh target streams; wall time of the query.
* **read**: ``spark.read.format("meteor")`` of the transactional target into the ``noop`` sink, with
  ``isolation=read_committed`` and ``read_uncommitted``; wall time of the job.

Each figure is the median of ``--repeat`` runs, the two variants interleaved, after a small warm-up of each path.
"""

from __future__ import annotations

import os
import statistics
import time
import uuid
from typing import Any

from meteor_spark.bench.jobs.session import bench_session
from meteor_spark.config import grid_options
from meteor_spark.grid.client import Grid
from meteor_spark.grid.streams import StreamConfig, open_stream
from meteor_spark.producer.publisher import Publisher
from meteor_spark.tables import render_table

RECORD_BYTES = 100
LANES = 2


def run(records: int, batches: int, repeat: int) -> dict[str, Any]:
    """Run the benchmark; figures in records/s (medians) plus the samples."""
    load_before = os.getloadavg()
    with bench_session("meteor-bench-transactions") as (spark, settings):
        options = grid_options(settings)
        with Grid(settings) as grid:
            source = _source(grid, records)
            warm = _source(grid, 2000)
            items = sum(grid.ring(name).tail() + 1 for name in open_stream(grid, source).ring_names)
            per_batch = max(1, items // batches)
            written: dict[bool, str] = {}

            def write(name: str, transactional: bool) -> float:
                seconds, written[transactional] = _write(spark, grid, options, name, transactional, per_batch)
                return seconds

            write(warm, True)
            write(warm, False)
            _read(spark, options, written[True], "read_committed")
            _read(spark, options, written[True], "read_uncommitted")
            samples: dict[str, list[float]] = {
                "write_transactional": [],
                "write_plain": [],
                "read_committed": [],
                "read_uncommitted": [],
            }
            for _ in range(repeat):
                samples["write_transactional"].append(records / write(source, True))
                samples["write_plain"].append(records / write(source, False))
                samples["read_committed"].append(records / _read(spark, options, written[True], "read_committed"))
                samples["read_uncommitted"].append(records / _read(spark, options, written[True], "read_uncommitted"))
        figures: dict[str, Any] = {name: statistics.median(values) for name, values in samples.items()}
        figures["settings"] = {
            "records": records,
            "batches": batches,
            "items_per_batch": per_batch,
            "repeat": repeat,
            "load_before": load_before,
            "load_after": os.getloadavg(),
        }
        figures["samples"] = samples
        return figures


def _write(
    spark: Any, grid: Grid, options: dict[str, str], name: str, transactional: bool, per_batch: int
) -> tuple[float, str]:
    """Copy stream ``name`` into a new stream with a streaming query (``per_batch`` ring items a micro-batch, until
    the source is read: availableNow), through the transactional sink or the plain one; returns the seconds the
    query took and the stream written."""
    target = f"bench-txn-out-{uuid.uuid4().hex[:8]}"
    open_stream(grid, StreamConfig(target, lanes=LANES))
    checkpoint = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"meteor-bench-{uuid.uuid4().hex}")
    started = time.perf_counter()
    (
        spark.readStream.format("meteor")
        .options(**options)
        .option("stream", name)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(per_batch))
        .load()
        .select("key", "value")
        .writeStream.format("meteor")
        .options(**options)
        .option("transactional", str(transactional).lower())
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start(target)
        .awaitTermination()
    )
    return time.perf_counter() - started, target


def _read(spark: Any, options: dict[str, str], name: str, isolation: str) -> float:
    """Seconds a batch read of stream ``name`` with ``isolation`` takes (into Spark's no-op sink)."""
    started = time.perf_counter()
    (
        spark.read.format("meteor")
        .options(**options)
        .option("stream", name)
        .option("isolation", isolation)
        .load()
        .write.format("noop")
        .mode("overwrite")
        .save()
    )
    return time.perf_counter() - started


def _source(grid: Grid, records: int) -> str:
    name = f"bench-txn-in-{uuid.uuid4().hex[:8]}"
    with Publisher(grid, StreamConfig(name, lanes=LANES, capacity=max(10_000, records // 100 + 1000))) as pub:
        pub.publish_many([b"%0*d" % (RECORD_BYTES, i) for i in range(records)])
    return name


def render(figures: dict[str, Any]) -> str:
    settings = figures["settings"]
    rows = [
        (
            "write meteor -> meteor",
            f"{figures['write_transactional']:,.0f}",
            f"{figures['write_plain']:,.0f}",
            f"{figures['write_transactional'] / figures['write_plain']:.0%}",
        ),
        (
            "batch read",
            f"{figures['read_committed']:,.0f}",
            f"{figures['read_uncommitted']:,.0f}",
            f"{figures['read_committed'] / figures['read_uncommitted']:.0%}",
        ),
    ]
    table = render_table(
        ("records/s (median)", "transactional / read_committed", "plain / read_uncommitted", "ratio"), rows
    )
    return (
        f"{table}\n{settings['records']:,} records of {RECORD_BYTES} bytes in {LANES} lanes, "
        f"{settings['batches']} micro-batches of {settings['items_per_batch']} ring items, median of "
        f"{settings['repeat']}; load {settings['load_before'][0]:.1f} -> {settings['load_after'][0]:.1f}"
    )
