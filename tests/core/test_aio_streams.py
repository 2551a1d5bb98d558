"""The asyncio clients on streams with a deduplication window, typed and ephemeral streams, and with Prometheus
export, against the real client and real TCP: a message id refused across asyncio and threaded publishers naming
the first copy's offset, a dead publisher's pending claim taken over after its lease; Avro values crossing between
the asyncio and the threaded clients both ways over two schema versions, the threaded checks and on_corrupt;
asyncio and threaded entities of an ephemeral stream each getting what their topics match once, what nobody wants
dropped and counted; the asyncio clients' series in a registry's text exposition.

Each test runs its coroutine with ``asyncio.run`` (no pytest-asyncio needed).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any, cast

import prometheus_client
import pytest

from meteor_spark.aio import AsyncPublisher, AsyncSubscriber
from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.errors import ConfigError, DuplicateMessageError, SerializationError
from meteor_spark.format.avro import SCHEMA_HEADER, AvroValues
from meteor_spark.format.offsets import sequence_of
from meteor_spark.format.records import Record
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.schemas import register_schema
from meteor_spark.grid.streams import StreamConfig
from meteor_spark.grid.subscriptions import NOT_STORED, live_subscriptions
from meteor_spark.producer.dedup import PENDING, WRITTEN, dedup_map_name
from meteor_spark.producer.publisher import Publisher
from meteor_spark.testing import wait_until


def _run(coroutine: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coroutine, 60))


def _order(*fields: dict[str, Any]) -> dict[str, Any]:
    return {"type": "record", "name": "Order", "namespace": "shop", "fields": list(fields)}


ID = {"name": "id", "type": "long"}
CUSTOMER = {"name": "customer", "type": "string"}
AMOUNT = {"name": "amount", "type": "double", "default": 0.0}
V1 = _order(ID, CUSTOMER)
V2 = _order(ID, CUSTOMER, AMOUNT)


@dataclass
class Order:
    id: int
    customer: str
    amount: float = 0.0


async def _poll(sub: AsyncSubscriber, count: int, timeout_s: float = 10.0) -> list[Record]:
    got: list[Record] = []
    deadline = asyncio.get_running_loop().time() + timeout_s
    while len(got) < count:
        assert asyncio.get_running_loop().time() < deadline, f"{len(got)} of {count} records"
        got.extend(await sub.poll(100))
    return got


def test_typed_values_cross_asyncio_and_threaded_clients_over_two_versions(
    grid: Grid, grid_settings: GridSettings, unique_name: str
) -> None:
    config = StreamConfig(unique_name, lanes=2, value_format="avro")
    register_schema(grid, unique_name, V1)
    with Publisher(grid, config) as threaded_v1:
        threaded_v1.publish({"id": 1, "customer": "ann"})

    async def publish_v1() -> None:
        async with AsyncPublisher(grid_settings, unique_name) as pub_v1:
            await pub_v1.publish({"id": 2, "customer": "bob"})
            with pytest.raises(SerializationError, match="customer"):
                await pub_v1.publish({"id": 3, "customer": 42})

    async def publish_v2_and_read() -> None:
        async with AsyncPublisher(grid_settings, unique_name) as pub_v2:
            await pub_v2.publish(Order(4, "cy", 9.5))
        async with AsyncSubscriber(
            grid_settings, unique_name, initial_offset_scheme="earliest", value_deserializer=AvroValues(into=Order)
        ) as sub:
            got = await _poll(sub, 4)
            orders = [cast(Order, r.value) for r in got]
            assert sorted((o.id, o.amount) for o in orders) == [(1, 0.0), (2, 0.0), (4, 9.5), (5, 1.5)]
            assert {dict(r.headers)[SCHEMA_HEADER] for r in got} == {b"1", b"2"}

    _run(publish_v1())
    register_schema(grid, unique_name, V2)
    with Publisher(grid, unique_name) as threaded_v2:
        threaded_v2.publish({"id": 5, "customer": "dee", "amount": 1.5})
    _run(publish_v2_and_read())
    with Subscriber(grid, unique_name, initial_offset_scheme="earliest") as threaded:
        got: list[Record] = []
        wait_until(lambda: got.extend(threaded.poll(50)) or len(got) >= 4, 10, message="4 records")
    values: dict[int, Any] = {cast(dict[str, Any], r.value)["id"]: r.value for r in got}
    assert sorted(values) == [1, 2, 4, 5]
    assert values[2] == {"id": 2, "customer": "bob", "amount": 0.0}
    assert values[4] == {"id": 4, "customer": "cy", "amount": 9.5}


def test_an_undecodable_typed_record_is_skipped_by_on_corrupt(
    grid: Grid, grid_settings: GridSettings, unique_name: str
) -> None:
    register_schema(grid, unique_name, V1)
    Publisher(grid, StreamConfig(unique_name, value_format="avro")).close()
    with Publisher(grid, unique_name, value_serializer="bytes") as raw:
        raw.publish(Record(b"\xff\xff\xff", headers=((SCHEMA_HEADER, b"1"),)))
        raw.publish(Record(b"no header"))
    with Publisher(grid, unique_name) as typed:
        typed.publish({"id": 1, "customer": "ann"})

    async def scenario() -> None:
        async with AsyncSubscriber(
            grid_settings, unique_name, initial_offset_scheme="earliest", on_corrupt="skip"
        ) as sub:
            got = await _poll(sub, 1)
            assert [cast(Any, r.value) for r in got] == [{"id": 1, "customer": "ann"}]
            assert sequence_of(got[0].offset) == 2
            assert sub.metrics()["undecodable_records"] == 2

    _run(scenario())


def test_a_typed_setting_on_a_stream_without_schema_is_refused(grid_settings: GridSettings, unique_name: str) -> None:
    async def scenario() -> None:
        with pytest.raises(ConfigError, match="has no schema; register one first"):
            await AsyncPublisher(grid_settings, StreamConfig(unique_name, value_format="avro")).start()
        with pytest.raises(ConfigError, match="has no schema"):
            await AsyncSubscriber(grid_settings, unique_name, value_deserializer="avro").start()

    _run(scenario())


def test_the_asyncio_clients_series_in_the_text_exposition(grid_settings: GridSettings, unique_name: str) -> None:
    registry = prometheus_client.CollectorRegistry()
    with pytest.raises(ConfigError, match="not a prometheus_client CollectorRegistry"):
        AsyncPublisher(grid_settings, unique_name, metrics="yes")

    async def scenario() -> None:
        async with (
            AsyncPublisher(grid_settings, StreamConfig(unique_name, lanes=2), metrics=registry) as pub,
            AsyncSubscriber(grid_settings, unique_name, initial_offset_scheme="earliest", metrics=registry) as sub,
        ):
            await pub.publish_many([b"r%d" % n for n in range(10)])
            await _poll(sub, 4)
            text = prometheus_client.generate_latest(registry).decode()
            assert f'meteor_publisher_records_total{{stream="{unique_name}"}} 10.0' in text
            assert f'meteor_publisher_buffered_records{{stream="{unique_name}"}} 0.0' in text
            delivered = sub.metrics()["delivered_records"]
            assert f'meteor_subscriber_records_total{{group="",stream="{unique_name}"}} {delivered:.1f}' in text
            lag = 'meteor_subscriber_lag_items{group="",lane="%d",stream="' + unique_name + '"}'
            assert all(lag % lane in text for lane in (0, 1))
        text = prometheus_client.generate_latest(registry).decode()
        assert f'meteor_publisher_records_total{{stream="{unique_name}"}} 10.0' in text  # kept after close
        assert "meteor_subscriber_lag_items{" not in text

    _run(scenario())


def test_ephemeral_entities_asyncio_and_threaded_each_get_their_topics_once(
    grid: Grid, grid_settings: GridSettings, unique_name: str
) -> None:
    config = StreamConfig(unique_name, lanes=2, ephemeral=True)
    threaded = Subscriber(grid, config, topics="orders.eu.*")

    async def scenario() -> dict[str, list[str]]:
        async with (
            AsyncSubscriber(grid_settings, unique_name, topics="orders.*.created") as created,
            AsyncSubscriber(grid_settings, unique_name, topics=["orders.#"], subscription_ttl_ms=3000) as orders,
            AsyncPublisher(grid_settings, unique_name, subscription_refresh_ms=50) as pub,
        ):
            assert len({s.entity for s in live_subscriptions(grid, unique_name)}) == 3
            assert await pub.publish(b"1", topic="orders.eu.created") >= 0
            assert await pub.publish(b"2", topic="audit.login") == NOT_STORED
            offsets = await pub.publish_many(
                [Record(b"3", topic="orders.us.created"), Record(b"4", topic="orders.eu.paid"), b"5"]
            )
            assert offsets[0] >= 0 and offsets[1] >= 0 and offsets[2] == NOT_STORED
            assert pub.metrics()["dropped_records"] == 2
            got = {"created": await _poll(created, 2), "orders": await _poll(orders, 3)}
            assert not await created.poll(200) and not await orders.poll(0)  # nothing twice
            assert created.metrics()["filtered_records"] == 1  # orders.eu.paid read and passed over
            with pytest.raises(ConfigError, match=r"seek back to offset 0 .* is ephemeral"):
                await created.seek(0, lane=got["created"][0].lane)
        return {name: sorted(bytes(r.value).decode() for r in records) for name, records in got.items()}

    try:
        got = _run(scenario())
        assert got == {"created": ["1", "3"], "orders": ["1", "3", "4"]}
        assert len(live_subscriptions(grid, unique_name)) == 1  # the asyncio entities left on close
        seen: list[Record] = []
        wait_until(lambda: seen.extend(threaded.poll(50)) or len(seen) >= 2, 10, message="2 records")
        assert sorted(bytes(r.value).decode() for r in seen) == ["1", "4"] and not threaded.poll(100)
    finally:
        threaded.close()
        grid.map(f"meteor.subscriptions::{unique_name}").clear()


def test_ephemeral_options_are_checked_as_the_threaded_ones(grid_settings: GridSettings, unique_name: str) -> None:
    async def scenario() -> None:
        async with AsyncPublisher(grid_settings, StreamConfig(unique_name)):
            pass
        with pytest.raises(ConfigError, match=r"subscription_refresh_ms: stream .* is not ephemeral"):
            await AsyncPublisher(grid_settings, unique_name, subscription_refresh_ms=100).start()
        with pytest.raises(ConfigError, match="subscription_ttl_ms"):
            await AsyncSubscriber(grid_settings, unique_name, subscription_ttl_ms=5).start()
        with pytest.raises(ConfigError, match=r"subscription_ttl_ms: stream .* is not ephemeral"):
            await AsyncSubscriber(grid_settings, unique_name, subscription_ttl_ms=5000).start()
        ephemeral = StreamConfig(f"{unique_name}-e", ephemeral=True)
        with pytest.raises(ConfigError, match=r"initial_offset_scheme EARLIEST: stream .* is ephemeral"):
            await AsyncSubscriber(grid_settings, ephemeral, initial_offset_scheme="earliest").start()

    _run(scenario())


def test_a_message_id_is_refused_across_asyncio_and_threaded_publishers(
    grid: Grid, grid_settings: GridSettings, unique_name: str
) -> None:
    config = StreamConfig(unique_name, lanes=2, dedup_window_ms=60_000)
    with Publisher(grid, config) as threaded:
        first = threaded.publish(b"threaded", message_id="order-1")

    async def scenario() -> tuple[int, int]:
        async with AsyncPublisher(grid_settings, unique_name) as pub:
            with pytest.raises(DuplicateMessageError) as refused:
                await pub.publish(b"copy", message_id="order-1")
            assert (refused.value.message_id, refused.value.first_offset) == ("order-1", first)
            assert "'order-1'" in str(refused.value) and f"offset {first}" in str(refused.value)
            second = await pub.publish(b"asyncio", message_id="order-2")
            many = await pub.publish_many([Record(b"m%d" % i, message_id=f"m{i}") for i in range(10)] + [b"plain"])
            with pytest.raises(DuplicateMessageError, match=r"appears twice .* \(records 0 and 2"):
                await pub.publish_many([Record(b"x", message_id="n1"), b"y", Record(b"z", message_id="n1")])
            with pytest.raises(DuplicateMessageError) as again:
                await pub.publish_many([Record(b"new", message_id="n2"), Record(b"old", message_id="m7")])
            assert again.value.first_offset == many[7]
            await pub.publish(b"n2", message_id="n2")  # all or nothing: the refused call gave its claim back
            assert pub.metrics()["duplicates_refused"] == 2
        return second, many[3]

    second, m3 = _run(scenario())
    claims = grid.map(dedup_map_name(unique_name))
    assert json.loads(claims.get("order-2") or "{}")["state"] == WRITTEN  # close waited for the marks
    with Publisher(grid, unique_name) as threaded:
        for mid, offset in (("order-2", second), ("m3", m3)):
            with pytest.raises(DuplicateMessageError) as refused:
                threaded.publish(b"copy", message_id=mid)
            assert refused.value.first_offset == offset


def test_a_dead_publishers_pending_claim_is_taken_over_after_its_lease(
    grid: Grid, grid_settings: GridSettings, unique_name: str
) -> None:
    Publisher(grid, StreamConfig(unique_name, lanes=2, dedup_window_ms=60_000)).close()
    dead = {"at": int(time.time() * 1000), "by": 0xDEAD, "from": 0, "lane": 0, "lease": 300, "state": PENDING}
    grid.map(dedup_map_name(unique_name)).put("order-9", json.dumps(dead, sort_keys=True, separators=(",", ":")))

    async def scenario() -> int:
        async with AsyncPublisher(grid_settings, unique_name, max_block_ms=10_000) as pub:
            started = time.monotonic()
            offset = await pub.publish(b"retry", message_id="order-9")
            print(f"\npending claim of a dead publisher: taken over after {time.monotonic() - started:.2f} s")
            assert pub.metrics()["dedup_takeovers"] == 1
            with pytest.raises(DuplicateMessageError):
                await pub.publish(b"again", message_id="order-9")
        return offset

    offset = _run(scenario())
    with Subscriber(grid, unique_name, initial_offset_scheme="earliest") as sub:
        got: list[Record] = []
        wait_until(lambda: got.extend(sub.poll(50)) or len(got) >= 1, 10, message="1 record")
        assert not sub.poll(200)
    assert [(r.value, r.offset) for r in got] == [(b"retry", offset)]
