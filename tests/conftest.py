"""Fixtures every test tier shares.

The grid: ``METEOR_TEST_HAZELCAST=host:port[,host:port...]`` (cluster name from ``METEOR_TEST_CLUSTER``, default
``dev``) selects a real Hazelcast 5.x cluster; otherwise one embedded member is started in its own process for the
whole run. Every integration test takes its grid from ``grid_settings`` / ``grid``, so the suite runs unchanged against both.
"""

from __future__ import annotations

import os
import sys
import uuid
from typing import Iterator

import pytest

from meteor_spark.config import spark_conf
from meteor_spark.grid import Grid, GridSettings, split_members

REAL_HAZELCAST = os.environ.get("METEOR_TEST_HAZELCAST")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not REAL_HAZELCAST:
        return
    skip = pytest.mark.skip(reason="exercises the embedded grid's own process; METEOR_TEST_HAZELCAST is set")
    for item in items:
        if "embedded_only" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def grid_settings() -> Iterator[GridSettings]:
    """Connection settings of the grid under test (real member or embedded member process)."""
    if REAL_HAZELCAST:
        yield GridSettings(
            members=split_members(REAL_HAZELCAST), cluster_name=os.environ.get("METEOR_TEST_CLUSTER", "dev")
        )
        return
    from meteor_spark.server import EmbeddedGrid

    server = EmbeddedGrid(port=0, process=True)
    server.start()
    try:
        yield GridSettings(members=(server.address,), cluster_name=server.cluster_name)
    finally:
        server.stop()


@pytest.fixture(scope="session")
def grid(grid_settings: GridSettings) -> Iterator[Grid]:
    """One client connection shared by the whole run."""
    with Grid(grid_settings) as shared:
        yield shared


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> str:
    """A name no other test uses (streams, maps, groups), so tests never see each other's data."""
    base = "".join(c if c.isalnum() else "-" for c in request.node.name)[:40]
    return f"t-{base}-{uuid.uuid4().hex[:8]}"


CHECKPOINT_MANAGER = "spark.sql.streaming.checkpointFileManagerClass"


@pytest.fixture(scope="session")
def spark() -> Iterator["object"]:
    """The one SparkSession of the run: local[2], workers on this interpreter."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("meteor-spark-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.streaming.pollingDelay", "10ms")
        # the Python worker's connect-back handshake, generous for a loaded 2-core CI machine (Spark's default: 15 s)
        .config("spark.python.authenticate.socketTimeout", "120s")
        # the shipped checkpoint manager (conf/spark-defaults.conf says why): tests run micro-batches as users do
        .config(CHECKPOINT_MANAGER, spark_conf()[CHECKPOINT_MANAGER])
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
