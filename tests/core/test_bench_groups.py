"""``meteor bench groups --quick`` runs end to end and reports every figure (values are not judged: timing never
decides pass/fail)."""

from __future__ import annotations

import argparse

import pytest

from meteor_spark.bench import groups
from meteor_spark.errors import ConfigError


@pytest.mark.slow
@pytest.mark.embedded_only
def test_quick_groups_bench_reports_shared_and_exclusive_figures() -> None:
    parser = argparse.ArgumentParser()
    groups.add_arguments(parser)
    figures = groups.run(parser.parse_args(["--quick", "--records", "3000", "--members", "1,2"]))
    for kind in ("exclusive", "shared"):
        assert set(figures[kind]) == {"1", "2"}
        assert all(run["records_s"] > 0 and run["settled"] >= 3000 for run in figures[kind].values())
    wide = figures["wide"]
    assert wide["ungrouped"]["settled"] >= wide["records"] and wide["exclusive"]["settled"] >= wide["records"]
    joins = figures["rebalance"]["members"]
    assert set(joins) == {"2", "4", "8"} and all(len(times) == 1 and times[0] > 0 for times in joins.values())
    printed = groups.render(figures)
    assert "a member joins" in printed and "8 members, 16 lanes" in printed
    assert "shared (poll + ack)" in printed and "2 member(s), 2 lanes" in printed
    assert "one ungrouped reader" in printed and "2 members, poll + confirm" in printed


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--rebalance-members", "1,2"], "--rebalance-members count must be >= 2"),
        (["--rebalance-members", "two"], "--rebalance-members 'two' is not a comma-separated list"),
        (["--rebalance-rounds", "0"], "--rebalance-rounds must be >= 1"),
    ],
)
def test_rebalance_flags_are_checked(flags: list[str], message: str) -> None:
    parser = argparse.ArgumentParser()
    groups.add_arguments(parser)
    with pytest.raises(ConfigError, match=message):
        groups.GroupsBenchOptions.from_args(parser.parse_args(flags))
