"""A Spark driver the group exactly-once fault test runs in a child process: a grouped meteor stream -> a
transactional meteor stream, each run with a checkpoint of its own (a restart resumes from the group alone).

Usage: group_eos_script.py MEMBERS CLUSTER SOURCE TARGET CHECKPOINT GROUP (forever|available-now|held FLAGS_DIR)

``held``: every batch passes through a step that, once the file FLAGS_DIR/hold exists, writes FLAGS_DIR/reached
and waits for FLAGS_DIR/go (a batch held between its read and its commit, for the test to take its lanes over);
the query's failure is printed as ``FAILED: <message>``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from pyspark.sql import SparkSession


def held(flags: Path) -> Callable[[Iterator], Iterator]:
    def step(batches: Iterator) -> Iterator:
        for batch in batches:
            if (flags / "hold").exists():
                (flags / "reached").touch()
                deadline = time.monotonic() + 300
                while not (flags / "go").exists() and time.monotonic() < deadline:
                    time.sleep(0.05)
            yield batch

    return step


def main() -> None:
    members, cluster, source, target, checkpoint, group, mode = sys.argv[1:8]
    flags = Path(sys.argv[8]) if mode == "held" else None
    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("meteor-group-eos-test")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.sql.streaming.pollingDelay", "10ms")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    grid = {"hazelcast.members": members, "hazelcast.clusterName": cluster}
    rows = (
        spark.readStream.format("meteor")
        .options(**grid)
        .option("stream", source)
        .option("startingOffsets", "earliest")
        # Small batches while it may be killed (kills land mid-stream); larger ones to finish quickly.
        .option("maxOffsetsPerTrigger", "16" if mode == "available-now" else "2")
        .option("group", group)
        # A killed run's lanes pass to the next run this long after its last renewal.
        .option("groupLeaseMs", "2000")
        .load()
        .select("key", "value")
    )
    if flags is not None:
        rows = rows.mapInArrow(held(flags), "key binary, value binary")
    writer = (
        rows.writeStream.format("meteor")
        .options(**grid)
        .option("checkpointLocation", checkpoint)
        .option("groupOffsets", "true")
        # A killed run's transaction that staged no offsets yet is aborted by its timeout.
        .option("transactionTimeoutMs", "8000")
    )
    if mode == "available-now":
        writer.trigger(availableNow=True).start(target).awaitTermination()
        print("DONE", flush=True)
    elif mode == "held":
        try:
            writer.trigger(processingTime="0 seconds").start(target).awaitTermination()
        except Exception as exc:  # the query's failure, for the test to read
            print("FAILED: " + " | ".join(line.strip() for line in str(exc).splitlines()), flush=True)
            sys.exit(1)
    else:
        writer.trigger(processingTime="0 seconds").start(target).awaitTermination()


if __name__ == "__main__":
    main()
