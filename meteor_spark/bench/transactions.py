"""``meteor bench transactions``: the transactional Spark sink vs the plain one (streaming meteor -> meteor), and a
``read_committed`` vs ``read_uncommitted`` batch read, measured side by side in the same run. The Spark code lives
in ``meteor_spark.bench.jobs.transactions`` (only ``meteor_spark.spark`` imports pyspark).
"""

from __future__ import annotations

import argparse
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="small sizes (seconds): 50,000 records, 5 batches")
    parser.add_argument("--records", type=int, default=None, help="source records (default 1,000,000)")
    parser.add_argument("--batches", type=int, default=None, help="micro-batches of the write (default 20)")
    parser.add_argument("--repeat", type=int, default=None, help="runs per figure, median reported (default 3)")


def run(args: argparse.Namespace) -> dict[str, Any]:
    from meteor_spark.bench.jobs.transactions import run as run_spark

    records = args.records or (50_000 if args.quick else 1_000_000)
    batches = args.batches or (5 if args.quick else 20)
    repeat = args.repeat or (1 if args.quick else 3)
    return run_spark(records, batches, repeat)


def render(figures: dict[str, Any]) -> str:
    from meteor_spark.bench.jobs.transactions import render as render_spark

    return render_spark(figures)
