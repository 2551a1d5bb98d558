"""Fixtures every test tier shares.

The grid under test, one for the whole run:
- ``METEOR_TEST_GRID=embedded`` (the default): one embedded member in its own process;
- ``METEOR_TEST_GRID=hazelcast`` (or ``hazelcast-5.3.8``, any fetched release): one real Hazelcast member started
  from ``hazelcast/member.xml`` (tests/real_members.py); only the tests that take the grid run, the rest ran in the
  embedded pass already;
- ``METEOR_TEST_HAZELCAST=host:port[,host:port...]`` (cluster name from ``METEOR_TEST_CLUSTER``, default ``dev``):
  an external Hazelcast 5.x cluster someone else started.
Every integration test takes its grid from ``grid_settings`` / ``grid``, so the suite runs unchanged against each.
Tests marked ``embedded_only`` (they kill, restart or inspect the embedded member's own process) are skipped on a
real member.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator

import pytest

from meteor_spark.config import spark_conf
from meteor_spark.grid.client import Grid, GridSettings, split_members

EXTERNAL_HAZELCAST = os.environ.get("METEOR_TEST_HAZELCAST")
GRID_UNDER_TEST = os.environ.get("METEOR_TEST_GRID", "embedded")
REAL_MEMBER = GRID_UNDER_TEST.startswith("hazelcast")
REAL_HAZELCAST = bool(EXTERNAL_HAZELCAST) or REAL_MEMBER


def _real_member_version() -> str:
    from tests.real_members import DEFAULT_VERSION

    _, _, version = GRID_UNDER_TEST.partition("-")
    return version or DEFAULT_VERSION


def pytest_report_header(config: pytest.Config) -> str:
    if EXTERNAL_HAZELCAST:
        return f"grid under test: external Hazelcast cluster {EXTERNAL_HAZELCAST}"
    if REAL_MEMBER:
        return f"grid under test: a real Hazelcast {_real_member_version()} member (hazelcast/member.xml)"
    return "grid under test: the embedded member"


def _runs_in_another_pass(item: pytest.Item) -> bool:
    """A deployment test (``deploy``) or a heavy end-to-end fault run (``once``) that takes the grid, when CI's
    passes run those in another pass (``.ci/dev`` sets ``METEOR_TEST_DEPLOY_PASS`` to that pass's grid): what they
    add is the topology or the fault, and the grid calls they make are under the rest of the suite on both grids."""
    deploy_pass = os.environ.get("METEOR_TEST_DEPLOY_PASS")
    return (
        deploy_pass is not None
        and deploy_pass != GRID_UNDER_TEST
        and ("deploy" in item.keywords or "once" in item.keywords)
        and "grid_settings" in getattr(item, "fixturenames", ())
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not REAL_HAZELCAST and not os.environ.get("METEOR_TEST_DEPLOY_PASS"):
        return
    skip = pytest.mark.skip(reason="exercises the embedded grid's own process; the grid under test is a real member")
    selected, deselected = [], []
    for item in items:
        if REAL_HAZELCAST and "embedded_only" in item.keywords:
            item.add_marker(skip)
        # the real-member pass repeats what talks to the grid; what never touches it ran in the embedded pass
        grid_less = REAL_MEMBER and "grid_settings" not in getattr(item, "fixturenames", ())
        if grid_less or _runs_in_another_pass(item):
            deselected.append(item)
        else:
            selected.append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = selected


@pytest.fixture(scope="session")
def grid_settings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GridSettings]:
    """Connection settings of the grid under test (real member or embedded member process)."""
    if EXTERNAL_HAZELCAST:
        yield GridSettings(
            members=split_members(EXTERNAL_HAZELCAST), cluster_name=os.environ.get("METEOR_TEST_CLUSTER", "dev")
        )
        return
    if REAL_MEMBER:
        from tests.real_members import HazelcastMember

        with HazelcastMember(tmp_path_factory.mktemp("hazelcast"), version=_real_member_version()) as member:
            yield GridSettings(members=(member.address,), cluster_name=member.cluster_name)
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
def spark() -> Iterator[object]:
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
