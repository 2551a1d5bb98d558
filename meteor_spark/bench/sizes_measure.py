"""What ``meteor bench sizes`` measures with, in one place for both of its process models (the sweep's own warm
process, ``sizes``, and a fresh process per run, ``sizes_fresh``): how the publisher's settings cut records
(``Shape``), the values, and the timed runs (raw ``add_all``, ``publish_many``, ``publish_async``, one subscriber).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.format.item_encoding import encode_columns
from meteor_spark.grid.client import Grid
from meteor_spark.grid.streams import StreamConfig
from meteor_spark.producer.batching import PublisherSettings
from meteor_spark.producer.publisher import Publisher

MB = 1_000_000  # figures are in MB/s (10^6), as network figures are
PUBLISH_MANY_CHUNK = 10_000
#: ``publish_async`` publishes at most this many records a run (one record a call: at 100 B it moves a third of
#: ``publish_many``'s records per second, so a whole run of small records would take the sweep's time).
ASYNC_MAX_RECORDS = 250_000


# ------------------------------------------------------------------------------------------------ shapes


@dataclass(frozen=True)
class Shape:
    """How the publisher's settings cut records of one size: records per ring item, items per call."""

    records_per_item: int
    items_per_call: int

    @classmethod
    def of(cls, settings: PublisherSettings, record_bytes: int) -> Shape:
        per_item = max(1, min(settings.max_batch_records, settings.max_item_bytes // record_bytes))
        per_call = max(1, min(settings.max_items_per_call, settings.max_call_bytes // (per_item * record_bytes)))
        return cls(per_item, per_call)


def value_pool(size: int, count: int) -> list[bytes]:
    pool = [os.urandom(size) for _ in range(max(1, min(4096, (64 << 20) // size)))]
    return (pool * (count // len(pool) + 1))[:count]


def records_for(options: Any, size: int) -> int:
    """Records of ``size`` bytes one run publishes: ``--megabytes`` worth, at most ``--max-records``."""
    return max(1, min(options.max_records, options.megabytes * MB // size))


def async_records(n: int) -> int:
    """Records one ``publish_async`` run publishes when the other sides publish ``n``: the same, so its rate is
    compared with theirs over the same bytes, at most ``ASYNC_MAX_RECORDS``.

    A fresh process's run pays a start-up of about 10-25 ms whatever its length (the first call's round trip before
    the pipeline fills, a few MiB of new buffers faulted in, threads and caches warming): a shorter ``publish_async``
    run (it once published a quarter of the records, 25 MB of 100 at 10 KiB: a 30-50 ms run) paid it on a quarter of
    the bytes, and read 0.60 of a ceiling measured over all of them. ``kafka-producer-perf-test`` likewise times
    every record of one run of a given count, start-up included.
    """
    return max(1, min(n, ASYNC_MAX_RECORDS))


def best_seconds(repeats: int, measure: Callable[[], float]) -> float:
    """The shortest of ``repeats`` runs of ``measure`` (seconds)."""
    return min(measure() for _ in range(repeats))


def unique_name(prefix: str) -> str:
    return f"bench-{prefix}-{os.getpid()}-{time.time_ns()}"


# ------------------------------------------------------------------------------------------------ measuring


class Seconds(float):
    """The wall seconds of a timed run, with this process's CPU seconds (all its threads) over the same window as
    ``cpu``: what a shared machine's load disturbs least, and nothing from before the timing (connecting, a
    publisher's start)."""

    cpu: float

    def __new__(cls, wall: float, cpu: float) -> Seconds:
        made = super().__new__(cls, wall)
        made.cpu = cpu
        return made

    @staticmethod
    def start() -> tuple[float, float]:
        return time.perf_counter(), time.process_time()

    @classmethod
    def since(cls, start: tuple[float, float]) -> Seconds:
        return cls(time.perf_counter() - start[0], time.process_time() - start[1])


def raw_add_all(grid: Grid, calls_per_ring: list[list[list[bytes]]]) -> Seconds:
    """Seconds to append pre-encoded calls to one fresh ring per entry, one call in flight per ring."""
    rings = [grid.ring(unique_name("raw")) for _ in calls_per_ring]
    try:
        start = Seconds.start()
        for round_calls in zip(*calls_per_ring, strict=True):
            futures = [ring.add_all_async(call) for ring, call in zip(rings, round_calls, strict=True)]
            for future in futures:
                future.result()
        return Seconds.since(start)
    finally:
        for ring in rings:
            ring.destroy()


def encoded_calls(values: list[bytes], shape: Shape, lanes: int) -> tuple[list[list[list[bytes]]], int]:
    """The values cut into ring items and calls per lane (contiguous runs per lane, as ``publish_many`` spreads
    keyless records), each lane padded to the same number of calls by repeating its last one (so every ring stays
    busy to the end); and the number of records all those calls carry."""
    per_lane = -(-len(values) // lanes)
    out = []
    records = []
    step = shape.records_per_item
    per_call = step * shape.items_per_call
    for lane in range(lanes):
        run = values[lane * per_lane : (lane + 1) * per_lane]
        items = [
            encode_columns(run[i : i + step], timestamps=0, producer_id=1, producer_seq=i)
            for i in range(0, len(run), step)
        ]
        out.append([items[i : i + shape.items_per_call] for i in range(0, len(items), shape.items_per_call)])
        records.append([len(run[i : i + per_call]) for i in range(0, len(run), per_call)])
    rounds = max(len(calls) for calls in out)
    total = sum(sum(counts) + (rounds - len(counts)) * counts[-1] for counts in records)
    return [calls + [calls[-1]] * (rounds - len(calls)) for calls in out], total


def ceiling_rate(grid: Grid, values: list[bytes], shape: Shape, lanes: int, repeats: int) -> float:
    """Records/s of raw ``add_all`` of ``values`` encoded beforehand (best of ``repeats``)."""
    calls, records = encoded_calls(values, shape, lanes)
    return records / best_seconds(repeats, lambda: raw_add_all(grid, calls))


def publish_many(grid: Grid, stream: StreamConfig, overrides: dict[str, Any], values: list[Any]) -> Seconds:
    with Publisher(grid, stream, max_buffered_records=max(100_000, 2 * PUBLISH_MANY_CHUNK), **overrides) as pub:
        start = Seconds.start()
        for i in range(0, len(values), PUBLISH_MANY_CHUNK):
            pub.publish_many(values[i : i + PUBLISH_MANY_CHUNK])
        pub.flush()
        return Seconds.since(start)


def publish_async(grid: Grid, stream: StreamConfig, overrides: dict[str, Any], values: list[bytes]) -> Seconds:
    with Publisher(grid, stream, **overrides) as pub:
        publish = pub.publish_async
        start = Seconds.start()
        for value in values:
            last = publish(value)
        pub.flush()
        elapsed = Seconds.since(start)
        last.result()
        return elapsed


def consume(grid: Grid, stream: str, expected: int) -> Seconds:
    """Seconds for one subscriber to turn every record of ``stream`` into a ``Record`` object."""
    with Subscriber(grid, stream, initial_offset_scheme="earliest") as sub:
        seen = 0
        start = Seconds.start()
        deadline = start[0] + 600
        while seen < expected:
            for _record in sub.poll(1000):
                seen += 1
            if time.perf_counter() > deadline:
                raise RuntimeError(f"the subscriber saw {seen} of {expected} records of {stream!r} in 600 s")
        return Seconds.since(start)


def stream_for(prefix: str, lanes: int, records: int, shape: Shape) -> StreamConfig:
    items = -(-records // shape.records_per_item) + 2 * lanes
    return StreamConfig(unique_name(prefix), lanes=lanes, capacity=max(1000, 2 * items // lanes + 100))
