"""``meteor grid start|status``, connection errors, and the real console script in a subprocess."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from meteor_spark.errors import GridConnectionError
from meteor_spark.grid.client import Grid, GridSettings

Meteor = Callable[..., Any]
METEOR = Path(sys.executable).with_name("meteor")


def test_status_shows_members_and_streams(meteor: Meteor, grid_settings: GridSettings, unique_name: str) -> None:
    assert meteor("streams", "create", unique_name).code == 0
    status = meteor("grid", "status")
    assert status.code == 0, status
    assert f"cluster {grid_settings.cluster_name!r}" in status.out
    assert "MEMBER" in status.out and "VERSION" in status.out
    assert unique_name in status.out
    assert "hz:impl:mapService" in status.out  # the stream metadata map at least


def test_unreachable_grid_is_one_clear_line(meteor: Meteor) -> None:
    run = meteor("--members", "127.0.0.1:1", "--connect-timeout", "1", "streams", "list", connect=False)
    run.assert_user_error("could not connect to cluster 'dev' at 127.0.0.1:1", "meteor grid start")


def test_wrong_cluster_name_is_one_clear_line(meteor: Meteor, grid_settings: GridSettings) -> None:
    members = ",".join(grid_settings.members)
    run = meteor(
        "streams", "list", "-m", members, "--cluster-name", "no-such-cluster", "--connect-timeout", "1", connect=False
    )
    run.assert_user_error("could not connect to cluster 'no-such-cluster'")


def test_debug_shows_the_traceback(meteor: Meteor) -> None:
    run = meteor("--debug", "-m", "127.0.0.1:1", "--connect-timeout", "1", "streams", "list", connect=False)
    assert run.code == 1 and "Traceback" in run.err and "GridConnectionError" in run.err


def test_bad_config_value_is_one_clear_line(meteor: Meteor, tmp_path: Path) -> None:
    config = tmp_path / "meteor.toml"
    config.write_text('[hazelcast]\nmembrs = "x:1"\n')
    meteor("--config", str(config), "streams", "list", connect=False).assert_user_error(
        "unknown option 'hazelcast.membrs'", "did you mean 'hazelcast.members'"
    )


def test_help_and_version(meteor: Meteor, capsys: pytest.CaptureFixture[str]) -> None:
    assert meteor("--help", connect=False).code == 0
    assert meteor("grid", "start", "--help", connect=False).code == 0
    assert meteor("--version", connect=False).code == 0
    unknown = meteor("frobnicate", connect=False)
    assert unknown.code == 1 and "invalid choice: 'frobnicate'" in unknown.err


def _start_member(*args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    process = subprocess.Popen(
        [str(METEOR), "grid", "start", "--port", "0", "--log-level", "WARNING", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert process.stdout is not None and process.stderr is not None
    first = process.stdout.readline()  # blocks until the member printed its address (or died)
    assert first.startswith("listening on "), (first, process.stderr.read() if process.poll() is not None else "")
    return process, first.split()[2]


@pytest.mark.skipif(not METEOR.exists(), reason="the meteor console script is not installed next to this interpreter")
def test_console_script_grid_start_status_and_sigterm(tmp_path: Path) -> None:
    config = tmp_path / "meteor.toml"
    config.write_text('[server]\ncluster-name = "from-toml"\n')
    process, address = _start_member("--config", str(config))
    try:
        status = subprocess.run(
            [str(METEOR), "grid", "status", "-m", address, "--cluster-name", "from-toml"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert status.returncode == 0, status.stderr
        assert address in status.stdout
        assert "cluster 'from-toml'" in status.stdout
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=30)
    assert code == 0  # a clean stop on SIGTERM


@pytest.mark.skipif(not METEOR.exists(), reason="the meteor console script is not installed next to this interpreter")
def test_console_script_reports_user_errors_without_traceback() -> None:
    done = subprocess.run(
        [str(METEOR), "streams", "list", "-m", "127.0.0.1:1", "--connect-timeout", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stderr.startswith("meteor streams: error: could not connect")
    assert "Traceback" not in done.stderr


@pytest.mark.skipif(not METEOR.exists(), reason="the meteor console script is not installed next to this interpreter")
def test_grid_start_takes_the_member_password_from_the_environment() -> None:
    secret = "s3cret-from-env"
    process, address = _start_member(
        "--username", "alice", "--log-level", "DEBUG", env={"METEOR_GRID_PASSWORD": secret}
    )
    try:
        with Grid.connect(address, username="alice", password=secret, connect_timeout_s=10) as grid:
            assert grid.members()
        with pytest.raises(GridConnectionError):
            Grid.connect(address, username="alice", password="wrong", connect_timeout_s=1)
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=30)
    assert process.stderr is not None
    log = process.stderr.read()
    assert code == 0, log
    assert secret not in log


def _grid_start(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(METEOR), "grid", "start", "--log-level", "WARNING", *args], capture_output=True, text=True, timeout=60
    )


@pytest.mark.skipif(not METEOR.exists(), reason="the meteor console script is not installed next to this interpreter")
def test_grid_start_on_a_data_dir_that_is_a_file_says_so(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "grid-data"
    not_a_dir.write_text("I am a file")
    done = _grid_start("--port", "0", "--data-dir", str(not_a_dir))
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"meteor grid: error: --data-dir {not_a_dir} is a file, not a directory; give a directory (created if missing)"
    ]


@pytest.mark.skipif(not METEOR.exists(), reason="the meteor console script is not installed next to this interpreter")
def test_grid_start_on_a_busy_port_says_so_in_one_line() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = _grid_start("--port", str(port))
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert f"port {port} on 127.0.0.1 is in use" in lines[0] and "--port 0 for a free port" in lines[0]
