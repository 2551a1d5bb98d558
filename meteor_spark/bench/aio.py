"""``meteor bench aio``: the asyncio API against the threaded one, side by side, on an embedded grid in its own process.

Per side (threaded ``Publisher`` / ``Subscriber``; asyncio ``AsyncPublisher`` / ``AsyncSubscriber``, on one event
loop and no threads of meteor's):

- publish throughput at 100-byte records: one record per call (``publish_async``, futures kept until the end, then
  ``flush``; and once more dropping each future as it comes, as a fire-and-forget caller does: futures a caller keeps
  are objects the garbage collector traverses), and ``publish_many`` of 10,000-record lists, each with this
  process's CPU time per record (the member runs in a process of its own: on a shared machine CPU time tells what
  the client's code costs where records per second also measure the neighbours);
- round trip with one record in flight: publish, and a subscriber on another client connection receives it
  (p50 / p99), the next record published only then;
- request/reply with one request in flight: a requester (``Requester`` / ``AsyncRequester``) and a responder
  (``Responder`` / ``AsyncResponder``) on two client connections of this process, p50 / p99 of ``request``;
- a shared-group member (``SharedSubscriber`` / ``AsyncSharedSubscriber``) alone on a 4-lane stream of published
  records: records acquired and acknowledged per second (``poll`` then ``ack`` of each batch).

Ceilings measured in the same run: raw ``add_all`` of pre-encoded 1000-record items through the threaded client and
through the asyncio client (no meteor logic), and a raw ring round trip (add, then a ``read_many`` of that item) of
each client. Sides run in alternation, ``--rounds`` times, keeping the best of each figure (``best_of_rounds``):
on a shared machine one round measures the neighbours as much as the code.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from dataclasses import dataclass
from typing import Any

from meteor_spark.aio import (
    AsyncGrid,
    AsyncPublisher,
    AsyncRequester,
    AsyncResponder,
    AsyncSharedSubscriber,
    AsyncSubscriber,
)
from meteor_spark.bench import check_at_least_one, given
from meteor_spark.bench.harness import bench_grid, best_of_rounds
from meteor_spark.bench.pubsub import WARM_UP_ROUND_TRIPS, ceilings, payloads, percentiles, round_trips, values_of
from meteor_spark.consumer.request_reply import Requester, Responder
from meteor_spark.consumer.shared_subscriber import SharedSubscriber
from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.format.item_encoding import encode_columns
from meteor_spark.format.records import Record
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.streams import StreamConfig
from meteor_spark.groups.admin import delete_stream
from meteor_spark.producer.publisher import Publisher
from meteor_spark.tables import render_table

RECORD_BYTES = 100
BULK = 10_000
#: Records a shared-group member acquires and acknowledges per side and round (at most ``--records``).
SHARED_RECORDS = 20_000


@dataclass(frozen=True)
class AioBenchOptions:
    """Sizes of one run (``--quick`` shrinks everything to seconds)."""

    records: int
    round_trips: int
    record_bytes: int
    rounds: int

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> AioBenchOptions:
        quick = bool(getattr(args, "quick", False))
        settings = cls(
            records=given(args.records, 20_000 if quick else 200_000),
            round_trips=given(args.round_trips, 200 if quick else 2000),
            record_bytes=args.record_bytes,
            rounds=given(args.rounds, 1 if quick else 3),
        )
        check_at_least_one(settings, ("records", "round_trips", "record_bytes", "rounds"))
        return settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="small sizes (seconds instead of a minute)")
    parser.add_argument("--records", type=int, default=None, help="records per throughput figure (default 200k)")
    parser.add_argument("--round-trips", type=int, default=None, help="one-in-flight round trips (default 2000)")
    parser.add_argument("--record-bytes", type=int, default=RECORD_BYTES, help="value size (default 100)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per side, the best kept (default 3)")


def run(args: argparse.Namespace) -> dict[str, Any]:
    settings = AioBenchOptions.from_args(args)
    figures: dict[str, Any] = {"settings": settings.__dict__}
    with bench_grid() as (grid, grid_settings):
        pool = payloads(settings.record_bytes)
        figures["ceiling"] = {
            **ceilings(grid, pool, settings.records),
            **asyncio.run(_async_ceilings(grid_settings, pool, settings)),
        }
        ring = grid.ring(f"bench.aio.raw.{os.getpid()}.{time.time_ns()}")
        figures["ceiling"]["raw_round_trip"] = round_trips(
            settings.round_trips, lambda payload: ring.read_many(ring.add(payload), 1, 1)
        )
        ring.destroy()
        figures.update(
            best_of_rounds(
                settings.rounds,
                {
                    "threaded": lambda: _threaded(grid, pool, settings),
                    "asyncio": lambda: asyncio.run(_asyncio(grid, grid_settings, pool, settings)),
                },
                lowest=lambda name: name.endswith(("_ms", "_us")),
            )
        )
        figures["shared"] = best_of_rounds(
            settings.rounds,
            {
                "threaded": lambda: _shared_threaded(grid, pool, settings),
                "asyncio": lambda: asyncio.run(_shared_asyncio(grid, grid_settings, pool, settings)),
            },
        )
    return figures


def _shared_stream(grid: Grid, pool: list[bytes], settings: AioBenchOptions, side: str) -> tuple[str, int]:
    """A fresh 4-lane stream holding the records a shared member works through."""
    name = f"bench-aio-shared-{side}-{os.getpid()}-{time.time_ns()}"
    values = values_of(pool, min(settings.records, SHARED_RECORDS))
    with Publisher(grid, StreamConfig(name, lanes=4, capacity=100_000), max_buffered_records=1_000_000) as pub:
        pub.publish_many(values)
        pub.flush()
    return name, len(values)


def _shared_threaded(grid: Grid, pool: list[bytes], settings: AioBenchOptions) -> dict[str, float]:
    """A threaded shared member alone: records acquired and acknowledged per second."""
    name, total = _shared_stream(grid, pool, settings, "threaded")
    try:
        with SharedSubscriber(grid, name, group="bench") as member:
            start, done = time.perf_counter(), 0
            while done < total:
                batch = member.poll(5000)
                member.ack(batch)
                done += len(batch)
            return {"shared_records_s": total / (time.perf_counter() - start)}
    finally:
        delete_stream(grid, name)


async def _shared_asyncio(
    grid: Grid, grid_settings: GridSettings, pool: list[bytes], settings: AioBenchOptions
) -> dict[str, float]:
    """An asyncio shared member alone: records acquired and acknowledged per second."""
    name, total = _shared_stream(grid, pool, settings, "asyncio")
    try:
        async with AsyncSharedSubscriber(grid_settings, name, group="bench") as member:
            start, done = time.perf_counter(), 0
            while done < total:
                batch = await member.poll(5000)
                await member.ack(batch)
                done += len(batch)
            return {"shared_records_s": total / (time.perf_counter() - start)}
    finally:
        delete_stream(grid, name)


async def _async_ceilings(grid_settings: GridSettings, pool: list[bytes], settings: AioBenchOptions) -> dict[str, Any]:
    """The asyncio client's raw ``add_all`` of pre-encoded items and raw ring round trip."""
    values = values_of(pool, settings.records)
    items = [
        encode_columns(values[i : i + 1000], timestamps=0, producer_id=1, producer_seq=i)
        for i in range(0, len(values), 1000)
    ]
    async with await AsyncGrid.start(grid_settings) as grid:
        ring = await grid.ring(f"bench.aio.ceiling.{os.getpid()}.{time.time_ns()}")
        start = time.perf_counter()
        for i in range(0, len(items), 64):
            await ring.add_all(items[i : i + 64])
        add_rate = len(values) / (time.perf_counter() - start)
        samples = []
        for i in range(settings.round_trips + WARM_UP_ROUND_TRIPS):
            payload = i.to_bytes(8, "big") * 12
            start = time.perf_counter()
            await ring.read_many(await ring.add_all([payload]), 1, 1)
            if i >= WARM_UP_ROUND_TRIPS:
                samples.append(time.perf_counter() - start)
        await ring.destroy()
    return {"raw_async_add_all_records_s": add_rate, "raw_async_round_trip": percentiles(samples)}


def _threaded(grid: Grid, pool: list[bytes], settings: AioBenchOptions) -> dict[str, float]:
    """The threaded side: throughput, then the round trip to a subscriber on a second connection."""
    name = f"bench-aio-threaded-{os.getpid()}-{time.time_ns()}"
    values = values_of(pool, settings.records)
    out: dict[str, float] = {}
    try:
        with Publisher(grid, StreamConfig(name, capacity=100_000), max_buffered_records=1_000_000) as pub:
            start, cpu = time.perf_counter(), time.process_time()
            futures = [pub.publish_async(value) for value in values]
            pub.flush()
            _rates(out, "publish_async", len(values), start, cpu)
            assert futures[-1].result() >= 0
            del futures
            start, cpu = time.perf_counter(), time.process_time()
            for value in values:
                pub.publish_async(value)
            pub.flush()
            _rates(out, "publish_async_dropped", len(values), start, cpu)
            start, cpu = time.perf_counter(), time.process_time()
            for i in range(0, len(values), BULK):
                pub.publish_many(values[i : i + BULK])
            pub.flush()
            _rates(out, "publish_many", len(values), start, cpu)
            with Grid(grid.settings) as other, Subscriber(other, name, initial_offset_scheme="latest") as sub:

                def round_trip(payload: bytes) -> None:
                    pub.publish_async(payload)
                    while not sub.poll(5000):
                        pass

                latency = round_trips(settings.round_trips, round_trip)
        out["p50_ms"], out["p99_ms"] = latency["p50_ms"], latency["p99_ms"]
        with (
            Grid(grid.settings) as other,
            Responder(grid, StreamConfig(f"{name}-rr"), _echo),
            Requester(other, f"{name}-rr", timeout_ms=10_000) as requester,
        ):
            replies = round_trips(settings.round_trips, requester.request)
        out["rr_p50_ms"], out["rr_p99_ms"] = replies["p50_ms"], replies["p99_ms"]
    finally:
        delete_stream(grid, name)
        delete_stream(grid, f"{name}-rr")
    return out


def _rates(out: dict[str, float], name: str, records: int, start: float, cpu: float) -> None:
    """Records per second since ``start`` (``perf_counter``) and this process's CPU microseconds per record since
    ``cpu`` (``process_time``)."""
    out[f"{name}_records_s"] = records / (time.perf_counter() - start)
    out[f"{name}_cpu_us"] = (time.process_time() - cpu) / records * 1e6


def _echo(request: Record) -> bytes:
    return request.value


async def _asyncio(
    grid: Grid, grid_settings: GridSettings, pool: list[bytes], settings: AioBenchOptions
) -> dict[str, float]:
    """The asyncio side: the same figures, with the publisher and the subscriber on two ``AsyncGrid``s."""
    name = f"bench-aio-asyncio-{os.getpid()}-{time.time_ns()}"
    values = values_of(pool, settings.records)
    out: dict[str, float] = {}
    try:
        async with (
            await AsyncGrid.start(grid_settings) as one,
            await AsyncGrid.start(grid_settings) as other,
            AsyncPublisher(one, StreamConfig(name, capacity=100_000), max_buffered_records=1_000_000) as pub,
        ):
            start, cpu = time.perf_counter(), time.process_time()
            futures = [await pub.publish_async(value) for value in values]
            await pub.flush()
            _rates(out, "publish_async", len(values), start, cpu)
            assert futures[-1].result() >= 0
            del futures
            start, cpu = time.perf_counter(), time.process_time()
            for value in values:
                await pub.publish_async(value)
            await pub.flush()
            _rates(out, "publish_async_dropped", len(values), start, cpu)
            start, cpu = time.perf_counter(), time.process_time()
            await asyncio.gather(*(pub.publish_many(values[i : i + BULK]) for i in range(0, len(values), BULK)))
            _rates(out, "publish_many", len(values), start, cpu)
            async with AsyncSubscriber(other, name, initial_offset_scheme="latest") as sub:
                samples = []
                for i in range(settings.round_trips + WARM_UP_ROUND_TRIPS):
                    payload = i.to_bytes(8, "big") * 12
                    start = time.perf_counter()
                    await pub.publish_async(payload)
                    while not await sub.poll(5000):
                        pass
                    if i >= WARM_UP_ROUND_TRIPS:
                        samples.append(time.perf_counter() - start)
        latency = percentiles(samples)
        out["p50_ms"], out["p99_ms"] = latency["p50_ms"], latency["p99_ms"]
        out["rr_p50_ms"], out["rr_p99_ms"] = await _async_request_reply(grid_settings, f"{name}-rr", settings)
    finally:
        delete_stream(grid, name)
        delete_stream(grid, f"{name}-rr")
    return out


async def _async_request_reply(
    grid_settings: GridSettings, name: str, settings: AioBenchOptions
) -> tuple[float, float]:
    """p50 / p99 of ``AsyncRequester.request`` with one request in flight, answered by an ``AsyncResponder`` on
    another ``AsyncGrid`` of the same loop."""
    async with (
        await AsyncGrid.start(grid_settings) as one,
        await AsyncGrid.start(grid_settings) as other,
        AsyncResponder(one, StreamConfig(name), _echo),
        AsyncRequester(other, name, timeout_ms=10_000) as requester,
    ):
        samples = []
        for i in range(settings.round_trips + WARM_UP_ROUND_TRIPS):
            payload = i.to_bytes(8, "big") * 12
            start = time.perf_counter()
            await requester.request(payload)
            if i >= WARM_UP_ROUND_TRIPS:
                samples.append(time.perf_counter() - start)
    latency = percentiles(samples)
    return latency["p50_ms"], latency["p99_ms"]


def render(figures: dict[str, Any]) -> str:
    """The figures of ``run`` as the table ``meteor bench aio`` prints."""
    ceiling = figures["ceiling"]
    threaded, asyncio_side = figures["threaded"], figures["asyncio"]
    raw_add, raw_async_add = ceiling["raw_add_all_records_s"], ceiling["raw_async_add_all_records_s"]
    raw_rt, raw_async_rt = ceiling["raw_round_trip"], ceiling["raw_async_round_trip"]
    rows = [
        ("ceiling: raw add_all, threaded client", f"{raw_add:,.0f} rec/s", "", ""),
        ("ceiling: raw add_all, asyncio client", f"{raw_async_add:,.0f} rec/s", "", ""),
        ("ceiling: raw add + read p50 / p99, threaded", f"{raw_rt['p50_ms']:.2f} / {raw_rt['p99_ms']:.2f} ms", "", ""),
        (
            "ceiling: raw add + read p50 / p99, asyncio",
            f"{raw_async_rt['p50_ms']:.2f} / {raw_async_rt['p99_ms']:.2f} ms",
            "",
            "",
        ),
    ]
    for label, side, add, rt in (
        ("threaded", threaded, raw_add, raw_rt),
        ("asyncio", asyncio_side, raw_async_add, raw_async_rt),
    ):
        rows += [
            (
                f"{label}: publish_async, one record a call",
                f"{side['publish_async_records_s']:,.0f} rec/s{_cpu(side, 'publish_async')}",
                f"{side['publish_async_records_s'] / add:.2f}",
                f"{side['publish_async_records_s'] / threaded['publish_async_records_s']:.2f}",
            ),
            *_dropped_row(label, side, add, threaded),
            (
                f"{label}: publish_many, {BULK:,} records a call",
                f"{side['publish_many_records_s']:,.0f} rec/s{_cpu(side, 'publish_many')}",
                f"{side['publish_many_records_s'] / add:.2f}",
                f"{side['publish_many_records_s'] / threaded['publish_many_records_s']:.2f}",
            ),
            (
                f"{label}: publish_async / publish_many",
                f"{side['publish_async_records_s'] / side['publish_many_records_s']:.2f} in rec/s" + _cpu_ratio(side),
                "",
                "",
            ),
            (
                f"{label}: publish -> other client receives, p50 / p99",
                f"{side['p50_ms']:.2f} / {side['p99_ms']:.2f} ms",
                f"{side['p50_ms'] / rt['p50_ms']:.1f}x",
                f"{side['p50_ms'] / threaded['p50_ms']:.2f}",
            ),
            (
                f"{label}: request -> reply, one in flight, p50 / p99",
                f"{side['rr_p50_ms']:.2f} / {side['rr_p99_ms']:.2f} ms",
                f"{side['rr_p50_ms'] / rt['p50_ms']:.1f}x",
                f"{side['rr_p50_ms'] / threaded['rr_p50_ms']:.2f}",
            ),
        ]
    rows += _shared_rows(figures.get("shared"))
    table = render_table(("scenario (100-byte records)", "result", "vs its ceiling", "vs threaded"), rows)
    note = (
        "ceilings: each client's raw add_all of pre-encoded 1000-record items and raw ring add + read_many round "
        "trip (no meteor logic); 'vs its ceiling' divides by the ceiling of the same client"
    )
    return "\n".join([table, note])


def _dropped_row(
    label: str, side: dict[str, float], add: float, threaded: dict[str, float]
) -> list[tuple[str, str, str, str]]:
    """The row of ``publish_async`` with each future dropped (none in figures from before it was measured)."""
    rate = side.get("publish_async_dropped_records_s")
    if rate is None:
        return []
    return [
        (
            f"{label}: publish_async, futures dropped",
            f"{rate:,.0f} rec/s{_cpu(side, 'publish_async_dropped')}",
            f"{rate / add:.2f}",
            f"{rate / threaded.get('publish_async_dropped_records_s', rate):.2f}",
        )
    ]


def _cpu(side: dict[str, float], name: str) -> str:
    """`` (x.xx us CPU)``: the client process's CPU per record (absent from figures measured before it was)."""
    cpu = side.get(f"{name}_cpu_us")
    return "" if cpu is None else f" ({cpu:.2f} us CPU)"


def _cpu_ratio(side: dict[str, float]) -> str:
    """``, y.yy in CPU per record (z.zz futures dropped)``: publish_many's CPU per record over publish_async's."""
    if "publish_async_cpu_us" not in side:
        return ""
    many = side["publish_many_cpu_us"]
    return (
        f", {many / side['publish_async_cpu_us']:.2f} in CPU per record"
        f" ({many / side['publish_async_dropped_cpu_us']:.2f} futures dropped)"
    )


def _shared_rows(shared: dict[str, dict[str, float]] | None) -> list[tuple[str, str, str, str]]:
    """The shared-group member's rows (none in figures from before they were measured)."""
    if shared is None:
        return []
    return [
        (
            f"{label}: shared group member, poll + ack",
            f"{shared[label]['shared_records_s']:,.0f} rec/s",
            "",
            f"{shared[label]['shared_records_s'] / shared['threaded']['shared_records_s']:.2f}",
        )
        for label in ("threaded", "asyncio")
    ]
