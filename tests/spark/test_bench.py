"""`meteor bench spark` runs end to end on small sizes (figures are not checked: timing never decides a test)."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from meteor_spark.bench import spark as bench_spark

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_bench_spark_runs_and_reports_every_figure(spark: Any) -> None:
    parser = argparse.ArgumentParser()
    bench_spark.add_arguments(parser)
    figures = bench_spark.run(parser.parse_args(["--quick", "--records", "20000", "--lanes", "1,2"]))
    assert figures["records"] == 20_000
    for lanes in (1, 2):
        row = figures[f"{lanes}_lanes"]
        assert set(row) == {"read_records_per_s", "read_ceiling_records_per_s", "read_vs_ceiling",
                            "write_records_per_s", "write_ceiling_records_per_s", "write_vs_ceiling"}
        assert all(value > 0 for value in row.values())
    assert "read, 2 lane(s)" in bench_spark.render(figures)
    assert spark.range(3).count() == 3  # the shared session is still usable
