"""Typed streams: Avro schemas in the grid (versions, compatibility, bounds), publishers encoding and subscribers
decoding across versions, and undecodable records through on_corrupt."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import pytest

from meteor_spark.consumer.dead_letters import ScanReport, scan_dead_letters
from meteor_spark.consumer.shared_subscriber import SharedSubscriber
from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.errors import ConfigError, DeserializationError, IncompatibleSchemaError, SerializationError
from meteor_spark.format.avro import SCHEMA_HEADER, AvroSchema, AvroValues, compatibility_problems, incompatibilities
from meteor_spark.format.offsets import sequence_of
from meteor_spark.format.records import Record
from meteor_spark.grid.client import Grid
from meteor_spark.grid.schemas import (
    check_schema,
    forget_schemas,
    get_subject,
    list_subjects,
    register_schema,
    set_compatibility,
)
from meteor_spark.grid.streams import StreamConfig, open_stream
from meteor_spark.producer.publisher import Publisher
from meteor_spark.testing import wait_until


def _order(*fields: dict[str, Any]) -> dict[str, Any]:
    return {"type": "record", "name": "Order", "namespace": "shop", "fields": list(fields)}


ID = {"name": "id", "type": "long"}
CUSTOMER = {"name": "customer", "type": "string"}
NOTE = {"name": "note", "type": ["null", "string"], "default": None}
AMOUNT = {"name": "amount", "type": "double", "default": 0.0}
#: v1; v2 adds a field with a default; v3 removes one that had a default (both backward- and forward-compatible)
V1 = _order(ID, CUSTOMER, NOTE)
V2 = _order(ID, CUSTOMER, NOTE, AMOUNT)
V3 = _order(ID, CUSTOMER, AMOUNT)


def _poll(sub: Subscriber, count: int, timeout_s: float = 10.0) -> list[Record]:
    got: list[Record] = []
    wait_until(lambda: got.extend(sub.poll(50)) or len(got) >= count, timeout_s, message=f"{count} records")
    return got


def _three_versions(grid: Grid, stream: str) -> None:
    assert [register_schema(grid, stream, s).version for s in (V1, V2, V3)] == [1, 2, 3]


def test_three_versions_round_trip_decoded_into_the_latest_or_a_pinned_version(grid: Grid, unique_name: str) -> None:
    config = StreamConfig(unique_name, lanes=2, value_format="avro")
    _three_versions(grid, unique_name)
    with Subscriber(grid, config, initial_offset_scheme="earliest") as latest:
        for version, value in (
            (1, {"id": 1, "customer": "ada", "note": "first"}),
            (2, {"id": 2, "customer": "bob", "note": None, "amount": 2.5}),
            (3, {"id": 3, "customer": "cy", "amount": 3.0}),
        ):
            with Publisher(grid, config, value_serializer=AvroValues(version=version)) as pub:
                pub.publish(Record(value, key=str(value["id"]).encode()))
        got = sorted(_poll(latest, 3), key=lambda r: r.value["id"])
    assert [r.value for r in got] == [  # v3 reads v1 and v2 data: note dropped, amount's default filled in
        {"id": 1, "customer": "ada", "amount": 0.0},
        {"id": 2, "customer": "bob", "amount": 2.5},
        {"id": 3, "customer": "cy", "amount": 3.0},
    ]
    assert sorted(dict(r.headers)[SCHEMA_HEADER] for r in got) == [b"1", b"2", b"3"]

    @dataclass
    class OrderV1:
        id: int
        customer: str
        note: str | None

    with Subscriber(
        grid, unique_name, initial_offset_scheme="earliest", value_deserializer=AvroValues(version=1, into=OrderV1)
    ) as pinned:
        old = sorted((r.value for r in _poll(pinned, 3)), key=lambda o: o.id)
    assert old == [OrderV1(1, "ada", "first"), OrderV1(2, "bob", None), OrderV1(3, "cy", None)]


def test_a_dataclass_is_published_and_a_bad_value_is_refused_naming_the_field(grid: Grid, unique_name: str) -> None:
    register_schema(grid, unique_name, V1)

    @dataclass
    class Order:
        id: int
        customer: str
        note: str | None = None

    with Publisher(grid, StreamConfig(unique_name), value_serializer="avro") as pub:
        pub.publish(Order(7, "dee"))
        with pytest.raises(SerializationError, match="customer"):
            pub.publish({"id": 8, "customer": 42})
    with Subscriber(grid, unique_name, initial_offset_scheme="earliest", value_deserializer="avro") as sub:
        assert [r.value for r in _poll(sub, 1)] == [{"id": 7, "customer": "dee", "note": None}]


def test_register_is_idempotent_and_two_writers_never_take_the_same_version(grid: Grid, unique_name: str) -> None:
    first = register_schema(grid, unique_name, V1)
    assert register_schema(grid, unique_name, dict(V1)) == first  # the same schema: the same version
    candidates = [_order(ID, CUSTOMER, NOTE, {"name": f"f{i}", "type": "int", "default": i}) for i in range(6)]
    taken: list[int] = []
    lock = threading.Lock()

    def register(schema: dict[str, Any]) -> None:
        try:
            version = register_schema(grid, unique_name, schema).version
        except IncompatibleSchemaError:
            return  # compatible with v1 but maybe not with the version another writer took first
        with lock:
            taken.append(version)

    threads = [threading.Thread(target=register, args=(s,)) for s in candidates]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    subject = get_subject(grid, unique_name)
    assert subject is not None
    assert sorted(taken) == [v.version for v in subject.versions[1:]]  # each version went to one writer
    assert len(set(taken)) == len(taken) >= 1
    assert [v.version for v in subject.versions] == list(range(1, len(subject.versions) + 1))
    assert any(s.stream == unique_name for s in list_subjects(grid))
    assert forget_schemas(grid, unique_name) and get_subject(grid, unique_name) is None


@pytest.mark.parametrize(
    ("mode", "new", "field"),
    [
        ("backward", _order(ID, {"name": "customer", "type": "int"}, NOTE), "customer"),  # string -> int
        ("backward", _order(ID, CUSTOMER, NOTE, {"name": "qty", "type": "int"}), "qty"),  # added, no default
        ("forward", _order(ID, NOTE), "customer"),  # removed a field the old readers need (no default)
        ("full", _order(ID, CUSTOMER, NOTE, {"name": "qty", "type": "int"}), "qty"),
    ],
)
def test_a_breaking_change_is_refused_naming_the_field(
    grid: Grid, unique_name: str, mode: str, new: dict[str, Any], field: str
) -> None:
    register_schema(grid, unique_name, V1, compatibility=mode)
    assert any(p.split(": ")[1] == field for p in check_schema(grid, unique_name, new))
    with pytest.raises(IncompatibleSchemaError, match=rf"{field}: ") as caught:
        register_schema(grid, unique_name, new)
    print(f"{mode}: {caught.value}")
    subject = get_subject(grid, unique_name)
    assert subject is not None and [v.version for v in subject.versions] == [1]  # nothing registered
    set_compatibility(grid, unique_name, "none")
    assert register_schema(grid, unique_name, new).version == 2


def test_resolution_rules_promotions_enums_nested_records_and_unions() -> None:
    def rec(*fields: dict[str, Any]) -> dict[str, Any]:
        return {"type": "record", "name": "R", "fields": list(fields)}

    assert incompatibilities(rec({"name": "n", "type": "long"}), rec({"name": "n", "type": "int"})) == []
    assert incompatibilities(rec({"name": "n", "type": "double"}), rec({"name": "n", "type": "float"})) == []
    assert incompatibilities(rec({"name": "s", "type": "bytes"}), rec({"name": "s", "type": "string"})) == []
    assert incompatibilities(rec({"name": "n", "type": "int"}), rec({"name": "n", "type": "long"})) == [
        "n: type 'long' cannot be read as 'int'"
    ]
    inner_old = {"type": "record", "name": "Addr", "fields": [{"name": "zip", "type": "string"}]}
    inner_new = {"type": "record", "name": "Addr", "fields": [{"name": "zip", "type": "int"}]}
    assert incompatibilities(rec({"name": "a", "type": inner_new}), rec({"name": "a", "type": inner_old})) == [
        "a.zip: type 'string' cannot be read as 'int'"
    ]
    listed = incompatibilities(
        rec({"name": "xs", "type": {"type": "array", "items": "int"}}),
        rec({"name": "xs", "type": {"type": "array", "items": "string"}}),
    )
    assert listed == ["xs[]: type 'string' cannot be read as 'int'"]
    colors = {"type": "enum", "name": "C", "symbols": ["RED"]}
    more = {"type": "enum", "name": "C", "symbols": ["RED", "BLUE"]}
    assert "BLUE" in incompatibilities(rec({"name": "c", "type": colors}), rec({"name": "c", "type": more}))[0]
    assert incompatibilities(rec({"name": "o", "type": ["null", "long"]}), rec({"name": "o", "type": "int"})) == []
    assert (
        "no branch"
        in incompatibilities(rec({"name": "o", "type": ["null", "int"]}), rec({"name": "o", "type": "string"}))[0]
    )
    renamed = {"type": "record", "name": "Renamed", "fields": []}
    assert "names differ" in incompatibilities(renamed, rec())[0]
    assert compatibility_problems(AvroSchema.parse(rec()), AvroSchema.parse(rec()), "full") == []


def test_the_registry_is_bounded_per_stream(grid: Grid, unique_name: str) -> None:
    limit = 5
    for i in range(limit):
        fields = [ID, *({"name": f"f{j}", "type": "int", "default": 0} for j in range(i))]
        register_schema(grid, unique_name, _order(*fields), max_versions=limit)
    with pytest.raises(ConfigError, match=r"5 schema versions, the most one stream may keep \(5\)"):
        register_schema(
            grid, unique_name, _order(ID, {"name": "extra", "type": "int", "default": 0}), max_versions=limit
        )
    subject = get_subject(grid, unique_name)
    assert subject is not None and len(subject.versions) == limit


def test_clear_errors_for_a_stream_without_schema_and_bad_schemas(grid: Grid, unique_name: str) -> None:
    with pytest.raises(ConfigError, match="has no schema; register one first"):
        Publisher(grid, StreamConfig(unique_name, value_format="avro"))
    with pytest.raises(ConfigError, match="value_format 'json' is not a value format"):
        StreamConfig(unique_name, value_format="json")
    with pytest.raises(ConfigError, match="must be an Avro record schema"):
        register_schema(grid, unique_name, '"string"')
    with pytest.raises(ConfigError, match="not a valid Avro schema"):
        register_schema(grid, unique_name, {"type": "record", "name": "R", "fields": [{"name": "x", "type": "nope"}]})
    with pytest.raises(ConfigError, match="is not JSON"):
        register_schema(grid, unique_name, "{nope")
    register_schema(grid, unique_name, V1)
    with pytest.raises(ConfigError, match=r"has no schema version 9; it has versions \[1\]"):
        Publisher(grid, unique_name, value_serializer=AvroValues(version=9))


def _publish_undecodable(grid: Grid, stream: str) -> None:
    """A good record, three undecodable ones (no version header, an unknown version, bytes that are not the
    schema's), then a good one."""
    good = AvroSchema.parse(V1).encode({"id": 1, "customer": "a", "note": None})
    with Publisher(grid, stream, value_serializer="bytes") as raw:
        raw.publish(Record(good, headers=((SCHEMA_HEADER, b"1"),)))
        raw.publish(Record(good))
        raw.publish(Record(good, headers=((SCHEMA_HEADER, b"7"),)))
        raw.publish(Record(b"\xff\xff\xff", headers=((SCHEMA_HEADER, b"1"),)))
        raw.publish(Record(good, headers=((SCHEMA_HEADER, b"1"),)))


@pytest.mark.parametrize("policy", ["skip", "dead_letter", "error"])
def test_an_undecodable_record_goes_through_on_corrupt(grid: Grid, unique_name: str, policy: str) -> None:
    register_schema(grid, unique_name, V1)
    ensure = StreamConfig(unique_name, value_format="avro")
    Publisher(grid, ensure).close()
    _publish_undecodable(grid, unique_name)
    dlq = f"{unique_name}-dlq"
    with Subscriber(
        grid,
        unique_name,
        initial_offset_scheme="earliest",
        on_corrupt=policy,
        dead_letter_stream=dlq if policy == "dead_letter" else None,
    ) as sub:
        if policy == "error":
            assert len(_poll(sub, 1)) == 1
            with pytest.raises(DeserializationError, match=f"carries no {SCHEMA_HEADER} header"):
                wait_until(lambda: sub.poll(50) and False, 5)
            return
        got = _poll(sub, 2)
        assert [sequence_of(r.offset) for r in got] == [sequence_of(got[0].offset), sequence_of(got[0].offset) + 4]
        assert sub.metrics()["undecodable_records"] == 3
    if policy == "dead_letter":
        letters = list(scan_dead_letters(grid, open_stream(grid, dlq), ScanReport()))
        errors = sorted(letter.error for letter in letters)
        assert len(letters) == 3 and all(letter.source_stream == unique_name for letter in letters)
        assert any("schema version 7 is not registered" in e for e in errors)
        assert any("not an Avro value" in e for e in errors)


def test_a_shared_group_member_gets_decoded_values(grid: Grid, unique_name: str) -> None:
    register_schema(grid, unique_name, V1)
    config = StreamConfig(unique_name, lanes=2, value_format="avro")
    with Publisher(grid, config) as pub:
        pub.publish_many([{"id": n, "customer": f"c{n}", "note": None} for n in range(4)]).result(10)
    with SharedSubscriber(grid, unique_name, group="workers") as member:
        got: list[Any] = []
        wait_until(lambda: got.extend(member.poll(50)) or len(got) >= 4, 10, message="4 records")
        member.ack(got)
    assert sorted(r.value["id"] for r in got) == [0, 1, 2, 3]


def test_a_version_registered_after_the_reader_started_is_decoded_at_once(grid: Grid, unique_name: str) -> None:
    """A record of a version registered after the reader read the registry is looked up when it first arrives,
    not refused for being new (before, a reader that had looked within the last second raised
    ``DeserializationError`` under the default ``on_corrupt``); a version that cannot exist is refused."""
    register_schema(grid, unique_name, V1)
    with (
        Subscriber(grid, StreamConfig(unique_name, value_format="avro"), initial_offset_scheme="earliest") as sub,
        Publisher(grid, unique_name) as v1,
    ):
        v1.publish({"id": 1, "customer": "ann"})
        assert len(_poll(sub, 1)) == 1
        register_schema(grid, unique_name, V2)
        with Publisher(grid, unique_name) as v2:
            v2.publish({"id": 2, "customer": "bob", "amount": 2.5})
        assert [r.value["id"] for r in _poll(sub, 1)] == [2]
        with Publisher(grid, unique_name, value_serializer="bytes") as raw:
            raw.publish(Record(b"\x00", headers=((SCHEMA_HEADER, b"7777"),)))
        with pytest.raises(DeserializationError, match="schema version 7777 is not registered"):
            _poll(sub, 1)
