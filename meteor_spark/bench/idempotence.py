"""``meteor bench idempotence``: what idempotent publishing costs, on an embedded grid in its own process.

The same publishes with ``idempotent=False`` and ``idempotent=True``, alternating, in the same run (the best of
``--rounds`` rounds each, so a noisy neighbour hurts both sides alike):

- ``publish_async``, one 100-byte record a call, futures dropped;
- ``publish_many``, lists of 10,000 records;
- a short-lived publisher (as a Spark task makes one): create it, publish one record to each of 8 lanes and wait,
  close it. An idempotent publisher reads every lane's tail when it starts (in parallel: where to look for a
  lane's first call should its answer be lost), so this is where its cost shows.

Without faults, an idempotent publisher does nothing more per call than keep the call's encoded items until the
answer (it holds them anyway) and remember one sequence per lane; retries cost only when an answer is lost.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass
from typing import Any

from meteor_spark.bench import check_at_least_one, given
from meteor_spark.bench.harness import bench_grid, best_of_rounds
from meteor_spark.format.records import Record
from meteor_spark.grid.client import Grid
from meteor_spark.grid.streams import StreamConfig
from meteor_spark.groups.admin import delete_stream
from meteor_spark.producer.publisher import Publisher
from meteor_spark.tables import render_table

RECORD_BYTES = 100
SHORT_LIVED_LANES = 8


@dataclass(frozen=True)
class IdempotenceBenchOptions:
    """Sizes of one run (``--quick`` shrinks everything to seconds)."""

    async_records: int
    bulk_records: int
    short_lived: int
    rounds: int

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> IdempotenceBenchOptions:
        quick = bool(getattr(args, "quick", False))
        settings = cls(
            async_records=given(args.async_records, 20_000 if quick else 200_000),
            bulk_records=given(args.bulk_records, 100_000 if quick else 1_000_000),
            short_lived=given(args.short_lived, 10 if quick else 100),
            rounds=given(args.rounds, 1 if quick else 3),
        )
        check_at_least_one(settings, ("async_records", "bulk_records", "short_lived", "rounds"))
        return settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="small sizes (seconds instead of a minute)")
    parser.add_argument("--async-records", type=int, default=None, help="records for publish_async (default 200k)")
    parser.add_argument("--bulk-records", type=int, default=None, help="records for publish_many (default 1M)")
    parser.add_argument(
        "--short-lived", type=int, default=None, help="short-lived publishers created and closed (default 100)"
    )
    parser.add_argument("--rounds", type=int, default=None, help="rounds per side, best kept (default 3)")


def run(args: argparse.Namespace) -> dict[str, Any]:
    settings = IdempotenceBenchOptions.from_args(args)
    figures: dict[str, Any] = {"settings": settings.__dict__}
    pool = [os.urandom(RECORD_BYTES) for _ in range(4096)]
    with bench_grid() as (grid, _):
        sides = {"off": lambda: _round(grid, pool, settings, False), "on": lambda: _round(grid, pool, settings, True)}
        figures.update(best_of_rounds(settings.rounds, sides, lowest=lambda name: name.endswith("_ms")))
    return figures


def _round(grid: Grid, pool: list[bytes], settings: IdempotenceBenchOptions, idempotent: bool) -> dict[str, float]:
    name = f"bench-idem-{os.getpid()}-{time.time_ns()}"
    out: dict[str, float] = {}
    try:
        config = StreamConfig(name, lanes=SHORT_LIVED_LANES, capacity=100_000)
        with Publisher(grid, config, max_buffered_records=1_000_000, idempotent=idempotent) as pub:
            values = (pool * (settings.async_records // len(pool) + 1))[: settings.async_records]
            publish = pub.publish_async
            start = time.perf_counter()
            for value in values:
                last = publish(value)
            pub.flush()
            out["publish_async_records_s"] = len(values) / (time.perf_counter() - start)
            last.result()
            values = (pool * (settings.bulk_records // len(pool) + 1))[: settings.bulk_records]
            start = time.perf_counter()
            for i in range(0, len(values), 10_000):
                pub.publish_many(values[i : i + 10_000])
            pub.flush()
            out["publish_many_records_s"] = len(values) / (time.perf_counter() - start)
        records = [Record(pool[lane], lane=lane) for lane in range(SHORT_LIVED_LANES)]
        start = time.perf_counter()
        for _ in range(settings.short_lived):
            with Publisher(grid, name, idempotent=idempotent) as short:
                short.publish_many(records).result()
        out["short_lived_publisher_ms"] = (time.perf_counter() - start) / settings.short_lived * 1000
    finally:
        delete_stream(grid, name)
    return out


def render(figures: dict[str, Any]) -> str:
    """The figures of ``run`` as the table ``meteor bench idempotence`` prints."""
    off, on = figures["off"], figures["on"]
    rows = [
        (
            "publish_async, one record a call",
            f"{off['publish_async_records_s']:,.0f} rec/s",
            f"{on['publish_async_records_s']:,.0f} rec/s",
            f"{on['publish_async_records_s'] / off['publish_async_records_s']:.2f}",
        ),
        (
            "publish_many, 10k records a call",
            f"{off['publish_many_records_s']:,.0f} rec/s",
            f"{on['publish_many_records_s']:,.0f} rec/s",
            f"{on['publish_many_records_s'] / off['publish_many_records_s']:.2f}",
        ),
        (
            f"short-lived publisher, 1 record x {SHORT_LIVED_LANES} lanes",
            f"{off['short_lived_publisher_ms']:.2f} ms",
            f"{on['short_lived_publisher_ms']:.2f} ms",
            f"{on['short_lived_publisher_ms'] / off['short_lived_publisher_ms']:.2f}",
        ),
    ]
    table = render_table(("scenario (100-byte records)", "idempotent=False", "idempotent=True", "on / off"), rows)
    rounds = figures["settings"]["rounds"]
    notes = [
        f"best of {rounds} round(s) per side, sides alternating in the same run; the short-lived publisher creates a "
        f"publisher, publishes one record to each of {SHORT_LIVED_LANES} lanes, waits and closes (an idempotent "
        f"publisher reads every lane's tail, in parallel, when it starts)",
    ]
    return "\n".join([table, *notes])
