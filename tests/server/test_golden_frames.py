"""Byte-exact frames, written out by hand with a comment per field (independent of any codec code)."""

from __future__ import annotations

import uuid

from meteor_spark.server.errors import StaleSequence
from meteor_spark.server.protocol import messages as m
from meteor_spark.server.protocol.errors import encode_error
from meteor_spark.server.protocol.frames import FrameReader
from meteor_spark.server.protocol.message_codec import decode_request, encode_event, encode_response


def joined(chunks: list[bytes | bytearray | memoryview]) -> bytes:
    return b"".join(bytes(chunk) for chunk in chunks)


def test_ringbuffer_size_response() -> None:
    expected = bytes.fromhex(
        "1b000000"  # frame length 27 = 6 header + 13 response header + 8 long
        "00e0"  # flags 0xE000: BEGIN_FRAGMENT | END_FRAGMENT | IS_FINAL
        "01011700"  # message type 0x170101 (Ringbuffer.size response)
        "0500000000000000"  # correlation id 5
        "00"  # backup acks 0
        "0300000000000000"  # response: size 3
    )
    assert joined(encode_response(m.RINGBUFFER_SIZE, 5, response=3)) == expected


def test_ringbuffer_add_request_decodes() -> None:
    golden = bytes.fromhex(
        "1a000000"  # frame length 26 = 6 + 16 request header + 4 int
        "00c0"  # flags 0xC000: unfragmented, not final
        "00061700"  # message type 0x170600 (Ringbuffer.add)
        "0900000000000000"  # correlation id 9
        "ffffffff"  # partition id -1
        "01000000"  # overflow_policy 1 (FAIL), the only fixed parameter
        "09000000"  # frame length 9
        "0000"  # flags 0
        "726e67"  # name "rng"
        "0e000000"  # frame length 14
        "0020"  # flags 0x2000: IS_FINAL
        "00000000fffffff3"  # Data header: partition hash 0, type -13 (byte array)
    )
    message = FrameReader(expect_preamble=False).feed(golden)[0]
    assert message.request_header() == (0x170600, 9, -1)
    assert decode_request(m.RINGBUFFER_ADD, message) == {
        "overflow_policy": 1,
        "name": "rng",
        "value": bytes.fromhex("00000000fffffff3"),
    }


def test_read_many_response_with_one_item() -> None:
    expected = bytes.fromhex(
        "1f000000"
        "00c0"  # initial frame: length 31 = 6 + 13 + 4 + 8; unfragmented
        "01091700"  # message type 0x170901 (Ringbuffer.readMany response)
        "0100000000000000"  # correlation id 1
        "00"  # backup acks 0
        "01000000"  # read_count 1
        "0800000000000000"  # next_seq 8
        "06000000"
        "0010"  # BEGIN_DATA_STRUCTURE: items list starts
        "08000000"
        "0000"
        "abcd"  # item 0: Data frame of 2 bytes
        "06000000"
        "0008"  # END_DATA_STRUCTURE: items list ends
        "0e000000"
        "0020"  # item_seqs LongArray frame, IS_FINAL
        "0700000000000000"  # sequence 7
    )
    chunks = encode_response(m.RINGBUFFER_READ_MANY, 1, read_count=1, next_seq=8, items=[b"\xab\xcd"], item_seqs=[7])
    assert joined(chunks) == expected


def test_stale_sequence_error_response() -> None:
    message = "sequence:1 is too small"
    expected = (
        bytes.fromhex(
            "13000000"
            "00c0"  # initial frame: length 19 = 6 + 13, no fixed fields
            "00000000"  # message type 0: error
            "0300000000000000"  # correlation id 3
            "00"  # backup acks 0
            "06000000"
            "0010"  # BEGIN: List<ErrorHolder>
            "06000000"
            "0010"  # BEGIN: ErrorHolder
            "0a000000"
            "0000"
            "33000000"  # ErrorHolder fixed frame: error_code 51 (StaleSequence)
        )
        + bytes.fromhex("350000000000")  # class name frame, length 53
        + b"com.hazelcast.ringbuffer.StaleSequenceException"
        + bytes.fromhex("1d0000000000")  # message frame, length 29
        + message.encode()
        + bytes.fromhex(
            "06000000"
            "0010"  # BEGIN: stack trace elements (none)
            "06000000"
            "0008"  # END: stack trace elements
            "06000000"
            "0008"  # END: ErrorHolder
            "06000000"
            "0028"  # END: List<ErrorHolder>, IS_FINAL
        )
    )
    assert joined(encode_error(3, StaleSequence(message))) == expected


def test_distributed_object_event() -> None:
    source = uuid.UUID(int=(1 << 64) | 2)
    expected = (
        bytes.fromhex(
            "27000000"
            "00c2"  # initial frame: length 39 = 6 + 16 + 17; unfragmented | IS_EVENT
            "02090000"  # message type 0x000902 (DistributedObject event)
            "0400000000000000"  # correlation id 4 of the listener registration
            "ffffffff"  # partition id -1
            "00"
            "0100000000000000"
            "0200000000000000"  # source uuid: not null, msb 1, lsb 2
            "07000000"
            "0000"  # name frame
        )
        + b"m"
        + bytes.fromhex("180000000000")  # service name frame, length 24
        + b"hz:impl:mapService"
        + bytes.fromhex("0d0000000020")  # event type frame, IS_FINAL
        + b"CREATED"
    )
    spec = m.CLIENT_ADD_DISTRIBUTED_OBJECT_LISTENER.events[0]
    chunks = encode_event(spec, 4, name="m", service_name="hz:impl:mapService", event_type="CREATED", source=source)
    assert joined(chunks) == expected
