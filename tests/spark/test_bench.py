"""`meteor bench spark` runs end to end on small sizes (figures are not checked: timing never decides a test)."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from meteor_spark.bench import spark as bench_spark
from meteor_spark.errors import ConfigError

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_bench_spark_runs_and_reports_every_figure(spark: Any) -> None:
    parser = argparse.ArgumentParser()
    bench_spark.add_arguments(parser)
    figures = bench_spark.run(parser.parse_args(["--quick", "--records", "20000", "--lanes", "1,2", "--repeat", "2"]))
    assert figures["records"] == 20_000
    for lanes in (1, 2):
        row = figures[f"{lanes}_lanes"]
        samples = figures["samples"][f"{lanes}_lanes"]
        assert set(row) == {
            "read_records_per_s",
            "read_ceiling_records_per_s",
            "read_vs_ceiling",
            "read_vs_ceiling_range",
            "write_records_per_s",
            "write_ceiling_records_per_s",
            "write_vs_ceiling",
            "write_vs_ceiling_range",
        }
        for side in ("read", "write"):
            assert len(samples[f"{side}_records_per_s"]) == 2
            # The share of the ceiling pairs each run with the ceiling measured beside it.
            ratios = sorted(
                ours / ceiling
                for ours, ceiling in zip(
                    samples[f"{side}_records_per_s"], samples[f"{side}_ceiling_records_per_s"], strict=True
                )
            )
            assert row[f"{side}_vs_ceiling_range"] == (ratios[0], ratios[1])
            assert row[f"{side}_vs_ceiling"] == pytest.approx((ratios[0] + ratios[1]) / 2)
            assert row[f"{side}_records_per_s"] > 0 and row[f"{side}_ceiling_records_per_s"] > 0
        # CPU per record of every path, split by kind of process (read from /proc: Linux, where CI runs).
        cpu = figures["cpu"][f"{lanes}_lanes"]
        assert set(cpu) == {"write", "write ceiling", "read", "read ceiling"}
        for by_kind in cpu.values():
            assert set(by_kind) == {"jvm", "python tasks", "python planning", "member", "driver", "total"}
            assert by_kind["total"] == pytest.approx(sum(v for k, v in by_kind.items() if k != "total"))
            # Every path runs its read or write in PySpark's task workers.
            assert by_kind["jvm"] > 0 and by_kind["python tasks"] > 0
    printed = bench_spark.render(figures)
    assert "read, 2 lane(s)" in printed and "RUNS" in printed
    assert "write ceiling, 2 lane(s)" in printed and "CPU NS/RECORD" in printed
    assert "read, 1 lane(s): CPU share" in printed and "write, 2 lane(s): CPU share" in printed
    assert spark.range(3).count() == 3  # the shared session is still usable


def test_bench_spark_pushdown_runs_and_reports_both_sides(spark: Any) -> None:
    parser = argparse.ArgumentParser()
    bench_spark.add_arguments(parser)
    figures = bench_spark.run(parser.parse_args(["--pushdown", "--records", "20000", "--repeat", "1"]))["pushdown"]
    pushed, not_pushed = figures["sides"]["pushed"], figures["sides"]["not pushed"]
    assert pushed["rows"] == not_pushed["rows"] == 200  # the newest 1 %
    assert 0 < pushed["items_read"] < not_pushed["items_read"]
    assert pushed["wall_s"] > 0 and not_pushed["wall_s"] > 0
    printed = bench_spark.render({"pushdown": figures})
    assert "RING ITEMS READ" in printed and "not pushed" in printed


def test_bench_spark_pattern_times_both_sides_at_every_stream_count() -> None:
    parser = argparse.ArgumentParser()
    bench_spark.add_arguments(parser)
    figures = bench_spark.run(parser.parse_args(["--pattern", "--streams", "1,3", "--repeat", "2"]))["pattern"]
    points = {(p["streams"], p["watched"]): p for p in figures["points"]}
    assert set(points) == {(1, False), (1, True), (3, False), (3, True)}
    for point in points.values():
        assert point["median_ms"] > 0 and point["calls"] >= 1 and point["unseen"] == 0
    printed = bench_spark.render({"pattern": figures})
    assert "every lane, every batch" in printed and "not measured" in printed
    with pytest.raises(ConfigError, match="--streams must list stream counts"):
        bench_spark.run(parser.parse_args(["--pattern", "--streams", "0,x"]))
