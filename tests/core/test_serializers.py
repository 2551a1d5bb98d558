"""Value and key (de)serializers of the clients: built-ins, callables, and refused records under each policy."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.errors import ArgumentTypeError, ConfigError, DeserializationError, SerializationError
from meteor_spark.format.corrupt import HEADER_ERROR, HEADER_SOURCE_LANE, HEADER_SOURCE_OFFSET, HEADER_SOURCE_STREAM
from meteor_spark.format.offsets import make_offset
from meteor_spark.format.records import Record, RecordBatch
from meteor_spark.grid.client import Grid
from meteor_spark.grid.streams import StreamConfig
from meteor_spark.producer.publisher import Publisher
from meteor_spark.testing import wait_until


def _poll(sub: Subscriber, count: int, timeout_s: float = 10.0) -> list[Record]:
    got: list[Record] = []
    wait_until(lambda: got.extend(sub.poll(50)) or len(got) >= count, timeout_s, message=f"{count} records")
    return got


@pytest.mark.parametrize(
    ("name", "obj", "stored"),
    [
        ("json", {"b": [1, 2.5, None], "a": "é"}, '{"b":[1,2.5,null],"a":"é"}'.encode()),
        ("str", "grüße", "grüße".encode()),
        ("bytes", b"\x00\xff", b"\x00\xff"),
    ],
)
def test_built_ins_round_trip_values_and_keys(grid: Grid, unique_name: str, name: str, obj: Any, stored: bytes) -> None:
    config = StreamConfig(unique_name, lanes=2)
    with (
        Subscriber(grid, config, value_deserializer=name, key_deserializer=name) as sub,
        Publisher(grid, config, value_serializer=name, key_serializer=name) as pub,
        Subscriber(grid, config) as raw,
    ):
        pub.publish(obj)
        pub.publish(Record(obj, key=obj, headers=(("h", b"1"),), timestamp_ms=1234))
        pub.publish_many([obj, Record(obj, key=obj)]).result(10)
        got = _poll(sub, 4)
        assert [r.value for r in got] == [obj] * 4
        assert sorted(r.key is None for r in got) == [False, False, True, True]
        keyed = [r for r in got if r.key is not None]
        assert all(r.key == obj for r in keyed)
        assert {r.timestamp_ms for r in keyed} >= {1234} and any(r.headers == (("h", b"1"),) for r in keyed)
        stored_records = _poll(raw, 4)
        assert [r.value for r in stored_records] == [stored] * 4  # compact JSON, UTF-8
        assert {r.key for r in stored_records} == {None, stored}


def test_a_callable_on_each_side_and_values_of_the_batch(grid: Grid, unique_name: str) -> None:
    config = StreamConfig(unique_name)
    with (
        Subscriber(grid, config, value_deserializer=lambda b: int(b.decode())) as sub,
        Publisher(grid, config, value_serializer=lambda n: str(n).encode()) as pub,
    ):
        pub.publish_many(range(5)).result(10)
        batch = sub.poll(5000)
        assert isinstance(batch, RecordBatch) and len(batch) == 5
        assert batch.values() == [0, 1, 2, 3, 4] and batch[2].value == 2 and batch.last().value == 4
        assert batch.to_arrow().column("value").to_pylist() == [b"0", b"1", b"2", b"3", b"4"]  # Arrow: stored bytes


def test_unknown_names_and_wrong_kinds_are_refused_with_the_built_ins(grid: Grid, unique_name: str) -> None:
    config = StreamConfig(unique_name)
    with pytest.raises(ConfigError, match=r"built-in 'jsn' \(did you mean 'json'\?\).*built-ins: bytes, json, str"):
        Publisher(grid, config, value_serializer="jsn")
    with pytest.raises(ConfigError, match=r"key_deserializer built-in 'yaml'.*bytes, json, str"):
        Subscriber(grid, config, key_deserializer="yaml")
    with pytest.raises(ArgumentTypeError, match="value_deserializer must be one of 'json', 'str', 'bytes' or a"):
        Subscriber(grid, config, value_deserializer=42)


def test_a_failing_serializer_names_the_record_and_queues_nothing(grid: Grid, unique_name: str) -> None:
    config = StreamConfig(unique_name)
    with Publisher(grid, config, value_serializer="json", key_serializer="str") as pub:
        with pytest.raises(SerializationError, match=r"value_serializer failed on the record .*TypeError.*set"):
            pub.publish({1, 2})
        with pytest.raises(
            SerializationError, match=r"value_serializer failed on record 2 \(0-based\) of the 3 given to publish_many"
        ):
            pub.publish_many([1, 2, object()])
        with pytest.raises(SerializationError, match=r"key_serializer failed on record 1 .*'str' serializer takes str"):
            pub.publish_many([Record(1, key="a"), Record(2, key=b"b")])
        with (
            Publisher(grid, config, value_serializer=lambda v: "text") as wrong,
            pytest.raises(SerializationError, match="it returned str, not bytes"),
        ):
            wrong.publish_async(1)
        pub.flush(10)
        assert pub.records_sent == 0


def _publish_with_a_bad_record(grid: Grid, config: StreamConfig) -> None:
    with Publisher(grid, config) as pub:
        pub.publish_many([b'{"n":0}', b'{"n":1}', b"not json", b'{"n":3}']).result(10)
        pub.publish(b'{"n":4}')


def test_bad_json_error_policy_returns_the_good_records_then_stops_at_the_bad_one(grid: Grid, unique_name: str) -> None:
    config = StreamConfig(unique_name)
    _publish_with_a_bad_record(grid, config)
    with Subscriber(grid, config, value_deserializer="json", initial_offset_scheme="earliest") as sub:
        assert [r.value for r in _poll(sub, 2)] == [{"n": 0}, {"n": 1}]
        bad = make_offset(0, 2)
        for _ in range(2):  # the lane stays stopped at the record until a seek
            with pytest.raises(
                DeserializationError,
                match=rf"value_deserializer failed on the record at offset {bad} "
                rf"of stream '{unique_name}' lane 0: JSONDecodeError",
            ):
                sub.poll(1000)
            assert sub.position() == bad
        sub.seek(bad + 1)
        assert [r.value for r in _poll(sub, 2)] == [{"n": 3}, {"n": 4}]


def test_bad_json_skip_policy_counts_it_and_confirm_passes_it(grid: Grid, unique_name: str) -> None:
    config = StreamConfig(unique_name)
    _publish_with_a_bad_record(grid, config)
    with Publisher(grid, config) as pub:
        pub.publish(b"{")  # the last record is refused too: confirm must still pass it
    group = f"{unique_name}-g"
    options: dict[str, Any] = {
        "group": group,
        "value_deserializer": "json",
        "on_corrupt": "skip",
        "initial_offset_scheme": "earliest",
    }
    with Subscriber(grid, config, **options) as sub:
        wait_until(sub.is_assigned, 10, message="lane assigned")
        assert [r.value for r in _poll(sub, 4)] == [{"n": 0}, {"n": 1}, {"n": 3}, {"n": 4}]
        wait_until(lambda: len(sub.poll(50)) == 0 and sub.undecodable_records == 2, 10, message="both refused")
        assert sub.metrics()["undecodable_records"] == 2
        assert sub.position() == make_offset(3, 0)  # past the refused last record (ring item 2)
        sub.confirm()
    with Subscriber(grid, config, **options) as again:
        wait_until(again.is_assigned, 10, message="lane assigned")
        assert len(again.poll(200)) == 0 and again.undecodable_records == 0  # confirmed past both, not counted again
        assert again.position() == make_offset(3, 0)


def test_bad_key_dead_letter_policy_publishes_the_stored_record(grid: Grid, unique_name: str) -> None:
    config = StreamConfig(unique_name)
    dead = f"{unique_name}-dlq"
    with Publisher(grid, config) as pub:
        pub.publish(Record(b"1", key=b"k"))
        pub.publish(Record(b"2", key=b"\xff\xfe", headers=(("trace", b"t-1"),), timestamp_ms=77))
        pub.publish(Record(b"3", key=b"m"))
    with Subscriber(
        grid,
        config,
        value_deserializer="json",
        key_deserializer="str",
        dead_letter_stream=dead,
        initial_offset_scheme="earliest",
    ) as sub:
        got = _poll(sub, 2)
        assert [(r.key, r.value) for r in got] == [("k", 1), ("m", 3)]
        assert sub.undecodable_records == 1
    with Subscriber(grid, dead, initial_offset_scheme="earliest") as dlq:
        (letter,) = _poll(dlq, 1)
        headers = dict(letter.headers)
        assert (letter.value, letter.key, letter.timestamp_ms) == (b"2", b"\xff\xfe", 77)
        assert headers["trace"] == b"t-1" and headers[HEADER_SOURCE_STREAM] == unique_name.encode()
        assert headers[HEADER_SOURCE_LANE] == b"0" and headers[HEADER_SOURCE_OFFSET] == str(make_offset(1, 0)).encode()
        assert b"key_deserializer failed" in headers[HEADER_ERROR] and b"UnicodeDecodeError" in headers[HEADER_ERROR]


def test_a_receiver_gets_deserialized_records(grid: Grid, unique_name: str) -> None:
    config = StreamConfig(unique_name)
    got: list[Any] = []
    done = threading.Event()

    def handle(record: Record) -> None:
        got.append(record.value)
        if len(got) == 3:
            done.set()

    with (
        Subscriber(grid, config, value_deserializer="json") as sub,
        Publisher(grid, config, value_serializer="json") as pub,
        sub.attach_receiver(handle, 50),
    ):
        pub.publish_many([{"i": 0}, [1], "two"]).result(10)
        assert done.wait(10)
    assert got == [{"i": 0}, [1], "two"]
