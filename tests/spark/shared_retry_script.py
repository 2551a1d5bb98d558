"""A Spark driver with task retries (``local[2,4]``: up to 4 attempts per task) reading a shared group, run in a
child process by ``test_shared_source``: a UDF fails the task holding one record twice, the third attempt
succeeds. Prints one JSON line: the rows the sink got (lane, offset, delivery_count) and the tasks per batch.

Usage: shared_retry_script.py MEMBERS CLUSTER STREAM CHECKPOINT MARKER POISON
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.functions import udf
from pyspark.sql.types import BinaryType


def main() -> None:
    members, cluster, stream, checkpoint, marker_path, poison_text = sys.argv[1:7]
    marker, poison = Path(marker_path), poison_text.encode()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (
        SparkSession.builder.master("local[2,4]")
        .appName("meteor-shared-retry-test")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")

    def check(value: bytes) -> bytes:
        if value == poison and marker.read_text().count("x") < 2:
            with marker.open("a") as f:
                f.write("x")
            raise RuntimeError("task attempt fails on purpose")
        return value

    fail_twice = udf(check, BinaryType())
    rows: list[list[Any]] = []
    tasks: list[int] = []

    def on_batch(batch: Any, batch_id: int) -> None:
        tasks.append(batch.rdd.getNumPartitions())
        got = batch.select(fail_twice("value").alias("value"), "lane", "offset", "delivery_count").collect()
        rows.extend([r.lane, r.offset, r.delivery_count] for r in got)

    query = (
        spark.readStream.format("meteor")
        .option("hazelcast.members", members)
        .option("hazelcast.clusterName", cluster)
        .option("stream", stream)
        .option("group", "work")
        .option("shared", "true")
        .option("maxRecordsPerTrigger", "800")
        .option("minPartitions", "16")
        .load()
        .writeStream.foreachBatch(on_batch)
        .option("checkpointLocation", checkpoint)
        .start()
    )
    query.processAllAvailable()
    query.stop()
    print("RESULT " + json.dumps({"rows": rows, "tasks": tasks, "attempts": marker.read_text().count("x")}), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
