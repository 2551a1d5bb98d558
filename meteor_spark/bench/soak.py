"""``meteor bench soak``: a long transactional meteor -> meteor streaming query with a ``read_committed``
subscriber and a shared group reading its output, printing the grid's map sizes and the member's memory every
``--every`` micro-batches, then records in/out, lost, duplicated. A command to watch state stay bounded, not a
throughput figure. The Spark code lives in ``meteor_spark.bench.jobs.soak`` (only ``meteor_spark.spark`` imports
pyspark).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from meteor_spark.errors import ConfigError
from meteor_spark.grid.transactions import SWEEP_INTERVAL_S


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="small sizes (a minute or so): 100 batches, every 25")
    parser.add_argument("--batches", type=int, default=None, help="micro-batches to run (default 10,000)")
    parser.add_argument("--every", type=int, default=None, help="sample every this many micro-batches (default 1,000)")
    parser.add_argument("--trigger-ms", type=int, default=10, help="processing-time trigger in ms (default 10)")
    parser.add_argument(
        "--sweep-interval-ms",
        type=int,
        default=int(SWEEP_INTERVAL_S * 1000),
        help="the sink's sweepIntervalMs: how often decided transactions are removed (default: the sink's default)",
    )
    parser.add_argument(
        "--capacity",
        type=int,
        default=1000,
        help="ring items per lane of the target stream (small, so its lanes wrap; default 1,000)",
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    from meteor_spark.bench.jobs.soak import run as run_spark

    batches = args.batches if args.batches is not None else (100 if args.quick else 10_000)
    every = args.every if args.every is not None else (25 if args.quick else 1000)
    for name, value, least in (
        ("--batches", batches, 1),
        ("--every", every, 1),
        ("--trigger-ms", args.trigger_ms, 0),
        ("--sweep-interval-ms", args.sweep_interval_ms, 1),
        ("--capacity", args.capacity, 1),
    ):
        if value < least:
            raise ConfigError(f"{name} must be at least {least}, got {value}")

    def progress(line: str) -> None:
        print(line, flush=True)

    if every > batches:
        print(f"--every {every} is above --batches {batches}: one sample at the end", file=sys.stderr)
    return run_spark(batches, every, args.trigger_ms, args.sweep_interval_ms, args.capacity, progress)


def render(figures: dict[str, Any]) -> str:
    from meteor_spark.bench.jobs.soak import render as render_spark

    return render_spark(figures)
