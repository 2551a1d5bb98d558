"""Kafka-style lag figures and the Prometheus collector over a streaming query's progress (``spark/lag.py``).

PySpark's Python Data Source API cannot put metrics into the progress (see the module's docstring), so these
figures come from ``query.lastProgress``; the conversion itself is checked against real Spark in tests/spark."""

from __future__ import annotations

import json
from types import SimpleNamespace

import prometheus_client
import pytest

pytest.importorskip("pyspark")

from meteor_spark.spark.lag import QueryLagCollector, kafka_metrics, lag_from_progress

PROGRESS = {
    "batchId": 4,
    "sources": [
        {
            "startOffset": json.dumps({"s": {"0": 0, "1": 0, "2": 0}}),
            "endOffset": json.dumps({"s": {"0": 10, "1": 4, "2": 7}}),
            "latestOffset": json.dumps({"s": {"0": 10, "1": 10, "2": 9}}),
            "numInputRows": 21,
        }
    ],
}


def test_kafka_metrics_of_a_progress() -> None:
    assert kafka_metrics(lag_from_progress(PROGRESS)) == {
        "avgOffsetsBehindLatest": "2.7",
        "maxOffsetsBehindLatest": "6",
        "minOffsetsBehindLatest": "0",
    }
    assert kafka_metrics(lag_from_progress({"sources": []})) == {}


def test_query_collector_reads_the_last_progress_at_each_scrape() -> None:
    query = SimpleNamespace(name="orders-job", id="x", lastProgress=None)
    registry = prometheus_client.CollectorRegistry()
    QueryLagCollector(query).register(registry)
    assert registry.get_sample_value("meteor_query_lag_items_max", {"query": "orders-job"}) is None
    query.lastProgress = PROGRESS
    for lane, behind in ((0, 0), (1, 6), (2, 2)):
        labels = {"query": "orders-job", "stream": "s", "lane": str(lane)}
        assert registry.get_sample_value("meteor_query_lag_items", labels) == behind
    assert registry.get_sample_value("meteor_query_lag_items_max", {"query": "orders-job"}) == 6
    assert registry.get_sample_value("meteor_query_lag_items_min", {"query": "orders-job"}) == 0
    assert registry.get_sample_value("meteor_query_lag_items_avg", {"query": "orders-job"}) == pytest.approx(8 / 3)
