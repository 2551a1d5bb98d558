"""The versioned ring-item wire format: encoding records into ring items and decoding them (no pyarrow here).

A ring item holds a micro-batch of records. Format version 2 (little-endian throughout)::

    header (56 bytes)
      magic            4s   b"MTRB"
      version          u8   2 (the byte at offset 4 is the version in every format, so any reader can dispatch)
      flags            u8   0x01 LZ4 body, 0x02 keys, 0x04 headers, 0x08 per-record timestamps,
                            0x10 transactional (see below)
      reserved         u16  0
      count            u32  records in the item, 1..65,536
      base_timestamp   i64  ms since the epoch (the timestamp of every record unless flag 0x08)
      producer_id      i64  who wrote the item (a FlakeId or random id)
      producer_seq     i64  the producer's item counter (gaps/duplicates show lost or repeated publishes)
      lane_max_ts      i64  the largest record timestamp of the lane up to and including this item (see below)
      body_length      u32  bytes of the body once decompressed
      stored_length    u32  bytes following the header (the body, LZ4-compressed when flag 0x01)
      crc32            u32  zlib CRC-32 of header bytes 0..51 followed by the stored bytes
    body, column by column (so a reader slices buffers instead of walking records)
      value_lengths    i32[count]
      key_lengths      i32[count]        flag 0x02; -1 = the record has no key
      timestamp_deltas i64[count]        flag 0x08; ms after base_timestamp
      header_counts    i32[count]        flag 0x04; headers per record
      hkey_lengths     i32[n_headers]    flag 0x04
      hvalue_lengths   i32[n_headers]    flag 0x04
      value bytes, key bytes (0x02), header key UTF-8 bytes (0x04), header value bytes (0x04)

``lane_max_ts`` is Kafka's time-index entry (the largest timestamp so far) carried by every item: it never
decreases along a lane, whatever order the records' own timestamps come in, so a binary search over it finds the
first item holding a record at or after a time (``meteor_spark.grid.timestamps``). The publisher keeps it per lane: it
starts from the ``lane_max_ts`` of the lane's last item (read once, when the publisher starts) and raises it with
every item it encodes (``ItemFraming.lane_max_timestamp``, ``encode_items``). Version 1 is version 2 without this
field (48-byte header, CRC over bytes 0..43); its items are still read, their running maximum unknown.

Transactional items (flag 0x10) are written by a transaction's producer (the transactional Spark sink, one
producer id per task attempt; ``meteor_spark.grid.transactions``). The flag is the only difference: the producer id
in the header is the link to the transaction (map ``meteor.txn.producers``: producer id -> transaction), so the
header keeps its size and items without the flag stay byte-identical to what earlier versions wrote. A
``read_committed`` reader delivers such an item only once its transaction committed that producer id, and never
when it was aborted; a ``read_uncommitted`` reader delivers it like any other. A reader that predates the flag
refuses the item loudly (unknown flag), so it never delivers uncommitted records unknowingly.

The LZ4 block format is used (``lz4.block``, no size prefix; the header carries ``body_length``), and only when
the body reaches the compression threshold and actually shrinks.

Versions: a reader that meets a version newer than ``FORMAT_VERSION`` raises ``UnsupportedFormatVersionError``
(upgrade the library); older versions are upgraded on read into the current in-memory shape. Version 0 is the
legacy row-wise layout ``magic, 0, count u32, then count x (length u32, value bytes)``: values only, no keys,
headers, timestamps or checksum (``encode_batch_v0`` writes it so the upgrade path stays tested; ``encode_item_v1``
does the same for version 1).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NamedTuple

import lz4.block
import numpy as np

from meteor_spark.errors import ConfigError, FormatError, SizeLimitError, UnsupportedFormatVersionError
from meteor_spark.format.offsets import INDEX_BITS, MAX_RECORDS_PER_ITEM

MAGIC = b"MTRB"
FORMAT_VERSION = 2

FLAG_LZ4 = 0x01
FLAG_KEYS = 0x02
FLAG_HEADERS = 0x04
FLAG_TIMESTAMPS = 0x08
FLAG_TRANSACTIONAL = 0x10
_KNOWN_FLAGS = FLAG_LZ4 | FLAG_KEYS | FLAG_HEADERS | FLAG_TIMESTAMPS | FLAG_TRANSACTIONAL

_HEADER = struct.Struct("<4sBBHIqqqqIII")
HEADER_SIZE = _HEADER.size
_CRC_COVERED = HEADER_SIZE - 4
_HEADER_V1 = struct.Struct("<4sBBHIqqqIII")
HEADER_SIZE_V1 = _HEADER_V1.size

#: ``lane_max_ts`` before a lane's first record: smaller than any timestamp.
NO_TIMESTAMP = -(1 << 63)
_V0_HEADER = struct.Struct("<4sBI")
_U32 = struct.Struct("<I")

COMPRESSIONS = ("lz4", "none")
_MAX_U32 = (1 << 32) - 1
_MAX_I32 = (1 << 31) - 1

_I32 = np.dtype("<i4")
_I64 = np.dtype("<i8")

# --------------------------------------------------------------------------------------------------- encoding


def encode_columns(
    values: Sequence[bytes],
    *,
    keys: Sequence[bytes | None] | None = None,
    headers: Sequence[Sequence[tuple[str, bytes]]] | None = None,
    timestamps: Sequence[int] | np.ndarray | int,
    producer_id: int,
    producer_seq: int,
    compression: str = "lz4",
    compression_threshold: int = 1024,
) -> bytes:
    """Encode records given column-wise (no ``Record`` objects needed).

    ``timestamps`` is one int (every record) or one per record (ms since the epoch). ``keys`` / ``headers``
    may be None when no record has any.
    """
    columns = prepare_columns(values, keys=keys, headers=headers, timestamps=timestamps)
    return encode_prepared([columns], ItemFraming(producer_id, producer_seq, compression, compression_threshold))


@dataclass(frozen=True)
class ItemFraming:
    """Who writes a ring item and how its body is stored: the header fields beyond the records themselves.

    Attributes:
        producer_id: the writer (a FlakeId or random id).
        producer_seq: the writer's item counter (gaps or repeats show lost or duplicated publishes).
        compression: "lz4" or "none".
        compression_threshold: bodies from this many bytes on are compressed (when that pays, see
            ``encode_prepared``).
        transactional: set flag 0x10: the producer belongs to a transaction (``meteor_spark.grid.transactions``).
        lane_max_timestamp: the largest record timestamp of the lane before these items (``NO_TIMESTAMP``: none);
            each item's ``lane_max_ts`` is it raised by that item's records and those of the items before it.
    """

    producer_id: int
    producer_seq: int
    compression: str = "lz4"
    compression_threshold: int = 1024
    transactional: bool = False
    lane_max_timestamp: int = NO_TIMESTAMP


@dataclass(frozen=True)
class PreparedColumns:
    """Records of one ring item (or of a piece of one) as length columns plus data, ready to be framed.

    Lengths are little-endian int32 numpy arrays (``key_lengths`` -1 = no key); ``timestamps`` is one int for
    every record or an int64 array; the header fields are all None when no record has headers.
    """

    count: int
    value_lengths: np.ndarray
    value_data: Any
    timestamps: np.ndarray | int
    key_lengths: np.ndarray | None = None
    key_data: Any = b""
    header_counts: np.ndarray | None = None
    hkey_lengths: np.ndarray | None = None
    hkey_data: Any = b""
    hvalue_lengths: np.ndarray | None = None
    hvalue_data: Any = b""


def header_bytes(headers: Sequence[Sequence[tuple[str, bytes]]]) -> np.ndarray:
    """Bytes of each record's headers (keys and values, as ``len`` counts them), int64: what the batching limits
    count for them."""
    return np.fromiter((sum(len(k) + len(v) for k, v in hs) for hs in headers), dtype=np.int64, count=len(headers))


def prepare_columns(
    values: Sequence[bytes],
    *,
    keys: Sequence[bytes | None] | None = None,
    headers: Sequence[Sequence[tuple[str, bytes]]] | None = None,
    timestamps: Sequence[int] | np.ndarray | int,
) -> PreparedColumns:
    """Length columns and joined data of records given as Python lists (validated: bytes, str header keys)."""
    count = len(values)
    try:
        value_lengths = np.fromiter(map(len, values), dtype=_I32, count=count)
        value_data = b"".join(values)
    except TypeError:
        raise _bad_column("value", values, allow_none=False) from None
    key_lengths = None
    key_data = b""
    if keys is not None and any(k is not None for k in keys):
        if len(keys) != count:
            raise ConfigError(f"keys: got {len(keys)} keys for {count} values; give one key (or None) per value")
        try:
            key_lengths = np.fromiter((-1 if k is None else len(k) for k in keys), dtype=_I32, count=count)
            key_data = b"".join([k for k in keys if k is not None])
        except TypeError:
            raise _bad_column("key", keys, allow_none=True) from None
    stamps: np.ndarray | int
    if isinstance(timestamps, (int, np.integer)):
        stamps = int(timestamps)
    else:
        stamps = np.asarray(timestamps, dtype=_I64)
        if stamps.shape != (count,):
            raise ConfigError(f"timestamps: got {stamps.size} timestamps for {count} values; give one per value")
    header_counts = hkey_lengths = hvalue_lengths = None
    hkey_data = hvalue_data = b""
    if headers is not None and any(headers):
        if len(headers) != count:
            raise ConfigError(f"headers: got {len(headers)} header lists for {count} values; give one per value")
        try:
            header_counts = np.fromiter(map(len, headers), dtype=_I32, count=count)
            hkeys = [k.encode("utf-8") for hs in headers for k, _ in hs]
            hvalues = [v for hs in headers for _, v in hs]
            hkey_data = b"".join(hkeys)
            hvalue_data = b"".join(hvalues)
        except (TypeError, AttributeError, ValueError):
            raise ConfigError(
                "headers must be (str key, bytes value) pairs, e.g. (('trace-id', b'abc'),); got "
                f"{_first_bad_headers(headers)!r}"
            ) from None
        hkey_lengths = np.fromiter(map(len, hkeys), dtype=_I32, count=len(hkeys))
        hvalue_lengths = np.fromiter(map(len, hvalues), dtype=_I32, count=len(hvalues))
    # Positional, in field order (the locals are named after the fields).
    return PreparedColumns(
        count,
        value_lengths,
        value_data,
        stamps,
        key_lengths,
        key_data,
        header_counts,
        hkey_lengths,
        hkey_data,
        hvalue_lengths,
        hvalue_data,
    )


def encode_prepared(pieces: Sequence[PreparedColumns], framing: ItemFraming) -> bytes:
    """Frame the records of one or more prepared pieces, in order, as one ring item (current format version).

    The body is LZ4-compressed when it reaches ``framing.compression_threshold`` and compression saves at least
    1/16 of it: every reader decompresses every item, so a body that barely shrinks (incompressible values) is
    cheaper to store as it is.
    """
    return encode_items([pieces], framing)[0]


def encode_items(items: Sequence[Sequence[PreparedColumns]], framing: ItemFraming) -> list[bytes]:
    """Frame the ring items of one ``add_all`` call, each from its prepared pieces (see ``encode_prepared``);
    item ``i`` gets producer sequence ``framing.producer_seq + i``. The framing is checked once per call."""
    if framing.compression not in COMPRESSIONS:
        raise ConfigError(f"compression {framing.compression!r} is not supported; use one of {', '.join(COMPRESSIONS)}")
    lz4_from = framing.compression_threshold if framing.compression == "lz4" else None
    flags = FLAG_TRANSACTIONAL if framing.transactional else 0
    producer_id, first_seq = framing.producer_id, framing.producer_seq
    lane_max = framing.lane_max_timestamp
    out: list[bytes] = []
    for i, pieces in enumerate(items):
        item, lane_max = _encode_item(
            pieces[0] if len(pieces) == 1 else _joined(pieces), flags, lz4_from, producer_id, first_seq + i, lane_max
        )
        out.append(item)
    return out


def _joined(pieces: Sequence[PreparedColumns]) -> PreparedColumns:
    """The pieces of one item as one: columns concatenated, data kept as a list of blobs (joined with the body)."""
    count = sum(p.count for p in pieces)
    keys = None
    if any(p.key_lengths is not None for p in pieces):
        keys = _join_arrays(
            [p.key_lengths if p.key_lengths is not None else np.full(p.count, -1, _I32) for p in pieces], _I32
        )
    stamps: np.ndarray | int
    if all(isinstance(p.timestamps, int) for p in pieces) and len({p.timestamps for p in pieces}) == 1:
        stamps = int(pieces[0].timestamps)
    else:
        stamps = np.concatenate(
            [
                np.full(p.count, p.timestamps, dtype=_I64) if isinstance(p.timestamps, int) else p.timestamps
                for p in pieces
            ]
        ).astype(_I64, copy=False)
    header_counts = hkey_lengths = hvalue_lengths = None
    hkey_data: Any = []
    hvalue_data: Any = []
    if any(p.header_counts is not None for p in pieces):
        with_headers = [p for p in pieces if p.header_counts is not None]
        header_counts = _join_arrays(
            [p.header_counts if p.header_counts is not None else np.zeros(p.count, _I32) for p in pieces], _I32
        )
        hkey_lengths = _join_arrays([p.hkey_lengths for p in with_headers], _I32)
        hvalue_lengths = _join_arrays([p.hvalue_lengths for p in with_headers], _I32)
        hkey_data = [p.hkey_data for p in with_headers]
        hvalue_data = [p.hvalue_data for p in with_headers]
    return PreparedColumns(
        count,
        _join_arrays([p.value_lengths for p in pieces], _I32),
        [p.value_data for p in pieces],
        stamps,
        keys,
        [p.key_data for p in pieces if p.key_lengths is not None],
        header_counts,
        hkey_lengths,
        hkey_data,
        hvalue_lengths,
        hvalue_data,
    )


def _view(array: Any, dtype: np.dtype) -> Any:
    """A column's bytes, in the wire's dtype (a view when it already is one)."""
    contiguous: Any = np.ascontiguousarray(array, dtype=dtype)
    return memoryview(contiguous)


def _blobs(data: Any) -> list[Any]:
    return data if isinstance(data, list) else [data]


def _encode_item(
    p: PreparedColumns, flags: int, lz4_from: int | None, producer_id: int, producer_seq: int, lane_max: int
) -> tuple[bytes, int]:
    """One framed item and the lane's largest timestamp once it is stored."""
    count = p.count
    if not 0 < count <= MAX_RECORDS_PER_ITEM:
        raise ConfigError(f"a ring item holds 1..{MAX_RECORDS_PER_ITEM} records, got {count}")
    parts: list[Any] = [_view(p.value_lengths, _I32)]
    blobs = _blobs(p.value_data)
    if p.key_lengths is not None:
        flags |= FLAG_KEYS
        parts.append(_view(p.key_lengths, _I32))
        blobs = blobs + _blobs(p.key_data)
    stamps = p.timestamps
    if isinstance(stamps, (int, np.integer)):
        base_ts = max_ts = int(stamps)
    else:
        stamps = np.asarray(stamps, dtype=_I64)
        base_ts = int(stamps.min())
        max_ts = int(stamps.max())
        if max_ts != base_ts:
            flags |= FLAG_TIMESTAMPS
            parts.append(_view(stamps - base_ts, _I64))
    lane_max = max(lane_max, max_ts)
    if p.header_counts is not None:
        flags |= FLAG_HEADERS
        parts += [
            _view(p.header_counts, _I32),
            _view(p.hkey_lengths, _I32),
            _view(p.hvalue_lengths, _I32),
        ]
        blobs = blobs + _blobs(p.hkey_data) + _blobs(p.hvalue_data)
    body = b"".join(parts + blobs)
    if len(body) > _MAX_U32:
        raise SizeLimitError(
            f"a ring item of {len(body)} bytes exceeds the 4 GiB format limit; lower max_batch_bytes/max_batch_records"
        )
    stored: bytes = body
    if lz4_from is not None and len(body) >= lz4_from:
        packed = lz4.block.compress(body, store_size=False)
        if len(packed) <= len(body) - (len(body) >> 4):
            stored = packed
            flags |= FLAG_LZ4
    return _frame(flags, count, base_ts, producer_id, producer_seq, lane_max, len(body), stored), lane_max


def _join_arrays(arrays: Sequence[Any], dtype: np.dtype) -> np.ndarray:
    if len(arrays) == 1:
        return np.ascontiguousarray(arrays[0], dtype=dtype)
    return np.concatenate(arrays).astype(dtype, copy=False)


def _frame(
    flags: int,
    count: int,
    base_ts: int,
    producer_id: int,
    producer_seq: int,
    lane_max: int,
    body_len: int,
    stored: bytes,
) -> bytes:
    prefix = _HEADER.pack(
        MAGIC, FORMAT_VERSION, flags, 0, count, base_ts, producer_id, producer_seq, lane_max, body_len, len(stored), 0
    )
    crc = zlib.crc32(stored, zlib.crc32(memoryview(prefix)[:_CRC_COVERED]))
    return b"".join((prefix[:_CRC_COVERED], _U32.pack(crc), stored))


def encode_item_v1(values: Sequence[bytes], *, timestamps: Sequence[int] | int, producer_id: int = 0) -> bytes:
    """Write format version 1 (version 2 without ``lane_max_ts``). Kept so the upgrade-on-read path stays tested."""
    item = encode_columns(values, timestamps=timestamps, producer_id=producer_id, producer_seq=0, compression="none")
    _, _, flags, _, count, base_ts, pid, pseq, _, _, _, _ = _HEADER.unpack_from(item)
    stored = item[HEADER_SIZE:]
    prefix = _HEADER_V1.pack(MAGIC, 1, flags, 0, count, base_ts, pid, pseq, len(stored), len(stored), 0)
    crc = zlib.crc32(stored, zlib.crc32(memoryview(prefix)[: HEADER_SIZE_V1 - 4]))
    return b"".join((prefix[: HEADER_SIZE_V1 - 4], _U32.pack(crc), stored))


def encode_batch_v0(values: Sequence[bytes]) -> bytes:
    """Write the legacy format version 0 (values only, row-wise). Kept so the upgrade-on-read path stays tested."""
    parts = [_V0_HEADER.pack(MAGIC, 0, len(values))]
    for value in values:
        parts += [_U32.pack(len(value)), value]
    return b"".join(parts)


def _bad_column(name: str, column: Sequence[Any], allow_none: bool) -> ConfigError:
    for index, value in enumerate(column):
        if value is None and allow_none:
            continue
        if not isinstance(value, (bytes, bytearray, memoryview)):
            return ConfigError(
                f"record {index}: {name} is a {type(value).__name__}, not bytes; encode it to bytes before publishing"
            )
    return ConfigError(f"{name}s must be bytes")


def _first_bad_headers(headers: Sequence[Any]) -> Any:
    for hs in headers:
        for pair in hs:
            if (
                not isinstance(pair, tuple)
                or len(pair) != 2
                or not isinstance(pair[0], str)
                or not isinstance(pair[1], (bytes, bytearray, memoryview))
            ):
                return pair
    return headers


# --------------------------------------------------------------------------------------------------- decoded items


@dataclass(frozen=True, eq=False)
class ItemView:
    """One decoded ring item: numpy views of its length columns and memoryviews of its data (no per-record work).

    ``base_timestamp_ms`` is None for legacy items whose records carry no timestamp. ``transactional``: flag 0x10.
    ``lane_max_timestamp_ms``: the header's ``lane_max_ts`` (None before format version 2).
    """

    version: int
    count: int
    producer_id: int
    producer_seq: int
    base_timestamp_ms: int | None
    timestamp_deltas: np.ndarray | None
    value_lengths: np.ndarray
    value_data: memoryview
    key_lengths: np.ndarray | None = None
    key_data: memoryview | None = None
    header_counts: np.ndarray | None = None
    hkey_lengths: np.ndarray | None = None
    hkey_data: memoryview | None = None
    hvalue_lengths: np.ndarray | None = None
    hvalue_data: memoryview | None = None
    transactional: bool = False
    lane_max_timestamp_ms: int | None = None

    @cached_property
    def value_offsets(self) -> np.ndarray:
        return _prefix_sums(self.value_lengths)

    @cached_property
    def key_offsets(self) -> np.ndarray:
        assert self.key_lengths is not None
        return _prefix_sums(np.maximum(self.key_lengths, 0))

    @cached_property
    def header_offsets(self) -> np.ndarray:
        assert self.header_counts is not None
        return _prefix_sums(self.header_counts)

    @cached_property
    def hkey_offsets(self) -> np.ndarray:
        assert self.hkey_lengths is not None
        return _prefix_sums(self.hkey_lengths)

    @cached_property
    def hvalue_offsets(self) -> np.ndarray:
        assert self.hvalue_lengths is not None
        return _prefix_sums(self.hvalue_lengths)

    def timestamps(self, start: int, stop: int | None) -> np.ndarray | None:
        """Per-record timestamps (ms) of records ``[start, stop)`` (``stop`` None: to the last); None for legacy
        items without timestamps."""
        if stop is None:
            stop = self.count
        if self.base_timestamp_ms is None:
            return None
        if self.timestamp_deltas is None:
            return np.full(stop - start, self.base_timestamp_ms, dtype=np.int64)
        return self.timestamp_deltas[start:stop] + self.base_timestamp_ms


def _prefix_sums(lengths: np.ndarray) -> np.ndarray:
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


@dataclass(frozen=True)
class ItemSlice:
    """Records ``[start, stop)`` of one decoded ring item of a lane (``records.BatchPart`` makes them records)."""

    stream: str
    lane: int
    sequence: int
    item: ItemView
    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start

    @property
    def first_offset(self) -> int:
        return self.sequence << INDEX_BITS | self.start

    @property
    def last_offset(self) -> int:
        return self.sequence << INDEX_BITS | (self.stop - 1)


# --------------------------------------------------------------------------------------------------- decoding


def decode_item(item: bytes | bytearray | memoryview, *, stream: str, lane: int, sequence: int) -> ItemView:
    """Decode one ring item.

    Raises:
        UnsupportedFormatVersionError: written by a newer format version than this library knows.
        FormatError: not a record batch, or corrupt; the message names stream, lane and sequence.
    """
    view, where, version = _open_item(item, stream, lane, sequence)
    if version:
        return _decode_v1(view, where, version)
    return _decode_v0(view, where)


def item_count(item: bytes | bytearray | memoryview, *, stream: str, lane: int, sequence: int) -> int:
    """The number of records in a ring item, from its header alone (the body is neither decompressed nor
    checksummed, so a corrupt body goes unnoticed; ``decode_item`` notices).

    Raises:
        UnsupportedFormatVersionError, FormatError: as ``decode_item``, for a header that fails its own checks.
    """
    view, where, version = _open_item(item, stream, lane, sequence)
    if version:
        return _v1_header(view, where, version, check_crc=False).records
    return _v0_count(view, where)


def item_base_timestamp(item: bytes | bytearray | memoryview, *, stream: str, lane: int, sequence: int) -> int | None:
    """The base timestamp (ms) of a ring item from its header alone: the smallest timestamp of its records (the
    encoder writes the minimum, and per-record timestamps as non-negative deltas from it). None for a version 0
    item, whose records carry no timestamp.

    Raises:
        UnsupportedFormatVersionError, FormatError: as ``decode_item``, for a header that fails its own checks.
    """
    view, where, version = _open_item(item, stream, lane, sequence)
    if version:
        return _v1_header(view, where, version, check_crc=False).base_ts
    return None


def item_lane_max_timestamp(
    item: bytes | bytearray | memoryview, *, stream: str, lane: int, sequence: int
) -> int | None:
    """The item's ``lane_max_ts`` from its header alone: the largest record timestamp of the lane up to and
    including this item. None for items of versions 0 and 1, which do not carry it.

    Raises:
        UnsupportedFormatVersionError, FormatError: as ``decode_item``, for a header that fails its own checks.
    """
    view, where, version = _open_item(item, stream, lane, sequence)
    if version:
        return _v1_header(view, where, version, check_crc=False).lane_max_ts
    return None


def lane_max_after(item: bytes | bytearray | memoryview, *, stream: str, lane: int, sequence: int) -> int:
    """The largest record timestamp of a lane whose last item is ``item``, as a new publisher continues it: the
    header's ``lane_max_ts``, or for an older item (which lacks it) the largest timestamp of its own records
    (``NO_TIMESTAMP`` for a version 0 item).

    Raises:
        UnsupportedFormatVersionError, FormatError: as ``decode_item``.
    """
    found = item_lane_max_timestamp(item, stream=stream, lane=lane, sequence=sequence)
    if found is not None:
        return found
    stamps = decode_item(item, stream=stream, lane=lane, sequence=sequence).timestamps(0, None)
    return NO_TIMESTAMP if stamps is None else int(stamps.max())


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
    view, where, version = _open_item(item, stream, lane, sequence)
    if version:
        h = _v1_header(view, where, version, check_crc=False)
        return ItemProducer(h.producer_id, h.producer_seq, bool(h.flags & FLAG_TRANSACTIONAL), h.records)
    return ItemProducer(0, 0, False, _v0_count(view, where))


def _open_item(
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


class _Header(NamedTuple):
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


def _v1_header(view: memoryview, where: str, version: int, *, check_crc: bool) -> _Header:
    """The fields of a version 1 or 2 header, checked against the item's length (and its checksum when asked)."""
    size = HEADER_SIZE if version == FORMAT_VERSION else HEADER_SIZE_V1
    if len(view) < size:
        raise FormatError(f"{where}: truncated ring item: {len(view)} bytes, shorter than the {size}-byte header")
    if version == FORMAT_VERSION:
        (_, _, flags, _, count, base_ts, pid, pseq, lane_max, body_len, stored_len, crc) = _HEADER.unpack_from(view)
    else:
        (_, _, flags, _, count, base_ts, pid, pseq, body_len, stored_len, crc) = _HEADER_V1.unpack_from(view)
        lane_max = None
    stored = view[size:]
    if stored_len != len(stored):
        raise FormatError(
            f"{where}: truncated or padded ring item: the header announces {stored_len} body bytes, "
            f"{len(stored)} follow"
        )
    if check_crc and zlib.crc32(stored, zlib.crc32(view[: size - 4])) != crc:
        raise FormatError(f"{where}: checksum mismatch: the ring item is corrupt")
    if flags & ~_KNOWN_FLAGS:
        raise FormatError(f"{where}: unknown flags 0x{flags & ~_KNOWN_FLAGS:02x} in a version {version} item")
    if not 0 < count <= MAX_RECORDS_PER_ITEM:
        raise FormatError(f"{where}: record count {count} is outside 1..{MAX_RECORDS_PER_ITEM}")
    return _Header(flags, count, base_ts, pid, pseq, lane_max, body_len, stored_len, crc, size)


def _decode_v1(view: memoryview, where: str, version: int) -> ItemView:
    h = _v1_header(view, where, version, check_crc=True)
    flags, count, body_len = h.flags, h.records, h.body_len
    stored = view[h.size :]
    if flags & FLAG_LZ4:
        try:
            body = memoryview(lz4.block.decompress(stored, uncompressed_size=body_len))
        except lz4.block.LZ4BlockError as exc:
            raise FormatError(f"{where}: the LZ4 body does not decompress ({exc})") from None
        if len(body) != body_len:
            raise FormatError(f"{where}: the LZ4 body decompressed to {len(body)} bytes, {body_len} announced")
    else:
        if h.stored_len != body_len:
            raise FormatError(f"{where}: uncompressed body of {h.stored_len} bytes, {body_len} announced")
        body = stored
    reader = _BodyReader(body, where)
    value_lengths = reader.array(_I32, count, "value lengths")
    key_lengths = reader.array(_I32, count, "key lengths") if flags & FLAG_KEYS else None
    deltas = reader.array(_I64, count, "timestamp deltas") if flags & FLAG_TIMESTAMPS else None
    header_counts = hkey_lengths = hvalue_lengths = None
    if flags & FLAG_HEADERS:
        header_counts = reader.array(_I32, count, "header counts")
        reader.non_negative(header_counts, "header count")
        n_headers = int(header_counts.sum())
        hkey_lengths = reader.array(_I32, n_headers, "header key lengths")
        hvalue_lengths = reader.array(_I32, n_headers, "header value lengths")
    reader.non_negative(value_lengths, "value length")
    value_data = reader.blob(int(value_lengths.sum()), "values")
    key_data = None
    if key_lengths is not None:
        if count and int(key_lengths.min()) < -1:
            raise FormatError(f"{where}: negative key length in the item")
        key_data = reader.blob(int(np.maximum(key_lengths, 0).sum()), "keys")
    hkey_data = hvalue_data = None
    if hkey_lengths is not None and hvalue_lengths is not None:
        reader.non_negative(hkey_lengths, "header key length")
        reader.non_negative(hvalue_lengths, "header value length")
        hkey_data = reader.blob(int(hkey_lengths.sum()), "header keys")
        hvalue_data = reader.blob(int(hvalue_lengths.sum()), "header values")
    reader.finish()
    # Positional, in field order (the locals are named after the fields).
    return ItemView(
        version,
        count,
        h.producer_id,
        h.producer_seq,
        h.base_ts,
        deltas,
        value_lengths,
        value_data,
        key_lengths,
        key_data,
        header_counts,
        hkey_lengths,
        hkey_data,
        hvalue_lengths,
        hvalue_data,
        bool(flags & FLAG_TRANSACTIONAL),
        h.lane_max_ts,
    )


class _BodyReader:
    """Cuts a body into columns, turning every overrun into a FormatError that names the item."""

    def __init__(self, body: memoryview, where: str) -> None:
        self.body = body
        self.where = where
        self.pos = 0

    def _take(self, size: int, what: str) -> memoryview:
        end = self.pos + size
        if size < 0 or end > len(self.body):
            raise FormatError(f"{self.where}: the body is too short for its {what} ({size} bytes at {self.pos})")
        chunk = self.body[self.pos : end]
        self.pos = end
        return chunk

    def array(self, dtype: np.dtype, count: int, what: str) -> np.ndarray:
        return np.frombuffer(self._take(count * dtype.itemsize, what), dtype=dtype)

    def blob(self, size: int, what: str) -> memoryview:
        return self._take(size, what)

    def non_negative(self, lengths: np.ndarray, what: str) -> None:
        if len(lengths) and int(lengths.min()) < 0:
            raise FormatError(f"{self.where}: negative {what} in the item")

    def finish(self) -> None:
        if self.pos != len(self.body):
            raise FormatError(f"{self.where}: {len(self.body) - self.pos} unexpected bytes after the last column")


def _v0_count(view: memoryview, where: str) -> int:
    if len(view) < _V0_HEADER.size:
        raise FormatError(f"{where}: truncated version 0 ring item ({len(view)} bytes)")
    _, _, count = _V0_HEADER.unpack_from(view)
    if not 0 < count <= MAX_RECORDS_PER_ITEM:
        raise FormatError(f"{where}: record count {count} is outside 1..{MAX_RECORDS_PER_ITEM}")
    return int(count)


def _decode_v0(view: memoryview, where: str) -> ItemView:
    """Upgrade a legacy version 0 item (row-wise values) to the current in-memory shape."""
    count = _v0_count(view, where)
    lengths = np.empty(count, dtype=_I32)
    chunks: list[memoryview] = []
    pos = _V0_HEADER.size
    for i in range(count):
        if pos + 4 > len(view):
            raise FormatError(f"{where}: truncated version 0 item at record {i}")
        (size,) = _U32.unpack_from(view, pos)
        pos += 4
        if pos + size > len(view) or size > _MAX_I32:
            raise FormatError(f"{where}: truncated version 0 item at record {i}")
        lengths[i] = size
        chunks.append(view[pos : pos + size])
        pos += size
    if pos != len(view):
        raise FormatError(f"{where}: {len(view) - pos} unexpected bytes after the last record of a version 0 item")
    return ItemView(
        version=0,
        count=count,
        producer_id=0,
        producer_seq=0,
        base_timestamp_ms=None,
        timestamp_deltas=None,
        value_lengths=lengths,
        value_data=memoryview(b"".join(chunks)),
    )
