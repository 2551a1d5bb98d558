"""EmbeddedGrid lifecycle and ``python -m meteor_spark.server`` (our own member's process and bind address)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import hazelcast
import pytest
from hazelcast.proxy.map import BlockingMap

from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.server import EmbeddedGrid, MapConfig, MemberOptions, RingConfig
from meteor_spark.server.__main__ import build_parser, options_from_args
from meteor_spark.server.config_syntax import parse_map_config, parse_ring_config
from meteor_spark.server.member import READY_LINE, member_arguments

pytestmark = pytest.mark.embedded_only


def test_thread_mode_start_stop_on_an_ephemeral_port() -> None:
    member = EmbeddedGrid()
    with pytest.raises(RuntimeError, match="not started"):
        _ = member.address
    member.start()
    try:
        host, port = member.address.rsplit(":", 1)
        assert host == "127.0.0.1" and int(port) > 0
        assert member.pid is None
        with Grid(GridSettings(members=(member.address,))) as grid:
            assert grid.ring("r").add(b"x") == 0
    finally:
        member.stop()
    assert not member.running
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", int(port))) != 0, "nothing listens after stop()"
    member.stop()  # idempotent


def test_process_mode_kill_and_restart_on_the_same_port() -> None:
    with EmbeddedGrid(process=True, ring_configs=[RingConfig("small*", capacity=2)]) as member:
        assert member.pid is not None and member.pid != os.getpid()
        address = member.address
        with Grid(GridSettings(members=(address,))) as grid:
            assert grid.ring("small-1").add(b"x") == 0
            assert grid.client.get_ringbuffer("small-1").blocking().capacity() == 2
        member.kill()
        assert not member.running
        member.restart()
        assert member.address == address
        with Grid(GridSettings(members=(address,))) as grid:
            assert grid.ring("small-1").add(b"y") == 0, "memory-only member starts empty"
    assert not member.running


def test_binds_loopback_by_default() -> None:
    with EmbeddedGrid() as member:
        port = member.port
        assert member.address.startswith("127.0.0.1:")
        addresses = {str(info[4][0]) for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)}
        outside = [a for a in addresses if not a.startswith("127.")]
        for address in outside:
            with socket.socket() as probe:
                probe.settimeout(1)
                assert probe.connect_ex((address, port)) != 0, f"member reachable on {address}"


def test_port_already_in_use_is_a_clear_error() -> None:
    with EmbeddedGrid() as first, pytest.raises(RuntimeError, match=f"could not start on 127.0.0.1:{first.port}"):
        EmbeddedGrid(port=first.port).start()


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--port", "{busy}"], "--port {busy} on 127.0.0.1 is in use"),
        (["--host", "no-such-host.invalid", "--port", "0"], "--host 'no-such-host.invalid': not a host name"),
        (["--host", "192.0.2.1", "--port", "0"], "--host 192.0.2.1: not an address of this machine"),
    ],
    ids=["port-in-use", "unresolvable-host", "host-not-here"],
)
def test_a_member_that_cannot_listen_prints_one_error_line_and_no_start_or_stop(
    flags: list[str], expected: str
) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        argv = [flag.format(busy=port) for flag in flags]
        # The default log level (INFO): a member that never ran must not log a start or a stop either.
        done = subprocess.run(
            [sys.executable, "-m", "meteor_spark.server", *argv], capture_output=True, text=True, timeout=60
        )
    print(f"{argv}: exit {done.returncode}, stderr {done.stderr!r}")
    assert done.returncode == 1
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: ") and expected.format(busy=port) in lines[0], lines[0]
    assert "choose" in lines[0] or "give" in lines[0], lines[0]  # says how to fix it


def test_password_is_not_in_repr_nor_command_line() -> None:
    with EmbeddedGrid(process=True, username="u", password="hunter2") as member:
        assert "hunter2" not in repr(member) and "hunter2" not in repr(member.options)
        with open(f"/proc/{member.pid}/cmdline", "rb") as cmdline:
            assert b"hunter2" not in cmdline.read()
        with Grid(GridSettings(members=(member.address,), username="u", password="hunter2")) as grid:
            assert grid.ring("r").size() == 0
        assert member.log_path is not None
    with open(member.log_path, encoding="utf-8") as log:
        assert "hunter2" not in log.read()


def test_python_dash_m_prints_the_address_and_exits_cleanly_on_sigterm() -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "meteor_spark.server", "--port", "0", "--cluster-name", "c1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline().decode().strip()
        match = READY_LINE.match(line)
        assert match, line
        assert match["cluster"] == "c1" and int(match["pid"]) == process.pid
        with Grid(GridSettings(members=(match["address"],), cluster_name="c1")) as grid:
            assert grid.ring("r").add(b"x") == 0
        process.send_signal(signal.SIGTERM)
        assert process.wait(20) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_bad_arguments_exit_with_an_error_message() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "meteor_spark.server", "--port", "0", "--username", "u"],
        capture_output=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "METEOR_GRID_PASSWORD"},
    )
    assert result.returncode == 1  # as `meteor`: 1 for every user error
    assert b"username and password go together" in result.stderr


def test_usage_errors_exit_1_like_the_meteor_command() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "meteor_spark.server", "--no-such-flag"], capture_output=True, timeout=60
    )
    assert result.returncode == 1
    assert b"unrecognized arguments: --no-such-flag" in result.stderr and b"usage:" in result.stderr
    help_run = subprocess.run([sys.executable, "-m", "meteor_spark.server", "--help"], capture_output=True, timeout=60)
    assert help_run.returncode == 0 and b"--cluster-name" in help_run.stdout


def test_ring_and_map_config_argument_parsing() -> None:
    assert parse_ring_config("meteor.stream::o.*:capacity=5,ttl=3") == RingConfig(
        "meteor.stream::o.*", capacity=5, ttl_s=3
    )
    with pytest.raises(ValueError, match="unknown ring config setting 'capacty' \\(did you mean 'capacity'\\?\\)"):
        parse_ring_config("x:capacty=3")
    with pytest.raises(ValueError, match="capacity must be an integer"):
        parse_ring_config("x:capacity=lots")
    assert parse_map_config("sessions.*:ttl=600,max-idle=60") == MapConfig("sessions.*", 600, 60)
    assert parse_map_config("plain:") == MapConfig("plain")
    with pytest.raises(ValueError, match="unknown map config setting 'capacity'"):
        parse_map_config("m:capacity=3")
    with pytest.raises(ValueError, match="time_to_live_seconds=-5 is negative"):
        parse_map_config("m:ttl=-5")
    with pytest.raises(ValueError, match="expected PATTERN:ttl=N,max-idle=N"):
        parse_map_config("no-colon")


def test_every_member_option_survives_the_command_line() -> None:
    """``EmbeddedGrid(process=True)`` and ``meteor grid start`` reach the member through these flags."""
    options = MemberOptions(
        port=5799,
        cluster_name="c2",
        data_dir="/tmp/somewhere",
        fsync="always",
        fsync_interval_ms=25,
        cp_mode="unsafe",
        ring_configs=(RingConfig("r.*", capacity=7, ttl_s=2, backup_count=0, async_backup_count=1),),
        map_configs=(
            MapConfig("m.*", time_to_live_seconds=3, max_idle_seconds=4),
            MapConfig("default", 9),
            MapConfig("stats", per_entry_stats_enabled=True),
        ),
        client_heartbeat_timeout_s=0.123456789,
        auth_timeout_s=3.5,
        busy_poll_us=150,
    )
    assert options_from_args(build_parser().parse_args(member_arguments(options))) == options


def test_invalid_member_options_name_the_setting() -> None:
    with pytest.raises(ValueError, match="cp_mode 'maybe' is unknown; use one of unsafe, disabled"):
        EmbeddedGrid(cp_mode="maybe")
    with pytest.raises(ValueError, match="fsync_interval_ms must be a positive number of milliseconds, got 0"):
        EmbeddedGrid(fsync_interval_ms=0)
    with pytest.raises(ValueError, match="fsync policy 'sometimes' is unknown"):
        EmbeddedGrid(fsync="sometimes")
    with pytest.raises(ValueError, match=r"client heartbeat timeout must be >= 0 seconds .*got -1"):
        EmbeddedGrid(client_heartbeat_timeout_s=-1)
    with pytest.raises(ValueError, match=r"authentication timeout must be >= 0 seconds .*got -2"):
        EmbeddedGrid(auth_timeout_s=-2)
    with pytest.raises(ValueError, match="per-entry-stats must be 0 or 1, got 2"):
        parse_map_config("m:per-entry-stats=2")


def test_a_data_dir_that_is_a_file_is_refused(tmp_path: os.PathLike[str]) -> None:
    not_a_dir = os.path.join(tmp_path, "file")
    with open(not_a_dir, "w") as handle:
        handle.write("x")
    with pytest.raises(ValueError, match="is a file, not a directory"):
        EmbeddedGrid(data_dir=not_a_dir)


def test_authentication_with_long_credentials_and_labels_fits_the_unauthenticated_limit() -> None:
    username, password = "u" * 500, "p" * 4000
    with EmbeddedGrid(username=username, password=password) as member:
        client = hazelcast.HazelcastClient(
            cluster_members=[member.address],
            cluster_name=member.cluster_name,
            cluster_connect_timeout=10,
            creds_username=username,
            creds_password=password,
            client_name="n" * 500,
            labels=[f"label-{i}-" + "l" * 200 for i in range(40)],
        )
        try:
            blocking: BlockingMap[str, str] = client.get_map("m").blocking()
            assert blocking.put("k", "v") is None
        finally:
            client.shutdown()


def _client(member: EmbeddedGrid) -> hazelcast.HazelcastClient:
    return hazelcast.HazelcastClient(
        cluster_members=[member.address], cluster_name=member.cluster_name, cluster_connect_timeout=10
    )


def test_map_configs_give_matching_maps_their_default_ttl() -> None:
    configs = [MapConfig("sessions.*", time_to_live_seconds=600, max_idle_seconds=60), MapConfig("default", 30)]
    with EmbeddedGrid(map_configs=configs) as member:
        client = _client(member)
        try:
            sessions: BlockingMap[str, str] = client.get_map("sessions.web").blocking()
            sessions.put("k", "v")
            view = sessions.get_entry_view("k")
            assert (view.ttl, view.max_idle) == (600_000, 60_000)
            sessions.put("k", "v", ttl=5)  # a write's own TTL wins over the map default
            assert sessions.get_entry_view("k").ttl == 5_000
            other: BlockingMap[str, str] = client.get_map("other").blocking()
            other.put("k", "v")
            assert other.get_entry_view("k").ttl == 30_000  # the "default" config
        finally:
            client.shutdown()


def test_process_member_honours_cp_mode_and_map_configs_from_its_flags() -> None:
    with EmbeddedGrid(process=True, cp_mode="unsafe", map_configs=[MapConfig("short.*", 1)]) as member:
        client = _client(member)
        try:
            assert client.cp_subsystem.get_atomic_long("counter").blocking().increment_and_get() == 1
            short: BlockingMap[str, str] = client.get_map("short.lived").blocking()
            short.put("k", "v")
            assert short.get_entry_view("k").ttl == 1_000
        finally:
            client.shutdown()


def test_the_member_imports_neither_hazelcast_nor_pyspark() -> None:
    code = (
        "import sys, meteor_spark.server, meteor_spark.server.__main__, meteor_spark.server.tcp;"
        "bad = [m for m in ('hazelcast', 'pyspark') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_member_process_exits_when_its_parent_dies() -> None:
    """A test run killed mid-way must not leave member processes behind."""
    code = (
        "import sys, time; from meteor_spark.server import EmbeddedGrid;"
        "g = EmbeddedGrid(process=True).start(); print(g.pid, flush=True); time.sleep(120)"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert parent.stdout is not None
    member_pid = int(parent.stdout.readline())
    parent.kill()
    parent.wait()

    def gone() -> bool:
        try:
            os.kill(member_pid, 0)
        except ProcessLookupError:
            return True
        with open(f"/proc/{member_pid}/stat") as stat:
            return stat.read().split()[2] == "Z"

    from meteor_spark.testing import wait_until

    wait_until(gone, timeout_s=20, message=f"member process {member_pid} to exit after its parent was killed")
