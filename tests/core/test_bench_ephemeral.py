"""``meteor bench ephemeral --quick`` runs end to end and reports every figure (values are not judged: timing never
decides pass/fail)."""

from __future__ import annotations

import argparse

import pytest

from meteor_spark.bench import ephemeral
from meteor_spark.errors import ConfigError


@pytest.mark.slow
@pytest.mark.embedded_only
def test_quick_bench_reports_every_entity_count() -> None:
    parser = argparse.ArgumentParser()
    ephemeral.add_arguments(parser)
    figures = ephemeral.run(parser.parse_args(["--quick", "--records", "2000", "--probes", "10"]))
    assert figures["ceiling"]["dropped_publish_records_s"] > 0
    for entities in ephemeral.ENTITY_COUNTS:
        row = figures[f"entities_{entities}"]
        assert row["deliveries_s"] == pytest.approx(row["unique_records_s"] * entities)
        assert row["latency_samples"] == 10 * entities and row["dropped"] == 0
        assert 0 < row["p50_ms"] <= row["p99_ms"]
    printed = ephemeral.render(figures)
    for text in ("ENTITIES", "p50 / p99 ms", "dropped at the publisher"):
        assert text in printed


@pytest.mark.parametrize("flag", ["--records", "--probes"])
def test_a_size_of_zero_is_refused_by_name_not_replaced_by_the_default(flag: str) -> None:
    parser = argparse.ArgumentParser()
    ephemeral.add_arguments(parser)
    with pytest.raises(ConfigError, match=f"{flag} must be >= 1, got 0"):
        ephemeral.EphemeralBenchOptions.from_args(parser.parse_args([flag, "0"]))
