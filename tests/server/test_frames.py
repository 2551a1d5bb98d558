"""FrameReader: preamble, partial input at every split point, fragments, malformed input; encode_frames."""

from __future__ import annotations

import random
import struct

import pytest

from meteor_spark.server.errors import ProtocolError
from meteor_spark.server.protocol.frames import (
    BEGIN_FRAGMENT,
    END_FRAGMENT,
    IS_FINAL,
    LARGE_FRAME,
    MAX_FRAME_SIZE,
    PREAMBLE,
    UNFRAGMENTED,
    Frame,
    FrameReader,
    encode_frames,
    iter_frames,
)


def frame(flags: int, content: bytes) -> bytes:
    return struct.pack("<iH", len(content) + 6, flags) + content


def request(message_type: int, correlation_id: int, *extra: bytes) -> bytes:
    initial = struct.pack("<iqi", message_type, correlation_id, -1)
    frames = [(UNFRAGMENTED, initial), *[(0, e) for e in extra]]
    return b"".join(bytes(c) for c in encode_frames(frames))


def test_preamble_then_one_message() -> None:
    reader = FrameReader()
    messages = reader.feed(PREAMBLE + request(0x170100, 7, b"ring"))
    assert len(messages) == 1
    assert messages[0].request_header() == (0x170100, 7, -1)
    assert messages[0].frames[1].content == b"ring"
    assert messages[0].frames[1].flags & IS_FINAL


def test_every_split_point_gives_the_same_messages() -> None:
    data = PREAMBLE + request(1, 1, b"a" * 10) + request(2, 2) + request(3, 3, b"", b"xyz")
    for split in range(len(data) + 1):
        reader = FrameReader()
        got = reader.feed(data[:split]) + reader.feed(data[split:])
        assert [m.request_header()[:2] for m in got] == [(1, 1), (2, 2), (3, 3)], split
        assert reader.buffered == 0


def test_every_split_after_the_preamble_gives_the_same_messages() -> None:
    """Reads that arrive while nothing is buffered are cut straight from the received bytes; the rest is buffered."""
    body = request(1, 1, b"a" * 10) + request(2, 2) + request(3, 3, b"", b"xyz")
    for split in range(len(body) + 1):
        reader = FrameReader()
        assert reader.feed(PREAMBLE) == []
        got = reader.feed(body[:split]) + reader.feed(body[split:])
        assert [m.request_header()[:2] for m in got] == [(1, 1), (2, 2), (3, 3)], split
        # Contents become map keys: they must be immutable bytes, never views of a reused buffer.
        assert all(type(f.content) is bytes for m in got for f in m.frames), split
        assert reader.buffered == 0


def test_byte_by_byte_input() -> None:
    data = PREAMBLE + request(5, 9, b"payload" * 100)
    reader = FrameReader()
    got = [m for byte in data for m in reader.feed(bytes([byte]))]
    assert len(got) == 1
    assert got[0].frames[1].content == b"payload" * 100


def test_random_chunking_of_many_messages() -> None:
    rng = random.Random(7)
    payloads = [bytes(rng.randrange(256) for _ in range(rng.randrange(0, 3000))) for _ in range(50)]
    data = PREAMBLE + b"".join(request(9, i, p) for i, p in enumerate(payloads))
    reader = FrameReader()
    got = []
    pos = 0
    while pos < len(data):
        step = rng.randrange(1, 5000)
        got += reader.feed(data[pos : pos + step])
        pos += step
    assert [m.frames[1].content for m in got] == payloads


def reads(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def test_a_32_mib_frame_in_64_kib_reads_is_read_whole_and_copied_once() -> None:
    """The frame path is linear: the reads of a big frame are joined once, never re-copied as the buffer grows."""
    big = bytes(range(256)) * (32 * 1024 * 1024 // 256)
    data = PREAMBLE + request(1, 1, b"before") + request(2, 2, big, b"tail") + request(3, 3, b"after")
    reader = FrameReader()
    got = [message for chunk in reads(data, 64 * 1024) for message in reader.feed(chunk)]
    assert [m.request_header()[:2] for m in got] == [(1, 1), (2, 2), (3, 3)]
    assert got[1].frames[1].content == big and got[1].frames[2].content == b"tail"
    assert type(got[1].frames[1].content) is bytes
    assert reader.buffered == 0
    # Each byte copied once (the join), plus the read the frame starts in (buffered, then moved out of the buffer)
    # and the one it ends in; appending to a growing buffer and copying the content out of it cost twice the frame.
    assert reader.copied_bytes <= len(big) + 3 * 64 * 1024, reader.copied_bytes


@pytest.mark.parametrize("read_type", [bytes, bytearray, memoryview])
def test_large_frames_at_random_splits(read_type: type) -> None:
    """Large frames split anywhere (in their header, at their last byte, with the next frames in the same read),
    fed as bytes or as a caller's reusable buffer, come out whole and as immutable bytes."""
    rng = random.Random(11)
    payloads = [
        rng.randbytes(rng.choice([10, 3000, LARGE_FRAME - 7, LARGE_FRAME, 3 * LARGE_FRAME + 5])) for _ in range(30)
    ]
    data = PREAMBLE + b"".join(request(9, i, p, b"x") for i, p in enumerate(payloads))
    reader = FrameReader()
    got = []
    pos = 0
    while pos < len(data):
        step = rng.choice([1, 5, 6, 7, 100, 20_000, 70_000, 300_000, 2_000_000])
        chunk = bytearray(data[pos : pos + step])
        got += reader.feed(read_type(chunk))
        chunk[:] = b"\x00" * len(chunk)  # the caller reuses its buffer: nothing may point into it
        pos += step
    assert [m.frames[1].content for m in got] == payloads
    assert all(type(f.content) is bytes for m in got for f in m.frames)
    assert reader.buffered == 0


def test_release_drops_a_large_frame_under_way() -> None:
    reader = FrameReader()
    data = PREAMBLE + request(1, 1, bytes(4 * LARGE_FRAME))
    assert reader.feed(data[: 2 * LARGE_FRAME]) == []
    assert reader.buffered > LARGE_FRAME
    reader.release()
    assert reader.buffered == 0


@pytest.mark.parametrize("start", [b"CP1", b"XYZ", b"HTTP/1.1", b"C\x00"])
def test_wrong_preamble_is_a_protocol_error(start: bytes) -> None:
    with pytest.raises(ProtocolError, match="preamble"):
        FrameReader().feed(start)


@pytest.mark.parametrize("length", [0, 5, -1, MAX_FRAME_SIZE + 1])
def test_invalid_frame_length_is_a_protocol_error(length: int) -> None:
    with pytest.raises(ProtocolError, match=f"declares length {length}"):
        FrameReader().feed(PREAMBLE + struct.pack("<iH", length, IS_FINAL) + b"\x00" * 10)


def test_fragmented_message_is_reassembled() -> None:
    initial = struct.pack("<iqi", 0x170900, 11, -1)
    fid = struct.pack("<q", 1234)
    data = (
        PREAMBLE
        + frame(BEGIN_FRAGMENT, fid)
        + frame(0, initial)
        + frame(IS_FINAL, b"part1")
        + frame(0, fid)
        + frame(IS_FINAL, b"part2")
        + frame(END_FRAGMENT, fid)
        + frame(IS_FINAL, b"part3")
    )
    messages = FrameReader().feed(data)
    assert len(messages) == 1
    assert messages[0].request_header() == (0x170900, 11, -1)
    assert [f.content for f in messages[0].frames[1:]] == [b"part1", b"part2", b"part3"]


def test_fragment_of_unknown_id_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="unknown fragmentation id 99"):
        FrameReader().feed(PREAMBLE + frame(END_FRAGMENT, struct.pack("<q", 99)) + frame(IS_FINAL, b"x"))


def test_short_request_header_is_a_protocol_error() -> None:
    message = FrameReader().feed(PREAMBLE + frame(UNFRAGMENTED | IS_FINAL, b"\x01\x00"))[0]
    with pytest.raises(ProtocolError, match="request header needs 16"):
        message.request_header()


def test_encode_frames_sets_is_final_only_on_the_last_frame() -> None:
    data = b"".join(bytes(c) for c in encode_frames([(UNFRAGMENTED, b"abc"), (0, b""), (0, b"de")]))
    frames = list(iter_frames(data))
    assert frames == [Frame(UNFRAGMENTED, b"abc"), Frame(0, b""), Frame(IS_FINAL, b"de")]
