"""One hop of ``meteor bench pubsub`` (c): ``publish_async`` -> ``Subscriber.poll`` on a second client connection,
one record in flight, next to the same hop on the grid client alone (``add_all``; a ``read_many`` parked on the
other connection, the next one started as the answer arrives: the same two invocations per round trip).

Apart from pubsub.py for its size; issue 24's round trip target is this hop. The CPU per round trip shows where the
time goes on a loaded machine, where wall-clock percentiles mostly measure the neighbours; the calling thread's share
is split by stage (``publish_async`` / ``poll``, ``add_all`` / the read), the rest is the clients' reactor threads
and the publisher's.
"""

from __future__ import annotations

import time
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
    clock = time.thread_time
    stages = [0, 0.0, 0.0]  # hops, CPU of the first stage, of the second (the calling thread's)
    with Grid(grid.settings) as other:
        with Publisher(grid, StreamConfig(name)) as pub, Subscriber(other, name, initial_offset_scheme="latest") as sub:

            def meteor_hop(payload: bytes) -> None:
                start = clock()
                pub.publish_async(payload)
                sent = clock()
                while not sub.poll(5000):
                    pass
                stages[0] += 1
                stages[1] += sent - start
                stages[2] += clock() - sent

            meteor = {**measure(meteor_hop), **_split(stages, "publish_cpu_us", "poll_cpu_us")}
        delete_stream(grid, name)
        ring, parked = grid.ring(name + "-raw"), other.ring(name + "-raw")
        reading = [parked.read_many_async(0, 1, 10)]

        def raw_hop(payload: bytes) -> None:
            start = clock()
            ring.add_all_async([payload])
            sent = clock()
            batch = Ring.to_batch(reading[0].result())
            reading[0] = parked.read_many_async(batch.next_sequence, 1, 10)
            stages[0] += 1
            stages[1] += sent - start
            stages[2] += clock() - sent

        stages[:] = [0, 0.0, 0.0]
        raw = {**measure(raw_hop), **_split(stages, "add_cpu_us", "read_cpu_us")}
        ring.add(b"end")  # answers the last parked read before the ring goes
        ring.destroy()
    return meteor, raw


def _split(stages: list[Any], first: str, second: str) -> dict[str, float]:
    """The calling thread's CPU per hop in each of its two stages."""
    hops = max(1, stages[0])
    return {first: stages[1] * 1e6 / hops, second: stages[2] * 1e6 / hops}


def hop_rows(lat: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """The one-hop round trip (p50 / p99, client CPU per round trip, the calling thread's by stage) against the grid
    client alone."""
    hop, raw = lat["one_hop"], lat["parked"]
    return [
        (
            "(c) publish -> poll, other connection",
            f"{hop['p50_ms']:.2f} / {hop['p99_ms']:.2f} ms, {hop['cpu_us']:.0f} us CPU "
            f"(caller: publish {hop['publish_cpu_us']:.0f} + poll {hop['poll_cpu_us']:.0f})",
            f"{hop['p50_ms'] / raw['p50_ms']:.1f}x",
            "<= 0.3 / <= 1 ms",
        ),
        (
            "ceiling: add_all + parked read_many",
            f"{raw['p50_ms']:.2f} / {raw['p99_ms']:.2f} ms, {raw['cpu_us']:.0f} us CPU "
            f"(caller: add {raw['add_cpu_us']:.0f} + read {raw['read_cpu_us']:.0f})",
            "",
            "",
        ),
    ]
