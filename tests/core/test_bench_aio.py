"""``meteor bench aio --quick`` runs end to end and reports every figure of both sides (values are not judged:
timing never decides pass/fail)."""

from __future__ import annotations

import argparse

import pytest

from meteor_spark.bench import aio
from meteor_spark.errors import ConfigError


@pytest.mark.slow
@pytest.mark.embedded_only
def test_quick_bench_reports_both_sides_next_to_their_ceilings() -> None:
    parser = argparse.ArgumentParser()
    aio.add_arguments(parser)
    figures = aio.run(parser.parse_args(["--quick", "--records", "3000", "--round-trips", "20"]))
    assert set(figures) >= {"ceiling", "threaded", "asyncio"}
    for side in ("threaded", "asyncio"):
        assert set(figures[side]) == {
            "publish_async_records_s",
            "publish_many_records_s",
            "publish_async_cpu_us",
            "publish_async_dropped_records_s",
            "publish_async_dropped_cpu_us",
            "publish_many_cpu_us",
            "p50_ms",
            "p99_ms",
            "rr_p50_ms",
            "rr_p99_ms",
        }
        assert all(value > 0 for value in figures[side].values())
    assert all(figures["shared"][side]["shared_records_s"] > 0 for side in ("threaded", "asyncio"))
    ceiling = figures["ceiling"]
    assert ceiling["raw_add_all_records_s"] > 0 and ceiling["raw_async_add_all_records_s"] > 0
    assert ceiling["raw_round_trip"]["p50_ms"] > 0 and ceiling["raw_async_round_trip"]["p50_ms"] > 0
    printed = aio.render(figures)
    for text in (
        "asyncio: publish_async",
        "threaded: publish_many",
        "other client receives",
        "request -> reply",
        "vs threaded",
        "shared group member, poll + ack",
        "us CPU",
        "asyncio: publish_async / publish_many",
        "publish_async, futures dropped",
    ):
        assert text in printed


def test_a_zero_size_is_refused_by_name() -> None:
    parser = argparse.ArgumentParser()
    aio.add_arguments(parser)
    with pytest.raises(ConfigError, match="--records must be >= 1, got 0"):
        aio.run(parser.parse_args(["--records", "0"]))
