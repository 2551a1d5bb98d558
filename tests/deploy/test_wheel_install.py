"""``pip install meteor-spark[spark]`` from the wheel into a fresh virtualenv works outside the checkout."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from deploy_helpers import deploy_env, publish_numbered, run_script

from meteor_spark.grid.client import Grid, GridSettings

pytestmark = [pytest.mark.deploy, pytest.mark.slow, pytest.mark.timeout(1200)]


def test_the_wheel_in_a_fresh_venv_reads_a_stream_with_spark(
    deploy_python: Path, outside: Path, grid: Grid, grid_settings: GridSettings, unique_name: str
) -> None:
    publish_numbered(grid, unique_name, count=3_000, lanes=3, per_item=100)
    done = run_script(
        deploy_python,
        "wheel_read.py",
        [",".join(grid_settings.members), grid_settings.cluster_name, unique_name, "3000"],
        cwd=outside,
        env=deploy_env(deploy_python),
        timeout_s=600,
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr[-5000:]}"
    found = json.loads(done.stdout.strip().splitlines()[-1])
    venv = str(Path(found["prefix"]).resolve())
    for module in ("package", "shim"):  # the installed copy, never the checkout's
        assert str(Path(found[module]).resolve()).startswith(venv), found[module]
    assert found["conf_files"] == ["log4j2.properties", "spark-defaults.conf"]
    requirements = found["requires"]
    assert any(r.startswith("numpy") for r in requirements), requirements
    pyspark = [r for r in requirements if r.startswith("pyspark")]
    assert pyspark and all("extra ==" in r for r in pyspark), f"pyspark must be an extra, not a dependency: {pyspark}"
    assert (found["count"], found["distinct"]) == (3_000, 3_000)
    # Spark's own start-up noise stays out of the console: the packaged log4j2 file is in effect.
    for noise in ("NativeCodeLoader", "resolves to a loopback address"):
        assert noise not in done.stderr, done.stderr[-3000:]
    print(f"wheel install: read {found['count']:,} of 3,000 records through the installed package")

    version = subprocess.run(
        [str(deploy_python.with_name("meteor")), "--version"], capture_output=True, text=True, cwd=outside, timeout=120
    )
    assert version.returncode == 0 and version.stdout.startswith("meteor-spark "), version
