"""The first hour of a new user: Spark's Python workers run the driver's interpreter (or the user is told at once
how to fix it), and ``meteor_spark.config`` is there after ``import meteor_spark``, as the README writes it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from meteor_spark.errors import ConfigError
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.streams import StreamConfig
from meteor_spark.producer.publisher import Publisher
from meteor_spark.spark.workers import ensure_workers_python

#: A PATH whose ``python3`` lacks meteor-spark and pyspark (the system interpreter), as for a venv not activated.
BARE_PATH = "/usr/bin:/bin"


def _bare_env() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PYSPARK_", "VIRTUAL_ENV"))}
    env["PATH"] = BARE_PATH
    return env


def test_config_is_an_attribute_after_import_and_names_the_workers_python() -> None:
    code = textwrap.dedent(
        """
        import sys, meteor_spark
        conf = meteor_spark.config.spark_conf()
        assert "pyspark" not in sys.modules
        print(conf["spark.pyspark.python"])
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_bare_env(), timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == sys.executable


def test_a_cluster_whose_workers_lack_the_package_is_refused_at_once_naming_pyspark_python() -> None:
    spark = SimpleNamespace(sparkContext=SimpleNamespace(pythonExec="/no/such/python3", master="spark://h:7077"))
    started = time.monotonic()
    with pytest.raises(ConfigError) as refused:
        ensure_workers_python(spark)
    assert time.monotonic() - started < 1.0
    message = str(refused.value)
    assert "PYSPARK_PYTHON" in message and "/no/such/python3" in message and sys.executable in message
    assert "\n" not in message


def test_a_local_master_gets_the_drivers_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYSPARK_PYTHON", "/no/such/python3")
    context = SimpleNamespace(pythonExec="/no/such/python3", master="local[2]")
    ensure_workers_python(SimpleNamespace(sparkContext=context))
    assert context.pythonExec == sys.executable
    assert os.environ["PYSPARK_PYTHON"] == sys.executable


SCRIPT = """
import sys
from pyspark.sql import SparkSession
import meteor_spark

members, cluster, stream, how = sys.argv[1:]
builder = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
if how == "spark_conf":
    builder = builder.config(map=meteor_spark.config.spark_conf())
spark = builder.getOrCreate()
if how == "register":
    meteor_spark.register(spark)
rows = spark.read.format("meteor").option("hazelcast.members", members).option("hazelcast.clusterName", cluster) \\
    .option("stream", stream).load().count()
print(f"rows={rows}")
spark.stop()
"""


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.deploy
@pytest.mark.parametrize("how", ["spark_conf", "register"])
def test_a_job_run_with_the_venvs_python_but_no_activation_reads(
    grid: Grid, grid_settings: GridSettings, unique_name: str, tmp_path: Path, how: str
) -> None:
    with Publisher(grid, StreamConfig(unique_name)) as pub:
        pub.publish_many([b"a", b"b", b"c"]).result(30)
    script = tmp_path / "my_job.py"
    script.write_text(SCRIPT)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(script), ",".join(grid_settings.members), grid_settings.cluster_name, unique_name, how],
        capture_output=True,
        text=True,
        env=_bare_env(),
        timeout=600,
        cwd=tmp_path,
    )
    print(f"\n{how}: exit {done.returncode} after {time.monotonic() - started:.0f} s")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rows=3" in done.stdout
