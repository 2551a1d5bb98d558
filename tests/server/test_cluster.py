"""Connection handshake, cluster view, proxies and distributed objects through the official client over TCP."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import hazelcast
import pytest
from hazelcast.errors import IllegalStateError, UnsupportedOperationError
from hazelcast.proxy.ringbuffer import BlockingRingbuffer, Ringbuffer

from meteor_spark.errors import GridConnectionError
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.testing import wait_until

RING_SERVICE = "hz:impl:ringbufferService"


def connect(settings: GridSettings, **overrides: object) -> hazelcast.HazelcastClient:
    config = settings.client_config()
    config.update(overrides)
    return hazelcast.HazelcastClient(**config)


@pytest.fixture(scope="module")
def client(grid_settings: GridSettings) -> Iterator[hazelcast.HazelcastClient]:
    c = connect(grid_settings)
    yield c
    c.shutdown()


@pytest.mark.parametrize("smart", [True, False], ids=["smart", "unisocket"])
def test_client_connects_and_sees_one_member_with_271_partitions(grid_settings: GridSettings, smart: bool) -> None:
    c = connect(grid_settings, smart_routing=smart)
    try:
        assert c.lifecycle_service.is_running()
        members = c.cluster_service.get_members()
        assert len(members) >= 1
        # A real member may deliver the partition table after the member list: poll for it.
        partitions = c.partition_service
        wait_until(lambda: partitions.get_partition_count() == 271, timeout_s=30, message="the partition table")
        if len(members) == 1:
            wait_until(
                lambda: partitions.get_partition_owner(0) is not None, timeout_s=30, message="the owner of partition 0"
            )
            assert partitions.get_partition_owner(0) == members[0].uuid
        ring: BlockingRingbuffer[bytes] = c.get_ringbuffer("t-connect-probe").blocking()
        assert ring.capacity() >= 1
    finally:
        c.shutdown()


def test_wrong_cluster_name_is_refused(grid_settings: GridSettings) -> None:
    with pytest.raises(IllegalStateError, match="Unable to connect to any cluster"):
        connect(grid_settings, cluster_name="not-" + grid_settings.cluster_name, cluster_connect_timeout=1.0)


def test_wrong_cluster_name_through_grid_is_a_connection_error(grid_settings: GridSettings) -> None:
    settings = dataclasses.replace(grid_settings, cluster_name="nope", connect_timeout_s=1.0)
    with pytest.raises(GridConnectionError, match="cluster 'nope'"):
        Grid(settings)


@pytest.mark.embedded_only
def test_credentials_are_required_and_checked() -> None:
    from meteor_spark.server import EmbeddedGrid

    with EmbeddedGrid(username="alice", password="s3cret") as member:
        assert "s3cret" not in repr(member)
        settings = GridSettings(members=(member.address,), username="alice", password="s3cret", connect_timeout_s=1.0)
        good = Grid(settings)
        try:
            assert good.ring("r").add(b"x") == 0
        finally:
            good.close()
        for username, password in [("alice", "wrong"), ("bob", "s3cret")]:
            with pytest.raises(GridConnectionError):
                Grid(dataclasses.replace(settings, username=username, password=password))
        with pytest.raises(IllegalStateError):
            hazelcast.HazelcastClient(cluster_members=[member.address], cluster_connect_timeout=1.0)


def test_unknown_message_type_gets_unsupported_operation(client: hazelcast.HazelcastClient) -> None:
    from hazelcast.invocation import Invocation
    from hazelcast.protocol.client_message import REQUEST_HEADER_SIZE, OutboundMessage, create_initial_buffer

    request = OutboundMessage(create_initial_buffer(REQUEST_HEADER_SIZE, 0x7E0100, True), False)
    invocation = Invocation(request, response_handler=lambda message: message)
    client._invocation_service.invoke(invocation)
    with pytest.raises(UnsupportedOperationError, match="0x7e0100"):
        invocation.future.result()
    assert client.get_ringbuffer("t-after-unknown").blocking().size() == 0, "the connection stays usable"


def test_distributed_objects_are_listed_and_destroyed(
    client: hazelcast.HazelcastClient, grid_settings: GridSettings, unique_name: str
) -> None:
    other = connect(grid_settings)
    try:
        other.get_ringbuffer(unique_name).blocking().size()
        wait_until(
            lambda: any(
                o.name == unique_name and o.service_name == RING_SERVICE for o in client.get_distributed_objects()
            ),
            message=f"{unique_name} in the distributed objects",
        )
        other.get_ringbuffer(unique_name).destroy()
        wait_until(
            lambda: all(o.name != unique_name for o in client.get_distributed_objects()),
            message=f"{unique_name} gone from the distributed objects",
        )
    finally:
        other.shutdown()


def test_distributed_object_listener_sees_created_and_destroyed(
    client: hazelcast.HazelcastClient, grid_settings: GridSettings, unique_name: str
) -> None:
    events: list[tuple[str, str, str]] = []
    registration = client.add_distributed_object_listener(
        lambda e: events.append((e.name, e.service_name, e.event_type))
    ).result()
    other = connect(grid_settings)
    try:
        ring: Ringbuffer[bytes] = other.get_ringbuffer(unique_name)
        ring.blocking().size()
        client.get_ringbuffer(unique_name).blocking().size()  # a second create_proxy: idempotent, no new event
        ring.destroy()
        wait_until(
            lambda: (unique_name, RING_SERVICE, "DESTROYED") in events,
            message="CREATED and DESTROYED events",
        )
        assert events.index((unique_name, RING_SERVICE, "CREATED")) < events.index(
            (unique_name, RING_SERVICE, "DESTROYED")
        )
        assert events.count((unique_name, RING_SERVICE, "CREATED")) == 1
    finally:
        other.shutdown()
        assert client.remove_distributed_object_listener(registration).result() is True


def test_grid_distributed_objects(grid: Grid, unique_name: str) -> None:
    grid.ring(unique_name).add(b"x")
    assert (RING_SERVICE, unique_name) in grid.distributed_objects()


def test_compact_schema_is_stored_and_served(
    client: hazelcast.HazelcastClient, grid_settings: GridSettings, unique_name: str
) -> None:
    """A compact-serialized value written by one client is readable by another (schemas go through the member)."""
    from hazelcast.serialization.api import CompactReader, CompactSerializer, CompactWriter

    class Point:
        def __init__(self, x: int, y: int) -> None:
            self.x, self.y = x, y

    class PointSerializer(CompactSerializer[Point]):
        def read(self, reader: CompactReader) -> Point:
            return Point(reader.read_int32("x"), reader.read_int32("y"))

        def write(self, writer: CompactWriter, obj: Point) -> None:
            writer.write_int32("x", obj.x)
            writer.write_int32("y", obj.y)

        def get_class(self) -> type[Point]:
            return Point

        def get_type_name(self) -> str:
            return "meteor.test.Point"

    writer = connect(grid_settings, compact_serializers=[PointSerializer()])
    reader = connect(grid_settings, compact_serializers=[PointSerializer()])
    try:
        writer.get_ringbuffer(unique_name).blocking().add(Point(3, 4))
        point: Point = reader.get_ringbuffer(unique_name).blocking().read_one(0)
        assert (point.x, point.y) == (3, 4)
    finally:
        writer.shutdown()
        reader.shutdown()


def test_many_clients_connect_at_once(grid_settings: GridSettings) -> None:
    clients = [connect(grid_settings) for _ in range(8)]
    try:
        assert all(c.lifecycle_service.is_running() for c in clients)
    finally:
        for c in clients:
            c.shutdown()
