"""Round trips of every Map / Topic / FlakeId / AtomicLong / CP group message against the official client's codecs.

Official encode -> our decode for requests; our encode -> official decode for responses and events. The client's
codecs are an independent implementation of the protocol, so an offset or order mistake in ``messages_data`` fails
here rather than in an integration test.
"""

from __future__ import annotations

import importlib
import inspect
import re
import uuid
from typing import Any

import pytest
from hazelcast.core import SimpleEntryView as ClientEntryView
from hazelcast.protocol import RaftGroupId as ClientRaftGroupId
from hazelcast.protocol.client_message import Frame as ClientFrame
from hazelcast.protocol.client_message import InboundMessage
from hazelcast.serialization.data import Data

from meteor_spark.server.engine.atomics import RaftGroupId
from meteor_spark.server.engine.map_types import SimpleEntryView
from meteor_spark.server.protocol import codecs as c
from meteor_spark.server.protocol import message_codec, messages_data, structs
from meteor_spark.server.protocol.frames import FrameReader, iter_frames

SPECS = messages_data.ALL
DATA_A = b"\x00\x00\x00\x00\xff\xff\xff\xf9alpha"
DATA_B = b"\x00\x00\x00\x07\xff\xff\xff\xf9\x00beta\xff"
SAMPLE_UUID = uuid.UUID("12345678-9abc-4def-8123-456789abcdef")


def _codec_module(spec: message_codec.MessageSpec) -> Any:
    service, method = spec.name.split(".")
    prefix = {
        "Map": "map",
        "Topic": "topic",
        "AtomicLong": "atomic_long",
        "CPGroup": "cp_group",
        "FlakeIdGenerator": "flake_id_generator",
    }[service]
    snake = re.sub(
        r"(?<!^)(?=[A-Z])", "_", method.replace("CPGroup", "CpGroup").replace("CPObject", "CpObject")
    ).lower()
    return importlib.import_module(f"hazelcast.protocol.codec.{prefix}_{snake}_codec")


def _sample(type_: Any, official: bool, salt: int = 0) -> Any:
    """A distinctive value of ``type_``: the official client's representation, or ours."""
    if type_ is c.STRING:
        return f"näme-{salt}"
    if type_ is c.DATA:
        raw = DATA_A if salt % 2 == 0 else DATA_B
        return Data(raw) if official else raw
    if type_ is c.LONG:
        return -1234567890123 - salt
    if type_ is c.INT:
        return -7 - salt
    if type_ is c.BOOLEAN:
        return salt % 2 == 0
    if type_ is c.UUID:
        return SAMPLE_UUID
    if type_ is structs.RAFT_GROUP_ID:
        return ClientRaftGroupId("grp", 3, 42) if official else RaftGroupId("grp", 3, 42)
    if type_ is structs.SIMPLE_ENTRY_VIEW:
        values = [_sample(c.DATA, official, 0), _sample(c.DATA, official, 1), *range(10, 20)]
        return ClientEntryView(*values) if official else SimpleEntryView(*values)
    name = getattr(type_, "name", "")
    if name.startswith("Nullable<"):
        return _sample(type_.inner, official, salt)
    if name.startswith("List<"):
        return [_sample(type_.item, official, salt + i) for i in range(3)]
    if name.startswith("EntryList<"):
        return [(_sample(type_.key, official, i), _sample(type_.value, official, i + 1)) for i in range(2)]
    raise AssertionError(f"no sample for {type_}")


def _norm(value: Any) -> Any:
    """One comparable representation for both sides."""
    if isinstance(value, Data):
        return bytes(value.buffer)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, (ClientRaftGroupId, RaftGroupId)):
        return ("raft", value.name, value.seed, value.id)
    if isinstance(value, (ClientEntryView, SimpleEntryView)):
        fields = (
            "key",
            "value",
            "cost",
            "creation_time",
            "expiration_time",
            "hits",
            "last_access_time",
            "last_stored_time",
            "last_update_time",
            "version",
            "ttl",
            "max_idle",
        )
        return tuple(_norm(getattr(value, f)) for f in fields)
    if isinstance(value, (list, tuple)):
        return [_norm(v) for v in value]
    return value


def _inbound(chunks: list[Any]) -> InboundMessage:
    message: InboundMessage | None = None
    for frame in iter_frames(b"".join(bytes(chunk) for chunk in chunks)):
        client_frame = ClientFrame(bytearray(frame.content), frame.flags)
        if message is None:
            message = InboundMessage(client_frame)
        else:
            message.add_frame(client_frame)
    assert message is not None
    return message


@pytest.mark.parametrize("spec", SPECS, ids=[s.name for s in SPECS])
def test_official_request_decodes(spec: message_codec.MessageSpec) -> None:
    codec = _codec_module(spec)
    official_args = {p.name: _sample(p.type, True, i) for i, p in enumerate(spec.request)}
    outbound = codec.encode_request(**official_args)
    outbound.set_correlation_id(99)
    (message,) = FrameReader(expect_preamble=False).feed(bytes(outbound.buf))
    assert message.request_header()[:2] == (spec.request_type, 99)
    decoded = message_codec.decode_request(spec, message)
    assert {k: _norm(v) for k, v in decoded.items()} == {k: _norm(v) for k, v in official_args.items()}


@pytest.mark.parametrize("spec", [s for s in SPECS if s.response], ids=[s.name for s in SPECS if s.response])
def test_our_response_decodes_officially(spec: message_codec.MessageSpec) -> None:
    codec = _codec_module(spec)
    ours = {p.name: _sample(p.type, False, i) for i, p in enumerate(spec.response)}
    decoded = codec.decode_response(_inbound(message_codec.encode_response(spec, 5, ours)))
    expected = {k: _norm(v) for k, v in ours.items()}
    if len(spec.response) == 1 and spec.response[0].name == "response":
        assert _norm(decoded) == expected["response"]
    else:
        assert {k: _norm(v) for k, v in decoded.items()} == expected


def test_nullable_responses_decode_as_none() -> None:
    for spec in (messages_data.MAP_GET, messages_data.MAP_PUT, messages_data.MAP_PUT_IF_ABSENT):
        assert (
            _codec_module(spec).decode_response(_inbound(message_codec.encode_response(spec, 1, response=None))) is None
        )
    spec = messages_data.MAP_GET_ENTRY_VIEW
    decoded = _codec_module(spec).decode_response(
        _inbound(message_codec.encode_response(spec, 1, response=None, max_idle=-1))
    )
    assert decoded == {"max_idle": -1, "response": None}


@pytest.mark.parametrize("spec", [s for s in SPECS if s.events], ids=[s.name for s in SPECS if s.events])
def test_our_events_decode_officially(spec: message_codec.MessageSpec) -> None:
    codec = _codec_module(spec)
    (event_spec,) = spec.events
    ours = {p.name: _sample(p.type, False, i) for i, p in enumerate(event_spec.params)}
    received: list[tuple[Any, ...]] = []
    handler_name = "handle_" + re.sub(r"(?<!^)(?=[A-Z])", "_", event_spec.name).lower() + "_event"
    codec.handle(
        _inbound(message_codec.encode_event(event_spec, 17, ours)), **{handler_name: lambda *a: received.append(a)}
    )
    # The client calls its handler with its own argument order (var params first): read it from the codec.
    call = re.search(handler_name + r"\(([^)]*)\)\n", inspect.getsource(codec.handle))
    assert call is not None
    order = [name.strip() for name in call.group(1).split(",")]
    assert [[_norm(v) for v in args] for args in received] == [[_norm(ours[name]) for name in order]]
