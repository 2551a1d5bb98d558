"""A record's topic and message id: checked when published, carried in reserved headers, filled in when read."""

from __future__ import annotations

import pytest

from meteor_spark import Publisher, StreamConfig, Subscriber
from meteor_spark.errors import ArgumentTypeError, ConfigError
from meteor_spark.format.records import Record
from meteor_spark.format.routing import MESSAGE_ID_HEADER, TOPIC_HEADER
from meteor_spark.grid.client import Grid
from meteor_spark.testing import wait_until


def _read_all(grid: Grid, stream: str, count: int) -> list[Record]:
    out: list[Record] = []
    with Subscriber(grid, stream, initial_offset_scheme="earliest") as sub:
        wait_until(lambda: out.extend(sub.poll(timeout_ms=100)) or len(out) >= count, timeout_s=20)
    return out


def test_topic_and_message_id_travel_with_the_record(grid: Grid, unique_name: str) -> None:
    with Publisher(grid, StreamConfig(unique_name)) as pub:
        pub.publish(Record(b"a", topic="orders.eu.created", message_id="order-1"))
        pub.publish(b"b", topic="orders.us.created")
        pub.publish("c", message_id="order-3")
        pub.publish(Record(b"d", headers=(("trace", b"t1"),)))
    a, b, c, d = _read_all(grid, unique_name, 4)
    assert (a.topic, a.message_id) == ("orders.eu.created", "order-1")
    assert (TOPIC_HEADER, b"orders.eu.created") in a.headers and (MESSAGE_ID_HEADER, b"order-1") in a.headers
    assert (b.topic, b.message_id) == ("orders.us.created", None)
    assert (c.topic, c.message_id) == ("", "order-3")
    assert (d.topic, d.message_id, d.headers) == ("", None, (("trace", b"t1"),))


@pytest.mark.parametrize(
    ("kwargs", "error", "named"),
    [
        ({"topic": "orders.*"}, ConfigError, "wildcard"),
        ({"topic": "a.#.b"}, ConfigError, "wildcard"),
        ({"topic": 7}, ArgumentTypeError, "topic"),
        ({"topic": "x" * 256}, ConfigError, "255 bytes"),
        ({"message_id": ""}, ConfigError, "message_id"),
        ({"message_id": b"id"}, ArgumentTypeError, "message_id"),
    ],
)
def test_bad_topic_or_message_id_is_refused_and_nothing_is_stored(
    grid: Grid, unique_name: str, kwargs: dict[str, object], error: type[Exception], named: str
) -> None:
    with Publisher(grid, StreamConfig(unique_name)) as pub:
        with pytest.raises(error, match=named):
            pub.publish(b"x", **kwargs)  # type: ignore[arg-type]
        with pytest.raises(error, match=named):
            pub.publish(Record(b"x", **kwargs))  # type: ignore[arg-type]
        assert pub.records_sent == 0


def test_stream_config_checks_the_new_fields_and_stores_them_only_when_set() -> None:
    assert "ephemeral" not in StreamConfig("s").to_dict()
    assert StreamConfig("s", dedup_window_ms=5000).to_dict()["dedup_window_ms"] == 5000
    assert StreamConfig.from_dict(StreamConfig("s", region="eu-west").to_dict()).region == "eu-west"
    with pytest.raises(ConfigError, match="dedup_window_ms"):
        StreamConfig("s", dedup_window_ms=-1)
    with pytest.raises(ConfigError, match="ephemeral stream"):
        StreamConfig("s", ephemeral=True, dedup_window_ms=1000)
    with pytest.raises(ConfigError, match="ephemeral must be True or False"):
        StreamConfig("s", ephemeral="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="region"):
        StreamConfig("s", region="eu west")
