"""History below the ring's head, from the RingbufferStore: on a two-member Hazelcast 5.7.0 cluster whose rings hold
``CAPACITY`` items, a stream gets many times that, and every way to read from the start of the stream or from a time
returns all of it (read back from PostgreSQL through the members), not only what the ring still holds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from store_helpers import CAPACITY, settings_of

from meteor_spark.consumer.subscriber import InitialOffsetScheme, Subscriber
from meteor_spark.format.partitioning import lane_for_key
from meteor_spark.format.records import Record
from meteor_spark.grid.client import Grid
from meteor_spark.grid.streams import StreamConfig
from meteor_spark.producer.publisher import Publisher
from tests.real_members import HazelcastCluster

pytestmark = [pytest.mark.real_members, pytest.mark.slow, pytest.mark.timeout(600)]

LANES = 2
RECORDS = 400
#: records per ring item: RECORDS / PER_ITEM items over LANES lanes, each lane about 6 times the ring capacity
PER_ITEM = 2
T0 = 1_700_000_000_000


@pytest.fixture(scope="module")
def cluster(store_cluster: Callable[[], HazelcastCluster]) -> Iterator[HazelcastCluster]:
    with store_cluster() as running:
        yield running


@pytest.fixture(scope="module")
def grid(cluster: HazelcastCluster) -> Iterator[Grid]:
    with Grid(settings_of(cluster)) as client:
        yield client


@pytest.fixture(scope="module")
def history(grid: Grid) -> str:
    """A stream of RECORDS records, value ``"<n>"``, timestamp ``T0 + n``, spread evenly over the lanes by key."""
    config = StreamConfig("store-history", lanes=LANES, capacity=CAPACITY, max_batch_records=PER_ITEM)
    keys = [lane_key(lane) for lane in range(LANES)]
    with Publisher(grid, config) as publisher:
        futures = [
            publisher.publish_async(Record(str(n).encode(), key=keys[n % LANES], timestamp_ms=T0 + n))
            for n in range(RECORDS)
        ]
        publisher.flush()
    for future in futures:
        future.result(timeout=60)
    info_rings = [grid.ring(f"meteor.stream::store-history.{lane}") for lane in range(LANES)]
    heads = [ring.head() for ring in info_rings]
    tails = [ring.tail() for ring in info_rings]
    print(f"\nstore history: {RECORDS} records, ring heads {heads}, tails {tails}, capacity {CAPACITY}")
    # the rings hold CAPACITY items each: most of the stream is only in the store
    assert all(head > 0 for head in heads), heads
    return config.name


def lane_key(lane: int) -> bytes:
    """A key of ``lane``."""
    return next(key for key in (f"k{n}".encode() for n in range(1000)) if lane_for_key(key, LANES) == lane)


def _read_all(subscriber: Subscriber, expected: int) -> list[int]:
    values: list[int] = []
    for _ in range(1000):
        batch = subscriber.poll(timeout_ms=200)
        values.extend(int(record.value) for record in batch)
        if len(values) >= expected and not batch:
            break
    return values


def test_earliest_reads_the_whole_history_below_the_head(grid: Grid, history: str) -> None:
    with Subscriber(grid, history, initial_offset_scheme=InitialOffsetScheme.EARLIEST) as subscriber:
        values = _read_all(subscriber, RECORDS)
    print(f"EARLIEST: read {len(values)} of {RECORDS} records, {len(values) - len(set(values))} duplicated")
    assert sorted(values) == list(range(RECORDS))


def test_a_timestamp_below_the_head_is_found_and_read_from(grid: Grid, history: str) -> None:
    since = 37  # in the ring's first items, long overwritten
    with Subscriber(grid, history, initial_offset_scheme=InitialOffsetScheme.LATEST) as subscriber:
        subscriber.poll(timeout_ms=0)
        found = subscriber.seek_to_timestamp(T0 + since)
        values = _read_all(subscriber, RECORDS - since)
    print(f"seek_to_timestamp(T0 + {since}): offsets {found}, read {len(values)} records")
    assert all(offset is not None for offset in found.values()), found
    assert sorted(values) == list(range(since, RECORDS))


@pytest.mark.spark
def test_a_spark_batch_read_returns_the_whole_history(spark: Any, cluster: HazelcastCluster, history: str) -> None:
    rows = (
        spark.read.format("meteor")
        .option("hazelcast.members", cluster.members)
        .option("hazelcast.clusterName", cluster.cluster_name)
        .option("stream", history)
        .load()
        .selectExpr("CAST(value AS STRING) AS value")
        .collect()
    )
    values = sorted(int(row.value) for row in rows)
    print(f"Spark batch read: {len(values)} of {RECORDS} records")
    assert values == list(range(RECORDS))
