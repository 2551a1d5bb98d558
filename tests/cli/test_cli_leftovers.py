"""The command line says what happened and ends as docs/cli.md states: errors of ``grid start`` named as what they
are, ``tail --group ''``, record offsets typed to ``--from``, Ctrl-C (130) and SIGTERM (143) on ``tail`` and
``groups --watch`` (a group member releasing its lanes first), and ``publish`` interrupted and resumed exactly."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from meteor_spark.cli import docs
from meteor_spark.format.offsets import first_offset_of
from meteor_spark.format.records import Record, decode_batch
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.reading import read_range
from meteor_spark.grid.streams import StreamConfig, StreamInfo, lane_bounds, open_stream
from meteor_spark.groups.admin import group_state
from meteor_spark.producer.publisher import Publisher
from meteor_spark.testing import wait_until
from tests.cli.conftest import Meteor

METEOR = Path(sys.executable).parent / "meteor"
needs_script = pytest.mark.skipif(not METEOR.exists(), reason="the meteor console script is not installed here")
#: The CLI reference page (exit codes, generated --help) and the Spark page (the generated options table).
CLI_PAGE = docs.page("cli").read_text()
SPARK_PAGE = docs.page("options").read_text()


def test_grid_start_names_a_data_dir_it_cannot_create(meteor: Meteor) -> None:
    run = meteor("grid", "start", "--port", "0", "--data-dir", "/proc/x/data", connect=False)
    run.assert_user_error("--data-dir /proc/x/data: cannot create the data directory")
    assert "listen" not in run.err


def test_grid_start_port_in_use_and_bad_host_are_one_line_without_a_stopped_line(meteor: Meteor) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        meteor("grid", "start", "--port", str(port), connect=False).assert_user_error(f"port {port}", "in use")
    meteor("grid", "start", "--port", "0", "--host", "no-such-host.invalid", connect=False).assert_user_error(
        "--host 'no-such-host.invalid'"
    )
    meteor("grid", "start", "--port", "0", "--host", "192.0.2.1", connect=False).assert_user_error(
        "--host 192.0.2.1: not an address of this machine"
    )


def test_tail_group_empty_is_named_as_a_flag(meteor: Meteor, grid: Grid, unique_name: str) -> None:
    open_stream(grid, StreamConfig(unique_name))
    run = meteor("tail", unique_name, "--group", "")
    run.assert_user_error("--group is empty")
    assert "None" not in run.err


def test_tail_from_takes_record_offsets_and_refuses_one_that_names_no_record(
    meteor: Meteor, grid: Grid, unique_name: str
) -> None:
    info = open_stream(grid, StreamConfig(unique_name))
    grid.ring(info.ring_names[0]).add_all([_item([b"a", b"b", b"c"]), _item([b"d", b"e", b"f"])])
    run = meteor("tail", unique_name, "--from", "5", "--max", "1")
    run.assert_user_error("--from 5: lane 0 has no record at offset 5", "65536", "--from 327680")
    inside = meteor("tail", unique_name, "--from", "2", "--max", "1", "--json")
    assert inside.code == 0 and '"value": "c"' in inside.out
    second_item = meteor("tail", unique_name, "--from", str(first_offset_of(1)), "--max", "1", "--json")
    assert second_item.code == 0 and '"value": "d"' in second_item.out


def _item(values: list[bytes]) -> bytes:
    from meteor_spark.format.records import encode_batch

    return encode_batch([Record(v) for v in values], producer_id=3, producer_seq=time.monotonic_ns())


def test_help_and_options_table_are_true_for_a_wheel_install(meteor: Meteor) -> None:
    assert "conf/meteor.toml" not in meteor("--help", connect=False).out
    options = docs.sections(SPARK_PAGE)["options"]
    assert "`meteor group`" not in options and "`meteor groups`" in options
    assert "SIGTERM with 143" in CLI_PAGE


def _ctrl_c_as_at_a_terminal() -> None:
    """A command started in the background of a shell without job control (``nohup ... &``, as some CI runners
    start the suite) inherits an ignored SIGINT, and rightly keeps ignoring Ctrl-C; these tests stand for a user at a
    terminal, so their command gets the default SIGINT."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _spawn(args: list[str], settings: GridSettings, **kwargs: object) -> subprocess.Popen[str]:
    connection = ["--members", ",".join(settings.members), "--cluster-name", settings.cluster_name]
    return subprocess.Popen(
        [str(METEOR), *args, *connection],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        preexec_fn=_ctrl_c_as_at_a_terminal,
        **kwargs,  # type: ignore[call-overload]
    )


def _end(process: subprocess.Popen[str], signum: int) -> tuple[int, str]:
    process.send_signal(signum)
    try:
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    return process.returncode, err


@needs_script
def test_ctrl_c_on_tail_and_groups_watch_exits_130(grid: Grid, grid_settings: GridSettings, unique_name: str) -> None:
    info = open_stream(grid, StreamConfig(unique_name))
    with Publisher(grid, info.config.name) as pub:
        pub.publish(b"one")
    tail = _spawn(["tail", unique_name, "--from", "earliest"], grid_settings)
    assert tail.stdout is not None
    assert "one" in tail.stdout.readline()  # reading: the next poll waits for records
    code, err = _end(tail, signal.SIGINT)
    assert code == 130, err
    assert "Traceback" not in err

    watch = _spawn(["groups", unique_name, "--watch", "--interval", "0.2"], grid_settings)
    assert watch.stdout is not None
    assert watch.stdout.readline().startswith("-- ")
    code, err = _end(watch, signal.SIGINT)
    assert code == 130, err
    assert "Traceback" not in err


@needs_script
def test_sigterm_on_tail_group_releases_the_lanes_and_exits_143(
    grid: Grid, grid_settings: GridSettings, unique_name: str
) -> None:
    info = open_stream(grid, StreamConfig(unique_name, lanes=2))
    tail = _spawn(["tail", unique_name, "--group", "audit"], grid_settings)
    try:
        wait_until(
            lambda: all(s.holder for s in group_state(grid, info, "audit")),
            timeout_s=60,
            message="tail --group holds both lanes",
        )
    except BaseException:
        tail.kill()
        raise
    started = time.monotonic()
    code, err = _end(tail, signal.SIGTERM)
    ended = time.monotonic() - started
    holders = [s.holder for s in group_state(grid, info, "audit")]
    print(f"\ntail --group on SIGTERM: exit {code} after {ended:.2f} s; lane holders afterwards: {holders}")
    assert code == 143, err
    assert holders == [None, None]  # released, not left to expire
    assert "Traceback" not in err


def _values(grid: Grid, info: StreamInfo) -> list[bytes]:
    values: list[bytes] = []
    for lane, (head, end) in lane_bounds(grid, info).items():
        for items, sequences in read_range(grid, info, lane, head, end):
            for item, sequence in zip(items, sequences, strict=True):
                values.extend(r.value for r in decode_batch(item, stream=info.name, lane=lane, sequence=sequence))
    return values


@needs_script
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_publish_reports_what_was_stored_and_resumes_exactly(
    grid: Grid, grid_settings: GridSettings, unique_name: str, tmp_path: Path, signum: int
) -> None:
    info = open_stream(grid, StreamConfig(unique_name, lanes=2))
    lines = [f'{{"n": {n}}}\n' for n in range(1, 5001)]
    publish = _spawn(["publish", unique_name], grid_settings, stdin=subprocess.PIPE)
    assert publish.stdin is not None
    publish.stdin.write("".join(lines[:3500]))  # three whole chunks of 1000 are sent; 500 lines wait for more
    publish.stdin.flush()
    wait_until(lambda: len(_values(grid, info)) >= 3000, timeout_s=60, message="the first chunks are stored")
    code, err = _end(publish, signum)
    stored = len(_values(grid, info))
    print(f"\npublish interrupted ({signal.Signals(signum).name}): exit {code}; {err.strip()}")
    assert code == (130 if signum == signal.SIGINT else 143), err
    assert f"{stored:,} record(s) stored" in err
    resume = err.strip().splitlines()[-1]
    assert resume.startswith("resume with: meteor publish ")
    command = shlex.split(resume.removeprefix("resume with: "))
    assert command[-2:] == ["--skip", str(stored)]

    done = subprocess.run(
        [str(METEOR), *command[1:]], input="".join(lines), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    values = sorted(int(v.decode().split(":")[1].strip(" }")) for v in _values(grid, info))
    assert values == list(range(1, 5001))  # each line once: nothing lost, nothing twice
