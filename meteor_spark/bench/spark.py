"""``meteor bench spark``: the Spark connector's throughput next to ceilings measured in the same run.

Streaming read into the ``noop`` sink (Trigger.AvailableNow, rows / addBatch time) next to a synthetic in-memory
Python Arrow source, and a batch ``df.write`` of a cached DataFrame next to a no-op Python Arrow writer, for 1 and
4 lanes, 100-byte records, an embedded grid in its own process and a local[2] SparkSession; after a warm-up,
medians of ``--repeat`` runs. The Spark code lives in
``meteor_spark.bench.jobs.throughput`` (only ``meteor_spark.spark`` imports pyspark).

``--latency`` measures publish -> row latency with the default trigger instead, next to the same query over a
source that costs nothing (``meteor_spark.bench.jobs.latency``).

``--pushdown`` measures a batch read's ``where timestamp >= t`` selecting the newest 1 % with filter pushdown on and
off: ring items read and wall time side by side (``meteor_spark.bench.jobs.pushdown``; default 10,000,000 records,
``--records`` to change it, 3 runs).

``--pattern`` measures what planning one micro-batch of a ``streamPattern`` query costs on the driver at 1, 10, 100
and 1,000 matching streams (``--streams`` to change them): ``latestOffset`` + ``partitions`` called directly, no
SparkSession (``meteor_spark.bench.jobs.pattern``).
"""

from __future__ import annotations

import argparse
from typing import Any

from meteor_spark.errors import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="small sizes (seconds): 100,000 records")
    parser.add_argument("--records", type=int, default=None, help="records per run (default 2,000,000)")
    parser.add_argument("--lanes", default="1,4", help="lane counts to compare, comma-separated (default 1,4)")
    parser.add_argument(
        "--partitions",
        type=int,
        default=None,
        help="Spark tasks per read and write (default: the connector's planning; the cores)",
    )
    parser.add_argument(
        "--repeat", type=int, default=None, help="runs per figure, the median is reported (default 5; 1 with --quick)"
    )
    parser.add_argument(
        "--latency",
        action="store_true",
        help="measure publish -> row latency (default trigger, 200 records/s for 20 s, 5 with "
        "--quick) next to a source that costs nothing, instead of throughput",
    )
    parser.add_argument(
        "--pushdown",
        action="store_true",
        help="measure a batch read's `where timestamp >= t` selecting the newest 1%% with filter pushdown on and "
        "off (ring items read, wall time; default 10,000,000 records), instead of throughput",
    )
    parser.add_argument(
        "--pattern",
        action="store_true",
        help="measure the driver's planning of one streamPattern micro-batch (latestOffset + partitions) at 1, 10, "
        "100 and 1,000 matching streams, instead of throughput",
    )
    parser.add_argument(
        "--streams",
        default="1,10,100,1000",
        help="with --pattern: the matching stream counts, comma-separated (default 1,10,100,1000)",
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.latency:
        from meteor_spark.bench.jobs import latency as latency_benchmark

        return {"latency": latency_benchmark.run(seconds=5 if args.quick else 20, warm_up_s=2 if args.quick else 5)}
    if args.pushdown:
        from meteor_spark.bench.jobs import pushdown as pushdown_benchmark

        records = args.records or (100_000 if args.quick else 10_000_000)
        return {"pushdown": pushdown_benchmark.run(records, args.repeat or (1 if args.quick else 3))}
    if args.pattern:
        return {"pattern": _pattern(args)}
    from meteor_spark.bench.jobs.throughput import run as run_spark

    records = args.records or (100_000 if args.quick else 2_000_000)
    lanes = [int(part) for part in str(args.lanes).split(",") if part.strip()]
    repeat = args.repeat or (1 if args.quick else 5)
    return run_spark(records, lanes, args.partitions, repeat)


def render(figures: dict[str, Any]) -> str:
    """The figures of ``run`` as the table ``meteor bench spark`` prints."""
    if "latency" in figures:
        from meteor_spark.bench.jobs import latency as latency_benchmark

        return latency_benchmark.render(figures["latency"])
    if "pushdown" in figures:
        from meteor_spark.bench.jobs import pushdown as pushdown_benchmark

        return pushdown_benchmark.render(figures["pushdown"])
    if "pattern" in figures:
        from meteor_spark.bench.jobs import pattern as pattern_benchmark

        return pattern_benchmark.render(figures["pattern"])
    from meteor_spark.bench.jobs.throughput import render as render_spark

    return render_spark(figures)


def _pattern(args: argparse.Namespace) -> dict[str, Any]:
    """``--pattern``: the stream counts checked (ConfigError naming ``--streams``), then the driver-side run."""
    from meteor_spark.bench.jobs import pattern as pattern_benchmark

    try:
        counts = tuple(int(part) for part in str(args.streams).split(",") if part.strip())
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1 or max(counts) > 10_000:
        raise ConfigError(f"--streams must list stream counts of 1..10000, comma-separated, got {args.streams!r}")
    return pattern_benchmark.run(counts, batches=args.repeat or (5 if args.quick else 20))
