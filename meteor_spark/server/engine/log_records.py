"""The record format every persistence log shares: ``uint32 length | uint32 crc32 | body`` (little-endian).

A ring log's record body starts with its int64 sequence; a map log's body is a map change (``engine.map_log``). The
framing lives apart from the logs so the scanner that recovers them (``engine.log_recovery``), the ring store and the
map log agree on one definition of a record, and of the damage a recovery reports.
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass

HEADER = struct.Struct("<II")
SEQUENCE = struct.Struct("<q")
MAX_RECORD = 1 << 31  # a length beyond this is garbage, not a record


def frame(body_parts: list[bytes | bytearray | memoryview]) -> list[bytes | bytearray | memoryview]:
    """``length | crc32 | body`` as a list of buffers for ``os.writev`` (the body is never copied)."""
    crc = 0
    length = 0
    for part in body_parts:
        crc = zlib.crc32(part, crc)
        length += len(part)
    return [HEADER.pack(length, crc), *body_parts]


def append_record(fd: int, body_parts: list[bytes | bytearray | memoryview]) -> int:
    """Append one framed record to a log opened with ``O_APPEND``; the bytes written.

    Raises:
        OSError: the write failed (disk full...): the operation is refused, never acknowledged.
    """
    parts = frame(body_parts)
    expected = sum(len(part) for part in parts)
    written = os.writev(fd, parts)
    while written < expected:  # a short write: finish the record, never leave a silent hole in the log
        written += os.write(fd, b"".join(bytes(part) for part in parts)[written:])
    return expected


@dataclass(frozen=True)
class Scanned:
    """A record a scan found well-formed: where it is, and its header."""

    offset: int
    """File offset of the record's header."""
    length: int
    """Body length."""
    crc: int
    sequence: int = -1
    """A ring record's sequence (-1 in the map log)."""

    @property
    def end(self) -> int:
        return self.offset + HEADER.size + self.length


@dataclass(frozen=True)
class Damage:
    """A damaged byte range ``[start, end)`` of a log, and what it cost."""

    start: int
    end: int
    reason: str
    torn: bool = False
    """A real torn tail: the last record, cut short by the end of the file (a write the crash interrupted)."""
    lost_first: int = -1
    """Ring logs: the first sequence lost with these bytes (-1 when the log is a map log)."""
    lost_last: int = -2
    """Ring logs: the last sequence lost (an upper bound when ``exact`` is False)."""
    exact: bool = True

    @property
    def size(self) -> int:
        return self.end - self.start

    def lost(self) -> str:
        if self.lost_first < 0:
            return "unknown records"
        count = self.lost_last - self.lost_first + 1
        items = "item" if count == 1 else "items"
        if self.exact:
            return f"ring sequences {self.lost_first}..{self.lost_last} ({count} {items})"
        return f"ring sequences from {self.lost_first} up to at most {self.lost_last} (at most {count} {items})"
