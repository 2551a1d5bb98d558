"""The compiled codecs (a decoder per request and an encoder per response, derived from each spec's parameters)
give exactly what the general path gives: same values, same bytes; and they leave what they do not cover (null
values, messages an older peer shortened) to it."""

from __future__ import annotations

from typing import Any

import pytest

from meteor_spark.server.errors import ProtocolError
from meteor_spark.server.protocol import codecs as c
from meteor_spark.server.protocol import message_codec
from meteor_spark.server.protocol import messages as m
from meteor_spark.server.protocol import messages_data as md
from meteor_spark.server.protocol.frames import (
    BEGIN_DATA_STRUCTURE,
    END_DATA_STRUCTURE,
    IS_FINAL,
    IS_NULL,
    FrameReader,
    Message,
    iter_frames,
)
from tests.server.test_codecs import ALL_SPECS, Samples

COMPILED_READERS = [spec for spec in ALL_SPECS if spec._read_request is not None]  # type: ignore[attr-defined]
COMPILED_WRITERS = [spec for spec in ALL_SPECS if spec._write_response is not None]  # type: ignore[attr-defined]


def _joined(chunks: list[bytes | bytearray | memoryview]) -> bytes:
    return b"".join(bytes(chunk) for chunk in chunks)


def test_the_hot_messages_are_compiled() -> None:
    for spec in (md.MAP_GET, md.MAP_PUT, md.MAP_SET):
        assert spec in COMPILED_READERS and spec in COMPILED_WRITERS, spec.name


def test_compiled_request_decoders_match_the_general_path() -> None:
    assert len(COMPILED_READERS) > 50
    samples = Samples()
    for spec in COMPILED_READERS:
        values = {param.name: samples.of(param.type) for param in spec.request}
        message = FrameReader(expect_preamble=False).feed(_joined(message_codec.encode_request(spec, 9, values)))[0]
        compiled = message_codec.decode_request(spec, message)
        assert compiled == message_codec.decode_request_generic(spec, message.frames), spec.name


def test_compiled_response_encoders_match_the_general_path_bytes_for_bytes() -> None:
    assert len(COMPILED_WRITERS) > 50
    samples = Samples()
    for spec in COMPILED_WRITERS:
        values = {param.name: samples.of(param.type) for param in spec.response}
        general = _joined(message_codec.encode_response_generic(spec, 11, values))
        assert _joined(message_codec.encode_response(spec, 11, values)) == general, spec.name
        nulls = {name: None for name in values}
        if all(param.type.name.startswith("Nullable") for param in spec.response):
            expected = _joined(message_codec.encode_response_generic(spec, 11, nulls))
            assert _joined(message_codec.encode_response(spec, 11, nulls)) == expected, spec.name


def test_a_null_value_and_an_empty_one_decode_as_the_general_path_does() -> None:
    chunks = message_codec.encode_request(md.MAP_PUT_IF_ABSENT, 3, name="m", key=b"", value=b"v", thread_id=1, ttl=-1)
    message = Message(list(iter_frames(_joined(chunks))))
    assert message_codec.decode_request(md.MAP_PUT_IF_ABSENT, message)["key"] == b""
    response = message_codec.encode_response(md.MAP_GET, 4, response=None)
    assert _joined(response) == _joined(message_codec.encode_response_generic(md.MAP_GET, 4, {"response": None}))


def test_a_missing_parameter_still_names_it() -> None:
    chunks = message_codec.encode_request(md.MAP_GET, 1, name="m", key=b"k", thread_id=1)
    frames = list(iter_frames(_joined(chunks)))
    with pytest.raises(ProtocolError, match="key"):
        message_codec.decode_request(md.MAP_GET, Message(frames[:-1]))
    with pytest.raises(ValueError, match="response"):
        message_codec.encode_response(md.MAP_GET, 1, {})


BYTES_READERS = [spec for spec in ALL_SPECS if spec._read_bytes is not None]  # type: ignore[attr-defined]


def test_requests_decoded_from_their_bytes_match_the_general_path() -> None:
    # The frame decoders' messages, and those with a List<Data> parameter (Ringbuffer.addAll, the Spark writer's).
    assert set(COMPILED_READERS) < set(BYTES_READERS)
    for spec in set(BYTES_READERS) - set(COMPILED_READERS):
        assert any(param.type.name == "List<Data>" for param in spec.request), spec.name
    assert m.RINGBUFFER_ADD_ALL in BYTES_READERS
    samples = Samples()
    for spec in BYTES_READERS:
        for sized in (None, 0, 1, 3):  # the samples' two items, or lists of that many
            values = {
                param.name: samples.of(param.type)
                if sized is None or param.type.name != "List<Data>"
                else [samples.of(c.DATA) for _ in range(sized)]
                for param in spec.request
            }
            data = _joined(message_codec.encode_request(spec, 9, values))
            message = FrameReader(expect_preamble=False).feed(data)[0]
            general = message_codec.decode_request_generic(spec, message.frames)
            assert spec._read_bytes(data, 0) == (general, len(data)), spec.name  # type: ignore[attr-defined]
            # ... and the same request behind another one, read from where it starts
            assert spec._read_bytes(data + data, len(data)) == (general, 2 * len(data)), spec.name  # type: ignore[attr-defined]


def _add_all_bytes(items: list[bytes]) -> bytes:
    return _joined(message_codec.encode_request(m.RINGBUFFER_ADD_ALL, 5, name="r", value_list=items, overflow_policy=0))


def _with_flags(data: bytes, frame_index: int, flags: int) -> bytes:
    """``data`` with the flags of its ``frame_index``-th frame replaced."""
    pos = 0
    for _ in range(frame_index):
        pos += int.from_bytes(data[pos : pos + 4], "little")
    return data[: pos + 4] + flags.to_bytes(2, "little") + data[pos + 6 :]


def test_a_data_list_not_laid_out_as_clients_send_it_goes_to_the_general_path() -> None:
    def read(data: bytes) -> dict[str, Any] | None:
        done = m.RINGBUFFER_ADD_ALL._read_bytes(data, 0)  # type: ignore[attr-defined]
        return None if done is None else done[0]

    items = [b"a" * 10, b"", b"c" * 300]
    data = _add_all_bytes(items)
    assert read(data) == {"name": "r", "value_list": items, "overflow_policy": 0}
    # frames: 0 initial, 1 name, 2 BEGIN, 3..5 items, 6 END (final)
    assert read(_with_flags(data, 2, BEGIN_DATA_STRUCTURE | IS_NULL)) is None  # a null list
    assert read(_with_flags(data, 4, BEGIN_DATA_STRUCTURE)) is None  # a nested structure as an item
    assert read(_with_flags(data, 4, IS_FINAL)) is None  # the message ends inside the list
    assert read(_with_flags(data, 6, END_DATA_STRUCTURE)) is None  # no final flag on the last frame
    assert read(data[:-6]) is None  # no END frame
    for cut in range(1, len(data)):
        assert read(data[:cut]) is None, cut


def test_the_bytes_decoder_leaves_anything_but_a_whole_request_to_the_general_path() -> None:
    def read(data: bytes) -> dict[str, Any] | None:
        done = md.MAP_PUT._read_bytes(data, 0)  # type: ignore[attr-defined]
        return None if done is None else done[0]

    data = _joined(message_codec.encode_request(md.MAP_PUT, 3, name="m", key=b"k", value=b"v", thread_id=1, ttl=-1))
    assert read(data) is not None
    frames = list(iter_frames(data))
    # The value's frame without its final flag, then a frame more: the general path decides.
    last = len(data) - 7
    not_final = data[:last] + bytes([*data[last : last + 4], data[last + 4], data[last + 5] & ~0x20]) + data[last + 6 :]
    assert read(not_final) is None
    assert read(not_final + b"\x06\x00\x00\x00\x00\x20") is None
    for cut in range(1, len(data)):
        assert read(data[:cut]) is None, cut  # bytes missing
    # Bytes after the request (the next requests of a client sending several at once) are left to the caller.
    assert md.MAP_PUT._read_bytes(data + data, 0) == (read(data), len(data))  # type: ignore[attr-defined]
    assert md.MAP_PUT._read_bytes(data + b"\x06\x00\x00\x00\x00\x20", 0) == (read(data), len(data))  # type: ignore[attr-defined]
    fragmented = bytes([*data[:4], data[4], data[5] & ~0x40]) + data[6:]  # END_FRAGMENT cleared
    assert read(fragmented) is None
    assert len(frames) == 4
