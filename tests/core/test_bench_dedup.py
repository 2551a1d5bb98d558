"""``meteor bench dedup --quick`` runs end to end and reports both sides of every figure (values are not judged:
timing never decides pass/fail)."""

from __future__ import annotations

import argparse

import pytest

from meteor_spark.bench import dedup


@pytest.mark.slow
@pytest.mark.embedded_only
def test_quick_bench_reports_with_and_without_ids() -> None:
    parser = argparse.ArgumentParser()
    dedup.add_arguments(parser)
    args = parser.parse_args(["--quick", "--plain-records", "2000", "--id-records", "100", "--bulk-records", "2000"])
    figures = dedup.run(args)
    names = {"plain_async_records_s", "id_async_records_s", "id_many_records_s"}
    assert set(figures["without"]) == set(figures["with"]) == names
    assert all(value > 0 for side in ("without", "with") for value in figures[side].values())
    assert "window / none" in dedup.render(figures)
