"""Consume-transform-produce, exactly once through a group: a Python loop process reads stream A in a group and
writes transformed records to B in transactions that also confirm its offsets; it is SIGKILLed at random points and
restarted. A read_committed reader of B sees every A record exactly once (figures printed)."""

from __future__ import annotations

import collections
import random
import time

import pytest

from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.format.offsets import sequence_of
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.streams import StreamConfig, open_stream
from meteor_spark.groups.store import OFFSETS_MAP, read_offset
from meteor_spark.producer.publisher import Publisher
from meteor_spark.testing import wait_until
from tests.core.processes import Child

# The loop: poll A in group "g", publish "b:<value>" to B in the transaction, send the offsets, commit. A fixed
# member id, so a restarted loop takes its lanes over at once (epoch + 1) instead of after a lease period. Short
# transaction timeout: a transaction open when the loop was killed, before it staged offsets, holds B's
# read_committed readers only that long.
LOOP_CHILD = r"""
import sys
from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.consumer.transactional import TransactionalPublisher
from meteor_spark.errors import FencedError, NotAssignedError, TransactionAbortedError
from meteor_spark.format.offsets import sequence_of
from meteor_spark.grid.client import Grid, GridSettings

address, cluster, source, target = sys.argv[1:5]
grid = Grid(GridSettings(members=(address,), cluster_name=cluster))
sub = Subscriber(grid, source, group="g", member_id="loop", lease_ms=1000, initial_offset_scheme="earliest",
                 max_poll_records=4)
txn = TransactionalPublisher(grid, target, timeout_ms=2000, linger_ms=0)
print("ready", flush=True)
while True:
    batch = sub.poll(50)
    try:
        for record in batch:
            txn.publish(b"b:" + record.value)
        txn.send_offsets(sub)
        txn.commit()
    except (FencedError, NotAssignedError, TransactionAbortedError):
        txn.abort()
"""

KILLS = 10
PER_RUN = 150


@pytest.mark.fault
def test_a_consume_transform_produce_loop_sigkilled_10_times_delivers_every_record_once(
    grid: Grid, grid_settings: GridSettings, unique_name: str, children: list[Child]
) -> None:
    source = open_stream(grid, StreamConfig(f"{unique_name}-a", lanes=2, capacity=2000))
    target = open_stream(grid, StreamConfig(f"{unique_name}-b", lanes=2, capacity=2000))
    args = (grid_settings.members[0], grid_settings.cluster_name, source.name, target.name)
    rng = random.Random(22)
    published = 0
    with Publisher(grid, source.name, linger_ms=0) as publisher:
        for run in range(KILLS + 1):
            for n in range(published, published + PER_RUN):
                publisher.publish(str(n).encode())
            published += PER_RUN
            publisher.flush()
            child = Child(LOOP_CHILD, *args)
            children.append(child)
            assert child.read_line(60).strip() == "ready"
            if run < KILLS:
                # a random point of the loop: mid-poll, mid-publish, between staging and commit, after the commit
                _pause(rng)
                child.kill()
    offsets = grid.map(OFFSETS_MAP)

    def consumed_all() -> bool:
        for lane in range(source.lanes):
            stored = read_offset(offsets, source.name, "g", lane)
            tail = grid.ring(source.ring_names[lane]).tail()
            if stored is None or stored.offset is None or stored.txn is not None or sequence_of(stored.offset) <= tail:
                return False
        return True

    wait_until(consumed_all, 30, message="the last loop confirms every A record")
    seen: collections.Counter[str] = collections.Counter()
    with Subscriber(grid, target.name, initial_offset_scheme="earliest", isolation="read_committed") as reader:

        def drained() -> bool:
            seen.update(r.value.decode() for r in reader.poll(50))
            return not any(reader.lag().values())

        wait_until(drained, 30, message="B read to its end")
        seen.update(r.value.decode() for r in reader.poll(50))
    expected = {f"b:{n}" for n in range(published)}
    lost = len(expected - set(seen))
    duplicated = sum(count - 1 for count in seen.values() if count > 1)
    print(f"\nconsume-transform-produce: {published} records, {KILLS} kills: lost {lost}, duplicated {duplicated}")
    assert set(seen) == expected
    assert (lost, duplicated) == (0, 0)


def _pause(rng: random.Random) -> None:
    """Let the loop run for a random time (a deadline poll, not a sleep: nothing to wait for but the clock)."""
    end = time.monotonic() + rng.uniform(0.05, 0.5)
    wait_until(lambda: time.monotonic() >= end, 2)
