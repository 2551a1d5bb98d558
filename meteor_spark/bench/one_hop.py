"""One hop of ``meteor bench pubsub`` (c): ``publish_async`` -> ``Subscriber.poll`` on a second client connection,
one record in flight, next to the same hop on the grid client alone (``add_all``; a ``read_many`` parked on the
other connection, the next one started as the answer arrives: the same two invocations per round trip).

Apart from pubsub.py for its size; issue 24's round trip target is this hop. The CPU per round trip shows where the
time goes on a loaded machine, where wall-clock percentiles mostly measure the neighbours.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.grid.client import Grid, Ring
from meteor_spark.grid.streams import StreamConfig
from meteor_spark.groups.admin import delete_stream
from meteor_spark.producer.publisher import Publisher


def one_hop(
    grid: Grid, name: str, measure: Callable[[Callable[[bytes], None]], dict[str, float]]
) -> tuple[dict[str, float], dict[str, float]]:
    """One record in flight from a publisher to a subscriber on a second connection, then the same on the grid
    client alone, each timed by ``measure`` (the round trips and this process's CPU per round trip)."""
    with Grid(grid.settings) as other:
        with Publisher(grid, StreamConfig(name)) as pub, Subscriber(other, name, initial_offset_scheme="latest") as sub:

            def meteor_hop(payload: bytes) -> None:
                pub.publish_async(payload)
                while not sub.poll(5000):
                    pass

            meteor = measure(meteor_hop)
        delete_stream(grid, name)
        ring, parked = grid.ring(name + "-raw"), other.ring(name + "-raw")
        reading = [parked.read_many_async(0, 1, 10)]

        def raw_hop(payload: bytes) -> None:
            ring.add_all_async([payload])
            batch = Ring.to_batch(reading[0].result())
            reading[0] = parked.read_many_async(batch.next_sequence, 1, 10)

        raw = measure(raw_hop)
        ring.add(b"end")  # answers the last parked read before the ring goes
        ring.destroy()
    return meteor, raw


def hop_rows(lat: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """The one-hop round trip (p50 / p99, client CPU per round trip) against the grid client alone."""
    hop, raw = lat["one_hop"], lat["parked"]
    return [
        (
            "(c) publish -> poll, other connection",
            f"{hop['p50_ms']:.2f} / {hop['p99_ms']:.2f} ms, {hop['cpu_us']:.0f} us CPU",
            f"{hop['p50_ms'] / raw['p50_ms']:.1f}x",
            "<= 0.3 / <= 1 ms",
        ),
        (
            "ceiling: add_all + parked read_many",
            f"{raw['p50_ms']:.2f} / {raw['p99_ms']:.2f} ms, {raw['cpu_us']:.0f} us CPU",
            "",
            "",
        ),
    ]
