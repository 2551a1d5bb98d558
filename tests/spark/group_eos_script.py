"""A Spark driver the group exactly-once fault test runs in a child process: a grouped meteor stream -> a
transactional meteor stream, each run with a checkpoint of its own (a restart resumes from the group alone).

Usage: group_eos_script.py MEMBERS CLUSTER SOURCE TARGET CHECKPOINT GROUP (forever|available-now)
"""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession


def main() -> None:
    members, cluster, source, target, checkpoint, group, mode = sys.argv[1:8]
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
    writer = (
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
        .writeStream.format("meteor")
        .options(**grid)
        .option("checkpointLocation", checkpoint)
        .option("groupOffsets", "true")
        # A killed run's transaction that staged no offsets yet is aborted by its timeout.
        .option("transactionTimeoutMs", "8000")
    )
    if mode == "available-now":
        writer.trigger(availableNow=True).start(target).awaitTermination()
        print("DONE", flush=True)
    else:
        writer.trigger(processingTime="0 seconds").start(target).awaitTermination()


if __name__ == "__main__":
    main()
