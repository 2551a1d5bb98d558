"""A Spark driver whose write tasks fail part-way: meteor stream -> meteor stream, one task attempt of partition 0
fails after its first rows were published (``local[2,4]``: Spark retries a failed task up to 4 times).

The failure is the sink's own: the first attempt of partition 0 sends its fourth slice of rows to a stream that
does not exist (``createStream=false``), after the writer published the slices before it. (An exception raised
upstream, in ``mapInArrow``, ends the writer's Python worker before it publishes what it was handed.)

Usage: txn_script.py MEMBERS CLUSTER SOURCE TARGET CHECKPOINT TRANSACTIONAL(true|false)
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator

from pyspark import TaskContext
from pyspark.sql import SparkSession


def routed(target: str) -> Callable[[Iterator], Iterator]:
    def route(batches: Iterator) -> Iterator:
        """Rows to ``target`` in slices of 4; the first attempt of partition 0 sends its fourth slice nowhere."""
        import pyarrow as pa

        context = TaskContext.get()
        failing = context is not None and context.partitionId() == 0 and context.attemptNumber() == 0
        handed = 0
        for batch in batches:
            for start in range(0, batch.num_rows, 4):
                piece = batch.slice(start, 4)
                name = f"{target}-missing" if failing and handed == 3 else target
                handed += 1
                yield piece.append_column("stream", pa.array([name] * piece.num_rows, pa.string()))

    return route


def main() -> None:
    members, cluster, source, target, checkpoint, transactional = sys.argv[1:7]
    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (
        SparkSession.builder.master("local[2,4]")
        .appName("meteor-txn-test")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "4")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    grid = {"hazelcast.members": members, "hazelcast.clusterName": cluster}
    rows = (
        spark.readStream.format("meteor")
        .options(**grid)
        .option("stream", source)
        .option("startingOffsets", "earliest")
        .load()
        .select("key", "value")
    )
    (
        rows.mapInArrow(routed(target), "key binary, value binary, stream string")
        .writeStream.format("meteor")
        .options(**grid)
        .option("checkpointLocation", checkpoint)
        .option("createStream", "false")
        .option("transactional", transactional)
        .trigger(availableNow=True)
        .start()
        .awaitTermination()
    )
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
