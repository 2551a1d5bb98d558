"""``meteor bench``: each area's flags reach its own parser; ``all`` runs every area and sums up."""

from __future__ import annotations

import argparse
import importlib
import types
from collections.abc import Callable
from typing import Any

import pytest

from meteor_spark.cli import bench_cmd
from meteor_spark.errors import ConfigError

Meteor = Callable[..., Any]


def test_area_help_comes_from_the_bench_module(meteor: Meteor) -> None:
    run = meteor("bench", "grid", "--help", connect=False)
    assert run.code == 0
    assert "usage: meteor bench grid" in run.out and "--item-kb" in run.out and "--quick" in run.out


@pytest.mark.slow
def test_bench_grid_quick_prints_its_table(meteor: Meteor) -> None:
    run = meteor("bench", "grid", "--quick", connect=False)
    assert run.code == 0, run
    assert "ring ingest" in run.out and "ceiling" in run.out


def test_unknown_area_flag_is_a_usage_error(meteor: Meteor) -> None:
    run = meteor("bench", "grid", "--no-such-flag", connect=False)
    assert run.code == 1 and "unrecognized arguments: --no-such-flag" in run.err


@pytest.mark.parametrize(
    ("area", "flags", "message"),
    [
        ("grid", ("--batch", "1000"), "--batch must be 1..999 items"),
        ("grid", ("--inflight", "0"), "--inflight must be >= 1, got 0"),
        ("groups", ("--members", "2,0"), "every --members count must be >= 1, got 2,0"),
        ("groups", ("--poll-records", "0"), "--poll-records must be >= 1, got 0"),
        ("pubsub", ("--subscriber-processes", "99"), "--subscriber-processes must be <= 16"),
        ("soak", ("--every", "0"), "--every must be at least 1, got 0"),
    ],
)
def test_a_bad_bench_flag_is_one_error_line_naming_it(
    meteor: Meteor, area: str, flags: tuple[str, ...], message: str
) -> None:
    run = meteor("bench", area, *flags, connect=False)
    assert run.code == 1 and message in run.err and "Traceback" not in run.err


def test_all_runs_every_area_and_keeps_going_after_a_failure(meteor: Meteor, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, bool]] = []

    def fake(name: str, fail: bool = False) -> types.ModuleType:
        module = types.ModuleType(f"fake_{name}")

        def add_arguments(parser: argparse.ArgumentParser) -> None:
            parser.add_argument("--quick", action="store_true")

        def run(args: argparse.Namespace) -> dict[str, Any]:
            calls.append((name, args.quick))
            if fail:
                raise RuntimeError("boom")
            return {"read": {"records_per_s": 1234567.0, "ratio": 0.5}}

        module.add_arguments = add_arguments  # type: ignore[attr-defined]
        module.run = run  # type: ignore[attr-defined]
        module.render = lambda figures: f"{name} table"  # type: ignore[attr-defined]
        return module

    modules = {name: fake(name, fail=name == "pubsub") for name in bench_cmd.AREAS}
    monkeypatch.setattr(bench_cmd, "_module", lambda name: modules[name])
    run = meteor("bench", "all", "--quick", connect=False)
    assert calls == [(name, True) for name in bench_cmd.AREAS if name != "soak"]  # the soak runs for hours: alone
    assert "soak" in bench_cmd.AREAS and "== meteor bench soak" not in run.out
    assert run.code == 1 and "area(s) failed: pubsub" in run.err
    assert "read.records_per_s" in run.out and "1,234,567" in run.out and "0.5" in run.out
    assert "grid table" in run.out and "spark table" in run.out and "pubsub table" not in run.out


def test_flatten_keeps_numbers_and_text() -> None:
    rows = bench_cmd.flatten({"a": {"b": 12.3456, "c": [1000, 2]}, "ok": True, "note": "x", "skip": None})
    assert rows == [("a.b", "12.3"), ("a.c.0", "1,000"), ("a.c.1", "2"), ("ok", "true"), ("note", "x")]


@pytest.mark.parametrize(
    ("area", "options", "flag"),
    [
        ("idempotence", "IdempotenceBenchOptions", "--rounds"),
        ("pubsub", "PubSubBenchOptions", "--round-trips"),
        ("groups", "GroupsBenchOptions", "--records"),
        ("dedup", "DedupBenchOptions", "--id-records"),
    ],
)
def test_a_size_of_zero_is_refused_by_name_in_every_area(area: str, options: str, flag: str) -> None:
    """``value or default`` ran the default for a given 0, past the check beside it; ``bench.given`` keeps the 0."""
    module = importlib.import_module(f"meteor_spark.bench.{area}")
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    with pytest.raises(ConfigError, match=f"{flag} must be >= 1, got 0"):
        getattr(module, options).from_args(parser.parse_args([flag, "0"]))
