"""The transaction maps stop growing under a long transactional Spark query (the fault tier's bound test through
Spark; ``tests/core/test_transaction_bounds.py`` covers ``transactions.sweep`` itself).

A meteor -> meteor query runs a couple of hundred micro-batches into a target whose lanes hold 20 ring items, with the
sink sweeping every 500 ms (``sweepIntervalMs``), while a ``read_committed`` subscriber and a shared group read the
target. Past warm-up (the first 100 batches: rings filling, the last ``KEEP_BATCHES`` batch ids accumulating) every
map must stay under its documented bound: committed transactions at most about the items the target's rings hold,
two producers per transaction (one per task), ``KEEP_BATCHES`` batch ids, no open entry left behind. Figures are
printed (the soak's table).
"""

from __future__ import annotations

from typing import Any

import pytest

from meteor_spark.bench.jobs.soak import LANES, render
from meteor_spark.bench.jobs.soak import run as run_soak
from meteor_spark.grid.transactions import KEEP_BATCHES

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.fault, pytest.mark.embedded_only]

BATCHES = 220
EVERY = 30
CAPACITY = 20
WARM_UP = 100
#: Batches that can commit between two sweeps, and between a sample and the sweep before it.
SLACK = 20


def test_transaction_maps_stay_flat_over_hundreds_of_micro_batches(spark: Any) -> None:
    figures = run_soak(BATCHES, EVERY, 0, 500, CAPACITY, progress=print)
    print(render(figures))
    assert figures["lost"] == 0 and figures["duplicated"] == 0
    assert figures["records_out"] == figures["records_in"] == figures["shared_acked"]
    settled = [s for s in figures["samples"] if s["batches"] >= WARM_UP]
    assert len(settled) >= 3, figures["samples"]
    ring_items = CAPACITY * LANES
    for sample in settled:
        maps = sample["maps"]
        where = f"after {sample['batches']} micro-batches: {maps}"
        assert maps.get("meteor.txns", 0) <= ring_items + SLACK, where
        assert maps.get("meteor.txn.producers", 0) <= 2 * (ring_items + SLACK) + 1, where
        assert maps.get("meteor.txn.batches", 0) <= KEEP_BATCHES + SLACK, where
        assert maps.get("meteor.txn.open", 0) <= 1, where
        assert maps.get("meteor.sink.commits", 0) == 1, where
    first, last = settled[0]["maps"], settled[-1]["maps"]
    for name in ("meteor.txns", "meteor.txn.producers", "meteor.txn.batches"):
        assert last.get(name, 0) <= max(first.get(name, 0), 0) + SLACK, f"{name} grew: {first} -> {last}"
