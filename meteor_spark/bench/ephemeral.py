"""``meteor bench ephemeral``: ephemeral (at-most-once) publish -> consume with 1, 4 and 16 matching entities.

An entity is an ungrouped ``Subscriber(topics="orders.*.created")`` on an ephemeral stream (so every record goes
through the topic filter), a receiver thread counting per batch; the entities are spread over
``--subscriber-processes`` processes (one per core by default). For each entity count:

- throughput: one publisher sends ``--records`` records (topic ``orders.eu.created``, 100-byte values) with
  ``publish_many``; unique records/s and deliveries/s (unique x entities) from the first publish until every
  entity has every record;
- latency: then ``--probes`` single records, one at a time with a pause between them, each carrying the
  publisher's ``time.monotonic_ns()`` (one clock for every process of the machine); p50/p99 of publish -> handed
  to the receiver, over every delivery.

Ceiling in the same run: the same publisher on a stream with no entity at all, where every record is dropped at the
publisher (the registry check alone: nothing is sent).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import struct
import threading
import time
from dataclasses import dataclass
from typing import Any

from meteor_spark.bench import check_at_least_one, given
from meteor_spark.bench.harness import bench_grid
from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.format.records import Record
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.streams import StreamConfig
from meteor_spark.grid.subscriptions import live_subscriptions
from meteor_spark.groups.admin import delete_stream
from meteor_spark.producer.publisher import Publisher
from meteor_spark.tables import render_table

ENTITY_COUNTS = (1, 4, 16)
TOPIC = "orders.eu.created"
PATTERN = "orders.*.created"
PROBE_GAP_S = 0.002


@dataclass(frozen=True)
class EphemeralBenchOptions:
    """Sizes of one run (``--quick`` shrinks them to seconds)."""

    records: int
    probes: int
    record_bytes: int
    subscriber_processes: int

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> EphemeralBenchOptions:
        quick = bool(getattr(args, "quick", False))
        settings = cls(
            records=given(args.records, 20_000 if quick else 200_000),
            probes=given(args.probes, 100 if quick else 1000),
            record_bytes=args.record_bytes,
            subscriber_processes=args.subscriber_processes,
        )
        check_at_least_one(settings, ("records", "probes", "record_bytes", "subscriber_processes"))
        return settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="small sizes (seconds instead of a minute)")
    parser.add_argument("--records", type=int, default=None, help="records of the throughput run (default 200k)")
    parser.add_argument("--probes", type=int, default=None, help="single records timed for latency (default 1000)")
    parser.add_argument("--record-bytes", type=int, default=100, help="value size (default 100, at least 8)")
    parser.add_argument(
        "--subscriber-processes", type=int, default=2, help="processes the entities are spread over (default 2)"
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    settings = EphemeralBenchOptions.from_args(args)
    figures: dict[str, Any] = {"settings": settings.__dict__}
    with bench_grid() as (grid, grid_settings):
        figures["ceiling"] = {"dropped_publish_records_s": _dropping(grid, settings)}
        for entities in ENTITY_COUNTS:
            figures[f"entities_{entities}"] = _entities(grid, grid_settings, settings, entities)
    return figures


def _value(size: int, mark: bytes) -> bytes:
    """``mark`` (1 byte), the publisher's monotonic clock (8 bytes), random padding up to ``size``."""
    return mark + struct.pack("<q", time.monotonic_ns()) + os.urandom(max(0, size - 9))


def _dropping(grid: Grid, settings: EphemeralBenchOptions) -> float:
    name = f"bench-eph-none-{os.getpid()}-{time.time_ns()}"
    records = [Record(os.urandom(settings.record_bytes), topic=TOPIC) for _ in range(settings.records)]
    try:
        with Publisher(grid, StreamConfig(name, lanes=2, ephemeral=True)) as pub:
            start = time.perf_counter()
            for i in range(0, len(records), 10_000):
                pub.publish_many(records[i : i + 10_000])
            elapsed = time.perf_counter() - start
            assert pub.records_sent == 0 and pub.metrics()["dropped_records"] == len(records)
        return len(records) / elapsed
    finally:
        delete_stream(grid, name)


def _entity_process(
    members: str, cluster: str, stream: str, count: int, sizes: tuple[int, int], ready: Any, results: Any
) -> None:
    """Child process: ``count`` entities (receivers). Reports when each saw the ``sizes[0]`` throughput records
    (the time the last one did), then, once each saw ``sizes[1]`` records in all, the probes' latencies."""
    grid = Grid(GridSettings(members=(members,), cluster_name=cluster))
    throughput, expected = sizes
    counts = [0] * count
    latencies: list[list[int]] = [[] for _ in range(count)]
    through = [0.0] * count
    finished = [0.0] * count
    done = threading.Event()
    lock = threading.Lock()
    unpack = struct.Struct("<q").unpack_from

    def counter(i: int) -> Any:
        def on_batch(batch: Any) -> None:
            now = time.monotonic_ns()
            counts[i] += len(batch)
            if counts[i] > throughput:  # the probes: published once every entity had the throughput records
                latencies[i].extend(now - unpack(v, 1)[0] for v in batch.values() if v[:1] == b"P")
            if counts[i] >= throughput and not through[i]:
                with lock:
                    through[i] = time.monotonic()
                    if all(through):
                        results.put({"through_at": max(through)})
            if counts[i] >= expected and not finished[i]:
                finished[i] = time.monotonic()
                if all(finished):
                    done.set()

        return on_batch

    subs = [Subscriber(grid, stream, topics=PATTERN, max_poll_records=100_000) for _ in range(count)]
    for i, sub in enumerate(subs):
        sub.attach_receiver(counter(i), poll_timeout_ms=100, per_batch=True)
    ready.set()
    completed = done.wait(600)
    results.put({"counts": counts, "completed": completed, "latencies": [x for lane in latencies for x in lane]})
    for sub in subs:
        sub.close()
    grid.close()


def _entities(
    grid: Grid, grid_settings: GridSettings, settings: EphemeralBenchOptions, entities: int
) -> dict[str, float]:
    name = f"bench-eph-{entities}-{os.getpid()}-{time.time_ns()}"
    total = settings.records + settings.probes
    Publisher(grid, StreamConfig(name, lanes=2, capacity=max(1000, total // 100 + 100), ephemeral=True)).close()
    results, children = _start_entities(grid_settings, settings, name, entities)
    try:
        for _, ready in children:
            if not ready.wait(120):
                raise RuntimeError("an entity process did not start within 120 s")
        deadline = time.monotonic() + 60
        while len(live_subscriptions(grid, name)) < entities:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{entities} entities did not register within 60 s")
            time.sleep(0.05)  # bench code, not a test: a plain pause while the children register
        records = [Record(_value(settings.record_bytes, b"T"), topic=TOPIC) for _ in range(settings.records)]
        with Publisher(grid, name, max_buffered_records=200_000) as pub:
            start = time.monotonic()
            for i in range(0, len(records), 10_000):
                pub.publish_many(records[i : i + 10_000])
            pub.flush()
            through_at = max(results.get(timeout=600)["through_at"] for _ in children)
            for _ in range(settings.probes):
                pub.publish(_value(settings.record_bytes, b"P"), topic=TOPIC)
                time.sleep(PROBE_GAP_S)
            dropped = pub.metrics()["dropped_records"]
        outcomes = [results.get(timeout=600) for _ in children]
        if not all(outcome["completed"] for outcome in outcomes):
            raise RuntimeError(f"entities did not receive everything: {[o['counts'] for o in outcomes]}")
        latencies = sorted(ns / 1e6 for outcome in outcomes for ns in outcome["latencies"])
        elapsed = max(through_at - start, 1e-9)  # CLOCK_MONOTONIC: one clock for every process
        return {
            "entities": entities,
            "unique_records_s": settings.records / elapsed,
            "deliveries_s": settings.records * entities / elapsed,
            "p50_ms": statistics.median(latencies) if latencies else float("nan"),
            "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] if latencies else float("nan"),
            "latency_samples": len(latencies),
            "dropped": dropped,
        }
    finally:
        for child, _ in children:
            child.join(30)
            if child.is_alive():
                child.kill()
        delete_stream(grid, name)


def _start_entities(
    grid_settings: GridSettings, settings: EphemeralBenchOptions, name: str, entities: int
) -> tuple[Any, list[tuple[Any, Any]]]:
    """The entity processes (spawned), with the queue they report on and each one's ready event."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    processes = min(entities, settings.subscriber_processes)
    children = []
    for i in range(processes):
        count = entities // processes + (1 if i < entities % processes else 0)
        ready = context.Event()
        child = context.Process(
            target=_entity_process,
            args=(
                grid_settings.members[0],
                grid_settings.cluster_name,
                name,
                count,
                (settings.records, settings.records + settings.probes),
                ready,
                results,
            ),
            daemon=True,
        )
        child.start()
        children.append((child, ready))
    return results, children


def render(figures: dict[str, Any]) -> str:
    settings = figures["settings"]
    rows = []
    for entities in ENTITY_COUNTS:
        f = figures.get(f"entities_{entities}")
        if f is None:
            continue
        rows.append(
            [
                entities,
                f"{f['unique_records_s']:,.0f}",
                f"{f['deliveries_s']:,.0f}",
                f"{f['p50_ms']:.2f} / {f['p99_ms']:.2f}",
                f["latency_samples"],
                f["dropped"],
            ]
        )
    table = render_table(
        ["ENTITIES", "UNIQUE REC/S", "DELIVERIES/S", "p50 / p99 ms", "SAMPLES", "DROPPED"], rows, right=[0, 1, 2, 4, 5]
    )
    ceiling = figures["ceiling"]["dropped_publish_records_s"]
    return (
        f"ephemeral publish -> consume, {settings['records']:,} records of {settings['record_bytes']} B with topic "
        f"{TOPIC!r}, entities Subscriber(topics={PATTERN!r}) over {settings['subscriber_processes']} process(es)\n"
        f"{table}\n"
        f"no entity: every record dropped at the publisher: {ceiling:,.0f} records/s (nothing sent)"
    )
