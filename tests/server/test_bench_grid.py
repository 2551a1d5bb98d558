"""`meteor bench grid --quick` runs and reports every figure, and with --members the same figures of a real member
next to the embedded grid's (timing never decides pass/fail here)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pytest

from meteor_spark.bench import grid as bench
from meteor_spark.errors import ConfigError

pytestmark = pytest.mark.embedded_only


@pytest.mark.parametrize("member_options", [[], ["--busy-poll-us", "100"]])
def test_quick_grid_bench_reports_figures(member_options: list[str]) -> None:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    figures = bench.run(parser.parse_args(["--quick", "--total-mb", "4", "--map-ops", "50", *member_options]))
    for key in ("ring_ingest_mb_s", "ring_read_mb_s", "ceiling_send_mb_s", "ceiling_recv_mb_s", "ceiling_rtt_p50_us"):
        assert figures[key] > 0 and math.isfinite(figures[key]), key
    assert "map_ops_s" in figures or "not available" in figures["map"]
    if "map_ops_s" in figures and Path("/proc/self/stat").exists():
        assert figures["map_member_cpu_us"] >= 0
    assert figures["ring_hop_p50_us"] > 0 and math.isfinite(figures["ring_hop_p99_us"])
    if Path("/proc/self/stat").exists():
        assert figures["ring_hop_member_cpu_us"] >= 0
    table = bench.render(figures)
    assert "ring ingest (add_all)" in table and "ceiling" in table and "add -> parked read_many" in table


def test_bad_batch_is_refused_with_the_limit() -> None:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    with pytest.raises(ValueError, match=r"--batch must be 1\.\.999"):
        bench.GridBenchOptions.from_args(parser.parse_args(["--batch", "1000"]))


def test_bad_members_are_refused_naming_the_value() -> None:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    with pytest.raises(ConfigError, match="'nohost' is not host:port"):
        bench.GridBenchOptions.from_args(parser.parse_args(["--members", "nohost"]))


@pytest.mark.real_members
@pytest.mark.slow
def test_members_runs_the_workload_against_a_real_member_too(tmp_path: Path) -> None:
    from tests.real_members import HazelcastMember

    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    with HazelcastMember(tmp_path) as member:
        args = ["--total-mb", "2", "--map-ops", "30", "--members", member.address, "--cluster-name", "dev"]
        figures = bench.run(parser.parse_args(args))
        found = bench.local_listener_pid(member.address)
    cluster = figures["cluster"]
    assert cluster["members"] == 1 and cluster["versions"] == [member.version]
    for key in ("ring_ingest_mb_s", "ring_read_mb_s", "map_ops_s", "map_get_p50_us", "ring_hop_p50_us"):
        assert cluster[key] > 0 and math.isfinite(cluster[key]), key
    if Path("/proc/self/stat").exists():  # the member runs here: found by its port, its CPU measured like ours
        assert found == member.pid
        assert cluster["map_member_cpu_us"] > 0 and figures["map_member_cpu_us"] >= 0
    table = bench.render(figures)
    print(table)
    assert f"embedded grid vs cluster {member.address}" in table and "cluster/embedded" in table
    assert "member CPU per request" in table.split("embedded grid vs cluster")[1]


def test_no_listener_is_no_pid() -> None:
    assert bench.local_listener_pid("127.0.0.1:1") is None
