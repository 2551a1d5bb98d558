"""Clients that misbehave without closing their connection: one that stops reading its responses, one that goes
silent (network partition, frozen process). Both are played by a raw socket client (the official one always reads
and pings); the member runs in a thread so the tests can look at its connections (``EmbeddedGrid.connections``)."""

from __future__ import annotations

from typing import Any

import hazelcast
import pytest
from hazelcast.config import Config
from hazelcast.lifecycle import LifecycleState
from hazelcast.proxy.map import BlockingMap
from hazelcast.serialization.service import SerializationServiceV1
from raw_client import RawClient, correlation_id_of, message_type_of

from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.server import EmbeddedGrid, RingConfig, tcp
from meteor_spark.server.protocol import message_codec
from meteor_spark.server.protocol import messages as m
from meteor_spark.server.protocol import messages_data as md
from meteor_spark.server.tcp import HANDOFF_BYTES, OUTPUT_HIGH_WATER, ConnectionInfo
from meteor_spark.testing import wait_until

pytestmark = pytest.mark.embedded_only

ITEM_BYTES = 64 * 1024
ITEMS = 32  # one read_many response: 2 MiB
REQUESTS = 24  # 48 MiB of responses if the member buffered them all


def _connection(member: EmbeddedGrid, client_name: str) -> ConnectionInfo | None:
    return next((info for info in member.connections() if info.client_name == client_name), None)


def _read_many(
    name: str, start: int, min_count: int, max_count: int
) -> tuple[message_codec.MessageSpec, dict[str, Any]]:
    values = {"name": name, "start_sequence": start, "min_count": min_count, "max_count": max_count, "filter": None}
    return m.RINGBUFFER_READ_MANY, values


@pytest.mark.timeout(120)
@pytest.mark.parametrize("writev", [True, False], ids=["writev", "transport-only"])
def test_a_client_that_stops_reading_costs_bounded_memory_and_stalls_nobody(
    unique_name: str, writev: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    items = [bytes([index]) * ITEM_BYTES for index in range(ITEMS)]
    woken_items = [bytes([100 + index]) * ITEM_BYTES for index in range(ITEMS)]
    # Bytes the member may hold for the client: up to the high-water mark, plus the response that crossed it.
    response_bytes = ITEMS * (ITEM_BYTES + 6) + 1024
    bound = OUTPUT_HIGH_WATER + response_bytes + HANDOFF_BYTES
    if not writev:
        # Where os.writev is missing (Windows) everything goes through the transport, which also takes up to
        # about that much before it pauses.
        monkeypatch.setattr(tcp, "_WRITEV", None)
        bound = 2 * (OUTPUT_HIGH_WATER + response_bytes)
    with (
        EmbeddedGrid(ring_configs=[RingConfig(unique_name, capacity=4 * ITEMS)]) as member,
        Grid(GridSettings(members=(member.address,), cluster_name=member.cluster_name)) as grid,
    ):
        ring = grid.ring(unique_name)
        ring.add_all(items)
        with RawClient(member.address, receive_buffer=64 * 1024, timeout_s=30) as slow:
            slow.authenticate(client_name="stops-reading")
            # A long poll (woken below) and many big reads, received by the member together; then no reading.
            parked, *requested = slow.send_all(
                [_read_many(unique_name, ITEMS, ITEMS, ITEMS)]
                + [_read_many(unique_name, 0, 1, ITEMS) for _ in range(REQUESTS)]
            )

            held = wait_until(
                lambda: (
                    (info := _connection(member, "stops-reading")) is not None
                    and info.congested
                    and info.backlog > 0
                    and info
                ),
                message="the member to hold back the requests of the client that does not read",
            )
            assert held  # narrows the poll's `... and info` to the ConnectionInfo
            assert held.queued_bytes + held.transport_bytes <= bound, held

            # Other clients are served meanwhile, and the woken long poll does not add to what is held: its
            # 2 MiB answer waits until the client reads (only the kernel could shrink the queue, and it is full).
            ring.add_all(woken_items)
            for index in range(20):
                assert ring.read_many(ITEMS + index % ITEMS, 1, 1).items == [woken_items[index % ITEMS]]
            grid.map(unique_name).put("k", str(index))
            after = _connection(member, "stops-reading")
            assert after is not None and after.congested
            assert after.queued_bytes <= held.queued_bytes, (held, after)
            assert after.queued_bytes + after.transport_bytes <= bound, after

            # The client reads at last: every response arrives once, whole, and correct.
            responses: dict[int, dict[str, Any]] = {}
            while len(responses) < REQUESTS + 1:
                message = slow.receive(deadline_s=30)
                correlation_id = correlation_id_of(message)
                assert correlation_id not in responses
                assert message_type_of(message) == m.RINGBUFFER_READ_MANY.response_type
                responses[correlation_id] = message_codec.decode_response(m.RINGBUFFER_READ_MANY, message)
            for correlation_id in requested:
                assert [bytes(item) for item in responses[correlation_id]["items"]] == _serialized(items)
            assert [bytes(item) for item in responses[parked]["items"]] == _serialized(woken_items)
            drained = wait_until(
                lambda: (
                    (info := _connection(member, "stops-reading")) is not None
                    and not info.congested
                    and info.queued_bytes == 0
                    and info
                ),
                message="the member to resume the client",
            )
            assert drained  # narrows the poll's `... and info` to the ConnectionInfo
            assert drained.backlog == 0
            # ... and it is served normally again.
            assert slow.call(m.RINGBUFFER_SIZE, name=unique_name)["response"] == 2 * ITEMS


_SERIALIZATION = SerializationServiceV1(Config())


def _serialized(values: list[Any]) -> list[bytes]:
    """``values`` as the official client puts them on the wire (so raw and official clients name the same data);
    ``bytes`` as ``meteor_spark.grid.client`` sends them (a byte array)."""
    return [
        bytes(_SERIALIZATION.to_data(bytearray(value) if isinstance(value, bytes) else value).buffer)
        for value in values
    ]


@pytest.mark.timeout(120)
def test_a_silent_client_is_disconnected_and_its_lock_released_while_a_pinging_idle_client_stays(
    unique_name: str,
) -> None:
    timeout_s = 1.0
    with EmbeddedGrid(client_heartbeat_timeout_s=timeout_s) as member:
        events: list[str] = []
        idle = hazelcast.HazelcastClient(
            cluster_members=[member.address],
            cluster_name=member.cluster_name,
            heartbeat_interval=timeout_s / 10,  # an idle client pings (every 5 s by default, against 60 s)
            lifecycle_listeners=[events.append],
        )
        try:
            locks: BlockingMap[str, str] = idle.get_map(unique_name).blocking()
            idle_connection = wait_until(lambda: member.connections(), message="the idle client's connection")
            assert len(idle_connection) == 1

            silent = RawClient(member.address)
            try:
                silent.authenticate(client_name="vanishes")
                silent.call(
                    md.MAP_LOCK, name=unique_name, key=_serialized(["k"])[0], thread_id=1, ttl=-1, reference_id=1
                )
                assert locks.is_locked("k")
                # It now says nothing and does not close: like a frozen process or a cut cable.
                wait_until(lambda: not locks.is_locked("k"), timeout_s=30, message="the silent client's lock release")
                assert _connection(member, "vanishes") is None
                _wait_closed(silent)
            finally:
                silent.close()
            # More silent connections (not even authenticated) go the same way; each takes a heartbeat timeout,
            # so the idle client has now been idle for several of them.
            for _ in range(2):
                with RawClient(member.address) as mute:
                    _wait_closed(mute)
            assert [info.remote for info in member.connections()] == [idle_connection[0].remote], (
                "the idle official client keeps its one connection"
            )
            assert LifecycleState.DISCONNECTED not in events
            assert locks.try_lock("k") and locks.is_locked("k")
        finally:
            idle.shutdown()


@pytest.mark.timeout(120)
def test_a_held_back_client_that_pings_stays_connected_while_a_frozen_one_is_closed(unique_name: str) -> None:
    """Back-pressure must not look like silence: the member keeps reading a client it holds back."""
    timeout_s = 1.0
    with EmbeddedGrid(client_heartbeat_timeout_s=timeout_s, ring_configs=[RingConfig(unique_name, ITEMS)]) as member:
        with Grid(GridSettings(members=(member.address,), cluster_name=member.cluster_name)) as grid:
            grid.ring(unique_name).add_all([bytes([index]) * ITEM_BYTES for index in range(ITEMS)])
        reads = [_read_many(unique_name, 0, 1, ITEMS) for _ in range(8)]
        with (
            RawClient(member.address, receive_buffer=64 * 1024) as alive,
            RawClient(member.address, receive_buffer=64 * 1024) as frozen,
        ):
            alive.authenticate(client_name="pinging")
            frozen.authenticate(client_name="frozen")
            requested = alive.send_all(reads)
            frozen.send_all(reads)

            def both_held() -> bool:
                return all(
                    (info := _connection(member, name)) is not None and info.congested for name in ("pinging", "frozen")
                )

            wait_until(both_held, message="the member to hold back both clients")
            pings: list[int] = []

            def ping_until_frozen_is_closed() -> bool:
                pings.append(alive.send(m.CLIENT_PING))
                return _connection(member, "frozen") is None

            wait_until(ping_until_frozen_is_closed, timeout_s=30, interval_s=timeout_s / 10)
            _wait_closed(frozen)
            assert _connection(member, "pinging") is not None, "pings keep a held-back client connected"
            # Everything it asked for arrives once it reads.
            answered: set[int] = set()
            while not answered >= set(requested + pings):
                answered.add(correlation_id_of(alive.receive(deadline_s=30)))


def _wait_closed(client: RawClient, timeout_s: float = 30.0) -> None:
    """Read until the member closes the connection (EOF or reset); raises ``socket.timeout`` if it does not."""
    client.sock.settimeout(timeout_s)
    try:
        while client.sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
