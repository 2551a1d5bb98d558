"""A Spark standalone cluster from the pyspark wheel's own launcher: a master and two one-core workers, each its own
process on loopback, executors on the deployed Python. A grouped query meteor -> meteor keeps running when one
worker and its executor are SIGKILLed mid-query: Spark retries the lost tasks on the other worker, and a
read_committed reader of the target (transactional sink) reads every record exactly once.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from deploy_helpers import (
    deploy_env,
    descendants,
    free_port,
    kill_tree,
    losses,
    publish_numbered,
    pyspark_home,
    read_all_values,
    record_count,
    start,
    stop,
    wait_for_log,
)

from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.streams import StreamConfig, open_stream
from meteor_spark.testing import committed_values, wait_until

pytestmark = [pytest.mark.deploy, pytest.mark.fault, pytest.mark.slow, pytest.mark.timeout(1200)]

RECORDS = 20_000
#: Ring items per micro-batch (the driver script's maxOffsetsPerTrigger) and records per item.
ITEMS_PER_BATCH, PER_ITEM = 16, 100


class Cluster:
    def __init__(self, master_url: str, workers: list[subprocess.Popen[bytes]], logs: list[Path]) -> None:
        self.master_url = master_url
        self.workers = workers
        self.logs = logs


@pytest.fixture
def cluster(deploy_python: Path, outside: Path, tmp_path: Path) -> Iterator[Cluster]:
    home = pyspark_home(deploy_python)
    env = {
        **deploy_env(deploy_python),
        "SPARK_HOME": str(home),
        "SPARK_DAEMON_MEMORY": "256m",
        "SPARK_NO_DAEMONIZE": "1",
    }
    spark_class = str(home / "bin" / "spark-class")
    port = free_port()
    master_url = f"spark://127.0.0.1:{port}"
    started: list[subprocess.Popen[bytes]] = []
    try:
        master_log = tmp_path / "master.log"
        master = start(
            [
                spark_class,
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--webui-port",
                str(free_port()),
            ],
            master_log,
            env,
            outside,
        )
        started.append(master)
        wait_for_log(master_log, "I have been elected leader", master, timeout_s=180)
        workers, logs = [], []
        for n in range(2):
            log = tmp_path / f"worker-{n}.log"
            work_dir = tmp_path / f"work-{n}"
            worker = start(
                [
                    spark_class,
                    "org.apache.spark.deploy.worker.Worker",
                    "--host",
                    "127.0.0.1",
                    "--cores",
                    "1",
                    "--memory",
                    "768m",
                    "--webui-port",
                    str(free_port()),
                    "--work-dir",
                    str(work_dir),
                    master_url,
                ],
                log,
                env,
                outside,
            )
            started.append(worker)
            workers.append(worker)
            logs.append(log)
        for worker, log in zip(workers, logs, strict=True):
            wait_for_log(log, "Successfully registered with master", worker, timeout_s=180)
        yield Cluster(master_url, workers, logs)
    finally:
        for process in reversed(started):
            stop(process)


def test_grouped_query_survives_a_worker_killed_mid_query(
    cluster: Cluster,
    deploy_python: Path,
    outside: Path,
    grid: Grid,
    grid_settings: GridSettings,
    unique_name: str,
    tmp_path: Path,
) -> None:
    source, target = f"{unique_name}-in", f"{unique_name}-out"
    publish_numbered(grid, source, count=RECORDS, lanes=2, per_item=PER_ITEM)  # 200 ring items
    open_stream(grid, StreamConfig(target, lanes=1))
    stop_file = tmp_path / "stop"
    args = [
        cluster.master_url,
        ",".join(grid_settings.members),
        grid_settings.cluster_name,
        source,
        target,
        "cluster-test",
        str(tmp_path / "checkpoint"),
        str(stop_file),
    ]
    driver_log = tmp_path / "driver.log"
    script = outside / "cluster_driver.py"
    script.write_text((Path(__file__).with_name("scripts") / "cluster_driver.py").read_text())
    driver = start([str(deploy_python), str(script), *args], driver_log, deploy_env(deploy_python), outside)
    killed_at, below = 0, []
    try:
        # Kill one worker once both executors have written part of the target, while the query is running.
        wait_until(
            lambda: record_count(grid, target) >= RECORDS // 4 or driver.poll() is not None,
            timeout_s=600,
            interval_s=0.25,
            message="the query to write a quarter of the records",
        )
        assert driver.poll() is None, driver_log.read_text()[-5000:]
        killed_at = record_count(grid, target)
        below = descendants(cluster.workers[0].pid)
        assert below, "the worker runs no executor: killing it would test nothing"
        kill_tree(cluster.workers[0])  # the worker JVM, its executor JVM and the executor's Python workers
        # Stop once every record is committed (a batch still open when the query stops is aborted by Spark, and
        # a restart would publish it again): a read_committed reader has seen them all.
        with Subscriber(grid, target, initial_offset_scheme="earliest", isolation="read_committed") as reader:
            seen: set[bytes] = set()
            wait_until(
                lambda: (
                    seen.update(r.value for r in reader.poll(200)) or len(seen) >= RECORDS or driver.poll() is not None
                ),
                timeout_s=600,
                interval_s=0.05,
                message="the query to commit every record after the kill",
            )
        assert driver.poll() is None, driver_log.read_text()[-5000:]
        stop_file.write_text("stop")
        driver.wait(timeout=300)
    finally:
        stop_file.write_text("stop")
        if driver.poll() is None:
            kill_tree(driver)
    assert driver.returncode == 0, driver_log.read_text()[-5000:]
    assert "DONE" in driver_log.read_text()
    lost, duplicated = losses(RECORDS, committed_values(grid, target))
    _, stored_twice = losses(RECORDS, read_all_values(grid, target))
    summary = (
        f"[fault] standalone cluster, 1 of 2 workers SIGKILLed with {len(below)} process(es) below it "
        f"(executor, Python workers) after {killed_at:,} of {RECORDS:,} records: read_committed lost {lost}, "
        f"duplicated {duplicated}; read_uncommitted duplicated {stored_twice} (the lost attempts' rows, "
        f"aborted)"
    )
    print(summary, flush=True)
    assert lost == 0 and duplicated == 0, summary
    # A write task whose records the grid stored before its executor died is run again by Spark: its first copy
    # stays in the stream, aborted, at most the micro-batch in flight at the kill.
    assert stored_twice <= ITEMS_PER_BATCH * PER_ITEM, summary
