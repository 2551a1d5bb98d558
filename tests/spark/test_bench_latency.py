"""`meteor bench spark --latency` runs end to end quickly and reports every figure (values are not checked: timing
never decides a test)."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from meteor_spark.bench import spark as bench_spark
from meteor_spark.bench.jobs.latency import PHASES

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_bench_spark_latency_reports_every_figure(spark: Any) -> None:
    parser = argparse.ArgumentParser()
    bench_spark.add_arguments(parser)
    figures = bench_spark.run(parser.parse_args(["--latency", "--quick"]))["latency"]
    for query in ("meteor", "ceiling"):
        run = figures[query]
        assert run["rows"] > 0
        assert set(run["seen_ms"]) == set(run["committed_ms"]) == {"p50", "p99", "max"}
        assert set(run["phases_ms"]) == set(PHASES)
        assert run["batches"] > 0
    table = bench_spark.render({"latency": figures})
    assert "meteor" in table and "ceiling (bench-clock)" in table and "triggerExecution" in table
    assert spark.range(3).count() == 3  # the shared session is still usable
