"""Spark Connect: a server started from the pyspark wheel (its connect jar ships in pyspark/jars), meteor-spark
installed in the server's Python, and a remote client doing a batch read, a grouped streaming read and a batch write
with ``format("meteor")``, with and without registering the data source from the client.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from deploy_helpers import (
    deploy_env,
    free_port,
    losses,
    publish_numbered,
    pyspark_home,
    read_all_values,
    run_script,
    start,
    stop,
    wait_for_log,
)

from meteor_spark.format.offsets import make_offset
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.streams import lane_bounds, open_stream
from meteor_spark.groups.admin import group_state

pytestmark = [pytest.mark.deploy, pytest.mark.slow, pytest.mark.timeout(1200)]

RECORDS = 2_000


@pytest.fixture(scope="module")
def connect_server(deploy_python: Path, outside: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``sc://127.0.0.1:PORT`` of a Spark Connect server (local[2]) whose Python workers run the deployed Python."""
    home = pyspark_home(deploy_python)
    port = free_port()
    log = tmp_path_factory.mktemp("connect") / "connect-server.log"
    env = {**deploy_env(deploy_python), "SPARK_HOME": str(home)}
    args = [
        str(home / "bin" / "spark-submit"),
        "--class",
        "org.apache.spark.sql.connect.service.SparkConnectServer",
        "--name",
        "meteor-connect-test",
        "--master",
        "local[2]",
        "--driver-memory",
        "1g",
        "--conf",
        "spark.connect.grpc.binding.address=127.0.0.1",
        "--conf",
        f"spark.connect.grpc.binding.port={port}",
        "--conf",
        "spark.ui.enabled=false",
        "--conf",
        "spark.sql.shuffle.partitions=2",
        "--conf",
        "spark.python.authenticate.socketTimeout=120s",
        "spark-internal",
    ]
    server = start(args, log, env, outside)
    try:
        wait_for_log(log, "Spark Connect server started", server, timeout_s=300)
        yield f"sc://127.0.0.1:{port}"
    finally:
        stop(server)


@pytest.mark.parametrize("mode", ["plain", "register"])
def test_batch_read_grouped_stream_and_write_over_connect(
    mode: str,
    connect_server: str,
    deploy_python: Path,
    outside: Path,
    grid: Grid,
    grid_settings: GridSettings,
    unique_name: str,
) -> None:
    source, target, group = f"{unique_name}-in", f"{unique_name}-out", "connect"
    publish_numbered(grid, source, count=RECORDS, lanes=2, per_item=50)
    done = run_script(
        deploy_python,
        "connect_client.py",
        [connect_server, ",".join(grid_settings.members), grid_settings.cluster_name, source, target, group, mode],
        cwd=outside,
        env=deploy_env(deploy_python),
        timeout_s=600,
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr[-5000:]}"
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["connect"].startswith("pyspark.sql.connect"), found  # really a remote session
    assert found["batch_count"] == RECORDS
    assert (found["stream_rows"], found["stream_distinct"]) == (RECORDS, RECORDS)
    assert found["written"] == RECORDS
    lost, duplicated = losses(RECORDS, read_all_values(grid, target))
    assert (lost, duplicated) == (0, 0)
    # the grouped read confirmed every lane to its end
    info = open_stream(grid, source, create=False)
    ends = {lane: make_offset(end, 0) for lane, (_head, end) in lane_bounds(grid, info).items()}
    assert {s.lane: s.confirmed for s in group_state(grid, info, group)} == ends
    print(
        f"Spark Connect ({mode}): batch read {found['batch_count']:,}, grouped stream {found['stream_rows']:,}, "
        f"written {found['written']:,}; lost {lost}, duplicated {duplicated}"
    )
