"""The demo's workload: its options, the shop orders it publishes (deterministic, with event times) and the
publisher's own tally of them, which the summary checks Spark's results against.

Apart from ``meteor_spark.cli.demo`` (which runs it all) so the order generator can be used and tested without a
grid or Spark (``tests/test_demo.py``).
"""

from __future__ import annotations

import json
import random
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from meteor_spark.errors import ConfigError
from meteor_spark.format.records import Record
from meteor_spark.grid.client import Grid
from meteor_spark.producer.publisher import Publisher

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
