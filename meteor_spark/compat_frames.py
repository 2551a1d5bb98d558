"""How hazelcast-python-client's threaded connections cut the bytes they receive into frames: a private coupling,
apart from ``compat_ring.py`` (the ring read path, whose answers come through it) for its size; its check runs with
that module's (``compat.COUPLINGS``).

The client's ``connection._Reader`` appends every chunk the socket gives (up to 128,000 bytes) to one
``io.BytesIO`` and reads each frame back out of it, and empties the buffer only when a message ends exactly where
the received bytes end. Under a stream of large answers (an executor's ring reads: several reads of ~3 MB in flight
at once) that almost never happens, so the buffer keeps growing by an eighth at a time, and once the allocator
serves it from the heap (after any larger block was freed) every growth copies all of it: measured on 100-byte
records, ~50 ns of the reactor thread per record, more than the rest of the read path together, for what is one
copy of each byte.

``_FrameReader`` has the same interface and reads the same frames into the same ``Frame`` / ``InboundMessage``
objects, but keeps the received chunks as they are (a deque) and cuts each frame out of them when it is complete:
a frame inside one chunk is one slice (the whole chunk when it is exactly that), a frame across chunks one join of
its pieces. Every frame is ``bytes``, as the client's own reader gives. Memory is what the client holds anyway: the
bytes received and not yet cut into frames.

Applied to the versions it was written for (``fix_frame_reader``; another version runs the client's own reader).
The asyncio client has a reader of its own and is left as it is.
"""

from __future__ import annotations

import inspect
import logging
import struct
from collections import deque
from importlib.metadata import PackageNotFoundError, version
from typing import Any

logger = logging.getLogger(__name__)

#: The distribution every patch of the compat modules is written against (its versions: ``written_for``).
CLIENT = "hazelcast-python-client"
#: hazelcast-python-client versions the frame reader was written for (``check_frame_reader``).
FRAMES_WRITTEN_FOR = ((5, 7), (5, 8))

#: A frame's length (its header included) and flags, as the client's reader unpacks them.
_FRAME_HEADER = struct.Struct("<iH")


class _FrameReader:
    """``hazelcast.connection._Reader`` over a deque of received chunks (see the module's notes)."""

    __slots__ = (
        "_builder",
        "_chunks",
        "_flags",
        "_frame_class",
        "_frame_size",
        "_length",
        "_message",
        "_message_class",
        "_skip",
    )

    def __init__(self, builder: Any) -> None:
        from hazelcast.protocol.client_message import Frame, InboundMessage

        self._builder = builder
        self._frame_class = Frame
        self._message_class = InboundMessage
        self._chunks: deque[bytes] = deque()
        self._skip = 0  # bytes of the first chunk already cut into frames
        self._length = 0  # bytes received and not cut yet
        self._frame_size = -1  # the body size of the frame whose header was read, -1 before its header
        self._flags = 0
        self._message: Any = None

    def read(self, data: bytes) -> None:
        if data:
            self._chunks.append(data)
            self._length += len(data)

    @property
    def length(self) -> int:
        return self._length

    def process(self) -> None:
        builder = self._builder
        message = self._read_message()
        while message is not None:
            builder.on_message(message)
            message = self._read_message()

    def _read_message(self) -> Any:
        while True:
            if self._frame_size == -1:
                if self._length < _FRAME_HEADER.size:
                    return None
                size, self._flags = _FRAME_HEADER.unpack(self._take(_FRAME_HEADER.size))
                self._frame_size = size - _FRAME_HEADER.size
            if self._length < self._frame_size:
                return None
            frame = self._frame_class(self._take(self._frame_size), self._flags)
            self._frame_size = -1
            if self._message is None:
                self._message = self._message_class(frame)
            else:
                self._message.add_frame(frame)
            if frame.is_final_frame():
                message, self._message = self._message, None
                return message

    def _take(self, size: int) -> bytes:
        """The next ``size`` received bytes (``size <= self._length``), removed from the chunks."""
        if not size:
            return b""
        chunks = self._chunks
        self._length -= size
        first = chunks[0]
        skip = self._skip
        end = skip + size
        if end <= len(first):
            if end == len(first):
                chunks.popleft()
                self._skip = 0
                return first if skip == 0 else first[skip:]
            self._skip = end
            return first[skip:end]
        pieces = []
        while size:
            first = chunks[0]
            part = min(size, len(first) - skip)
            pieces.append(memoryview(first)[skip : skip + part])
            size -= part
            if skip + part == len(first):
                chunks.popleft()
                skip = 0
            else:
                skip += part
        self._skip = skip
        return b"".join(pieces)


def fix_frame_reader() -> bool:
    """Have the client's threaded connections read frames with ``_FrameReader`` (the versions it was written for
    only); returns whether it is applied. Connections made before keep their reader."""
    from hazelcast import connection

    if getattr(connection, "_Reader", None) is _FrameReader:
        return True
    if not written_for(FRAMES_WRITTEN_FOR):
        return False
    try:
        check_frame_reader()
    except AssertionError as exc:
        logger.warning("hazelcast-python-client's frame reader changed (%s); keeping its own", exc)
        return False
    module: Any = connection
    module._meteor_original_reader = module._Reader
    module._Reader = _FrameReader
    return True


def written_for(versions: tuple[tuple[int, int], tuple[int, int]]) -> bool:
    """Whether the installed hazelcast-python-client is of ``versions`` (from, below): a patch of its private
    details applies to the versions it was written for only (this module's and ``compat_ring``'s)."""
    found = installed_version(CLIENT)
    return found is not None and versions[0] <= found < versions[1]


def installed_version(distribution: str) -> tuple[int, int] | None:
    """``(major, minor)`` of an installed distribution, from its metadata (nothing is imported), else None. Here,
    the leaf of the compat modules, so that ``compat`` and ``compat_ring`` read versions the same way."""
    try:
        text = version(distribution)
    except PackageNotFoundError:
        return None
    major, _, rest = text.partition(".")
    minor = "".join(ch for ch in rest.partition(".")[0] if ch.isdigit())
    return int(major), int(minor or 0)


def check_frame_reader() -> None:
    """The client's reader is still made, fed and cut into frames as ``_FrameReader`` does it."""
    from hazelcast import connection, reactor
    from hazelcast.protocol import client_message

    original = getattr(connection, "_meteor_original_reader", None) or vars(connection)["_Reader"]
    assert set(vars(original)) >= {"read", "process", "length"}, "_Reader lost read / process / length"
    assert "self._reader = _Reader(self._builder)" in inspect.getsource(connection.Connection.__init__), (
        "Connection no longer makes its reader as `_Reader(self._builder)`"
    )
    read = inspect.getsource(reactor.AsyncoreConnection.handle_read)
    uses = {line.strip() for line in read.splitlines() if "reader" in line}
    assert uses == {"reader = self._reader", "reader.read(data)", "if reader.length:", "reader.process()"}, (
        f"AsyncoreConnection.handle_read uses its reader in new ways: {sorted(uses)}"
    )
    source = inspect.getsource(original)
    for step in (
        "self._builder.on_message(message)",
        "self._message.end_frame.is_final_frame()",
        "frame = Frame(data, self._frame_flags)",
        "self._message = InboundMessage(frame)",
        "self._message.add_frame(frame)",
        "self._frame_size -= SIZE_OF_FRAME_LENGTH_AND_FLAGS",
    ):
        assert step in source, f"_Reader no longer does `{step}`"
    assert connection._frame_header.format == _FRAME_HEADER.format, "the frame header's layout changed"
    assert _FRAME_HEADER.size == client_message.SIZE_OF_FRAME_LENGTH_AND_FLAGS, "the frame header's size changed"
