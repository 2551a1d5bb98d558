"""Every ring buffer operation through the official client over TCP, against the grid under test.

Only Hazelcast's documented behaviour is asserted, so this passes against a real Hazelcast 5.x member too
(``METEOR_TEST_HAZELCAST=host:port``). Rings that need a small capacity or a TTL get it through the dynamic
configuration (``Grid.add_ring_config``), which works on both.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import hazelcast
import pytest
from hazelcast.errors import IllegalArgumentError, StaleSequenceError
from hazelcast.future import Future
from hazelcast.proxy.reliable_topic import BlockingReliableTopic
from hazelcast.proxy.ringbuffer import BlockingRingbuffer, Ringbuffer

from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.testing import wait_until

OVERWRITE, FAIL = 0, 1


@pytest.fixture(scope="module")
def client(grid_settings: GridSettings) -> Iterator[hazelcast.HazelcastClient]:
    c = hazelcast.HazelcastClient(**grid_settings.client_config())
    yield c
    c.shutdown()


@pytest.fixture(scope="module")
def other_client(grid_settings: GridSettings) -> Iterator[hazelcast.HazelcastClient]:
    c = hazelcast.HazelcastClient(**grid_settings.client_config())
    yield c
    c.shutdown()


def items(*values: bytes) -> list[bytearray]:
    return [bytearray(v) for v in values]


def test_new_ring_reports_hazelcast_defaults(client: hazelcast.HazelcastClient, unique_name: str) -> None:
    ring: BlockingRingbuffer[bytearray] = client.get_ringbuffer(unique_name).blocking()
    assert ring.capacity() == 10_000
    assert (ring.size(), ring.tail_sequence(), ring.head_sequence(), ring.remaining_capacity()) == (0, -1, 0, 10_000)


def test_add_add_all_read_one_read_many(client: hazelcast.HazelcastClient, unique_name: str) -> None:
    ring: BlockingRingbuffer[bytearray] = client.get_ringbuffer(unique_name).blocking()
    assert ring.add(bytearray(b"a")) == 0
    assert ring.add_all(items(b"b", b"c", b"\x00\xff")) == 3
    assert ring.read_one(3) == bytearray(b"\x00\xff")
    result = ring.read_many(1, 1, 10)
    assert list(result) == items(b"b", b"c", b"\x00\xff")
    assert [result.get_sequence(i) for i in range(len(result))] == [1, 2, 3]
    assert result.read_count == 3 and result.next_sequence_to_read_from == 4
    assert (ring.size(), ring.tail_sequence(), ring.head_sequence()) == (4, 3, 0)


def test_read_many_respects_max_count(client: hazelcast.HazelcastClient, unique_name: str) -> None:
    ring: BlockingRingbuffer[bytearray] = client.get_ringbuffer(unique_name).blocking()
    ring.add_all(items(*[bytes([i]) for i in range(20)]))
    result = ring.read_many(5, 0, 7)
    assert [result.get_sequence(i) for i in range(len(result))] == list(range(5, 12))
    assert result.next_sequence_to_read_from == 12


def test_read_many_with_nothing_to_read_and_min_zero(client: hazelcast.HazelcastClient, unique_name: str) -> None:
    ring: BlockingRingbuffer[bytearray] = client.get_ringbuffer(unique_name).blocking()
    ring.add(bytearray(b"a"))
    result = ring.read_many(1, 0, 10)
    assert list(result) == []
    assert result.next_sequence_to_read_from == 0  # Hazelcast's quirk: not the start sequence


def test_large_items_round_trip(client: hazelcast.HazelcastClient, unique_name: str) -> None:
    ring: BlockingRingbuffer[bytearray] = client.get_ringbuffer(unique_name).blocking()
    payloads = [bytearray(bytes([i]) * (256 * 1024)) for i in range(8)]
    assert ring.add_all(payloads) == 7
    assert list(ring.read_many(0, 8, 8)) == payloads


def test_overwrite_moves_head_and_reads_clamp_or_fail(
    client: hazelcast.HazelcastClient, grid: Grid, unique_name: str
) -> None:
    grid.add_ring_config(unique_name, capacity=3)
    ring: BlockingRingbuffer[bytearray] = client.get_ringbuffer(unique_name).blocking()
    assert ring.capacity() == 3
    for i in range(5):
        assert ring.add(bytearray([i])) == i
    assert (ring.head_sequence(), ring.tail_sequence(), ring.size()) == (2, 4, 3)
    with pytest.raises(StaleSequenceError, match="sequence:0 is too small"):
        ring.read_one(0)
    with pytest.raises(IllegalArgumentError, match="sequence:6 is too large"):
        ring.read_one(6)
    result = ring.read_many(0, 1, 3)
    assert [result.get_sequence(i) for i in range(len(result))] == [2, 3, 4]


def test_fail_policy_without_ttl_overwrites(client: hazelcast.HazelcastClient, grid: Grid, unique_name: str) -> None:
    grid.add_ring_config(unique_name, capacity=2)
    ring: BlockingRingbuffer[bytearray] = client.get_ringbuffer(unique_name).blocking()
    assert [ring.add(bytearray(b"x"), FAIL) for _ in range(3)] == [0, 1, 2]
    assert ring.remaining_capacity() == 2


def test_fail_policy_with_ttl_refuses_a_full_ring(
    client: hazelcast.HazelcastClient, grid: Grid, unique_name: str
) -> None:
    grid.add_ring_config(unique_name, capacity=2, ttl_s=3600)
    ring: BlockingRingbuffer[bytearray] = client.get_ringbuffer(unique_name).blocking()
    assert ring.add_all(items(b"a", b"b"), FAIL) == 1
    assert ring.remaining_capacity() == 0
    assert ring.add(bytearray(b"c"), FAIL) == -1
    assert ring.add_all(items(b"c"), FAIL) == -1
    assert ring.tail_sequence() == 1
    assert ring.add(bytearray(b"c"), OVERWRITE) == 2


def test_ttl_expires_items(client: hazelcast.HazelcastClient, grid: Grid, unique_name: str) -> None:
    grid.add_ring_config(unique_name, capacity=10, ttl_s=1)
    ring: BlockingRingbuffer[bytearray] = client.get_ringbuffer(unique_name).blocking()
    ring.add_all(items(b"a", b"b"))
    wait_until(lambda: ring.size() == 0, timeout_s=10, message="items to expire after the 1 s TTL")
    assert (ring.head_sequence(), ring.tail_sequence()) == (2, 1)
    with pytest.raises(StaleSequenceError):
        ring.read_one(1)


def test_blocking_read_many_is_woken_by_another_client(
    client: hazelcast.HazelcastClient, other_client: hazelcast.HazelcastClient, unique_name: str
) -> None:
    reader: Ringbuffer[bytearray] = client.get_ringbuffer(unique_name)
    reader.blocking().add(bytearray(b"first"))
    pending = reader.read_many(1, 2, 10)
    writer: BlockingRingbuffer[bytearray] = other_client.get_ringbuffer(unique_name).blocking()
    writer.add(bytearray(b"second"))
    assert not pending.done(), "min_count 2 is not reached by one item"
    writer.add(bytearray(b"third"))
    result = pending.result()
    assert list(result) == items(b"second", b"third")
    assert result.next_sequence_to_read_from == 3


def test_blocking_read_one_is_woken_by_an_add(
    client: hazelcast.HazelcastClient, other_client: hazelcast.HazelcastClient, unique_name: str
) -> None:
    ring: Ringbuffer[bytearray] = client.get_ringbuffer(unique_name)
    ring.blocking().add(bytearray(b"a"))
    pending = ring.read_one(1)
    other_client.get_ringbuffer(unique_name).blocking().add(bytearray(b"b"))
    assert pending.result() == bytearray(b"b")


def test_a_blocked_read_does_not_stall_its_connection_or_other_clients(
    client: hazelcast.HazelcastClient, other_client: hazelcast.HazelcastClient, unique_name: str
) -> None:
    blocked = client.get_ringbuffer(unique_name + "-idle").read_many(0, 1, 1)
    busy: BlockingRingbuffer[bytearray] = client.get_ringbuffer(unique_name).blocking()
    for i in range(50):
        assert busy.add(bytearray([i])) == i
    assert other_client.get_ringbuffer(unique_name).blocking().size() == 50
    assert not blocked.done()
    client.get_ringbuffer(unique_name + "-idle").blocking().add(bytearray(b"wake"))
    assert list(blocked.result()) == items(b"wake")


def test_many_concurrent_clients(grid_settings: GridSettings, unique_name: str) -> None:
    clients = [hazelcast.HazelcastClient(**grid_settings.client_config()) for _ in range(6)]
    try:
        errors: list[BaseException] = []

        def work(index: int, c: hazelcast.HazelcastClient) -> None:
            try:
                ring: BlockingRingbuffer[bytearray] = c.get_ringbuffer(unique_name).blocking()
                for j in range(40):
                    ring.add(bytearray(f"{index}:{j}".encode()))
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(i, c)) for i, c in enumerate(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not errors
        ring: BlockingRingbuffer[bytearray] = clients[0].get_ringbuffer(unique_name).blocking()
        assert ring.size() == 240
        seen = [bytes(x).decode() for start in range(0, 240, 100) for x in ring.read_many(start, 0, 100)]
        for index in range(6):
            mine = [s for s in seen if s.startswith(f"{index}:")]
            assert mine == [f"{index}:{j}" for j in range(40)], "each client's writes keep their order"
    finally:
        for c in clients:
            c.shutdown()


def test_destroy_drops_the_data(client: hazelcast.HazelcastClient, unique_name: str) -> None:
    ring: Ringbuffer[bytearray] = client.get_ringbuffer(unique_name)
    ring.blocking().add_all(items(b"a", b"b"))
    ring.destroy()
    fresh: BlockingRingbuffer[bytearray] = client.get_ringbuffer(unique_name).blocking()
    assert (fresh.size(), fresh.tail_sequence()) == (0, -1)


def test_dynamic_config_conflict_is_refused(client: hazelcast.HazelcastClient, grid: Grid, unique_name: str) -> None:
    from meteor_spark.errors import GridOperationError

    grid.add_ring_config(unique_name + "*", capacity=5, ttl_s=0)
    grid.add_ring_config(unique_name + "*", capacity=5, ttl_s=0)  # the same again is fine
    with pytest.raises(GridOperationError) as caught:
        grid.add_ring_config(unique_name + "*", capacity=6, ttl_s=0)
    assert caught.value.code == 32
    assert "as there is already a conflicting configuration" in str(caught.value)
    assert client.get_ringbuffer(unique_name + ".0").blocking().capacity() == 5


def test_read_one_on_an_untouched_ring_parks_until_the_first_add(
    client: hazelcast.HazelcastClient, other_client: hazelcast.HazelcastClient, unique_name: str
) -> None:
    pending: Future[bytearray] = client.get_ringbuffer(unique_name).read_one(0)
    # The same connection answers in order: once this size comes back, the read was served and is parked.
    assert client.get_ringbuffer(unique_name).blocking().size() == 0
    assert not pending.done()
    other_client.get_ringbuffer(unique_name).blocking().add(bytearray(b"first"))
    assert pending.result() == bytearray(b"first")


def test_read_many_beyond_the_tail_waits_from_tail_plus_one(
    client: hazelcast.HazelcastClient, unique_name: str
) -> None:
    ring: Ringbuffer[bytearray] = client.get_ringbuffer(unique_name)
    ring.blocking().add_all(items(b"a", b"b"))
    pending = ring.read_many(10, 1, 5)  # clamped to tail + 1 = 2: waits for the next item, not for sequence 10
    assert ring.blocking().size() == 2
    assert not pending.done()
    ring.blocking().add(bytearray(b"c"))
    result = pending.result()
    assert list(result) == items(b"c")
    assert result.get_sequence(0) == 2 and result.next_sequence_to_read_from == 3


def test_reliable_topic_runs_on_a_ring_buffer(client: hazelcast.HazelcastClient, unique_name: str) -> None:
    """ReliableTopic has no messages of its own: it is ring buffer ``_hz_rb_<name>`` plus add / read_many."""
    topic: BlockingReliableTopic[str] = client.get_reliable_topic(unique_name).blocking()
    received: list[str] = []
    registration = topic.add_listener(lambda message: received.append(message.message))
    for i in range(30):
        topic.publish(f"m{i}")
    wait_until(lambda: len(received) >= 30, message="30 reliable topic messages")
    assert received == [f"m{i}" for i in range(30)]
    assert client.get_ringbuffer(f"_hz_rb_{unique_name}").blocking().tail_sequence() == 29
    assert topic.remove_listener(registration) is True


@pytest.mark.embedded_only
def test_read_many_with_a_filter_is_unsupported_by_the_embedded_member(
    client: hazelcast.HazelcastClient, unique_name: str
) -> None:
    """A filter is a serialized Java ``IFunction``, which only a Java member can run: ours answers code 61."""
    from hazelcast.errors import UnsupportedOperationError
    from hazelcast.invocation import Invocation
    from hazelcast.protocol.codec import ringbuffer_read_many_codec
    from hazelcast.serialization.data import Data

    java_function = Data(b"\x00\x00\x00\x00\xff\xff\xff\xfe" + b"\x00" * 8)  # an IdentifiedDataSerializable header
    request = ringbuffer_read_many_codec.encode_request(unique_name, 0, 0, 10, java_function)
    invocation = Invocation(request, partition_id=0, response_handler=lambda message: message)
    client._invocation_service.invoke(invocation)
    with pytest.raises(UnsupportedOperationError, match="filter needs a Java IFunction"):
        invocation.future.result()
