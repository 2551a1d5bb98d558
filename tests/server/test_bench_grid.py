"""`meteor bench grid --quick` runs and reports every figure (timing never decides pass/fail here)."""

from __future__ import annotations

import argparse
import math

import pytest

from meteor_spark.bench import grid as bench

pytestmark = pytest.mark.embedded_only


def test_quick_grid_bench_reports_figures() -> None:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    figures = bench.run(parser.parse_args(["--quick", "--total-mb", "4", "--map-ops", "50"]))
    for key in ("ring_ingest_mb_s", "ring_read_mb_s", "ceiling_send_mb_s", "ceiling_recv_mb_s", "ceiling_rtt_p50_us"):
        assert figures[key] > 0 and math.isfinite(figures[key]), key
    assert "map_ops_s" in figures or "not available" in figures["map"]
    table = bench.render(figures)
    assert "ring ingest (add_all)" in table and "ceiling" in table


def test_bad_batch_is_refused_with_the_limit() -> None:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    with pytest.raises(ValueError, match="--batch must be 1..999"):
        bench.GridBenchOptions.from_args(parser.parse_args(["--batch", "1000"]))
