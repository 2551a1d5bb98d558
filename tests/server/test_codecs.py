"""Every message spec against the official client's codecs, in both directions.

- official ``encode_request(sample)`` -> our ``decode_request`` gives the sample back;
- our ``encode_response(sample)`` -> official ``decode_response`` gives the sample back;
- our ``encode_event(sample)`` -> official ``handle`` calls its callback with the sample, in declaration order.

Samples are generated from the spec's types, so a wrong offset, order or type in any spec fails here. Specs the
Python client has no codec for (DynamicConfig) are checked against the request ``Grid.add_ring_config`` builds.
"""

from __future__ import annotations

import importlib
import inspect
import re
import uuid
from typing import Any

import pytest
from hazelcast.protocol.client_message import Frame as HzFrame
from hazelcast.protocol.client_message import InboundMessage
from hazelcast.serialization.data import Data

from meteor_spark.server.handlers import supported_messages
from meteor_spark.server.protocol import codecs as c
from meteor_spark.server.protocol import message_codec, structs
from meteor_spark.server.protocol.codecs import FixedType, Param, VarType
from meteor_spark.server.protocol.frames import FrameReader, Message, iter_frames
from meteor_spark.server.protocol.message_codec import MessageSpec
from meteor_spark.server.protocol.struct_type import StructType

ALL_SPECS: list[MessageSpec] = [entry.spec for entry in supported_messages()]


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def official_codec(spec: MessageSpec) -> Any | None:
    service, method = spec.name.split(".")
    module = f"hazelcast.protocol.codec.{_snake(service)}_{_snake(method)}_codec"
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError:
        return None


# ---------------------------------------------------------------------------------------------- sample values


class Samples:
    """Deterministic, non-trivial sample values for every type (distinct per call, so swapped fields show)."""

    def __init__(self) -> None:
        self.counter = 0

    def next(self) -> int:
        self.counter += 1
        return self.counter

    def of(self, type_: FixedType | VarType) -> Any:
        n = self.next()
        if isinstance(type_, FixedType):
            return {
                "byte": n % 100,
                "boolean": n % 2 == 1,
                "int": 100_000 + n,
                "long": -(1 << 40) - n,
                "UUID": uuid.UUID(int=(n << 96) | (0xFEDC << 64) | n),
                "float": float(n) / 4,
                "double": float(n) / 8,
            }[type_.name]
        if type_ is c.STRING:
            return f"näme-{n}"
        if type_ in (c.DATA, c.BYTE_ARRAY):
            return b"\x00\x00\x00\x00\xff\xff\xff\xf3" + bytes([n % 256]) * 5
        if type_ in (c.LONG_ARRAY, c.LIST_LONG):
            return [n, -n, 1 << 50]
        if type_ is c.LIST_INTEGER:
            return [n, n + 1, 7]
        if type_ in (c.LIST_UUID, c.SET_UUID):
            return [self.of(c.UUID), self.of(c.UUID)]
        if type_ is c.ENTRY_LIST_UUID_LIST_INTEGER:
            return [(self.of(c.UUID), [1, 2, n]), (self.of(c.UUID), [n + 3])]
        if type_ is c.ENTRY_LIST_UUID_LONG:
            return [(self.of(c.UUID), n), (self.of(c.UUID), -n)]
        if isinstance(type_, c._Nullable):
            return self.of(type_.inner)
        if isinstance(type_, c._ListMultiFrame):
            return [self.of(type_.item), self.of(type_.item)]
        if isinstance(type_, c._EntryList):
            if type_.as_dict and isinstance(type_.key, StructType):
                return {self.of(type_.key): self.of(type_.value)}
            pairs = [(self.of(type_.key), self.of(type_.value)), (self.of(type_.key), self.of(type_.value))]
            return dict(pairs) if type_.as_dict else pairs
        if type_ is structs.FIELD_DESCRIPTOR:
            return structs.FieldDescriptor(f"field{n}", (1, 8, 11)[n % 3])  # must be a real FieldKind for the client
        if isinstance(type_, StructType):
            return type_.cls(**{param.name: self.of(param.type) for param in type_.params})
        raise AssertionError(f"no sample for type {type_}")


# ---------------------------------------------------------------------------------------------- normalisation

_CLIENT_ALIASES = {"type": "protocol_type"}  # the client's EndpointQualifier calls its type "protocol_type"


def norm(type_: FixedType | VarType, value: Any) -> Any:
    """A comparable plain form of a value from either side (ours: dataclasses/bytes; the client's: its objects)."""
    if value is None:
        return None
    if isinstance(type_, FixedType):
        return value
    if type_ in (c.DATA, c.BYTE_ARRAY):
        return bytes(value.buffer if isinstance(value, Data) else value)
    if isinstance(type_, c._Nullable):
        return norm(type_.inner, value)
    if isinstance(type_, c._ListMultiFrame):
        return [norm(type_.item, item) for item in value]
    if isinstance(type_, c._FixedList):
        return list(value)
    if type_ is c.ENTRY_LIST_UUID_LIST_INTEGER or type_ is c.ENTRY_LIST_UUID_LONG:
        return [(key, item) for key, item in value]
    if isinstance(type_, c._EntryList):
        pairs = value.items() if isinstance(value, dict) else value
        return [(norm(type_.key, key), norm(type_.value, item)) for key, item in pairs]
    if isinstance(type_, StructType):
        result = {}
        for param in type_.params:
            if isinstance(value, dict):
                field_value = value[param.name]
            elif hasattr(value, param.name):
                field_value = getattr(value, param.name)
            else:
                field_value = getattr(value, _CLIENT_ALIASES[param.name])
            result[param.name] = norm(param.type, field_value)
        return result
    return value


def to_client(type_: FixedType | VarType, value: Any) -> Any:
    """Our sample value in the form the client's encoders take."""
    if value is None or isinstance(type_, FixedType):
        return value
    if type_ is c.DATA:
        return Data(value)
    if isinstance(type_, c._Nullable):
        return to_client(type_.inner, value)
    if isinstance(type_, c._ListMultiFrame):
        return [to_client(type_.item, item) for item in value]
    if isinstance(type_, c._EntryList):
        pairs = [
            (to_client(type_.key, k), to_client(type_.value, v))
            for k, v in (value.items() if isinstance(value, dict) else value)
        ]
        return dict(pairs) if type_.as_dict else pairs
    if isinstance(type_, StructType):
        fields = {param.name: to_client(param.type, getattr(value, param.name)) for param in type_.params}
        if type_ is structs.RAFT_GROUP_ID:
            from hazelcast.protocol import RaftGroupId

            return RaftGroupId(fields["name"], fields["seed"], fields["id"])
        if type_ is structs.SCHEMA:
            from hazelcast.serialization.compact import Schema

            return Schema(fields["type_name"], fields["fields"])
        if type_ is structs.FIELD_DESCRIPTOR:
            from hazelcast.serialization.compact import FieldDescriptor

            return FieldDescriptor(fields["field_name"], fields["kind"])
        raise AssertionError(f"no client form for struct {type_.name}")
    return value


def to_inbound(chunks: list[bytes | bytearray | memoryview]) -> InboundMessage:
    data = b"".join(bytes(chunk) for chunk in chunks)
    frames = list(iter_frames(data))
    start = HzFrame(bytearray(frames[0].content), frames[0].flags)
    message = InboundMessage(start)
    for frame in frames[1:]:
        message.add_frame(HzFrame(bytearray(frame.content), frame.flags))
    return message


def from_outbound(buf: bytearray) -> Message:
    messages = FrameReader(expect_preamble=False).feed(bytes(buf))
    assert len(messages) == 1
    return messages[0]


def _id(spec: MessageSpec) -> str:
    return f"{spec.name}-0x{spec.request_type:06X}"


def test_every_served_message_has_a_spec_with_the_official_id() -> None:
    assert ALL_SPECS, "no handlers registered"
    for spec in ALL_SPECS:
        codec = official_codec(spec)
        if codec is None:
            continue
        assert spec.request_type == codec._REQUEST_MESSAGE_TYPE, spec.name
        assert spec.response_type == codec._RESPONSE_MESSAGE_TYPE, spec.name


@pytest.mark.parametrize("spec", [s for s in ALL_SPECS if official_codec(s) is not None], ids=_id)
def test_official_request_decodes_with_our_spec(spec: MessageSpec) -> None:
    codec = official_codec(spec)
    assert codec is not None  # the parametrization kept only specs with an official codec
    samples = Samples()
    values = {param.name: samples.of(param.type) for param in spec.request}
    outbound = codec.encode_request(
        **{name: to_client(param.type, values[name]) for name, param in ((p.name, p) for p in spec.request)}
    )
    outbound.set_correlation_id(4242)
    message = from_outbound(outbound.buf)
    assert message.request_header()[:2] == (spec.request_type, 4242)
    decoded = message_codec.decode_request(spec, message)
    for param in spec.request:
        assert norm(param.type, decoded[param.name]) == norm(param.type, values[param.name]), param.name


@pytest.mark.parametrize("spec", [s for s in ALL_SPECS if official_codec(s) is not None], ids=_id)
def test_our_response_decodes_with_the_official_codec(spec: MessageSpec) -> None:
    codec = official_codec(spec)
    assert codec is not None  # the parametrization kept only specs with an official codec
    samples = Samples()
    values = {param.name: samples.of(param.type) for param in spec.response}
    message = to_inbound(message_codec.encode_response(spec, 77, values))
    assert message.get_message_type() == spec.response_type
    assert message.get_correlation_id() == 77
    if not spec.response:
        assert not hasattr(codec, "decode_response")
        return
    decoded = codec.decode_response(message)
    if len(spec.response) == 1 and spec.response[0].name == "response":
        decoded = {"response": decoded}
    assert set(decoded) == {param.name for param in spec.response}
    for param in spec.response:
        assert norm(param.type, decoded[param.name]) == norm(param.type, values[param.name]), param.name


_EVENT_CASES = [(s, e) for s in ALL_SPECS if official_codec(s) is not None for e in s.events]


@pytest.mark.parametrize("spec,event", _EVENT_CASES, ids=[f"{s.name}-{e.name}" for s, e in _EVENT_CASES])
def test_our_event_decodes_with_the_official_handler(spec: MessageSpec, event: message_codec.EventSpec) -> None:
    codec = official_codec(spec)
    assert codec is not None  # the parametrization kept only specs with an official codec
    samples = Samples()
    values = {param.name: samples.of(param.type) for param in event.params}
    message = to_inbound(message_codec.encode_event(event, 99, values))
    assert message.get_message_type() == event.type_id
    assert message.start_frame.flags & (1 << 9), "events carry IS_EVENT"
    received: list[tuple[Any, ...]] = []
    codec.handle(message, **{f"handle_{_snake(event.name)}_event": lambda *args: received.append(args)})
    assert len(received) == 1, f"the official handler did not recognise event 0x{event.type_id:06X}"
    # The official handler passes values positionally; its source names them (the codec's local variables).
    callback = f"handle_{_snake(event.name)}_event"
    call = re.search(rf"\b{callback}\(([^)]*)\)", inspect.getsource(codec.handle))
    assert call is not None, f"cannot find the {callback}(...) call in the official codec"
    names = [name.strip() for name in call.group(1).split(",")]
    assert sorted(names) == sorted(param.name for param in event.params), "event parameter names differ"
    got = dict(zip(names, received[0], strict=True))
    for param in event.params:
        assert norm(param.type, got[param.name]) == norm(param.type, values[param.name]), param.name


def test_event_ids_match_the_official_codecs() -> None:
    for spec, event in _EVENT_CASES:
        codec = official_codec(spec)
        constant = f"_EVENT_{_snake(event.name).upper()}_MESSAGE_TYPE"
        assert getattr(codec, constant) == event.type_id, f"{spec.name} {event.name}"


def test_add_ring_config_request_of_grid_decodes_with_our_spec() -> None:
    from meteor_spark.compat import add_ringbuffer_config_request
    from meteor_spark.server.protocol.messages import DYNAMIC_CONFIG_ADD_RINGBUFFER_CONFIG as spec

    message = from_outbound(add_ringbuffer_config_request("meteor.stream::o.*", 123, 2, 1, 60).buf)
    decoded = message_codec.decode_request(spec, message)
    assert decoded == {
        "name": "meteor.stream::o.*",
        "capacity": 123,
        "backup_count": 2,
        "async_backup_count": 1,
        "time_to_live_seconds": 60,
        "in_memory_format": "BINARY",
        "ringbuffer_store_config": None,
        "split_brain_protection_name": None,
        "merge_policy": "com.hazelcast.spi.merge.PutIfAbsentMergePolicy",
        "merge_batch_size": 100,
        "user_code_namespace": None,
    }


def test_request_round_trip_through_our_own_encoder_for_every_spec() -> None:
    """Specs without an official codec still round-trip (our encode_request -> our decode_request)."""
    for spec in ALL_SPECS:
        samples = Samples()
        values = {param.name: samples.of(param.type) for param in spec.request}
        message = FrameReader(expect_preamble=False).feed(
            b"".join(bytes(x) for x in message_codec.encode_request(spec, 5, values))
        )[0]
        decoded = message_codec.decode_request(spec, message)
        for param in spec.request:
            assert norm(param.type, decoded[param.name]) == norm(param.type, values[param.name]), (
                spec.name,
                param.name,
            )


def test_optional_trailing_parameter_defaults_when_an_older_peer_omits_it() -> None:
    from meteor_spark.server.protocol.messages import DYNAMIC_CONFIG_ADD_RINGBUFFER_CONFIG as spec

    values = {param.name: Samples().of(param.type) for param in spec.request}
    values["ringbuffer_store_config"] = None
    chunks = message_codec.encode_request(spec, 1, values)
    frames = list(iter_frames(b"".join(bytes(x) for x in chunks)))[:-1]  # drop user_code_namespace
    decoded = message_codec.decode_request(spec, Message(frames))
    assert decoded["user_code_namespace"] is None
    assert decoded["name"] == values["name"]


def test_missing_required_parameter_is_a_protocol_error() -> None:
    from meteor_spark.server.errors import ProtocolError
    from meteor_spark.server.protocol.messages import RINGBUFFER_ADD as spec

    chunks = message_codec.encode_request(spec, 1, name="r", overflow_policy=0, value=b"x")
    frames = list(iter_frames(b"".join(bytes(x) for x in chunks)))
    with pytest.raises(ProtocolError, match="value"):
        message_codec.decode_request(spec, Message(frames[:-1]))
    with pytest.raises(ProtocolError, match="overflow_policy"):
        message_codec.decode_request(
            spec, Message([type(frames[0])(frames[0].flags, frames[0].content[:17])] + frames[1:])
        )


def test_param_order_on_the_wire_is_fixed_first_then_var_in_declaration_order() -> None:
    from meteor_spark.server.protocol.messages import RINGBUFFER_READ_MANY as spec

    # the wire order is derived in __post_init__ into undeclared attributes: read them from the instance's dict
    assert [param.name for param in vars(spec)["_req_fixed"].params] == ["start_sequence", "min_count", "max_count"]
    assert [param.name for param in vars(spec)["_req_var"]] == ["name", "filter"]
    assert isinstance(spec.request[0], Param)
