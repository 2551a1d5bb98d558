"""``meteor bench dedup``: what a message-id deduplication window costs, on an embedded grid in its own process.

Persistent streams, 100-byte records, the best of ``--rounds`` rounds per side, sides alternating in the same run:

- ``publish_async`` of plain values (no ids) to a stream without a window and to one with a window: the path of
  records without ids is the same, so the ratio should be 1 within the machine's noise;
- ``publish_async``, one record a call, with a message id each vs without: every id costs a ``putIfAbsent``
  round trip before the record is queued (and a ``replace`` + ``setTtl`` after it is stored, off the caller's
  thread), so this is the worst case;
- ``publish_many`` of 1,000-record lists with ids vs without: the ids of a call are claimed all at once.
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
from meteor_spark.producer.dedup import dedup_map_name
from meteor_spark.producer.publisher import Publisher
from meteor_spark.tables import render_table

RECORD_BYTES = 100
LANES = 4
BULK = 1_000
WINDOW_MS = 600_000


@dataclass(frozen=True)
class DedupBenchOptions:
    """Sizes of one run (``--quick`` shrinks everything to seconds)."""

    plain_records: int
    id_records: int
    bulk_records: int
    rounds: int

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> DedupBenchOptions:
        quick = bool(getattr(args, "quick", False))
        settings = cls(
            plain_records=given(args.plain_records, 20_000 if quick else 200_000),
            id_records=given(args.id_records, 1_000 if quick else 10_000),
            bulk_records=given(args.bulk_records, 10_000 if quick else 100_000),
            rounds=given(args.rounds, 1 if quick else 3),
        )
        check_at_least_one(settings, ("plain_records", "id_records", "bulk_records", "rounds"))
        return settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="small sizes (seconds instead of a minute)")
    parser.add_argument("--plain-records", type=int, default=None, help="records without ids (default 200k)")
    parser.add_argument("--id-records", type=int, default=None, help="records with ids, one a call (default 10k)")
    parser.add_argument("--bulk-records", type=int, default=None, help="records for publish_many (default 100k)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per side, best kept (default 3)")


def run(args: argparse.Namespace) -> dict[str, Any]:
    settings = DedupBenchOptions.from_args(args)
    figures: dict[str, Any] = {"settings": settings.__dict__}
    pool = [os.urandom(RECORD_BYTES) for _ in range(4096)]
    with bench_grid() as (grid, _):
        sides = {
            "without": lambda: _round(grid, pool, settings, with_ids=False),
            "with": lambda: _round(grid, pool, settings, with_ids=True),
        }
        figures.update(best_of_rounds(settings.rounds, sides))
    return figures


def _round(grid: Grid, pool: list[bytes], settings: DedupBenchOptions, with_ids: bool) -> dict[str, float]:
    """One side: ``with_ids`` publishes to a stream with a window (ids on the records that carry them)."""
    name = f"bench-dedup-{os.getpid()}-{time.time_ns()}"
    out: dict[str, float] = {}
    config = StreamConfig(name, lanes=LANES, capacity=100_000, dedup_window_ms=WINDOW_MS if with_ids else 0)
    try:
        with Publisher(grid, config, max_buffered_records=1_000_000) as pub:
            values = (pool * (settings.plain_records // len(pool) + 1))[: settings.plain_records]
            publish = pub.publish_async
            start = time.perf_counter()
            for value in values:
                publish(value)
            pub.flush()
            out["plain_async_records_s"] = len(values) / (time.perf_counter() - start)
            ids = [f"{name}-a{i}" if with_ids else None for i in range(settings.id_records)]
            start = time.perf_counter()
            for i, mid in enumerate(ids):
                publish(Record(pool[i % len(pool)], message_id=mid))
            pub.flush()
            out["id_async_records_s"] = len(ids) / (time.perf_counter() - start)
            start = time.perf_counter()
            for base in range(0, settings.bulk_records, BULK):
                count = min(BULK, settings.bulk_records - base)
                pub.publish_many(
                    [
                        Record(pool[(base + i) % len(pool)], message_id=f"{name}-m{base + i}" if with_ids else None)
                        for i in range(count)
                    ]
                )
            pub.flush()
            out["id_many_records_s"] = settings.bulk_records / (time.perf_counter() - start)
    finally:
        delete_stream(grid, name)
        grid.map(dedup_map_name(name)).clear()
    return out


def render(figures: dict[str, Any]) -> str:
    """The figures of ``run`` as the table ``meteor bench dedup`` prints."""
    without, with_ = figures["without"], figures["with"]
    rows = []
    for key, scenario in (
        ("plain_async_records_s", "publish_async, values without ids"),
        ("id_async_records_s", "publish_async, one record with an id a call"),
        ("id_many_records_s", f"publish_many, {BULK:,} records with ids a call"),
    ):
        rows.append(
            (
                scenario,
                f"{without[key]:,.0f} rec/s",
                f"{with_[key]:,.0f} rec/s",
                f"{with_[key] / without[key]:.2f}",
            )
        )
    table = render_table(("scenario (100-byte records)", "no window", "dedup window", "window / none"), rows)
    rounds = figures["settings"]["rounds"]
    notes = [
        f"best of {rounds} round(s) per side, sides alternating in the same run; 'no window': a stream without "
        f"dedup_window_ms and records without ids; 'dedup window': dedup_window_ms={WINDOW_MS:,} and every record "
        f"of the id rows carrying a fresh message id (one claim in map meteor.dedup::<stream> each)",
    ]
    return "\n".join([table, *notes])
