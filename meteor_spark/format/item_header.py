"""A ring item's header: its layout, packing it, and what a reader learns from the header alone.

Every ring item starts with the magic ``b"MTRB"`` and its format version (the byte at offset 4 in every version, so
any reader can dispatch). ``meteor_spark.format.wire`` describes the whole format (the header's fields, the body,
versions) and decodes items; ``meteor_spark.format.item_encoding`` writes them.

The header has a module of its own because most readers of a ring look at headers only: the item gate (who wrote
an item, transactional or not), offsets by time (``lane_max_ts``), record counts and item marks. The functions here
neither decompress nor checksum the body, and need neither LZ4 nor the body's columns.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from meteor_spark.errors import FormatError, UnsupportedFormatVersionError
from meteor_spark.format.checksum import crc32
from meteor_spark.format.offsets import MAX_RECORDS_PER_ITEM

MAGIC = b"MTRB"
FORMAT_VERSION = 2

FLAG_LZ4 = 0x01
FLAG_KEYS = 0x02
FLAG_HEADERS = 0x04
FLAG_TIMESTAMPS = 0x08
FLAG_TRANSACTIONAL = 0x10
KNOWN_FLAGS = FLAG_LZ4 | FLAG_KEYS | FLAG_HEADERS | FLAG_TIMESTAMPS | FLAG_TRANSACTIONAL

#: The current header (fields in ``meteor_spark.format.wire``'s table); the CRC covers all of it but itself.
HEADER = struct.Struct("<4sBBHIqqqqIII")
HEADER_SIZE = HEADER.size
CRC_COVERED = HEADER_SIZE - 4
#: Version 1: the current header without ``lane_max_ts``.
HEADER_V1 = struct.Struct("<4sBBHIqqqIII")
HEADER_SIZE_V1 = HEADER_V1.size

#: ``lane_max_ts`` before a lane's first record: smaller than any timestamp.
NO_TIMESTAMP = -(1 << 63)
#: Version 0: magic, version, record count; then per record its u32 length and bytes.
V0_HEADER = struct.Struct("<4sBI")
U32 = struct.Struct("<I")


def pack_item(
    flags: int,
    count: int,
    base_ts: int,
    producer_id: int,
    producer_seq: int,
    lane_max: int,
    body_len: int,
    stored: Sequence[Any],
) -> bytes:
    """A current-version item: its header (CRC over the header's first bytes and the stored bytes) then the stored
    bytes, given as pieces (buffers, in order): checksummed piece by piece, then joined once, with the header."""
    stored_len = sum(map(len, stored))
    prefix = HEADER.pack(
        MAGIC, FORMAT_VERSION, flags, 0, count, base_ts, producer_id, producer_seq, lane_max, body_len, stored_len, 0
    )
    crc = crc32(memoryview(prefix)[:CRC_COVERED])
    for piece in stored:
        crc = crc32(piece, crc)
    return b"".join([memoryview(prefix)[:CRC_COVERED], U32.pack(crc), *stored])


def open_item(
    item: bytes | bytearray | memoryview, stream: str, lane: int, sequence: int
) -> tuple[memoryview, str, int]:
    """The item as bytes, where it lies (for messages) and its format version, after checking magic and version."""
    view = memoryview(item)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    where = f"stream {stream!r} lane {lane} sequence {sequence}"
    if len(view) < 5 or view[:4] != MAGIC:
        raise FormatError(
            f"{where}: the ring item ({len(view)} bytes) is not a meteor record batch (bad magic); it was not "
            f"written by a meteor-spark publisher, or it is corrupt"
        )
    version = view[4]
    if version > FORMAT_VERSION:
        raise UnsupportedFormatVersionError(
            f"{where}: the ring item uses record format version {version}, but this meteor-spark only knows "
            f"versions 0..{FORMAT_VERSION}; upgrade meteor-spark on this reader to read it"
        )
    return view, where, version


class ItemHeader(NamedTuple):
    """The fields of a version 1 or 2 header (``lane_max_ts`` None for version 1)."""

    flags: int
    records: int
    base_ts: int
    producer_id: int
    producer_seq: int
    lane_max_ts: int | None
    body_len: int
    stored_len: int
    crc: int
    size: int


def read_header(view: memoryview, where: str, version: int, *, check_crc: bool) -> ItemHeader:
    """The fields of a version 1 or 2 header, checked against the item's length (and its checksum when asked)."""
    size = HEADER_SIZE if version == FORMAT_VERSION else HEADER_SIZE_V1
    if len(view) < size:
        raise FormatError(f"{where}: truncated ring item: {len(view)} bytes, shorter than the {size}-byte header")
    if version == FORMAT_VERSION:
        (_, _, flags, _, count, base_ts, pid, pseq, lane_max, body_len, stored_len, crc) = HEADER.unpack_from(view)
    else:
        (_, _, flags, _, count, base_ts, pid, pseq, body_len, stored_len, crc) = HEADER_V1.unpack_from(view)
        lane_max = None
    stored = view[size:]
    if stored_len != len(stored):
        raise FormatError(
            f"{where}: truncated or padded ring item: the header announces {stored_len} body bytes, "
            f"{len(stored)} follow"
        )
    if check_crc and crc32(stored, crc32(view[: size - 4])) != crc:
        raise FormatError(f"{where}: checksum mismatch: the ring item is corrupt")
    if flags & ~KNOWN_FLAGS:
        raise FormatError(f"{where}: unknown flags 0x{flags & ~KNOWN_FLAGS:02x} in a version {version} item")
    if not 0 < count <= MAX_RECORDS_PER_ITEM:
        raise FormatError(f"{where}: record count {count} is outside 1..{MAX_RECORDS_PER_ITEM}")
    return ItemHeader(flags, count, base_ts, pid, pseq, lane_max, body_len, stored_len, crc, size)


def v0_count(view: memoryview, where: str) -> int:
    if len(view) < V0_HEADER.size:
        raise FormatError(f"{where}: truncated version 0 ring item ({len(view)} bytes)")
    _, _, count = V0_HEADER.unpack_from(view)
    if not 0 < count <= MAX_RECORDS_PER_ITEM:
        raise FormatError(f"{where}: record count {count} is outside 1..{MAX_RECORDS_PER_ITEM}")
    return int(count)


def item_count(item: bytes | bytearray | memoryview, *, stream: str, lane: int, sequence: int) -> int:
    """The number of records in a ring item, from its header alone (the body is neither decompressed nor
    checksummed, so a corrupt body goes unnoticed; ``decode_item`` notices).

    Raises:
        UnsupportedFormatVersionError, FormatError: as ``decode_item``, for a header that fails its own checks.
    """
    view, where, version = open_item(item, stream, lane, sequence)
    if version:
        return read_header(view, where, version, check_crc=False).records
    return v0_count(view, where)


def item_base_timestamp(item: bytes | bytearray | memoryview, *, stream: str, lane: int, sequence: int) -> int | None:
    """The base timestamp (ms) of a ring item from its header alone: the smallest timestamp of its records (the
    encoder writes the minimum, and per-record timestamps as non-negative deltas from it). None for a version 0
    item, whose records carry no timestamp.

    Raises:
        UnsupportedFormatVersionError, FormatError: as ``decode_item``, for a header that fails its own checks.
    """
    view, where, version = open_item(item, stream, lane, sequence)
    if version:
        return read_header(view, where, version, check_crc=False).base_ts
    return None


def item_lane_max_timestamp(
    item: bytes | bytearray | memoryview, *, stream: str, lane: int, sequence: int
) -> int | None:
    """The item's ``lane_max_ts`` from its header alone: the largest record timestamp of the lane up to and
    including this item. None for items of versions 0 and 1, which do not carry it.

    Raises:
        UnsupportedFormatVersionError, FormatError: as ``decode_item``, for a header that fails its own checks.
    """
    view, where, version = open_item(item, stream, lane, sequence)
    if version:
        return read_header(view, where, version, check_crc=False).lane_max_ts
    return None


@dataclass(frozen=True)
class ItemProducer:
    """Who wrote a ring item, from its header alone: what a reader's item gate needs (``meteor_spark.grid.item_gate``).

    Attributes:
        producer_id: the writer; 0 for version 0 items (unknown writer).
        producer_seq: the writer's item counter.
        transactional: flag 0x10.
        count: records in the item.
    """

    producer_id: int
    producer_seq: int
    transactional: bool
    count: int


def item_producer(item: bytes | bytearray | memoryview, *, stream: str, lane: int, sequence: int) -> ItemProducer:
    """The producer fields of a ring item from its header alone (neither decompressed nor checksummed).

    Raises:
        UnsupportedFormatVersionError, FormatError: as ``decode_item``, for a header that fails its own checks.
    """
    view, where, version = open_item(item, stream, lane, sequence)
    if version:
        h = read_header(view, where, version, check_crc=False)
        return ItemProducer(h.producer_id, h.producer_seq, bool(h.flags & FLAG_TRANSACTIONAL), h.records)
    return ItemProducer(0, 0, False, v0_count(view, where))
