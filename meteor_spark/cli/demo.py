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

This module runs the demo and watches it; the workload is in ``demo_orders``, the Spark session and query in
``demo_spark``, the checks and the closing table in ``demo_summary``. Pyspark is imported inside functions
only: importing these modules stays cheap and Spark-free.
"""

from __future__ import annotations

import json
import logging
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import IO, Any

from meteor_spark.cli.demo_orders import (
    DEFAULTS,
    GROUP,
    ORDERS,
    RESULTS,
    WATERMARK,
    WINDOW_MS,
    DemoOptions,
    OrderGenerator,
    PublishState,
    WindowResult,
    iso_ms,
    publish_orders,
)
from meteor_spark.cli.demo_spark import essence, local_spark_session, start_windowed_query
from meteor_spark.cli.demo_summary import DemoSummary, summarise
from meteor_spark.consumer.subscriber import InitialOffsetScheme, Subscriber
from meteor_spark.errors import MeteorError
from meteor_spark.grid.client import Grid
from meteor_spark.grid.streams import StreamConfig, open_stream
from meteor_spark.groups.admin import lag_report
from meteor_spark.server import EmbeddedGrid

logger = logging.getLogger(__name__)


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
    with _Interrupts() as interrupts, _Cleanup() as cleanup:
        import meteor_spark.spark  # noqa: F401  (before starting anything: names the extra when pyspark is missing)

        say("meteor demo: shop orders -> meteor stream -> Spark (event-time windows) -> meteor stream")
        say()
        grid = _start_grid(options, say, interrupts, cleanup)
        orders_info = open_stream(grid, _stream_config(ORDERS, options.lanes), create=True)
        open_stream(grid, _stream_config(RESULTS, 1), create=True)
        say(
            f"[streams] created {ORDERS!r} with {options.lanes} lanes (ring buffers; a customer's orders share a lane) "
            f"and {RESULTS!r} for the results"
        )
        query = _start_query(grid, options, say, interrupts, cleanup)
        generator, state = _start_publisher(grid, options, say, cleanup)

        monitor = _Monitor(grid, orders_info, query, state, options, say, interrupts)
        try:
            results = monitor.run_until_complete()
        except KeyboardInterrupt:
            say("[demo]    interrupted: stopping the publisher, the query, Spark and the grid ...")
            raise
        summary = summarise(
            state, monitor.rows_by_batch, generator, results, grid, orders_info, time.monotonic() - started
        )
        cleanup.close()
        return summary


def _start_grid(options: DemoOptions, say: _Printer, interrupts: _Interrupts, cleanup: _Cleanup) -> Grid:
    """An embedded member in its own process (the demo needs no Hazelcast install) and a client connected to it;
    both are stopped by ``cleanup``."""
    server = EmbeddedGrid(port=0, process=True)
    server.start()
    cleanup.push("embedded grid", server.stop)
    say(f"[grid]    embedded grid member running in its own process at {server.address} (cluster 'dev')")
    interrupts.check()
    grid = Grid.connect(server.address, cluster_name=server.cluster_name)
    cleanup.push("grid client", grid.close)
    return grid


def _start_query(grid: Grid, options: DemoOptions, say: _Printer, interrupts: _Interrupts, cleanup: _Cleanup) -> Any:
    """Spark and the windowed streaming query, with a checkpoint directory of their own; ``cleanup`` stops the
    query, removes the checkpoint and stops Spark, in that order. The signal handlers are installed again after
    Spark starts, which replaces PySpark's own SIGINT handler (see ``_Interrupts``)."""
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
    return query


def _start_publisher(
    grid: Grid, options: DemoOptions, say: _Printer, cleanup: _Cleanup
) -> tuple[OrderGenerator, PublishState]:
    """The background publisher thread, started after the query so the live progress shows both; its orders cover
    the last ``shop_minutes`` whole minutes of shop time. ``cleanup`` stops it first (it is pushed last)."""
    stop = threading.Event()
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
    return generator, state


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
            raise MeteorError(f"the Spark streaming query failed: {essence(str(exception))}")
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


def _behind(report: Any) -> dict[int, int]:
    """The group's lag per lane in ring items (one unit, known without reading the items: an item is one of the
    publisher's micro-batches, so records behind would mean reading every item behind on each tick)."""
    # nothing confirmed yet (items is None): everything the lane ever held is ahead of the group
    return {entry.lane: entry.next_sequence if entry.items is None else entry.items for entry in report}


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
