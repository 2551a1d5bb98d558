"""A grouped subscriber's poll trusts its member's own lease state: no lease read per lane per poll."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.format.records import Record
from meteor_spark.grid.client import Grid
from meteor_spark.grid.streams import StreamConfig
from meteor_spark.groups.store import LEASES_MAP
from meteor_spark.producer.publisher import Publisher
from meteor_spark.testing import wait_until

LANES = 4


class _CountingGrid:
    """A ``Grid`` whose maps count the calls made from the thread that created it (the polling thread)."""

    def __init__(self, grid: Grid) -> None:
        self._grid = grid
        self.calls: Counter[str] = Counter()
        self._thread = threading.get_ident()

    def map(self, name: str) -> Any:
        target = self._grid.map(name)
        counter = self

        class Counting:
            def __getattr__(self, attr: str) -> Any:
                value = getattr(target, attr)
                if not callable(value):
                    return value

                def call(*args: Any, **kwargs: Any) -> Any:
                    if threading.get_ident() == counter._thread:
                        counter.calls[f"{name}.{attr}"] += 1
                    return value(*args, **kwargs)

                return call

        return Counting()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)


def test_a_grouped_poll_reads_no_lease(grid: Grid, unique_name: str) -> None:
    config = StreamConfig(unique_name, lanes=LANES)
    with Publisher(grid, config) as publisher:
        publisher.publish_many([Record(b"v%d" % i, lane=i % LANES) for i in range(4 * LANES)]).result(30)
    counting = _CountingGrid(grid)
    with Subscriber(counting, config, group="g", lease_ms=5000) as sub:  # type: ignore[arg-type]
        assert set(sub.member.assignment()) == set(range(LANES))
        counting.calls.clear()
        values: list[bytes] = []

        def all_delivered() -> bool:
            values.extend(record.value for record in sub.poll(100))
            return len(values) == 4 * LANES

        wait_until(all_delivered, 15, message="every record delivered")
        assert sorted(values) == sorted(b"v%d" % i for i in range(4 * LANES))
        lease_calls = {call: n for call, n in counting.calls.items() if call.startswith(LEASES_MAP)}
        print(f"lease map calls while polling {4 * LANES} records from {LANES} lanes: {lease_calls or 0}")
        assert lease_calls == {}
