"""The set-up every Spark benchmark (``meteor bench spark``, ``--latency``, ``meteor bench transactions``) runs in:
an embedded grid in its own process and a local SparkSession with the packaged, quiet Spark defaults.

Inside a test run a SparkSession is already active: the benchmark borrows it and leaves it running (stopping it
would stop the test session's).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from meteor_spark.config import CONF_DIR, spark_conf
from meteor_spark.grid.client import GridSettings
from meteor_spark.server import EmbeddedGrid


@contextmanager
def bench_session(app_name: str, extra_conf: Mapping[str, str] | None = None) -> Iterator[tuple[Any, GridSettings]]:
    """``(spark, grid settings)``: a fresh embedded grid and a SparkSession with ``spark_conf`` (plus
    ``extra_conf``) at log level ERROR; on exit the session (when this call started it) and the grid are stopped."""
    with bench_member_session(app_name, extra_conf) as (spark, settings, _server):
        yield spark, settings


@contextmanager
def bench_member_session(
    app_name: str, extra_conf: Mapping[str, str] | None = None
) -> Iterator[tuple[Any, GridSettings, EmbeddedGrid]]:
    """``bench_session`` plus the embedded grid itself (its member process's pid, for benchmarks that watch the
    member's memory)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    server = EmbeddedGrid(port=0, process=True)
    server.start()
    spark = None
    owned = SparkSession.getActiveSession() is None
    try:
        builder = SparkSession.builder.appName(app_name)
        for key, value in {**spark_conf(CONF_DIR), **(extra_conf or {})}.items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        yield spark, GridSettings(members=(server.address,), cluster_name=server.cluster_name), server
    finally:
        if spark is not None and owned:
            spark.stop()
        server.stop()
