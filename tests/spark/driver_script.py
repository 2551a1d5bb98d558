"""A Spark driver the SIGKILL test runs in a child process: meteor stream -> meteor stream, with a checkpoint.

Usage: driver_script.py MEMBERS CLUSTER SOURCE TARGET CHECKPOINT (forever|available-now)
"""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession


def main() -> None:
    members, cluster, source, target, checkpoint, mode = sys.argv[1:7]
    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (
        SparkSession.builder.master("local[1]")
        .appName("meteor-kill-test")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    grid = {"hazelcast.members": members, "hazelcast.clusterName": cluster}
    writer = (
        spark.readStream.format("meteor")
        .options(**grid)
        .option("stream", source)
        .option("startingOffsets", "earliest")
        # Small batches while it may be killed (kills land mid-stream); larger ones to finish quickly.
        .option("maxOffsetsPerTrigger", "8" if mode == "available-now" else "1")
        .option("group", "killed")
        .option("groupMemberId", "the-driver")
        .load()
        .writeStream.format("meteor")
        .options(**grid)
        .option("checkpointLocation", checkpoint)
        # A restart aborts the killed run's open transaction at once (fencing); the timeout is a backstop.
        .option("transactional", "true")
        .option("transactionTimeoutMs", "10000")
    )
    if mode == "available-now":
        writer.trigger(availableNow=True).start(target).awaitTermination()
        print("DONE", flush=True)
    else:
        writer.trigger(processingTime="0 seconds").start(target).awaitTermination()


if __name__ == "__main__":
    main()
