"""The Spark side of ``meteor bench soak``: a long transactional meteor -> meteor streaming query, watched for
growth.

Setup: an embedded grid in its own process, a local SparkSession (or the active one), a source stream fed by a
publisher thread (records of ``RECORD_BYTES`` whose value starts with a unique decimal id), a streaming query with
a short processing-time trigger writing them transactionally to a target stream with a small ring (so its lanes
wrap and committed transactions become removable), a ``read_committed`` subscriber and a shared group reading the
target at the same time.

Every ``every`` micro-batches a sample is taken: the entries of every ``meteor.*`` map of the grid, the items the
two streams' rings hold and the member process's resident memory (``VmRSS``). Flat samples after warm-up are what
bounded state looks like; a map that grows with the batch count is a leak. The rings fill up to their capacity
first (the source's within a few minutes), and the member's memory grows with them until they are full. At the
end: records in, records out through ``read_committed``, lost and duplicated ids, and the shared group's
acknowledged count.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from meteor_spark.bench.jobs.session import bench_member_session
from meteor_spark.config import grid_options
from meteor_spark.consumer.shared_subscriber import SharedSubscriber
from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.grid.client import Grid
from meteor_spark.grid.streams import StreamConfig, open_stream
from meteor_spark.producer.publisher import Publisher
from meteor_spark.tables import render_table

RECORD_BYTES = 100
LANES = 2
ID_DIGITS = 12
#: Records the publisher thread adds per call, and the pause between calls (a steady trickle: most micro-batches
#: find a few new records, as a live query does).
RECORDS_PER_PUBLISH = 5
PUBLISH_PAUSE_S = 0.005
#: Ring items per lane of the source: well above what a micro-batch lags behind (about a minute of the feeder's
#: items), and small enough that the source rings are full within the first minutes, so the member's memory
#: levels off once the rings are full rather than growing with them for the whole run.
SOURCE_CAPACITY = 5_000
#: Service name of maps in ``Grid.distributed_objects``.
MAP_SERVICE = "hz:impl:mapService"
#: How long the readers may take to catch up once the publisher has stopped.
DRAIN_TIMEOUT_S = 120.0


def run(
    batches: int,
    every: int,
    trigger_ms: int,
    sweep_interval_ms: int,
    capacity: int,
    progress: Callable[[str], None] = lambda line: None,
) -> dict[str, Any]:
    """Run the soak; figures: ``samples`` (one per ``every`` batches) and the end counts. ``progress`` receives a
    line per sample as it is taken (a long run shows it is alive)."""
    load_before = os.getloadavg()
    checkpoint = tempfile.mkdtemp(prefix="meteor-bench-soak-")
    with bench_member_session("meteor-bench-soak") as (spark, settings, server), Grid(settings) as grid:
        options = grid_options(settings)
        suffix = uuid.uuid4().hex[:8]
        source, target = f"soak-in-{suffix}", f"soak-out-{suffix}"
        rings = [
            *open_stream(grid, StreamConfig(source, lanes=LANES, capacity=SOURCE_CAPACITY)).ring_names,
            *open_stream(grid, StreamConfig(target, lanes=LANES, capacity=capacity)).ring_names,
        ]
        stop = threading.Event()
        feeder = _Feeder(grid, source, stop)
        committed = _CommittedReader(grid, target, stop)
        shared = _SharedReader(grid, target, f"soak-share-{suffix}", stop)
        threads = [
            threading.Thread(target=t.run, name=f"soak-{t.name}", daemon=True) for t in (committed, shared, feeder)
        ]
        for thread in threads:
            thread.start()
        query = None
        samples: list[dict[str, Any]] = []
        started = time.monotonic()

        def take_sample(done: int) -> dict[str, Any]:
            return _sample(grid, rings, server.pid, done, time.monotonic() - started)

        try:
            query = _start_query(spark, options, source, target, trigger_ms, sweep_interval_ms, checkpoint)
            done = _run_batches(query, batches, every, (feeder, committed, shared), take_sample, samples, progress)
            feeder.stop()
            published = feeder.published
            _wait(lambda: committed.received >= published and shared.acked >= published, DRAIN_TIMEOUT_S)
            done = int(query.lastProgress["batchId"]) + 1
            final = take_sample(done)
            if not samples or samples[-1]["batches"] != done:
                samples.append(final)
                progress(_progress_line(final))
            entry_bytes = entry_sizes(grid)
        finally:
            stop.set()
            if query is not None:
                query.stop()
            for thread in threads:
                thread.join(timeout=30)
            shutil.rmtree(checkpoint, ignore_errors=True)
        settings_used = {
            "batches": batches,
            "every": every,
            "trigger_ms": trigger_ms,
            "sweep_interval_ms": sweep_interval_ms,
            "capacity": capacity,
            "lanes": LANES,
            "load_before": load_before,
            "load_after": os.getloadavg(),
        }
        return _figures(
            samples, done, feeder, committed, shared, entry_bytes, time.monotonic() - started, settings_used
        )


def _figures(
    samples: list[dict[str, Any]],
    done: int,
    feeder: _Feeder,
    committed: _CommittedReader,
    shared: _SharedReader,
    entry_bytes: dict[str, dict[str, float]],
    seconds: float,
    settings_used: dict[str, Any],
) -> dict[str, Any]:
    """The soak's figures: the samples, what went in and came out (lost and duplicated records counted by the
    read_committed reader), the shared group's acks and the maps' entry sizes at the end."""
    lost, duplicated = committed.lost_and_duplicated(feeder.published)
    return {
        "samples": samples,
        "batches": done,
        "records_in": feeder.published,
        "records_out": committed.received,
        "lost": lost,
        "duplicated": duplicated,
        "shared_acked": shared.acked,
        "entry_bytes": entry_bytes,
        "seconds": seconds,
        "settings": settings_used,
    }


def _start_query(
    spark: Any,
    options: dict[str, str],
    source: str,
    target: str,
    trigger_ms: int,
    sweep_interval_ms: int,
    checkpoint: str,
) -> Any:
    """The soak's query: ``source`` copied into ``target`` by the transactional sink, sweeping every
    ``sweep_interval_ms`` (the maps whose sizes the soak watches)."""
    return (
        spark.readStream.format("meteor")
        .options(**options)
        .option("stream", source)
        .option("startingOffsets", "earliest")
        .load()
        .select("key", "value")
        .writeStream.format("meteor")
        .options(**options)
        .option("transactional", "true")
        .option("sweepIntervalMs", str(sweep_interval_ms))
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime=f"{trigger_ms} milliseconds")
        .start(target)
    )


def _run_batches(
    query: Any,
    batches: int,
    every: int,
    workers: tuple[Any, ...],
    take_sample: Callable[[int], dict[str, Any]],
    samples: list[dict[str, Any]],
    progress: Callable[[str], None],
) -> int:
    """Watch the query until it has run ``batches`` micro-batches, appending a sample every ``every`` of them;
    returns the micro-batches done. A stopped query or a failed feeder/reader thread ends the soak at once, with
    how far it got."""
    next_sample = every
    done = 0
    while done < batches:
        if not query.isActive:
            raise RuntimeError(f"the soak query stopped after {done} micro-batches: {query.exception()}")
        for error in (worker.error for worker in workers):
            if error is not None:
                raise RuntimeError(f"a soak thread failed after {done} micro-batches: {error}") from error
        progress_doc = query.lastProgress
        done = int(progress_doc["batchId"]) + 1 if progress_doc else 0
        if done >= next_sample:
            sample = take_sample(done)
            samples.append(sample)
            progress(_progress_line(sample))
            next_sample = (done // every + 1) * every
        time.sleep(0.05)
    return done


def map_sizes(grid: Grid) -> dict[str, int]:
    """Entries of every ``meteor.*`` map in the grid, by name."""
    names = sorted(
        name for service, name in grid.distributed_objects() if service == MAP_SERVICE and name.startswith("meteor.")
    )
    return {name: grid.map(name).size() for name in names}


def entry_sizes(grid: Grid) -> dict[str, dict[str, float]]:
    """Per ``meteor.*`` map: entries, and the mean UTF-8 bytes of a key and of a value (entries are JSON or
    decimal strings; the member stores them with a few bytes of type tag and its own per-entry overhead)."""
    sizes: dict[str, dict[str, float]] = {}
    for name in map_sizes(grid):
        entries = grid.map(name).entries()
        count = len(entries)
        sizes[name] = {
            "entries": count,
            "key_bytes": sum(len(k.encode()) for k in entries) / count if count else 0.0,
            "value_bytes": sum(len(v.encode()) for v in entries.values()) / count if count else 0.0,
        }
    return sizes


def member_rss_kib(pid: int | None) -> int | None:
    """Resident memory of process ``pid`` in KiB (``VmRSS`` of ``/proc/PID/status``); None where unknown."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _sample(grid: Grid, rings: list[str], pid: int | None, batches: int, seconds: float) -> dict[str, Any]:
    return {
        "batches": batches,
        "seconds": seconds,
        "maps": map_sizes(grid),
        "ring_items": sum(grid.ring(name).size() for name in rings),
        "rss_kib": member_rss_kib(pid),
    }


def _progress_line(sample: dict[str, Any]) -> str:
    maps = " ".join(f"{name.removeprefix('meteor.')}={size}" for name, size in sample["maps"].items())
    rss = "?" if sample["rss_kib"] is None else f"{sample['rss_kib'] / 1024:.1f} MiB"
    return (
        f"batches {sample['batches']:,} ({sample['seconds']:.0f} s): member RSS {rss}, ring items "
        f"{sample['ring_items']:,}; {maps}"
    )


def _wait(condition: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)


class _Feeder:
    """Publishes records with consecutive ids until stopped."""

    name = "feeder"

    def __init__(self, grid: Grid, stream: str, stop: threading.Event) -> None:
        self.grid, self.stream, self.stop_all = grid, stream, stop
        self._stop = threading.Event()
        self.published = 0
        self.error: BaseException | None = None

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        try:
            with Publisher(self.grid, self.stream) as publisher:
                while not (self._stop.is_set() or self.stop_all.is_set()):
                    first = self.published
                    publisher.publish_many([_value(first + i) for i in range(RECORDS_PER_PUBLISH)]).result(timeout=30)
                    self.published = first + RECORDS_PER_PUBLISH
                    self._stop.wait(PUBLISH_PAUSE_S)
        except BaseException as exc:  # reported by the main loop
            self.error = exc


def _value(record_id: int) -> bytes:
    return b"%0*d" % (ID_DIGITS, record_id) + b"x" * (RECORD_BYTES - ID_DIGITS)


class _CommittedReader:
    """A ``read_committed`` subscriber counting how often each id arrives (one byte per id, saturating)."""

    name = "read-committed"

    def __init__(self, grid: Grid, stream: str, stop: threading.Event) -> None:
        self.grid, self.stream, self.stop = grid, stream, stop
        self.counts = bytearray()
        self.received = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with Subscriber(
                self.grid, self.stream, isolation="read_committed", initial_offset_scheme="earliest"
            ) as subscriber:
                while not self.stop.is_set():
                    for value in subscriber.poll(100).values():
                        record_id = int(value[:ID_DIGITS])
                        if record_id >= len(self.counts):
                            self.counts.extend(bytes(max(record_id + 1 - len(self.counts), 65536)))
                        self.counts[record_id] = min(255, self.counts[record_id] + 1)
                        self.received += 1
        except BaseException as exc:  # reported by the main loop
            self.error = exc

    def lost_and_duplicated(self, published: int) -> tuple[int, int]:
        counts = self.counts[:published].ljust(published, b"\0")
        lost = counts.count(0)
        duplicated = sum(count - 1 for count in counts if count > 1)
        return lost, duplicated


class _SharedReader:
    """A shared-group member acknowledging every record it is handed."""

    name = "shared"

    def __init__(self, grid: Grid, stream: str, group: str, stop: threading.Event) -> None:
        self.grid, self.stream, self.group, self.stop = grid, stream, group, stop
        self.acked = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with SharedSubscriber(self.grid, self.stream, group=self.group, initial_offset_scheme="earliest") as member:
                while not self.stop.is_set():
                    batch = member.poll(100)
                    if len(batch):
                        member.ack(batch)
                        self.acked += len(batch)
        except BaseException as exc:  # reported by the main loop
            self.error = exc


def render(figures: dict[str, Any]) -> str:
    samples = figures["samples"]
    names = sorted({name for sample in samples for name in sample["maps"]})
    headers = [
        "batches",
        "seconds",
        "member RSS (MiB)",
        "ring items",
        *(name.removeprefix("meteor.") for name in names),
    ]
    rows = [
        [
            f"{s['batches']:,}",
            f"{s['seconds']:.0f}",
            "?" if s["rss_kib"] is None else f"{s['rss_kib'] / 1024:.1f}",
            f"{s['ring_items']:,}",
            *(f"{s['maps'].get(name, 0):,}" for name in names),
        ]
        for s in samples
    ]
    growth = render_table(headers, rows, right=range(len(headers)))
    totals = render_table(
        ["micro-batches", "records in", "records out (read_committed)", "lost", "duplicated", "shared group acked"],
        [
            [
                f"{figures['batches']:,}",
                f"{figures['records_in']:,}",
                f"{figures['records_out']:,}",
                f"{figures['lost']:,}",
                f"{figures['duplicated']:,}",
                f"{figures['shared_acked']:,}",
            ]
        ],
        right=range(6),
    )
    entries = render_table(
        ["map (at the end)", "entries", "mean key bytes", "mean value bytes"],
        [
            [name, f"{e['entries']:,.0f}", f"{e['key_bytes']:.0f}", f"{e['value_bytes']:.0f}"]
            for name, e in figures["entry_bytes"].items()
        ],
        right=(1, 2, 3),
    )
    settings = figures["settings"]
    return (
        f"grid map entries (maps named meteor.*) and the member's resident memory, every {settings['every']:,} "
        f"micro-batches:\n{growth}\n{totals}\n{entries}\n"
        f"transactional meteor -> meteor, trigger {settings['trigger_ms']} ms, {settings['lanes']} lanes, target "
        f"ring {settings['capacity']:,} items per lane (source {SOURCE_CAPACITY:,}), sweepIntervalMs "
        f"{settings['sweep_interval_ms']:,}; "
        f"{figures['seconds']:.0f} s; load {settings['load_before'][0]:.1f} -> {settings['load_after'][0]:.1f}"
    )
