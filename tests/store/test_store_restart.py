"""A full cluster restart with the JDBC stores: both members of a two-member Hazelcast 5.7.0 cluster are SIGKILLed
while a publisher is publishing, after a group confirmed offsets, and both are started again. Every acknowledged
record is read back from the start of the stream (ring items from the RingbufferStore), the group's confirmed
offsets are the ones it confirmed (map entries from the MapStore), and the group resumes exactly there.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

import pytest
from hazelcast.proxy.map import BlockingMap
from store_helpers import CAPACITY, settings_of

from meteor_spark.consumer.subscriber import InitialOffsetScheme, Subscriber
from meteor_spark.errors import MeteorError, PublishTimeoutError
from meteor_spark.format.records import Record
from meteor_spark.grid.client import Grid
from meteor_spark.grid.streams import StreamConfig
from meteor_spark.groups.store import OFFSETS_MAP, lane_key
from meteor_spark.producer.publisher import Publisher
from meteor_spark.testing import wait_until
from tests.real_members import HazelcastCluster

pytestmark = [pytest.mark.real_members, pytest.mark.fault, pytest.mark.slow, pytest.mark.timeout(600)]

LANES = 2
GROUP = "billing"
#: records the group reads and confirms before the kill
CONFIRMED = 300
#: records acknowledged (in all) before the members are killed
ACKED_BEFORE_KILL = 1200
#: a stored map (the Spark sink's commits; named here so the test does not import pyspark)
COMMITS_MAP = "meteor.sink.commits"
#: entries of each key and value type, put into a stored map with the client's own serializers
#: (the Python client sends str as String and bytearray as byte[]; it pickles bytes, which a member cannot deserialize)
TYPED_ENTRIES: list[tuple[str | bytearray, str | bytearray]] = [
    ("text", "value"),
    (bytearray(b"\x00bytes"), bytearray(b"\xff\x00")),
    ("mixed", bytearray(b"\x01")),
]


def _poll_values(subscriber: Subscriber, until: Callable[[list[int]], bool], timeout_s: float = 60) -> list[int]:
    values: list[int] = []

    def more() -> bool:
        values.extend(int(record.value) for record in subscriber.poll(timeout_ms=100))
        return until(values)

    wait_until(more, timeout_s=timeout_s, interval_s=0, message="records to read")
    return values


def _drain(subscriber: Subscriber) -> list[int]:
    """Everything the subscriber gets until a poll of 1 s returns nothing."""
    values: list[int] = []
    while True:
        batch = subscriber.poll(timeout_ms=1000)
        if not batch:
            return values
        values.extend(int(record.value) for record in batch)


def test_a_full_cluster_restart_loses_no_acknowledged_record_and_no_confirmed_offset(
    store_cluster: Callable[[], HazelcastCluster],
) -> None:
    config = StreamConfig("store-restart", lanes=LANES, capacity=CAPACITY, max_batch_records=5)
    keys = [lane_key(config.name, GROUP, lane) for lane in range(LANES)]
    acked: set[int] = set()
    failed: dict[int, str] = {}
    stop = threading.Event()
    published = [0]

    with store_cluster() as cluster:
        grid = Grid(settings_of(cluster))
        try:
            publisher = Publisher(grid, config, delivery_timeout_ms=5000)

            def callback(n: int) -> Callable[[int | None, BaseException | None], None]:
                def done(offset: int | None, error: BaseException | None) -> None:
                    if error is None:
                        acked.add(n)
                    else:
                        failed[n] = type(error).__name__

                return done

            def publish() -> None:
                n = 0
                while not stop.is_set():
                    try:
                        publisher.publish_async(Record(str(n).encode(), lane=n % LANES), callback=callback(n))
                    except MeteorError:
                        return
                    n += 1
                    published[0] = n
                    if n % 50 == 0:
                        wait_until(lambda: stop.is_set() or len(acked) + len(failed) >= n - 200, timeout_s=60)

            publishing = threading.Thread(target=publish, name="store-restart-publisher", daemon=True)
            publishing.start()

            with Subscriber(grid, config, group=GROUP, initial_offset_scheme=InitialOffsetScheme.EARLIEST) as group:
                wait_until(group.is_assigned, timeout_s=30, message="the group member to hold its lanes")
                consumed = _poll_values(group, lambda values: len(values) >= CONFIRMED)
                group.confirm()
                offsets_before = grid.map(OFFSETS_MAP).get_all(keys)
            assert len(offsets_before) == LANES, offsets_before

            # the Python client's str and bytes both reach the MapStore (as String and byte[]) and come back as such
            raw: BlockingMap[str | bytearray, str | bytearray] = grid.client.get_map(COMMITS_MAP).blocking()
            for key, value in TYPED_ENTRIES:
                raw.put(key, value)

            wait_until(lambda: len(acked) >= ACKED_BEFORE_KILL, timeout_s=120, message="acknowledged publishes")
            for index in range(2):
                cluster.member(index).kill()
            stop.set()
            publishing.join(timeout=60)
            # what was in flight at the kill fails in its futures (never counted as acknowledged)
            with contextlib.suppress(PublishTimeoutError):
                publisher.close(timeout_s=10)
        finally:
            grid.close()
        # every publish settles, acknowledged or failed; an answer that reached the client before the kill counts
        wait_until(lambda: len(acked) + len(failed) == published[0], timeout_s=60, message="every publish to settle")
        acked_at_kill = set(acked)

        for index in range(2):
            cluster.restart(index)

        with Grid(settings_of(cluster)) as grid:
            offsets_after = grid.map(OFFSETS_MAP).get_all(keys)
            restored: BlockingMap[str | bytearray, str | bytearray] = grid.client.get_map(COMMITS_MAP).blocking()
            typed_after = [(key, restored.get(key)) for key, _ in TYPED_ENTRIES]
            rings = [grid.ring(f"meteor.stream::{config.name}.{lane}") for lane in range(LANES)]
            bounds = [(ring.head(), ring.tail()) for ring in rings]
            with Subscriber(grid, config.name, initial_offset_scheme=InitialOffsetScheme.EARLIEST) as reader:
                read_back = _drain(reader)
            with Subscriber(grid, config.name, group=GROUP) as resumed:
                wait_until(resumed.is_assigned, timeout_s=30, message="the group member to hold its lanes")
                after_confirm = _drain(resumed)

    unique = set(read_back)
    lost = acked_at_kill - unique
    duplicated = len(read_back) - len(unique)
    stored_unacked = unique - acked_at_kill
    resumed_overlap = set(after_confirm) & set(consumed)
    print(
        f"\nfull restart: published {published[0]}, acked {len(acked_at_kill)}, failed {len(failed)}, "
        f"read back {len(read_back)} ({len(unique)} distinct), lost {len(lost)}, duplicated {duplicated}, "
        f"stored but unacknowledged {len(stored_unacked)}; ring (head, tail) after restart {bounds}\n"
        f"str/bytes map entries after: {typed_after}\n"
        f"group offsets before {offsets_before}\n"
        f"group offsets after  {offsets_after}\n"
        f"group consumed {len(consumed)} before, {len(after_confirm)} after the restart, "
        f"{len(resumed_overlap)} of them twice"
    )
    assert not lost, sorted(lost)[:20]
    assert duplicated == 0
    assert offsets_after == offsets_before
    assert typed_after == TYPED_ENTRIES
    assert [type(value) for _, value in typed_after] == [type(value) for _, value in TYPED_ENTRIES]
    # the ring continues after the largest stored sequence: empty in memory, everything below the head in the store
    assert all(head == tail + 1 and tail >= CAPACITY for head, tail in bounds), bounds
    # the group resumes at its confirmed offsets: nothing it confirmed again, everything after it once
    assert not resumed_overlap, sorted(resumed_overlap)[:20]
    assert sorted(after_confirm + consumed) == sorted(read_back)
