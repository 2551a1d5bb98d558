"""``meteor bench idempotence --quick`` runs end to end and reports both sides of every figure (values are not
judged: timing never decides pass/fail)."""

from __future__ import annotations

import argparse

import pytest

from meteor_spark.bench import idempotence


@pytest.mark.slow
@pytest.mark.embedded_only
def test_quick_bench_reports_idempotent_and_not() -> None:
    parser = argparse.ArgumentParser()
    idempotence.add_arguments(parser)
    args = parser.parse_args(["--quick", "--async-records", "2000", "--bulk-records", "20000", "--short-lived", "3"])
    figures = idempotence.run(args)
    names = {"publish_async_records_s", "publish_many_records_s", "short_lived_publisher_ms"}
    assert set(figures["off"]) == set(figures["on"]) == names
    assert all(value > 0 for side in ("off", "on") for value in figures[side].values())
    printed = idempotence.render(figures)
    assert "idempotent=True" in printed and "short-lived publisher" in printed
