"""AtomicLong, FlakeIdGenerator and Topic through the official client over TCP.

FlakeIdGenerator, Topic and the CP refusal run against the ``grid_settings`` grid (the embedded member, or a real
Hazelcast 5.7 member), so only Hazelcast's behaviour is asserted. Hazelcast 5.7 open source refuses the CP subsystem
(AtomicLong) as an Enterprise feature, and so does the embedded member by default; AtomicLong itself is served only by
an embedded member started with ``cp_mode="unsafe"`` (Hazelcast 4.x-5.4's "unsafe mode"), which these tests start
of their own (``embedded_only``: no 5.7 member serves it). The engine-level details are at the end of this file.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Any

import hazelcast
import pytest
from hazelcast.errors import DistributedObjectDestroyedError, UnsupportedOperationError

from meteor_spark.grid.client import GridSettings
from meteor_spark.server import EmbeddedGrid
from meteor_spark.server.engine import ManualClock
from meteor_spark.server.engine.atomics import CP_REFUSED, Atomics, CpMode, RaftGroupId
from meteor_spark.server.engine.flake_ids import EPOCH_START_MS, FlakeIds
from meteor_spark.server.errors import ClassCast, DistributedObjectDestroyed, IllegalArgument, UnsupportedOperation
from meteor_spark.testing import wait_until

LONG_MAX = (1 << 63) - 1
LONG_MIN = -(1 << 63)


@pytest.fixture(scope="module")
def client(grid_settings: GridSettings) -> Iterator[Any]:
    c = hazelcast.HazelcastClient(**grid_settings.client_config())
    yield c
    c.shutdown()


@pytest.fixture(scope="module")
def unsafe_client() -> Iterator[Any]:
    """A client of an embedded member serving CP in "unsafe mode" (as Hazelcast 4.x-5.4 without CP members)."""
    with EmbeddedGrid(cp_mode="unsafe") as member:
        c = hazelcast.HazelcastClient(cluster_members=[member.address], cluster_name=member.cluster_name)
        yield c
        c.shutdown()


def test_atomic_long_is_refused_as_an_enterprise_feature(client: Any, unique_name: str) -> None:
    with pytest.raises(UnsupportedOperationError, match="CP subsystem is an Enterprise feature"):
        client.cp_subsystem.get_atomic_long(unique_name)


@pytest.mark.embedded_only
def test_atomic_long_operations(unsafe_client: Any, unique_name: str) -> None:
    client = unsafe_client
    counter = client.cp_subsystem.get_atomic_long(unique_name).blocking()
    assert counter.get() == 0
    assert counter.increment_and_get() == 1
    assert counter.add_and_get(10) == 11
    assert counter.get_and_add(5) == 11
    assert counter.get_and_increment() == 16
    assert counter.decrement_and_get() == 16
    assert counter.get_and_set(100) == 16
    counter.set(7)
    assert counter.compare_and_set(6, 1) is False
    assert counter.compare_and_set(7, 1) is True
    assert counter.get() == 1
    counter.set(LONG_MAX)
    assert counter.increment_and_get() == LONG_MIN  # Java long overflow
    other = client.cp_subsystem.get_atomic_long(unique_name + "@default").blocking()
    assert other.get() == LONG_MIN  # "@default" names the same object


@pytest.mark.embedded_only
def test_atomic_long_groups_are_separate_namespaces(unsafe_client: Any, unique_name: str) -> None:
    client = unsafe_client
    a = client.cp_subsystem.get_atomic_long(unique_name).blocking()
    b = client.cp_subsystem.get_atomic_long(f"{unique_name}@group-b").blocking()
    a.set(1)
    b.set(2)
    assert (a.get(), b.get()) == (1, 2)


@pytest.mark.embedded_only
def test_destroyed_atomic_long_cannot_be_used(unsafe_client: Any, unique_name: str) -> None:
    client = unsafe_client
    counter = client.cp_subsystem.get_atomic_long(unique_name).blocking()
    counter.set(5)
    counter.destroy()
    with pytest.raises(DistributedObjectDestroyedError):
        counter.get()
    with pytest.raises(DistributedObjectDestroyedError):
        client.cp_subsystem.get_atomic_long(unique_name).blocking().increment_and_get()


def test_flake_ids_are_unique_and_ordered(client: Any, unique_name: str) -> None:
    generator = client.get_flake_id_generator(unique_name).blocking()
    ids = [generator.new_id() for _ in range(300)]  # more than one prefetched batch (100)
    assert len(set(ids)) == 300
    assert ids == sorted(ids)
    assert all(b - a == 1 << 16 for a, b in itertools.pairwise(ids[:100]))  # within a batch: 65536 apart
    timestamp_ms = (ids[0] >> 22) + EPOCH_START_MS
    assert abs(timestamp_ms - time.time() * 1000) < 60_000  # ids carry the member's clock


def test_topic_delivers_in_order_with_member_and_time(client: Any, unique_name: str) -> None:
    topic = client.get_topic(unique_name).blocking()
    received: list[Any] = []
    registration = topic.add_listener(received.append)
    before_ms = time.time() * 1000
    for i in range(20):
        topic.publish(f"m{i}")
    topic.publish_all(["x", "y"])
    wait_until(lambda: len(received) >= 22, message="22 topic messages")
    assert [message.message for message in received] == [f"m{i}" for i in range(20)] + ["x", "y"]
    assert all(message.member is not None for message in received)
    assert all(message.publish_time * 1000 >= before_ms - 60_000 for message in received)
    assert topic.remove_listener(registration) is True
    assert topic.remove_listener(registration) is False


def test_removed_topic_listener_gets_nothing(client: Any, unique_name: str) -> None:
    topic = client.get_topic(unique_name).blocking()
    removed: list[Any] = []
    kept: list[Any] = []
    registration = topic.add_listener(removed.append)
    topic.add_listener(kept.append)
    topic.remove_listener(registration)
    topic.publish("after")
    wait_until(lambda: kept, message="the remaining listener's message")
    assert removed == []


# ---------------------------------------------------------------------------------------------- engine level


def test_cp_is_refused_by_default_as_hazelcast_5_7_refuses_it() -> None:
    atomics = Atomics()
    assert atomics.mode is CpMode.DISABLED
    with pytest.raises(UnsupportedOperation) as raised:
        atomics.create_group("counter")
    assert (raised.value.code, str(raised.value)) == (61, CP_REFUSED)


def test_atomic_engine_details() -> None:
    atomics = Atomics(CpMode.UNSAFE)
    group = atomics.create_group("c@grp")
    assert (group.name, group.seed) == ("grp", 0)
    assert atomics.create_group("c") == RaftGroupId("default", 0, atomics.create_group("d").id)
    with pytest.raises(IllegalArgument, match="metadata"):
        atomics.create_group("c@METADATA")
    java_function = bytes(4) + (-2).to_bytes(4, "big", signed=True) + b"\x01" + (-10).to_bytes(4, "big", signed=True)
    with pytest.raises(UnsupportedOperation, match="IFunction"):
        atomics.apply_function(group, "c", java_function + bytes(4))
    a_string = bytes(4) + (-11).to_bytes(4, "big", signed=True) + b"\x00\x00\x00\x01x"
    with pytest.raises(ClassCast, match=r"class java\.lang\.String cannot be cast to class com\.hazelcast"):
        atomics.apply_function(group, "c", a_string)
    atomics.destroy(group, "hz:raft:atomicLongService", "c")
    with pytest.raises(DistributedObjectDestroyed, match=r"AtomicValue\[c\] is already destroyed!"):
        atomics.get(group, "c")


def test_flake_id_algorithm() -> None:
    clock = ManualClock(wall_ms=EPOCH_START_MS + 1000)
    flakes = FlakeIds(clock, node_id=3)
    first = flakes.new_id_batch("f", 10)
    assert first.base == ((1000 << 6) << 16) | 3 and first.increment == 1 << 16 and first.wait_ms == 0
    second = flakes.new_id_batch("f", 100)  # same millisecond: continues after the first batch
    assert second.base == (((1000 << 6) + 10) << 16) | 3
    assert flakes.new_id_batch("other", 1).base == first.base  # generators are independent
    with pytest.raises(IllegalArgument, match="batchSize"):
        flakes.new_id_batch("f", 0)
    ahead = FlakeIds(clock, allowed_future_ms=1)
    assert ahead.new_id_batch("f", 64 * 5).wait_ms == 4  # 5 ms worth of ids, 1 ms allowed ahead
