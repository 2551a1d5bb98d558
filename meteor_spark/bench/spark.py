"""``meteor bench spark``: the Spark connector's throughput next to ceilings measured in the same run.

Streaming read into the ``noop`` sink (Trigger.AvailableNow, rows / addBatch time) next to a synthetic in-memory
Python Arrow source, and a batch ``df.write`` next to a no-op Python Arrow writer, for 1 and 4 lanes, 100-byte
records, an embedded grid in its own process and a local[2] SparkSession. The Spark code lives in
``meteor_spark.spark.benchmark`` (only ``meteor_spark.spark`` imports pyspark).
"""

from __future__ import annotations

import argparse
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="small sizes (seconds): 100,000 records")
    parser.add_argument("--records", type=int, default=None, help="records per run (default 2,000,000)")
    parser.add_argument("--lanes", default="1,4", help="lane counts to compare, comma-separated (default 1,4)")
    parser.add_argument("--partitions", type=int, default=2, help="Spark tasks per read (default 2 = the cores)")


def run(args: argparse.Namespace) -> dict[str, Any]:
    from meteor_spark.spark.benchmark import run as run_spark

    records = args.records or (100_000 if args.quick else 2_000_000)
    lanes = [int(part) for part in str(args.lanes).split(",") if part.strip()]
    return run_spark(records, lanes, args.partitions)
