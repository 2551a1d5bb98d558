"""``meteor bench transactions --quick`` runs end to end and reports every figure (values are not judged: timing
never decides pass/fail)."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from meteor_spark.bench import transactions

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.embedded_only]


def test_quick_bench_reports_every_figure(spark: Any) -> None:
    parser = argparse.ArgumentParser()
    transactions.add_arguments(parser)
    figures = transactions.run(parser.parse_args(["--quick", "--records", "4000", "--batches", "2"]))
    names = ("write_transactional", "write_plain", "read_committed", "read_uncommitted")
    assert all(figures[name] > 0 for name in names)
    printed = transactions.render(figures)
    assert "transactional / read_committed" in printed and "2 micro-batches" in printed
