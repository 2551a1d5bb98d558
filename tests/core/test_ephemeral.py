"""Ephemeral (at-most-once) streams with AMQP topic matching: the matcher, drops counted at the publisher, fan-out
to entities (subscribers and groups), load balance inside a group, registry leases, the refusals of acknowledgement,
and topics as a plain filter on a persistent stream."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from meteor_spark import Publisher, StreamConfig, Subscriber
from meteor_spark.consumer.shared_subscriber import SharedSubscriber
from meteor_spark.errors import ArgumentTypeError, ConfigError
from meteor_spark.format.records import Record
from meteor_spark.format.routing import TopicMatcher
from meteor_spark.grid.client import Grid
from meteor_spark.grid.subscriptions import NOT_STORED, live_subscriptions
from meteor_spark.testing import wait_until

CASES = [
    ("#", "", True),
    ("#", "a.b.c", True),
    ("*", "", False),
    ("*", "a", True),
    ("*", "a.b", False),
    ("", "", True),
    ("", "a", False),
    ("a", "a", True),
    ("a", "A", False),
    ("a.*", "a.b", True),
    ("a.*", "a", False),
    ("a.*", "a.b.c", False),
    ("a.#", "a", True),
    ("a.#", "a.b.c", True),
    ("a.#", "b.a", False),
    ("#.c", "c", True),
    ("#.c", "a.b.c", True),
    ("#.c", "a.c.b", False),
    ("a.#.c", "a.c", True),
    ("a.#.c", "a.x.y.c", True),
    ("a.#.c", "a.x.y", False),
    ("*.#", "", False),
    ("*.#", "a", True),
    ("#.#", "", True),
    ("orders.*.created", "orders.eu.created", True),
    ("orders.*.created", "orders.eu.west.created", False),
    ("a..b", "a..b", True),
    ("a.*.b", "a..b", True),
]


@pytest.mark.parametrize(("pattern", "topic", "expected"), CASES)
def test_topic_matching(pattern: str, topic: str, expected: bool) -> None:
    matcher = TopicMatcher(pattern)
    assert matcher.matches(topic) is expected
    assert matcher.matches(topic) is expected  # from the remembered verdict


def test_a_list_of_patterns_matches_when_any_does() -> None:
    matcher = TopicMatcher(["orders.eu.*", "audit.#"])
    assert [matcher.matches(t) for t in ("orders.eu.created", "audit", "orders.us.created")] == [True, True, False]


@pytest.mark.parametrize(
    ("patterns", "named"),
    [("ord*rs.#", "'ord\\*rs'"), ("a.b#", "'b#'"), ([], "non-empty list"), ([7], "7"), ("x" * 256, "255 bytes")],
)
def test_bad_patterns_are_refused_by_name(patterns: object, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        TopicMatcher(patterns)  # type: ignore[arg-type]


@pytest.fixture
def ephemeral(grid: Grid, unique_name: str) -> Iterator[str]:
    yield StreamConfig(unique_name, lanes=4, capacity=1000, ephemeral=True).name
    grid.map(f"meteor.subscriptions::{unique_name}").clear()


def _config(name: str) -> StreamConfig:
    return StreamConfig(name, lanes=4, capacity=1000, ephemeral=True)


def _drain(sub: Subscriber, count: int, timeout_s: float = 20) -> list[Record]:
    got: list[Record] = []
    wait_until(lambda: got.extend(sub.poll(timeout_ms=100)) or len(got) >= count, timeout_s=timeout_s)
    got.extend(sub.poll(timeout_ms=300))  # and nothing more
    return got


def test_a_record_no_entity_matches_is_dropped_and_counted(grid: Grid, ephemeral: str) -> None:
    called: list[tuple[int | None, object]] = []
    with Publisher(grid, _config(ephemeral), metrics=None) as pub:
        assert pub.publish(b"nobody", topic="orders.eu.created") == NOT_STORED
        pub.publish_async(b"nobody", callback=lambda offset, error: called.append((offset, error)))
        assert pub.publish_many([b"x", Record(b"y", topic="a.b")]).result(10) == [NOT_STORED, NOT_STORED]
        pub.flush(10)
        wait_until(lambda: called == [(NOT_STORED, None)], 10)
        assert pub.metrics()["dropped_records"] == 4 and pub.records_sent == 0
        with Subscriber(grid, ephemeral, topics="orders.#") as sub:
            pub._gate.view.refresh()  # type: ignore[union-attr]  # no waiting for the refresh interval
            stored = pub.publish(b"wanted", topic="orders.eu.created")
            assert stored >= 0
            assert pub.publish(b"unwanted", topic="audit.login") == NOT_STORED
            mixed = pub.publish_many([Record(b"1", topic="orders.x"), Record(b"2", topic="other")]).result(10)
            assert mixed[0] >= 0 and mixed[1] == NOT_STORED
            assert pub.metrics()["dropped_records"] == 6 and pub.records_sent == 2
            assert sorted(r.value for r in _drain(sub, 2)) == [b"1", b"wanted"]


def test_fan_out_to_two_subscribers_by_their_topics(grid: Grid, ephemeral: str) -> None:
    topics = ["orders.eu.created", "orders.us.created", "orders.eu.paid", "audit.login", ""]
    with (
        Subscriber(grid, _config(ephemeral), topics="orders.*.created") as created,
        Subscriber(grid, ephemeral, topics=["orders.#", ""]) as orders,
        Publisher(grid, ephemeral) as pub,
    ):
        assert {s.entity.split("/")[0] for s in live_subscriptions(grid, ephemeral)} == {"subscriber"}
        results = [pub.publish(f"v{i}".encode(), topic=topic) for i, topic in enumerate(topics)]
        assert [r == NOT_STORED for r in results] == [False, False, False, True, False]
        assert pub.metrics()["dropped_records"] == 1
        assert sorted(r.topic for r in _drain(created, 2)) == ["orders.eu.created", "orders.us.created"]
        assert sorted(r.topic for r in _drain(orders, 4)) == [
            "",
            "orders.eu.created",
            "orders.eu.paid",
            "orders.us.created",
        ]
        assert created.metrics()["filtered_records"] == 2 and created.metrics()["delivered_records"] == 2


def test_fan_out_to_two_groups_and_load_balance_inside_one(grid: Grid, ephemeral: str) -> None:
    config = _config(ephemeral)
    with (
        Subscriber(grid, config, group="billing", member_id="b1", lease_ms=1000) as b1,
        Subscriber(grid, ephemeral, group="billing", member_id="b2", lease_ms=1000) as b2,
        Subscriber(grid, ephemeral, group="audit", member_id="a1", lease_ms=1000) as a1,
    ):
        assert b1.member is not None and b2.member is not None

        def balanced() -> bool:
            for sub in (b1, b2, a1):
                sub.poll(0)
            return len(b1.lanes) == 2 and len(b2.lanes) == 2 and len(a1.lanes) == 4

        wait_until(balanced, 30, message="billing's 4 lanes shared 2/2, audit holds 4")
        entities = Counter(s.entity for s in live_subscriptions(grid, ephemeral))
        assert entities == {"group/billing": 2, "group/audit": 1}
        with Publisher(grid, ephemeral) as pub:
            pub.publish_many([Record(f"r{i}".encode(), key=f"k{i}".encode()) for i in range(40)]).result(20)
        by_member: dict[str, list[bytes]] = {"b1": [], "b2": [], "a1": []}

        def all_in() -> bool:
            for name, sub in (("b1", b1), ("b2", b2), ("a1", a1)):
                by_member[name].extend(r.value for r in sub.poll(timeout_ms=50))
            return len(by_member["b1"]) + len(by_member["b2"]) >= 40 and len(by_member["a1"]) >= 40

        wait_until(all_in, 30, message="40 records to each group")
        billing = by_member["b1"] + by_member["b2"]
        assert sorted(billing) == sorted(by_member["a1"]) and len(set(billing)) == 40
        assert by_member["b1"] and by_member["b2"]  # both members got some
        print(f"[ephemeral] billing split b1={len(by_member['b1'])} b2={len(by_member['b2'])}, audit={40}")


def test_an_entity_starts_at_the_end_and_sees_nothing_older(grid: Grid, ephemeral: str) -> None:
    with Subscriber(grid, _config(ephemeral)) as first, Publisher(grid, ephemeral) as pub:
        pub.publish_many([b"old-1", b"old-2"]).result(10)
        with Subscriber(grid, ephemeral) as late:
            pub.publish(b"new")
            assert [r.value for r in _drain(late, 1)] == [b"new"]
        assert sorted(r.value for r in _drain(first, 3)) == [b"new", b"old-1", b"old-2"]


def test_acknowledgement_and_going_back_are_refused(grid: Grid, ephemeral: str) -> None:
    config = _config(ephemeral)
    with Subscriber(grid, config, group="g", lease_ms=1000) as sub:
        with pytest.raises(ConfigError, match="ephemeral"):
            sub.confirm()
        with pytest.raises(ConfigError, match="seek back"):
            _publish_then_seek_back(grid, sub)
        with pytest.raises(ConfigError, match="auto_confirm_interval_ms"):
            sub.attach_receiver(lambda record: None, auto_confirm_interval_ms=100)
    with pytest.raises(ConfigError, match="ephemeral"):
        Subscriber(grid, ephemeral, group="g2", auto_confirm_interval_ms=100)
    with pytest.raises(ConfigError, match="ephemeral"):
        SharedSubscriber(grid, ephemeral, group="shared")
    with pytest.raises(ConfigError, match="EARLIEST"):
        Subscriber(grid, ephemeral, initial_offset_scheme="earliest")
    with pytest.raises(ConfigError, match="subscription_ttl_ms"):
        Subscriber(grid, StreamConfig(ephemeral + "-persistent"), subscription_ttl_ms=5000)
    with pytest.raises(ConfigError, match="subscription_refresh_ms"):
        Publisher(grid, ephemeral + "-persistent", subscription_refresh_ms=100)


def _publish_then_seek_back(grid: Grid, sub: Subscriber) -> None:
    with Publisher(grid, sub.stream) as pub:
        pub.publish(Record(b"x", lane=sub.lanes[0]))
    _drain(sub, 1)
    sub.seek(0, lane=sub.lanes[0])


def test_an_entity_that_stops_polling_drops_out_after_its_ttl(grid: Grid, ephemeral: str) -> None:
    with Subscriber(grid, _config(ephemeral), subscription_ttl_ms=3000) as idle:
        idle_since = time.monotonic()
        assert [s.member for s in live_subscriptions(grid, ephemeral)] == [idle._member_id]
        wait_until(lambda: not live_subscriptions(grid, ephemeral), 15, message="the idle entry expired")
        print(f"[ephemeral] idle entry gone {time.monotonic() - idle_since:.2f} s after its last renewal (TTL 3 s)")
        with Publisher(grid, ephemeral) as pub:
            assert pub.publish(b"to nobody") == NOT_STORED
        idle.poll(0)  # polling registers it again
        assert len(live_subscriptions(grid, ephemeral)) == 1
    assert live_subscriptions(grid, ephemeral) == []  # close leaves at once


def test_topics_filter_a_persistent_stream(grid: Grid, unique_name: str) -> None:
    with Publisher(grid, StreamConfig(unique_name, lanes=1)) as pub:
        pub.publish_many([Record(b"1", topic="a.x"), Record(b"2", topic="b"), Record(b"3", topic="a.y"), b"4"])
        pub.flush(10)
    with Subscriber(grid, unique_name, initial_offset_scheme="earliest", topics="a.*") as sub:
        assert [r.value for r in _drain(sub, 2)] == [b"1", b"3"]
        assert sub.metrics()["filtered_records"] == 2
    with Subscriber(
        grid, unique_name, initial_offset_scheme="earliest", topics=["b", ""], value_deserializer="str"
    ) as sub:
        assert [str(r.value) for r in _drain(sub, 2)] == ["2", "4"]
    assert live_subscriptions(grid, unique_name) == []  # a persistent stream keeps no registry


def test_a_group_that_was_gone_starts_again_at_the_end(grid: Grid, ephemeral: str) -> None:
    config = _config(ephemeral)
    with Subscriber(grid, config) as other, Publisher(grid, ephemeral) as pub:
        with Subscriber(grid, ephemeral, group="g", lease_ms=1000) as member:
            pub.publish(b"while g lived")
            assert [r.value for r in _drain(member, 1)] == [b"while g lived"]
        pub.publish_many([b"while g was gone"] * 3).result(10)  # stored for `other` only
        with Subscriber(grid, ephemeral, group="g", lease_ms=1000) as revived:
            pub.publish(b"after g came back")
            assert [r.value for r in _drain(revived, 1)] == [b"after g came back"]
        assert len(_drain(other, 5)) == 5


def test_bulk_publishes_drop_row_by_row_and_serialize_once(grid: Grid, ephemeral: str) -> None:
    import pyarrow as pa

    with (
        Subscriber(grid, _config(ephemeral), topics="keep", value_deserializer="json") as sub,
        Publisher(grid, ephemeral, value_serializer="json") as pub,
    ):
        offsets = pub.publish_many([Record({"n": 1}, topic="keep"), Record({"n": 2}, topic="drop")]).result(10)  # type: ignore[arg-type]
        assert offsets[0] >= 0 and offsets[1] == NOT_STORED
        with Publisher(grid, ephemeral) as raw, pytest.raises(ArgumentTypeError, match=r"Record\.value"):
            raw.publish_many([Record(7, topic="drop")])  # type: ignore[arg-type]
        headers = pa.array(
            [[{"key": "meteor.topic", "value": b"keep"}], [{"key": "meteor.topic", "value": b"drop"}], None],
            pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])),
        )
        table = pa.table({"value": pa.array([b'{"n": 3}', b'{"n": 4}', b'{"n": 5}']), "headers": headers})
        assert pub.publish_arrow(table).result(10) == 1
        assert pub.metrics()["dropped_records"] == 3
        # the two calls' records may sit in different lanes of the four: no order between them is promised
        values: list[Any] = [r.value for r in _drain(sub, 2)]
        assert sorted(value["n"] for value in values) == [1, 3]
