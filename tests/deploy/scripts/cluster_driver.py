"""Run by the deployed Python: a grouped streaming query meteor -> meteor on a Spark standalone cluster.

Usage: cluster_driver.py MASTER_URL MEMBERS CLUSTER SOURCE TARGET GROUP CHECKPOINT STOP_FILE
Runs until STOP_FILE exists (the test creates it once the target holds everything), then stops cleanly.
"""

import sys
import time
from pathlib import Path
from typing import Any


def main() -> None:
    master, members, cluster, source, target, group, checkpoint, stop_file = sys.argv[1:9]
    from pyspark.sql import SparkSession

    from meteor_spark.config import spark_conf

    settings: dict[str, Any] = {**spark_conf(), "spark.master": master}  # config(map=) takes any option value type
    spark = (
        SparkSession.builder.appName("meteor-cluster-test")
        .config(map=settings)
        .config("spark.executor.memory", "512m")
        .config("spark.executor.cores", "1")
        .config("spark.cores.max", "2")
        # one retry more than the default is not needed: the lost executor's tasks are retried on the other one
        .getOrCreate()
    )
    grid = {"hazelcast.members": members, "hazelcast.clusterName": cluster}
    query = (
        spark.readStream.format("meteor")
        .options(**grid)
        .option("stream", source)
        .option("group", group)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "16")
        .load()
        .select("key", "value")
        .writeStream.format("meteor")
        .options(**grid)
        .option("stream", target)
        .option("checkpointLocation", checkpoint)
        # One transaction per micro-batch: a task re-run after its executor died aborts the lost attempt's records.
        .option("transactional", "true")
        .option("transactionTimeoutMs", "20000")
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    print("QUERY STARTED", flush=True)
    while not Path(stop_file).exists():
        if query.exception() is not None:
            print(f"QUERY FAILED: {query.exception()}", flush=True)
            sys.exit(1)
        time.sleep(0.2)
    query.stop()
    spark.stop()
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
