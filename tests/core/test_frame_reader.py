"""``meteor_spark.compat_frames._FrameReader`` cuts a connection's received bytes into the same messages and frames
as the client's own reader, however the socket splits them: the frames' bytes and flags, message by message
(no grid: the readers are fed bytes directly)."""

from __future__ import annotations

import os
import random
import struct
from typing import Any

from hazelcast.protocol.client_message import InboundMessage

from meteor_spark.compat_frames import _FrameReader

_FINAL = 1 << 13


def _frame(payload: bytes, flags: int = 0) -> bytes:
    return struct.pack("<iH", len(payload) + 6, flags) + payload


def _stream() -> bytes:
    """Messages of every shape: one frame, empty frames, frames of ~100 KB (longer than one receive)."""
    items = [os.urandom(size) for size in (100_012, 12, 0, 250_000, 1)]
    big = _frame(b"\0" * 30) + _frame(b"", 1 << 12) + b"".join(_frame(i) for i in items) + _frame(b"", 1 << 11)
    return b"".join(
        [
            _frame(b"\1" * 30, _FINAL),
            big + _frame(b"\2" * 256, _FINAL),
            _frame(b"\3" * 22) + _frame(b"", _FINAL),
            _frame(b"", _FINAL),
        ]
    )


class _Messages:
    def __init__(self) -> None:
        self.got: list[list[tuple[bytes, int]]] = []

    def on_message(self, message: InboundMessage) -> None:
        frames = []
        frame: Any = message.start_frame
        while frame is not None:
            assert type(frame.buf) is bytes
            frames.append((frame.buf, frame.flags))
            frame = frame.next
        self.got.append(frames)


def _read(reader_class: Any, chunks: list[bytes]) -> list[list[tuple[bytes, int]]]:
    messages = _Messages()
    reader = reader_class(messages)
    for chunk in chunks:
        reader.read(chunk)
        if reader.length:
            reader.process()
    assert reader.length == 0
    return messages.got


def test_messages_are_cut_as_the_clients_reader_cuts_them_whatever_the_chunks() -> None:
    from hazelcast import connection

    original = getattr(connection, "_meteor_original_reader", connection._Reader)
    data = _stream() * 2
    rng = random.Random(7)
    cuts = [
        [data],
        [data[i : i + 128_000] for i in range(0, len(data), 128_000)],
        [data[i : i + 1] for i in range(0, 300)] + [data[300:]],
    ]
    for _ in range(5):
        at = sorted(rng.sample(range(1, len(data)), 40))
        cuts.append([data[a:b] for a, b in zip([0, *at], [*at, len(data)], strict=True)])
    expected = _read(original, [data])
    assert len(expected) == 8
    for chunks in cuts:
        assert _read(_FrameReader, chunks) == expected


def test_the_grid_clients_connections_use_the_frame_reader() -> None:
    from hazelcast import connection

    import meteor_spark.grid.client  # noqa: F401 - applies the client fixes

    assert vars(connection)["_Reader"] is _FrameReader
