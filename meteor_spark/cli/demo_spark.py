"""The demo's Spark side: a quiet local session on the packaged configuration, and the windowed query from
``orders`` to ``order-stats``. PySpark is imported inside the functions only, so importing this module stays cheap.
"""

from __future__ import annotations

import os
import re
import sys
import warnings
from pathlib import Path
from typing import Any

from meteor_spark.cli.demo_orders import GROUP, ORDERS, RESULTS, WATERMARK
from meteor_spark.config import CONF_DIR, grid_options, spark_conf
from meteor_spark.errors import MeteorError
from meteor_spark.grid.client import Grid

_PYTHON_ERROR_LINE = re.compile(r"^[\w.]*(Error|Exception)\b[^:]*: ")


def essence(text: str) -> str:
    """Spark's error text is a JVM wrapper around a Python traceback: keep its first line and the Python error."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return "(no message)"
    errors = [line for line in lines[1:] if _PYTHON_ERROR_LINE.match(line)]
    return lines[0] if not errors else f"{lines[0]} ... {errors[-1]}"


def local_spark_session(app_name: str, conf_dir: Path | None = None) -> Any:
    """A local SparkSession configured from ``conf/spark-defaults.conf`` and ``conf/log4j2.properties`` (quiet
    console), with workers on this interpreter."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # PySpark warns about pandas >= 3 on import; the connector does not use pandas, so it is noise here.
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)
    from pyspark.sql import SparkSession

    import meteor_spark.spark  # noqa: F401  (names the `spark` extra when pyspark is missing)

    settings = spark_conf(conf_dir or CONF_DIR)
    builder = SparkSession.builder.appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    try:
        session = builder.getOrCreate()
    except Exception as exc:  # py4j/JVM start-up failures are not MeteorErrors; the user needs one clear line
        raise MeteorError(
            f"could not start Spark ({essence(str(exc))}); Spark needs Java 17 or newer on the PATH "
            f"(`java -version`; `bash .ci/dev demo` installs it)"
        ) from exc
    session.sparkContext.setLogLevel("ERROR")
    # No register() call: Spark finds format("meteor") through the installed top-level `pyspark_meteor` module,
    # which is exactly what a user's own job relies on.
    return session


def start_windowed_query(spark: Any, grid: Grid, checkpoint: str, trigger: str) -> Any:
    """The demo's query: orders (JSON) -> 1-minute windows per category -> ``order-stats``."""
    from pyspark.sql import functions as F

    connection = grid_options(grid.settings)
    orders = (
        spark.readStream.format("meteor")
        .option("stream", ORDERS)
        .option("group", GROUP)
        .option("startingOffsets", "earliest")
        .options(**connection)
        .load()
    )
    schema = (
        "type STRING, order_id STRING, customer STRING, category STRING, product STRING, quantity INT, "
        "price DOUBLE, event_time TIMESTAMP"
    )
    events = orders.select(F.from_json(F.col("value").cast("string"), schema).alias("e")).select("e.*")
    windows = (
        events.withWatermark("event_time", WATERMARK)
        # Orders only. The clock event must reach the watermark first, so the filter is written against
        # event_time: Spark pushes filters that do not reference the event-time column below the watermark.
        .where(F.when(F.col("type") == "order", F.col("event_time")).isNotNull())
        .groupBy(F.window("event_time", "1 minute"), F.col("category"))
        .agg(F.count("*").alias("orders"), F.round(F.sum(F.col("price") * F.col("quantity")), 2).alias("revenue"))
    )
    results = windows.select(
        F.col("category").cast("binary").alias("key"),
        F.to_json(
            F.struct(
                F.col("window.start").alias("window_start"),
                F.col("window.end").alias("window_end"),
                "category",
                "orders",
                "revenue",
            )
        )
        .cast("binary")
        .alias("value"),
    )
    return (
        results.writeStream.format("meteor")
        .queryName("orders_per_minute")
        .option("stream", RESULTS)
        .options(**connection)
        .option("checkpointLocation", checkpoint)
        .outputMode("append")
        .trigger(processingTime=trigger)
        .start()
    )
