"""``meteor demo``: meteor-spark doing its real job on this machine, start to finish, in about half a minute.

1. An embedded grid starts in its own process (a Hazelcast-compatible member; no Java Hazelcast install).
2. A stream ``orders`` with several lanes is created, and a background thread publishes shop orders as JSON,
   keyed by customer (so one customer's orders stay in order on one lane) with event times covering a few minutes
   of "shop time".
3. A Spark Structured Streaming query reads ``orders`` as the subscriber group ``dashboard`` (the query holds the
   group's lane leases and confirms offsets after each committed micro-batch), parses the JSON, counts orders and
   sums revenue per category over one-minute event-time windows with a watermark, and writes one JSON result per
   closed window into the stream ``order-stats``.
4. Live progress shows records/s and the group's lag per lane; the summary checks every window Spark wrote against
   the publisher's own tally, and that the group confirmed every lane to its end.

Append mode emits a window once the watermark has passed it, so after the last order the publisher sends one
``clock`` event an hour of shop time later; the query ignores it except for moving the watermark, which closes the
last windows.

Pyspark is imported inside functions only: importing this module stays cheap and Spark-free.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from meteor_spark.config import CONF_DIR, grid_options, spark_conf
from meteor_spark.consumer.subscriber import InitialOffsetScheme, Subscriber
from meteor_spark.errors import ConfigError, MeteorError
from meteor_spark.format.offsets import make_offset
from meteor_spark.format.records import Record
from meteor_spark.grid.client import Grid
from meteor_spark.grid.streams import StreamConfig, lane_bounds, open_stream
from meteor_spark.groups.admin import group_state, lag_report
from meteor_spark.producer.publisher import Publisher
from meteor_spark.server import EmbeddedGrid
from meteor_spark.tables import render_table

logger = logging.getLogger(__name__)

ORDERS = "orders"
RESULTS = "order-stats"
GROUP = "dashboard"
WINDOW_MS = 60_000
WATERMARK = "2 minutes"
#: Orders arrive up to this much out of event-time order; well inside the watermark, so none is dropped as late.
MAX_JITTER_MS = 20_000
#: The clock event's distance past the last order: far beyond the watermark, so every window closes.
CLOCK_ADVANCE_MS = 60 * 60_000

CATEGORIES: dict[str, tuple[tuple[str, float], ...]] = {
    "books": (("paperback", 12.99), ("hardcover", 27.5), ("e-reader case", 19.0)),
    "electronics": (("headphones", 89.0), ("usb-c cable", 9.49), ("keyboard", 59.9)),
    "garden": (("seeds", 3.25), ("hose", 24.0), ("gloves", 11.5)),
    "grocery": (("coffee", 8.75), ("olive oil", 14.2), ("chocolate", 2.99)),
    "toys": (("puzzle", 17.0), ("kite", 22.5), ("blocks", 34.99)),
}


@dataclass(frozen=True)
class DemoOptions:
    """How big the demo is.

    Attributes:
        records: orders to publish.
        lanes: lanes of the ``orders`` stream.
        seconds: wall-clock seconds the publishing is spread over.
        shop_minutes: minutes of shop (event) time the orders cover; one window per minute and category.
        timeout_s: longest wait for complete results after the last order was published.
        live: print a progress line every second.
        seed: seed of the order generator (the same seed gives the same orders).
        trigger: the query's processing-time trigger.
    """

    records: int = 20_000
    lanes: int = 4
    seconds: float = 20.0
    shop_minutes: int = 10
    timeout_s: float = 120.0
    live: bool = True
    seed: int = 7
    trigger: str = "1 second"

    def __post_init__(self) -> None:
        if self.records < 1:
            raise ConfigError(f"--records must be at least 1, got {self.records}")
        if not 1 <= self.lanes <= 64:
            raise ConfigError(f"--lanes must be between 1 and 64, got {self.lanes}")
        if self.seconds <= 0:
            raise ConfigError(f"--seconds must be > 0, got {self.seconds:g}")
        if self.shop_minutes < 1:
            raise ConfigError(f"--minutes must be at least 1, got {self.shop_minutes}")
        if self.timeout_s <= 0:
            raise ConfigError(f"--timeout must be > 0 seconds, got {self.timeout_s:g}")


DEFAULTS = DemoOptions()


@dataclass(frozen=True)
class WindowResult:
    """Orders and revenue of one category in one one-minute window."""

    window_start_ms: int
    category: str
    orders: int
    revenue: float


@dataclass
class Tally:
    """What the publisher published, per (window start, category): the truth Spark's results are checked against."""

    windows: dict[tuple[int, str], list[float]] = field(default_factory=dict)
    orders: int = 0

    def add(self, event_ms: int, category: str, amount: float) -> None:
        cell = self.windows.setdefault((event_ms - event_ms % WINDOW_MS, category), [0, 0.0])
        cell[0] += 1
        cell[1] += amount
        self.orders += 1


class OrderGenerator:
    """Deterministic, realistic-looking orders: JSON values, customer keys, event times in shop time."""

    def __init__(self, options: DemoOptions, shop_start_ms: int) -> None:
        self.options = options
        self.shop_start_ms = shop_start_ms
        self.span_ms = options.shop_minutes * WINDOW_MS
        self.random = random.Random(options.seed)
        self.tally = Tally()

    def order(self, number: int) -> Record:
        rnd = self.random
        nominal = self.shop_start_ms + number * self.span_ms // self.options.records
        jitter = rnd.randint(-MAX_JITTER_MS, MAX_JITTER_MS)
        event_ms = min(max(nominal + jitter, self.shop_start_ms), self.shop_start_ms + self.span_ms - 1)
        category = rnd.choice(tuple(CATEGORIES))
        product, price = rnd.choice(CATEGORIES[category])
        quantity = rnd.choices((1, 2, 3, 4), weights=(60, 25, 10, 5))[0]
        customer = f"c-{rnd.randint(1, 500):04d}"
        document = {
            "type": "order",
            "order_id": f"o-{number + 1:07d}",
            "customer": customer,
            "category": category,
            "product": product,
            "quantity": quantity,
            "price": price,
            "event_time": iso_ms(event_ms),
        }
        self.tally.add(event_ms, category, price * quantity)
        return Record(value=json.dumps(document).encode(), key=customer.encode(), timestamp_ms=event_ms)

    def clock(self) -> Record:
        event_ms = self.shop_start_ms + self.span_ms + CLOCK_ADVANCE_MS
        document = {"type": "clock", "event_time": iso_ms(event_ms)}
        return Record(value=json.dumps(document).encode(), key=b"clock", timestamp_ms=event_ms)


def iso_ms(epoch_ms: int) -> str:
    return datetime.fromtimestamp(epoch_ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


@dataclass
class PublishState:
    """Progress of the background publisher (written by its thread, read by the monitor)."""

    published: int = 0
    done: bool = False
    error: BaseException | None = None
    started: float = field(default_factory=time.monotonic)
    finished: float | None = None


def publish_orders(grid: Grid, generator: OrderGenerator, state: PublishState, stop: threading.Event) -> None:
    """Publish every order at an even pace over ``options.seconds``, then the clock event. Runs in a thread."""
    options = generator.options
    chunk = max(1, options.records // max(1, int(options.seconds * 20)))  # ~20 chunks a second
    try:
        with Publisher(grid, ORDERS) as publisher:
            pending = []
            for first in range(0, options.records, chunk):
                if stop.is_set():
                    return
                batch = [generator.order(n) for n in range(first, min(first + chunk, options.records))]
                pending.append(publisher.publish_many(batch))
                state.published += len(batch)
                due = state.started + options.seconds * state.published / options.records
                stop.wait(max(0.0, due - time.monotonic()))
            pending.append(publisher.publish_many([generator.clock()]))
            publisher.flush()
            for future in pending:
                future.result()  # a record the grid refused must fail the demo, not vanish
    except BaseException as exc:  # reported by the monitor; the thread must not die silently
        state.error = exc
    finally:
        state.finished = time.monotonic()
        state.done = True


@dataclass(frozen=True)
class DemoSummary:
    """What the demo did and whether everything checked out.

    Attributes:
        published: orders published (the clock event not included).
        read: rows the query read from ``orders`` (orders + the clock event when complete).
        batches: micro-batches that read rows.
        windows_expected: (window, category) cells the publisher's tally has.
        windows_out: results the query wrote into ``order-stats``.
        mismatches: cells whose count or revenue differs from the tally, or that are missing.
        confirmed: lane -> the group's confirmed offset at the end.
        lane_ends: lane -> the offset after the last record of the lane.
        elapsed_s: wall time of the whole demo.
        ok: every order read, every window written and right, every lane confirmed to its end.
        last_window: the results of the last window as Spark wrote them, highest revenue first.
    """

    published: int
    read: int
    batches: int
    windows_expected: int
    windows_out: int
    mismatches: tuple[str, ...]
    confirmed: dict[int, int | None]
    lane_ends: dict[int, int]
    elapsed_s: float
    ok: bool
    last_window: tuple[WindowResult, ...] = ()


class _Printer:
    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    def __call__(self, text: str = "") -> None:
        self.stream.write(text + "\n")
        self.stream.flush()


def run(options: DemoOptions = DEFAULTS, *, stream: IO[str] | None = None) -> DemoSummary:
    """Run the demo, printing what happens in plain words to ``stream`` (stdout), and return the checked figures
    (``render_summary`` turns them into the closing table). Stops everything it started, also on Ctrl-C / SIGTERM."""
    say = _Printer(stream or sys.stdout)
    started = time.monotonic()
    stop = threading.Event()
    with _Interrupts() as interrupts, _Cleanup() as cleanup:
        import meteor_spark.spark  # noqa: F401  (before starting anything: names the extra when pyspark is missing)

        say("meteor demo: shop orders -> meteor stream -> Spark (event-time windows) -> meteor stream")
        say()
        server = EmbeddedGrid(port=0, process=True)
        server.start()
        cleanup.push("embedded grid", server.stop)
        say(f"[grid]    embedded grid member running in its own process at {server.address} (cluster 'dev')")
        interrupts.check()
        grid = Grid.connect(server.address, cluster_name=server.cluster_name)
        cleanup.push("grid client", grid.close)

        orders_info = open_stream(grid, _stream_config(ORDERS, options.lanes), create=True)
        open_stream(grid, _stream_config(RESULTS, 1), create=True)
        say(
            f"[streams] created {ORDERS!r} with {options.lanes} lanes (ring buffers; a customer's orders share a lane) "
            f"and {RESULTS!r} for the results"
        )

        say("[spark]   starting Spark (local[2]); the first start takes a few seconds ...")
        spark = local_spark_session("meteor-demo")
        cleanup.push("Spark", spark.stop)
        interrupts.install()
        interrupts.check()
        checkpoint = tempfile.mkdtemp(prefix="meteor-demo-checkpoint-")
        cleanup.push("checkpoint directory", lambda: shutil.rmtree(checkpoint, ignore_errors=True))
        query = start_windowed_query(spark, grid, checkpoint, options.trigger)
        cleanup.push("streaming query", query.stop)
        say(
            f"[spark]   streaming query {query.name!r} reads {ORDERS!r} as group {GROUP!r}, counts orders and revenue "
            f"per category over 1-minute event-time windows (watermark {WATERMARK}) and appends closed windows "
            f"to {RESULTS!r}"
        )

        shop_start_ms = (int(time.time() * 1000) // WINDOW_MS - options.shop_minutes) * WINDOW_MS
        generator = OrderGenerator(options, shop_start_ms)
        state = PublishState()
        publisher = threading.Thread(
            target=publish_orders, args=(grid, generator, state, stop), name="demo-publisher", daemon=True
        )
        publisher.start()

        def stop_publisher() -> None:
            stop.set()
            publisher.join(10)

        cleanup.push("publisher", stop_publisher)
        say(
            f"[publish] publishing {options.records:,} orders over {options.seconds:g} s in the background: JSON "
            f"keyed by customer, event times covering {options.shop_minutes} minutes of shop time "
            f"({iso_ms(shop_start_ms)[11:16]}-{iso_ms(shop_start_ms + options.shop_minutes * WINDOW_MS)[11:16]} UTC)"
        )
        say()

        monitor = _Monitor(grid, orders_info, query, state, options, say, interrupts)
        try:
            results = monitor.run_until_complete()
        except KeyboardInterrupt:
            say("[demo]    interrupted: stopping the publisher, the query, Spark and the grid ...")
            raise
        summary = _summarise(monitor, generator, results, grid, orders_info, time.monotonic() - started)
        cleanup.close()
        return summary


def _stream_config(name: str, lanes: int) -> Any:
    return StreamConfig(name=name, lanes=lanes, capacity=100_000)


class _Monitor:
    """Watches the query, the group's lag and the results stream; prints a progress line every second."""

    def __init__(
        self,
        grid: Grid,
        orders_info: Any,
        query: Any,
        state: PublishState,
        options: DemoOptions,
        say: Callable[..., None],
        interrupts: _Interrupts,
    ) -> None:
        self.grid = grid
        self.orders_info = orders_info
        self.query = query
        self.state = state
        self.options = options
        self.say = say
        self.interrupts = interrupts
        self.rows_by_batch: dict[int, int] = {}
        self.results: dict[tuple[int, str], WindowResult] = {}
        self.lag: dict[int, int] = {}
        self.caught_up = False
        self.results_reader = Subscriber(grid, RESULTS, initial_offset_scheme=InitialOffsetScheme.EARLIEST)
        self._last_line = (state.started, 0, 0)

    @property
    def read(self) -> int:
        return sum(self.rows_by_batch.values())

    def run_until_complete(self) -> dict[tuple[int, str], WindowResult]:
        deadline: float | None = None
        try:
            while True:
                self._observe()
                if self.state.error is not None:
                    raise self.state.error
                if self.state.done and deadline is None:
                    deadline = time.monotonic() + self.options.timeout_s
                if self.state.done and self._complete():
                    self._progress_line(final=True)
                    return self.results
                if deadline is not None and time.monotonic() > deadline:
                    self.say(
                        f"[demo]    results still incomplete {self.options.timeout_s:g} s after the last order; "
                        f"stopping (see the summary)"
                    )
                    return self.results
                if self.options.live:
                    self._progress_line()
                self.interrupts.event.wait(1.0)  # a one-second tick that ends at once on Ctrl-C
                self.interrupts.check()
        finally:
            self.results_reader.close()

    def _complete(self) -> bool:
        expected_rows = self.state.published + 1  # + the clock event
        results_orders = sum(r.orders for r in self.results.values())
        return self.read >= expected_rows and results_orders >= self.state.published and self.caught_up

    def _observe(self) -> None:
        exception = self.query.exception()
        if exception is not None:
            raise MeteorError(f"the Spark streaming query failed: {_essence(str(exception))}")
        for progress in self.query.recentProgress:
            self.rows_by_batch[int(progress.batchId)] = int(progress.numInputRows)
        report = lag_report(self.grid, self.orders_info, GROUP)
        self.lag = _behind(report)
        # A lane that never held a record may never be confirmed; it is caught up all the same.
        self.caught_up = all(entry.items == 0 or (entry.items is None and entry.next_sequence == 0) for entry in report)
        for record in self.results_reader.poll(0):
            document = json.loads(record.value)
            start_ms = int(datetime.fromisoformat(document["window_start"]).timestamp() * 1000)
            result = WindowResult(start_ms, document["category"], int(document["orders"]), float(document["revenue"]))
            self.results[(start_ms, result.category)] = result

    def _progress_line(self, final: bool = False) -> None:
        now = time.monotonic()
        last_time, last_published, last_read = self._last_line
        elapsed = max(now - last_time, 1e-6)
        published, read = self.state.published, self.read
        self._last_line = (now, published, read)
        lanes = " ".join(f"{lane}:{behind:,}" for lane, behind in sorted(self.lag.items())) or "-"
        self.say(
            f"[{now - self.state.started:5.1f}s] published {published:>9,} "
            f"({(published - last_published) / elapsed:>7,.0f}/s)"
            f" | read by Spark {read:>9,} ({(read - last_read) / elapsed:>7,.0f}/s)"
            f" | ring items behind per lane {lanes} | windows out {len(self.results):,}"
            + ("  (complete)" if final else "")
            + ("  (Spark is starting its Python workers)" if not self.rows_by_batch else "")
        )


_PYTHON_ERROR_LINE = re.compile(r"^[\w.]*(Error|Exception)\b[^:]*: ")


def _essence(text: str) -> str:
    """Spark's error text is a JVM wrapper around a Python traceback: keep its first line and the Python error."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return "(no message)"
    errors = [line for line in lines[1:] if _PYTHON_ERROR_LINE.match(line)]
    return lines[0] if not errors else f"{lines[0]} ... {errors[-1]}"


def _behind(report: Any) -> dict[int, int]:
    """The group's lag per lane in ring items (one unit, known without reading the items: an item is one of the
    publisher's micro-batches, so records behind would mean reading every item behind on each tick)."""
    # nothing confirmed yet (items is None): everything the lane ever held is ahead of the group
    return {entry.lane: entry.next_sequence if entry.items is None else entry.items for entry in report}


def _summarise(
    monitor: _Monitor,
    generator: OrderGenerator,
    results: dict[tuple[int, str], WindowResult],
    grid: Grid,
    orders_info: Any,
    elapsed_s: float,
) -> DemoSummary:

    mismatches: list[str] = []
    for (start_ms, category), (count, revenue) in sorted(generator.tally.windows.items()):
        got = results.get((start_ms, category))
        where = f"window {iso_ms(start_ms)[11:16]} {category}"
        if got is None:
            mismatches.append(f"{where}: missing from {RESULTS!r}")
        elif got.orders != count or abs(got.revenue - revenue) > 0.011:
            mismatches.append(
                f"{where}: Spark says {got.orders} orders / {got.revenue:.2f}, published {count} / {revenue:.2f}"
            )
    for key in sorted(set(results) - set(generator.tally.windows)):
        mismatches.append(f"window {iso_ms(key[0])[11:16]} {key[1]}: in {RESULTS!r} but nothing was published there")
    confirmed = {s.lane: s.confirmed for s in group_state(grid, orders_info, GROUP)}
    lane_ends = {lane: make_offset(nxt, 0) for lane, (_head, nxt) in lane_bounds(grid, orders_info).items()}
    published = monitor.state.published
    offsets_ok = all(confirmed.get(lane) == end for lane, end in lane_ends.items() if end > 0)
    last_start = max((start for start, _ in results), default=None)
    last_window = sorted((r for r in results.values() if r.window_start_ms == last_start), key=lambda r: -r.revenue)
    ok = (
        monitor.state.done
        and published == generator.options.records
        and monitor.read == published + 1
        and not mismatches
        and offsets_ok
    )
    return DemoSummary(
        published=published,
        read=monitor.read,
        batches=sum(1 for rows in monitor.rows_by_batch.values() if rows),
        windows_expected=len(generator.tally.windows),
        windows_out=len(results),
        mismatches=tuple(mismatches),
        confirmed=confirmed,
        lane_ends=lane_ends,
        elapsed_s=elapsed_s,
        ok=ok,
        last_window=tuple(last_window),
    )


def render_summary(summary: DemoSummary) -> str:
    """The closing summary of a demo run: what was published, read and written back, every lane's confirmed
    offset, the last window's results and the verdict."""
    lines: list[str] = []
    say = lines.append
    say("")
    say("summary")
    rows = [
        ["orders published", f"{summary.published:,}", f"+ 1 clock event, into {ORDERS!r}"],
        [
            "records read by Spark",
            f"{summary.read:,}",
            f"in {summary.batches} micro-batch{'es' if summary.batches != 1 else ''}, as group {GROUP!r}",
        ],
        [
            "windows written back",
            f"{summary.windows_out:,}",
            f"of {summary.windows_expected:,} expected, into {RESULTS!r}",
        ],
        [
            "windows checked",
            f"{summary.windows_expected - len(summary.mismatches):,}",
            "match; see the mismatches below" if summary.mismatches else "match the publisher's own count and revenue",
        ],
        ["elapsed", f"{summary.elapsed_s:.1f} s", "wall time, Spark start included"],
    ]
    say(render_table(["WHAT", "COUNT", "DETAIL"], rows, right=[1]))
    say("")
    lanes = []
    for lane, end in sorted(summary.lane_ends.items()):
        confirmed = summary.confirmed.get(lane)
        state = "at the end" if confirmed == end else ("nothing to read" if end == 0 else "BEHIND")
        lanes.append([lane, "-" if confirmed is None else f"{confirmed:,}", f"{end:,}", state])
    say(f"group {GROUP!r}: confirmed offsets (the next record the group will read; sequence << 16 | index)")
    say(render_table(["LANE", "CONFIRMED", "LANE END", "STATE"], lanes, right=[0, 1, 2]))
    if summary.last_window:
        say("")
        start_ms = summary.last_window[0].window_start_ms
        say(f"the last window, {iso_ms(start_ms)[11:16]} UTC, as Spark wrote it to {RESULTS!r}:")
        top: list[list[object]] = [[r.category, r.orders, f"{r.revenue:,.2f}"] for r in summary.last_window]
        say(render_table(["CATEGORY", "ORDERS", "REVENUE"], top, right=[1, 2]))
    say("")
    for problem in summary.mismatches[:10]:
        say(f"  mismatch: {problem}")
    if summary.ok:
        say("OK: every order was read, every window was written back and is right, and the group confirmed every lane.")
    else:
        say("NOT OK: see above. Run with --debug for the logs.")
    return "\n".join(lines)


def local_spark_session(app_name: str, conf_dir: Path | None = None) -> Any:
    """A local SparkSession configured from ``conf/spark-defaults.conf`` and ``conf/log4j2.properties`` (quiet
    console), with workers on this interpreter."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # PySpark warns about pandas >= 3 on import; the connector does not use pandas, so it is noise here.
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)
    from pyspark.sql import SparkSession

    import meteor_spark.spark  # noqa: F401  (names the `spark` extra when pyspark is missing)

    settings = spark_conf(conf_dir or CONF_DIR)
    builder = SparkSession.builder.appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    try:
        session = builder.getOrCreate()
    except Exception as exc:  # py4j/JVM start-up failures are not MeteorErrors; the user needs one clear line
        raise MeteorError(
            f"could not start Spark ({_essence(str(exc))}); Spark needs Java 17 or newer on the PATH "
            f"(`java -version`; `bash .ci/dev demo` installs it)"
        ) from exc
    session.sparkContext.setLogLevel("ERROR")
    # No register() call: Spark finds format("meteor") through the installed top-level `pyspark_meteor` module,
    # which is exactly what a user's own job relies on.
    return session


def start_windowed_query(spark: Any, grid: Grid, checkpoint: str, trigger: str) -> Any:
    """The demo's query: orders (JSON) -> 1-minute windows per category -> ``order-stats``."""
    from pyspark.sql import functions as F

    connection = grid_options(grid.settings)
    orders = (
        spark.readStream.format("meteor")
        .option("stream", ORDERS)
        .option("group", GROUP)
        .option("startingOffsets", "earliest")
        .options(**connection)
        .load()
    )
    schema = (
        "type STRING, order_id STRING, customer STRING, category STRING, product STRING, quantity INT, "
        "price DOUBLE, event_time TIMESTAMP"
    )
    events = orders.select(F.from_json(F.col("value").cast("string"), schema).alias("e")).select("e.*")
    windows = (
        events.withWatermark("event_time", WATERMARK)
        # Orders only. The clock event must reach the watermark first, so the filter is written against
        # event_time: Spark pushes filters that do not reference the event-time column below the watermark.
        .where(F.when(F.col("type") == "order", F.col("event_time")).isNotNull())
        .groupBy(F.window("event_time", "1 minute"), F.col("category"))
        .agg(F.count("*").alias("orders"), F.round(F.sum(F.col("price") * F.col("quantity")), 2).alias("revenue"))
    )
    results = windows.select(
        F.col("category").cast("binary").alias("key"),
        F.to_json(
            F.struct(
                F.col("window.start").alias("window_start"),
                F.col("window.end").alias("window_end"),
                "category",
                "orders",
                "revenue",
            )
        )
        .cast("binary")
        .alias("value"),
    )
    return (
        results.writeStream.format("meteor")
        .queryName("orders_per_minute")
        .option("stream", RESULTS)
        .options(**connection)
        .option("checkpointLocation", checkpoint)
        .outputMode("append")
        .trigger(processingTime=trigger)
        .start()
    )


class _Cleanup:
    """Stops what the demo started, newest first, each step on its own (one failing step does not skip the rest)."""

    def __init__(self) -> None:
        self._steps: list[tuple[str, Callable[[], Any]]] = []

    def push(self, what: str, step: Callable[[], Any]) -> None:
        self._steps.append((what, step))

    def close(self) -> None:
        while self._steps:
            what, step = self._steps.pop()
            try:
                step()
            except Exception:
                logger.warning("stopping the %s failed", what, exc_info=True)

    def __enter__(self) -> _Cleanup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Interrupts:
    """Ctrl-C and SIGTERM set a flag that the demo checks between steps (``check``), where stopping is safe.

    Raising KeyboardInterrupt from the signal handler itself would land inside whatever call is running, often a
    py4j call to the JVM, and leave the gateway's socket mid-message (PySpark's own SIGINT handler does that). A
    flag is checked at least once a second by the monitor loop.
    """

    def __init__(self) -> None:
        self.event = threading.Event()
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        """(Re)install the handlers; PySpark replaces the SIGINT handler when it starts, so call again after."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous = signal.signal(signum, self._handle)
            self._previous.setdefault(signum, previous)

    def _handle(self, signum: int, frame: Any) -> None:
        self.event.set()

    def check(self) -> None:
        if self.event.is_set():
            raise KeyboardInterrupt

    def __enter__(self) -> _Interrupts:
        self.install()
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
