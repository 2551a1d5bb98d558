"""``meteor bench pubsub --quick`` runs end to end and reports every figure (values are not judged: timing never
decides pass/fail)."""

from __future__ import annotations

import argparse

import pytest

from meteor_spark.bench import pubsub


@pytest.mark.slow
@pytest.mark.embedded_only
def test_quick_bench_reports_every_scenario() -> None:
    parser = argparse.ArgumentParser()
    pubsub.add_arguments(parser)
    args = parser.parse_args(
        [
            "--quick",
            "--async-records",
            "2000",
            "--bulk-records",
            "20000",
            "--fanout-records",
            "8000",
            "--round-trips",
            "20",
            "--subscriber-processes",
            "3",
        ]
    )
    figures = pubsub.run(args)
    assert set(figures) >= {"ceiling", "one_publisher", "fanout", "fanout_constant", "latency"}
    for fanout in (figures["fanout"], figures["fanout_constant"]):
        assert fanout["deliveries_s"] == pytest.approx(fanout["unique_records_s"] * 16)
    assert set(figures["one_publisher"]) >= {"publish_async_records_s", "publish_async_kept_records_s"}
    assert all(value > 0 for value in figures["one_publisher"].values())
    latency = figures["latency"]
    keys = ("meteor", "helper", "raw_request_reply", "raw_add_read", "one_hop", "parked")
    assert all(latency[key]["p50_ms"] > 0 for key in keys)
    assert latency["one_hop"]["cpu_us"] > 0 and latency["parked"]["cpu_us"] > 0
    assert latency["one_hop"]["poll_cpu_us"] > 0 and latency["parked"]["read_cpu_us"] > 0
    printed = pubsub.render(figures)
    for text in ("deliveries", "Meteor's constant payload", "p50 / p99", "Requester / Responder", "raw request/reply"):
        assert text in printed
    assert "publish -> poll, other connection" in printed and "add_all + parked read_many" in printed
