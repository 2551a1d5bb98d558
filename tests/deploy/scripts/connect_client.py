"""Run by the deployed Python: a Spark Connect client using format("meteor") on a remote session.

Usage: connect_client.py REMOTE MEMBERS CLUSTER SOURCE TARGET GROUP (plain|register)
``register`` first registers the data source from the client (the class travels to the server, pickled); ``plain``
relies on the server finding it by itself (meteor-spark installed in the server's Python).
Prints one JSON line of findings.
"""

import json
import sys
from typing import Any


def main() -> None:
    remote, members, cluster, source, target, group, mode = sys.argv[1:8]
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.remote(remote).getOrCreate()
    if mode == "register":
        from meteor_spark.spark import MeteorDataSource

        spark.dataSource.register(MeteorDataSource)
    grid = {"hazelcast.members": members, "hazelcast.clusterName": cluster}
    findings: dict[str, Any] = {"mode": mode, "connect": type(spark).__module__}

    batch = spark.read.format("meteor").options(**grid).option("stream", source).load()
    findings["batch_count"] = batch.count()

    sink = f"seen_{mode}"
    query = (
        spark.readStream.format("meteor")
        .options(**grid)
        .option("stream", source)
        .option("group", group)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "8")
        .load()
        .writeStream.format("memory")
        .queryName(sink)
        .start()
    )
    query.processAllAvailable()
    query.stop()
    findings["stream_rows"] = spark.table(sink).count()
    findings["stream_distinct"] = spark.table(sink).select("value").distinct().count()

    batch.select("key", "value").write.format("meteor").options(**grid).option("stream", target).mode("append").save()
    findings["written"] = spark.read.format("meteor").options(**grid).option("stream", target).load().count()
    spark.stop()
    print(json.dumps(findings))


if __name__ == "__main__":
    main()
