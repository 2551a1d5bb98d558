"""``meteor bench soak`` with tiny sizes runs end to end: the per-sample map sizes and member memory are printed,
and every record published reaches the ``read_committed`` reader exactly once and is acknowledged by the shared
group (the sizes are not judged here: a soak is a command to watch, not a pass/fail figure)."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from meteor_spark.bench import soak

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.embedded_only]


def test_a_tiny_soak_prints_every_figure_and_loses_nothing(spark: Any, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    soak.add_arguments(parser)
    args = parser.parse_args(["--batches", "30", "--every", "10", "--capacity", "20", "--sweep-interval-ms", "500"])
    figures = soak.run(args)
    live = capsys.readouterr().out
    printed = soak.render(figures)
    print(live, printed, sep="\n")
    assert figures["batches"] >= 30 and len(figures["samples"]) >= 3
    assert live.count("member RSS") >= 3 and "txns=" in live and "txn.producers=" in live
    for header in (
        "member RSS (MiB)",
        "txns",
        "txn.producers",
        "txn.batches",
        "txn.open",
        "sink.commits",
        "share.lanes",
        "records in",
        "records out (read_committed)",
        "lost",
        "duplicated",
        "shared group acked",
    ):
        assert header in printed
    assert all(sample["rss_kib"] and sample["rss_kib"] > 0 for sample in figures["samples"])
    assert figures["records_in"] > 0
    assert figures["lost"] == 0 and figures["duplicated"] == 0
    assert figures["records_out"] == figures["records_in"] == figures["shared_acked"]
