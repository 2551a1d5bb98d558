"""Run by the deployed Python from outside the checkout: the installed package alone, as a user's script.

Usage: wheel_read.py MEMBERS CLUSTER STREAM EXPECTED_RECORDS
Prints one JSON line of findings; the test asserts on it.
"""

import json
import os
import sys
from importlib.metadata import requires
from typing import Any


def main() -> None:
    members, cluster, stream, expected = sys.argv[1:5]
    import meteor_spark
    from meteor_spark import Grid, Publisher, StreamConfig  # noqa: F401  (the core: numpy, pyarrow, lz4, hazelcast)
    from meteor_spark.config import CONF_DIR, grid_options, spark_conf

    findings: dict[str, Any] = {
        "package": meteor_spark.__file__,
        "prefix": sys.prefix,
        "shim": __import__("pyspark_meteor").__file__,
        "conf_files": sorted(os.listdir(CONF_DIR)),
        "requires": requires("meteor-spark"),
    }
    from pyspark.sql import SparkSession

    # The packaged defaults (local[2], quiet log4j2 file); no register(): format("meteor") comes from the shim.
    conf: dict[str, Any] = spark_conf()  # pyspark's config(map=) takes a dict of any option value type
    spark = SparkSession.builder.appName("meteor-wheel-check").config(map=conf).getOrCreate()
    grid = Grid.connect(members, cluster_name=cluster)
    frame = spark.read.format("meteor").option("stream", stream).options(**grid_options(grid.settings)).load()
    findings["count"] = frame.count()
    findings["distinct"] = frame.select("value").distinct().count()
    findings["expected"] = int(expected)
    spark.stop()
    grid.close()
    print(json.dumps(findings))


if __name__ == "__main__":
    main()
