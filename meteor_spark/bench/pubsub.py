"""``meteor bench pubsub``: the core data path on an embedded grid in its own process, 100-byte records.

Scenarios (the targets on a 2-core machine in brackets):

- (a) one publisher's throughput, three ways: ``publish_async`` per record (futures dropped as they come, as
  Meteor's benchmark did, and all kept), ``publish_many`` of lists, ``publish_arrow`` of tables
  [>= 1,000,000 records/s];
- (b) Meteor's headline scenario: 4 publishers (threads of this process) and 16 ungrouped subscribers (receiver
  threads spread over ``--subscriber-processes`` processes, 2 by default: one per core) on one stream; unique
  records/s and deliveries/s (= unique x 16) [>= 4,300,000 deliveries/s]. Run twice: with random values, and with
  the original's payload (one constant all-zero value, which LZ4 shrinks to almost nothing). Receivers count per
  batch (``per_batch=True``): records are never turned into Python objects, as a columnar consumer would do.
- (c) round-trip latency: request/reply over two streams with one message in flight, the responder in a third
  process; p50/p99 [p50 <= 0.4 ms, p99 <= 1.5 ms]. Measured twice: a hand-written loop (publish, then poll the reply
  stream), and ``meteor_spark.consumer.request_reply`` (``Requester.request`` and a ``Responder``: correlation ids, a
  reply stream per requester, the reply handed from the requester's receiver thread to the waiting caller). And one
  hop: ``publish_async`` and a ``Subscriber`` on a second client connection, one record in flight, with this
  process's CPU per round trip, next to the same on the grid client alone (``add_all``, a ``read_many`` parked on the
  other connection, the next one started) [p50 <= 0.3 ms, p99 <= 1 ms].

Ceilings measured in the same run: encoding + LZ4 of the same records in memory (CPU bound, no grid), raw
``add_all`` / ``read_many`` of the same pre-encoded ring items through the client (the grid and the client, no
Meteor logic), and for latency a raw ring add + read round trip in one process and a raw request/reply: the same
three processes and two rings as (c), the responder's ``read_many`` parked on the request ring, with the grid
client alone (no encoding, no Meteor logic): the floor (c) stands on. Payloads are random bytes from a pool, so LZ4
cannot cheat, except in the second run of (b), which reproduces Meteor's all-zero payload.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from meteor_spark.bench import check_at_least_one, given
from meteor_spark.bench.harness import bench_grid
from meteor_spark.bench.one_hop import hop_rows, one_hop
from meteor_spark.consumer.request_reply import Requester, Responder
from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.errors import ConfigError
from meteor_spark.format.item_encoding import encode_columns
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.streams import StreamConfig
from meteor_spark.groups.admin import delete_stream
from meteor_spark.producer.publisher import Publisher
from meteor_spark.tables import render_table

RECORD_BYTES = 100
SUBSCRIBERS = 16
PUBLISHERS = 4


@dataclass(frozen=True)
class PubSubBenchOptions:
    """Sizes of one run (``--quick`` shrinks everything to seconds). ``publish_async`` publishes 200,000 records
    in both: its figure includes the ``flush`` of the calls still queued when the loop ends (1-4 ms of encoding and
    round trips), which over 20,000 records (10 ms of loop) was a third of the run; over 200,000, as many as
    ``--quick``'s ``publish_many`` publishes, it is a few per cent."""

    async_records: int
    bulk_records: int
    fanout_records: int
    round_trips: int
    record_bytes: int
    subscriber_processes: int

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> PubSubBenchOptions:
        quick = bool(getattr(args, "quick", False))
        settings = cls(
            async_records=given(args.async_records, 200_000),
            bulk_records=given(args.bulk_records, 200_000 if quick else 2_000_000),
            fanout_records=given(args.fanout_records, 100_000 if quick else 1_000_000),
            round_trips=given(args.round_trips, 200 if quick else 2000),
            record_bytes=args.record_bytes,
            subscriber_processes=args.subscriber_processes,
        )
        check_at_least_one(
            settings,
            ("async_records", "bulk_records", "fanout_records", "round_trips", "record_bytes", "subscriber_processes"),
        )
        if settings.subscriber_processes > SUBSCRIBERS:
            raise ConfigError(f"--subscriber-processes must be <= {SUBSCRIBERS} (one subscriber per process at least)")
        return settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="small sizes (seconds instead of a minute)")
    parser.add_argument("--async-records", type=int, default=None, help="records for publish_async (default 200k)")
    parser.add_argument("--bulk-records", type=int, default=None, help="records for the bulk publishes (default 2M)")
    parser.add_argument("--fanout-records", type=int, default=None, help="unique records in scenario (b) (default 1M)")
    parser.add_argument("--round-trips", type=int, default=None, help="request/reply round trips (default 2000)")
    parser.add_argument("--record-bytes", type=int, default=RECORD_BYTES, help="value size (default 100)")
    parser.add_argument(
        "--subscriber-processes",
        type=int,
        default=2,
        help="processes the 16 subscribers of scenario (b) are spread over (default 2, one per core)",
    )


def payloads(size: int, count: int = 4096) -> list[bytes]:
    return [os.urandom(size) for _ in range(count)]


def values_of(pool: list[bytes], n: int) -> list[bytes]:
    return (pool * (n // len(pool) + 1))[:n]


def run(args: argparse.Namespace) -> dict[str, Any]:
    settings = PubSubBenchOptions.from_args(args)
    figures: dict[str, Any] = {"settings": settings.__dict__}
    with bench_grid() as (grid, grid_settings):
        pool = payloads(settings.record_bytes)
        figures["ceiling"] = ceilings(grid, pool, settings.bulk_records)
        figures["one_publisher"] = _one_publisher(grid, pool, settings)
        figures["fanout"] = _fanout(grid, grid_settings, pool, settings)
        figures["fanout_constant"] = _fanout(grid, grid_settings, [bytes(settings.record_bytes)], settings)
        figures["latency"] = _latency(grid, grid_settings, settings)
    return figures


# ------------------------------------------------------------------------------------------------ ceilings


def ceilings(grid: Grid, pool: list[bytes], records: int) -> dict[str, float]:
    """Throughput ceilings of ``records`` values from ``pool``: encoding + LZ4 in memory, raw ``add_all`` of the
    pre-encoded items (1000 records each, 64 items a call) and raw ``read_many`` of them (``meteor bench aio`` too)."""
    values = values_of(pool, records)
    per_item = 1000
    start = time.perf_counter()
    items = [
        encode_columns(values[i : i + per_item], timestamps=0, producer_id=1, producer_seq=i)
        for i in range(0, len(values), per_item)
    ]
    encode_rate = len(values) / (time.perf_counter() - start)
    name = f"bench.ceiling.{os.getpid()}.{time.time_ns()}"
    ring = grid.ring(name)
    calls = [items[i : i + 64] for i in range(0, len(items), 64)]
    start = time.perf_counter()
    for call in calls:
        ring.add_all(call)
    add_rate = len(values) / (time.perf_counter() - start)
    start = time.perf_counter()
    seq = ring.head()
    read = 0
    while read < len(items):
        batch = ring.read_many(seq, 1, 64)
        read += len(batch.items)
        seq = batch.sequences[-1] + 1
    read_rate = len(values) / (time.perf_counter() - start)
    ring.destroy()
    return {
        "encode_lz4_records_s": encode_rate,
        "raw_add_all_records_s": add_rate,
        "raw_read_many_records_s": read_rate,
    }


# ------------------------------------------------------------------------------------------------ (a)


def _one_publisher(grid: Grid, pool: list[bytes], settings: PubSubBenchOptions) -> dict[str, float]:
    name = f"bench-pub-{os.getpid()}-{time.time_ns()}"
    config = StreamConfig(name, capacity=100_000)
    out: dict[str, float] = {}
    try:
        with Publisher(grid, config, max_buffered_records=1_000_000) as pub:
            values = values_of(pool, settings.async_records)
            publish = pub.publish_async
            # Fire and forget, as Meteor's benchmark did (publishAsync(record, nop)): each future is dropped.
            start = time.perf_counter()
            for value in values:
                last = publish(value)
            pub.flush()
            out["publish_async_records_s"] = len(values) / (time.perf_counter() - start)
            assert last.result() >= 0
            # Every future kept until the end: the garbage collector then walks them all, again and again.
            start = time.perf_counter()
            futures = [publish(value) for value in values]
            pub.flush()
            out["publish_async_kept_records_s"] = len(values) / (time.perf_counter() - start)
            assert futures[-1].result() >= 0
            del futures
            values = values_of(pool, settings.bulk_records)
            chunk = 10_000
            start = time.perf_counter()
            for i in range(0, len(values), chunk):
                pub.publish_many(values[i : i + chunk])
            pub.flush()
            out["publish_many_records_s"] = len(values) / (time.perf_counter() - start)
            table = pa.table({"value": pa.array(values_of(pool, 100_000), pa.binary())})
            rounds = max(1, settings.bulk_records // table.num_rows)
            start = time.perf_counter()
            for _ in range(rounds):
                pub.publish_arrow(table)
            pub.flush()
            out["publish_arrow_records_s"] = rounds * table.num_rows / (time.perf_counter() - start)
    finally:
        delete_stream(grid, name)
    return out


# ------------------------------------------------------------------------------------------------ (b)


def _fanout_subscribers(
    members: str, cluster: str, stream: str, count: int, expected: int, ready: Any, results: Any
) -> None:
    """Child process: ``count`` ungrouped subscribers (receivers counting batch sizes) until each saw every record."""
    grid = Grid(GridSettings(members=(members,), cluster_name=cluster))
    counts = [0] * count
    done = threading.Event()
    finished = [0.0] * count

    def counter(i: int) -> Any:
        def on_batch(batch: Any) -> None:
            counts[i] += len(batch)
            if counts[i] >= expected and not finished[i]:
                finished[i] = time.monotonic()
                if all(finished):
                    done.set()

        return on_batch

    subs = [Subscriber(grid, stream, initial_offset_scheme="earliest", max_poll_records=200_000) for _ in range(count)]
    for i, sub in enumerate(subs):
        sub.attach_receiver(counter(i), poll_timeout_ms=100, per_batch=True)
    ready.set()
    completed = done.wait(600)
    results.put({"finished": max(finished) if completed else None, "counts": counts})
    for sub in subs:
        sub.close()
    grid.close()


def _fanout(
    grid: Grid, grid_settings: GridSettings, pool: list[bytes], settings: PubSubBenchOptions
) -> dict[str, float]:
    name = f"bench-fanout-{os.getpid()}-{time.time_ns()}"
    per_publisher = settings.fanout_records // PUBLISHERS
    total = per_publisher * PUBLISHERS
    # Room for everything: the run measures throughput, not overwrite (Meteor throttled publishers instead).
    config = StreamConfig(name, capacity=max(1000, 2 * total // 1000 + 100))
    Publisher(grid, config).close()
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    # The subscribers spread over processes (one per core by default): one process's GIL caps decoding.
    processes = settings.subscriber_processes
    children = []
    for i in range(processes):
        count = SUBSCRIBERS // processes + (1 if i < SUBSCRIBERS % processes else 0)
        ready = context.Event()
        child = context.Process(
            target=_fanout_subscribers,
            args=(grid_settings.members[0], grid_settings.cluster_name, name, count, total, ready, results),
            daemon=True,
        )
        child.start()
        children.append((child, ready))
    try:
        for _, ready in children:
            if not ready.wait(120):
                raise RuntimeError("a subscriber process did not start within 120 s")
        publishers = [Publisher(grid, name, max_buffered_records=200_000) for _ in range(PUBLISHERS)]
        values = values_of(pool, per_publisher)

        def publish(pub: Publisher) -> None:
            for i in range(0, len(values), 10_000):
                pub.publish_many(values[i : i + 10_000])
            pub.flush()

        threads = [threading.Thread(target=publish, args=(p,)) for p in publishers]
        start = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        published = time.monotonic()
        outcomes = [results.get(timeout=600) for _ in children]
        for pub in publishers:
            pub.close()
        if any(outcome["finished"] is None for outcome in outcomes):
            raise RuntimeError(f"subscribers did not receive everything: {[o['counts'] for o in outcomes]}")
        elapsed = max(outcome["finished"] for outcome in outcomes) - start
        return {
            "unique_records_s": total / elapsed,
            "deliveries_s": total * SUBSCRIBERS / elapsed,
            "publish_records_s": total / (published - start),
            "seconds": elapsed,
        }
    finally:
        for child, _ in children:
            child.join(30)
            if child.is_alive():
                child.kill()
        delete_stream(grid, name)


# ------------------------------------------------------------------------------------------------ (c)


def _responder(members: str, cluster: str, requests: str, replies: str, ready: Any, stop: Any) -> None:
    """Child process: answer every request with a reply carrying the same bytes."""
    grid = Grid(GridSettings(members=(members,), cluster_name=cluster))
    pub = Publisher(grid, replies)
    sub = Subscriber(grid, requests)
    ready.set()
    while not stop.is_set():
        for record in sub.poll(100):
            pub.publish_async(record.value)
    sub.close()
    pub.close()
    grid.close()


def _raw_responder(members: str, cluster: str, requests: str, replies: str, ready: Any, stop: Any) -> None:
    """Child process: the raw request/reply ceiling's responder, on the grid client alone: a ``read_many`` parked
    on the request ring, each item added to the reply ring as it is."""
    grid = Grid(GridSettings(members=(members,), cluster_name=cluster))
    request_ring, reply_ring = grid.ring(requests), grid.ring(replies)
    sequence = 0
    ready.set()
    while not stop.is_set():
        batch = request_ring.read_many(sequence, 1, 10)
        for item in batch.items:
            reply_ring.add_async(item)
        sequence = batch.next_sequence
    grid.close()


def _helper_responder(members: str, cluster: str, requests: str, ready: Any, stop: Any) -> None:
    """Child process: the same, with ``request_reply.Responder`` (replies go to each request's reply stream)."""
    grid = Grid(GridSettings(members=(members,), cluster_name=cluster))
    responder = Responder(grid, requests, lambda request: request.value)
    ready.set()
    stop.wait()
    responder.close()
    grid.close()


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_ms": ordered[len(ordered) // 2] * 1000,
        "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000,
        "mean_ms": statistics.fmean(ordered) * 1000,
    }


#: Round trips run before the measured ones (connections, code paths and the responder warmed up).
WARM_UP_ROUND_TRIPS = 20


def round_trips(count: int, round_trip: Callable[[bytes], object]) -> dict[str, float]:
    """Percentiles of ``count`` calls of ``round_trip(payload)`` (one request answered), after the warm-up ones."""
    samples = []
    for i in range(count + WARM_UP_ROUND_TRIPS):
        payload = i.to_bytes(8, "big") * 12
        start = time.perf_counter()
        round_trip(payload)
        if i >= WARM_UP_ROUND_TRIPS:
            samples.append(time.perf_counter() - start)
    return percentiles(samples)


@contextmanager
def _responder_process(
    target: Callable[..., None], grid_settings: GridSettings, *args: str, wake: Callable[[], object] | None = None
) -> Iterator[None]:
    """Run ``target(members, cluster, *args, ready, stop)`` in a third process while the block runs; ``wake``
    (after ``stop`` is set) unblocks a responder parked in a read so it sees the stop."""
    context = multiprocessing.get_context("spawn")
    ready, stop = context.Event(), context.Event()
    child = context.Process(
        target=target, args=(grid_settings.members[0], grid_settings.cluster_name, *args, ready, stop), daemon=True
    )
    child.start()
    try:
        if not ready.wait(120):
            raise RuntimeError("the responder process did not start within 120 s")
        yield
    finally:
        stop.set()
        if wake is not None:
            wake()
        child.join(30)
        if child.is_alive():
            child.kill()


def _latency(grid: Grid, grid_settings: GridSettings, settings: PubSubBenchOptions) -> dict[str, Any]:
    base = f"bench-rtt-{os.getpid()}-{time.time_ns()}"
    requests, replies = StreamConfig(base + "-req"), StreamConfig(base + "-rep")
    Publisher(grid, requests).close()
    Publisher(grid, replies).close()
    out: dict[str, Any] = {}
    try:
        with (
            _responder_process(_responder, grid_settings, requests.name, replies.name),
            Publisher(grid, requests.name) as pub,
            Subscriber(grid, replies.name) as sub,
        ):

            def meteor_round_trip(payload: bytes) -> None:
                pub.publish_async(payload)
                while not sub.poll(5000):
                    pass

            out["meteor"] = round_trips(settings.round_trips, meteor_round_trip)
    finally:
        delete_stream(grid, requests.name)
        delete_stream(grid, replies.name)
    out["helper"] = _helper_latency(grid, grid_settings, settings, base + "-helper")
    out["one_hop"], out["parked"] = one_hop(grid, base + "-hop", lambda hop: _with_cpu(settings.round_trips, hop))
    ring = grid.ring(base + "-raw")
    out["raw_add_read"] = round_trips(settings.round_trips, lambda payload: ring.read_many(ring.add(payload), 1, 1))
    ring.destroy()
    out["raw_request_reply"] = _raw_request_reply(grid, grid_settings, settings, base + "-raw")
    return out


def _with_cpu(count: int, round_trip: Callable[[bytes], object]) -> dict[str, float]:
    """``round_trips`` and this process's CPU per round trip (user + system of all its threads, warm-up ones
    included). ``process_time`` reads the kernel's nanosecond clock; ``os.times`` counts 10 ms ticks, which a short
    run (a few dozen round trips of ~0.1 ms CPU) can end without crossing."""
    before = time.process_time()
    figures = round_trips(count, round_trip)
    cpu = time.process_time() - before
    return {**figures, "cpu_us": cpu * 1e6 / (count + WARM_UP_ROUND_TRIPS)}


def _raw_request_reply(
    grid: Grid, grid_settings: GridSettings, settings: PubSubBenchOptions, base: str
) -> dict[str, float]:
    """Round trips of (c) on the grid client alone: add a request, wait on a ``read_many`` parked on the reply
    ring; ``_raw_responder`` in a third process answers."""
    requests, replies = grid.ring(base + "-req"), grid.ring(base + "-rep")
    next_reply = 0

    def raw_round_trip(payload: bytes) -> None:
        nonlocal next_reply
        requests.add_async(payload)
        next_reply = replies.read_many(next_reply, 1, 10).next_sequence

    try:
        # The stop request wakes the responder's parked read so it sees the stop.
        with _responder_process(
            _raw_responder, grid_settings, requests.name, replies.name, wake=lambda: requests.add(b"stop")
        ):
            return round_trips(settings.round_trips, raw_round_trip)
    finally:
        requests.destroy()
        replies.destroy()


def _helper_latency(
    grid: Grid, grid_settings: GridSettings, settings: PubSubBenchOptions, requests: str
) -> dict[str, float]:
    """Round trips through ``Requester.request`` and a ``Responder`` in a third process."""
    Publisher(grid, StreamConfig(requests)).close()
    try:
        with (
            _responder_process(_helper_responder, grid_settings, requests),
            Requester(grid, requests, timeout_ms=5000) as requester,
        ):
            return round_trips(settings.round_trips, requester.request)
    finally:
        delete_stream(grid, requests)


# ------------------------------------------------------------------------------------------------ output


def render(figures: dict[str, Any]) -> str:
    """The figures of ``run`` as the table ``meteor bench pubsub`` prints."""
    rows = [*_throughput_rows(figures), *_latency_rows(figures["latency"])]
    table = render_table(("scenario (100-byte records)", "result", "ratio", "target"), rows)
    notes = [
        "ratios: (a) against raw add_all of pre-encoded items; (b) deliveries against one raw reader's read_many "
        "rate; (c) against the raw request/reply (the same three processes and rings, the grid client alone)",
        "(b) 'random': incompressible values (LZ4 cannot help; every delivery moves 100 bytes); 'Meteor's constant "
        "payload': one all-zero 100-byte value, as the original benchmark used (LZ4 shrinks the items ~250x)",
    ]
    return "\n".join([table, *notes])


def _throughput_rows(figures: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """The ceilings and scenarios (a) and (b): records/s, each scenario as a ratio of its ceiling."""
    ceiling = figures["ceiling"]
    one = figures["one_publisher"]
    fan = figures["fanout"]
    constant = figures["fanout_constant"]
    raw_add = ceiling["raw_add_all_records_s"]
    return [
        ("ceiling: encode + LZ4 in memory", f"{ceiling['encode_lz4_records_s']:,.0f} rec/s", "", ""),
        ("ceiling: raw add_all (1000 rec/item)", f"{raw_add:,.0f} rec/s", "", ""),
        ("ceiling: raw read_many", f"{ceiling['raw_read_many_records_s']:,.0f} rec/s", "", ""),
        (
            "(a) publish_async, one record a call",
            f"{one['publish_async_records_s']:,.0f} rec/s",
            f"{one['publish_async_records_s'] / raw_add:.2f}",
            ">= 1,000,000",
        ),
        (
            "(a) same, all futures kept",
            f"{one['publish_async_kept_records_s']:,.0f} rec/s",
            f"{one['publish_async_kept_records_s'] / raw_add:.2f}",
            ">= 1,000,000",
        ),
        (
            "(a) publish_many, 10k records a call",
            f"{one['publish_many_records_s']:,.0f} rec/s",
            f"{one['publish_many_records_s'] / raw_add:.2f}",
            ">= 1,000,000",
        ),
        (
            "(a) publish_arrow, 100k rows a call",
            f"{one['publish_arrow_records_s']:,.0f} rec/s",
            f"{one['publish_arrow_records_s'] / raw_add:.2f}",
            ">= 1,000,000",
        ),
        ("(b) 4 pub x 16 sub, random: unique", f"{fan['unique_records_s']:,.0f} rec/s", "", ""),
        (
            "(b) 4 pub x 16 sub, random: deliveries",
            f"{fan['deliveries_s']:,.0f} rec/s",
            f"{fan['deliveries_s'] / ceiling['raw_read_many_records_s']:.2f}",
            ">= 4,300,000",
        ),
        (
            "(b) same, Meteor's constant payload",
            f"{constant['deliveries_s']:,.0f} rec/s",
            f"{constant['deliveries_s'] / ceiling['raw_read_many_records_s']:.2f}",
            ">= 4,300,000",
        ),
    ]


def _latency_rows(lat: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """Scenario (c), request/reply p50 / p99, as a ratio of the raw request/reply, and the latency ceilings."""
    raw_rr = lat["raw_request_reply"]
    return [
        (
            "(c) request/reply p50 / p99",
            f"{lat['meteor']['p50_ms']:.2f} / {lat['meteor']['p99_ms']:.2f} ms",
            f"{lat['meteor']['p50_ms'] / raw_rr['p50_ms']:.1f}x",
            "<= 0.4 / <= 1.5 ms",
        ),
        (
            "(c) same with Requester / Responder",
            f"{lat['helper']['p50_ms']:.2f} / {lat['helper']['p99_ms']:.2f} ms",
            f"{lat['helper']['p50_ms'] / raw_rr['p50_ms']:.1f}x",
            "<= 0.4 / <= 1.5 ms",
        ),
        ("ceiling: raw request/reply p50 / p99", f"{raw_rr['p50_ms']:.2f} / {raw_rr['p99_ms']:.2f} ms", "", ""),
        *(hop_rows(lat) if "one_hop" in lat else []),
        (
            "ceiling: raw add + read p50 / p99",
            f"{lat['raw_add_read']['p50_ms']:.2f} / {lat['raw_add_read']['p99_ms']:.2f} ms",
            "",
            "",
        ),
    ]
