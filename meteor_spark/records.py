"""Records, the versioned ring-item wire format, and the column-wise conversion to Arrow.

A ring item holds a micro-batch of records. Format version 1 (little-endian throughout)::

    header (48 bytes)
      magic            4s   b"MTRB"
      version          u8   1 (the byte at offset 4 is the version in every format, so any reader can dispatch)
      flags            u8   0x01 LZ4 body, 0x02 keys, 0x04 headers, 0x08 per-record timestamps
      reserved         u16  0
      count            u32  records in the item, 1..65,536
      base_timestamp   i64  ms since the epoch (the timestamp of every record unless flag 0x08)
      producer_id      i64  who wrote the item (a FlakeId or random id)
      producer_seq     i64  the producer's item counter (gaps/duplicates show lost or repeated publishes)
      body_length      u32  bytes of the body once decompressed
      stored_length    u32  bytes following the header (the body, LZ4-compressed when flag 0x01)
      crc32            u32  zlib CRC-32 of header bytes 0..43 followed by the stored bytes
    body, column by column (so a reader slices buffers instead of walking records)
      value_lengths    i32[count]
      key_lengths      i32[count]        flag 0x02; -1 = the record has no key
      timestamp_deltas i64[count]        flag 0x08; ms after base_timestamp
      header_counts    i32[count]        flag 0x04; headers per record
      hkey_lengths     i32[n_headers]    flag 0x04
      hvalue_lengths   i32[n_headers]    flag 0x04
      value bytes, key bytes (0x02), header key UTF-8 bytes (0x04), header value bytes (0x04)

The LZ4 block format is used (``lz4.block``, no size prefix; the header carries ``body_length``), and only when
the body reaches the compression threshold and actually shrinks.

Versions: a reader that meets a version newer than ``FORMAT_VERSION`` raises ``UnsupportedFormatVersionError``
(upgrade the library); older versions are upgraded on read into the current in-memory shape. Version 0 is the
legacy row-wise layout ``magic, 0, count u32, then count x (length u32, value bytes)``: values only, no keys,
headers, timestamps or checksum (``encode_batch_v0`` writes it so the upgrade path stays tested).
"""

from __future__ import annotations

import struct
import time
import zlib
from bisect import bisect_right
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Iterable, Iterator, Sequence, overload

import lz4.block
import numpy as np
import pyarrow as pa

from meteor_spark.errors import ConfigError, FormatError, UnsupportedFormatVersionError
from meteor_spark.offsets import INDEX_BITS, MAX_RECORDS_PER_ITEM, index_of, sequence_of

MAGIC = b"MTRB"
FORMAT_VERSION = 1

FLAG_LZ4 = 0x01
FLAG_KEYS = 0x02
FLAG_HEADERS = 0x04
FLAG_TIMESTAMPS = 0x08
_KNOWN_FLAGS = FLAG_LZ4 | FLAG_KEYS | FLAG_HEADERS | FLAG_TIMESTAMPS

_HEADER = struct.Struct("<4sBBHIqqqIII")
HEADER_SIZE = _HEADER.size
_CRC_COVERED = HEADER_SIZE - 4
_V0_HEADER = struct.Struct("<4sBI")
_U32 = struct.Struct("<I")

COMPRESSIONS = ("lz4", "none")
_MAX_U32 = (1 << 32) - 1
_MAX_I32 = (1 << 31) - 1

_I32 = np.dtype("<i4")
_I64 = np.dtype("<i8")

HEADER_STRUCT = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
HEADERS_TYPE = pa.list_(pa.field("element", HEADER_STRUCT))
TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")

#: The Arrow schema of records read from a stream (Spark's source schema; every field nullable).
ARROW_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("stream", pa.string()),
        pa.field("lane", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", TIMESTAMP_TYPE),
    ]
)
#: ``ARROW_SCHEMA`` plus ``headers: list<struct<key: string, value: binary>>``.
ARROW_SCHEMA_WITH_HEADERS = ARROW_SCHEMA.append(pa.field("headers", HEADERS_TYPE))


@dataclass(frozen=True, slots=True)
class Record:
    """One record: a value with an optional key, headers and timestamp.

    ``timestamp_ms`` left None is set to the publish time by the publisher. ``offset``, ``lane`` and ``stream``
    are assigned when the record is read; when publishing, ``lane`` may name the lane explicitly (-1 = by key,
    or the publisher's choice for records without a key).
    """

    value: bytes
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp_ms: int | None = None
    offset: int = -1
    lane: int = -1
    stream: str = ""


def as_record(item: Record | bytes | bytearray | memoryview | str) -> Record:
    """A ``Record`` from a record or the shortcut forms (bytes-like or str value)."""
    if isinstance(item, Record):
        return item
    if isinstance(item, (bytes, bytearray, memoryview)):
        return Record(bytes(item))
    if isinstance(item, str):
        return Record(item.encode("utf-8"))
    raise ConfigError(
        f"cannot publish a {type(item).__name__}: give a Record, bytes or str (encode other objects to bytes first)"
    )


# --------------------------------------------------------------------------------------------------- encoding


def encode_batch(
    records: Sequence[Record | bytes | str],
    *,
    producer_id: int,
    producer_seq: int,
    compression: str = "lz4",
    compression_threshold: int = 1024,
) -> bytes:
    """Encode records into one ring item (the current format version). Timestamps left None become now."""
    recs = [as_record(r) for r in records]
    now = int(time.time() * 1000)
    columns = prepare_columns(
        [r.value for r in recs],
        keys=[r.key for r in recs],
        headers=[r.headers for r in recs],
        timestamps=[now if r.timestamp_ms is None else r.timestamp_ms for r in recs],
    )
    return encode_prepared([columns], ItemFraming(producer_id, producer_seq, compression, compression_threshold))


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
    """

    producer_id: int
    producer_seq: int
    compression: str = "lz4"
    compression_threshold: int = 1024


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
        count, value_lengths, value_data, stamps, key_lengths, key_data, header_counts, hkey_lengths, hkey_data,
        hvalue_lengths, hvalue_data,
    )


def encode_prepared(pieces: Sequence[PreparedColumns], framing: ItemFraming) -> bytes:
    """Frame the records of one or more prepared pieces, in order, as one ring item (current format version).

    The body is LZ4-compressed when it reaches ``framing.compression_threshold`` and compression saves at least
    1/16 of it: every reader decompresses every item, so a body that barely shrinks (incompressible values) is
    cheaper to store as it is.
    """
    count = sum(p.count for p in pieces)
    if not 0 < count <= MAX_RECORDS_PER_ITEM:
        raise ConfigError(f"a ring item holds 1..{MAX_RECORDS_PER_ITEM} records, got {count}")
    if framing.compression not in COMPRESSIONS:
        raise ConfigError(
            f"compression {framing.compression!r} is not supported; use one of {', '.join(COMPRESSIONS)}"
        )
    flags = 0
    columns: list[Any] = [_join_arrays([p.value_lengths for p in pieces], _I32)]
    blobs: list[Any] = [p.value_data for p in pieces]

    if any(p.key_lengths is not None for p in pieces):
        flags |= FLAG_KEYS
        columns.append(
            _join_arrays(
                [p.key_lengths if p.key_lengths is not None else np.full(p.count, -1, _I32) for p in pieces], _I32
            )
        )
        blobs += [p.key_data for p in pieces if p.key_lengths is not None]

    if all(isinstance(p.timestamps, int) for p in pieces) and len({p.timestamps for p in pieces}) == 1:
        base_ts = int(pieces[0].timestamps)  # type: ignore[arg-type]
    else:
        stamps = np.concatenate(
            [
                np.full(p.count, p.timestamps, dtype=_I64) if isinstance(p.timestamps, int) else p.timestamps
                for p in pieces
            ]
        ).astype(_I64, copy=False)
        base_ts = int(stamps.min())
        if int(stamps.max()) != base_ts:
            flags |= FLAG_TIMESTAMPS
            columns.append((stamps - base_ts).astype(_I64, copy=False))

    if any(p.header_counts is not None for p in pieces):
        flags |= FLAG_HEADERS
        with_headers = [p for p in pieces if p.header_counts is not None]
        columns += [
            _join_arrays(
                [p.header_counts if p.header_counts is not None else np.zeros(p.count, _I32) for p in pieces], _I32
            ),
            _join_arrays([p.hkey_lengths for p in with_headers], _I32),
            _join_arrays([p.hvalue_lengths for p in with_headers], _I32),
        ]
        blobs += [p.hkey_data for p in with_headers] + [p.hvalue_data for p in with_headers]

    body = b"".join([memoryview(c) for c in columns] + blobs)
    if len(body) > _MAX_U32:
        raise ConfigError(
            f"a ring item of {len(body)} bytes exceeds the 4 GiB format limit; lower max_batch_bytes/max_batch_records"
        )
    stored: bytes = body
    if framing.compression == "lz4" and len(body) >= framing.compression_threshold:
        packed = lz4.block.compress(body, store_size=False)
        if len(packed) <= len(body) - (len(body) >> 4):
            stored = packed
            flags |= FLAG_LZ4
    return _frame(FORMAT_VERSION, flags, count, base_ts, framing.producer_id, framing.producer_seq, len(body), stored)


def _join_arrays(arrays: Sequence[Any], dtype: np.dtype) -> np.ndarray:
    if len(arrays) == 1:
        return np.ascontiguousarray(arrays[0], dtype=dtype)
    return np.concatenate(arrays).astype(dtype, copy=False)


def _frame(
    version: int, flags: int, count: int, base_ts: int, producer_id: int, producer_seq: int, body_len: int, stored: bytes
) -> bytes:
    prefix = _HEADER.pack(MAGIC, version, flags, 0, count, base_ts, producer_id, producer_seq, body_len, len(stored), 0)
    crc = zlib.crc32(stored, zlib.crc32(memoryview(prefix)[:_CRC_COVERED]))
    return b"".join((prefix[:_CRC_COVERED], _U32.pack(crc), stored))


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


# --------------------------------------------------------------------------------------------------- decoding


@dataclass(frozen=True, eq=False)
class ItemView:
    """One decoded ring item: numpy views of its length columns and memoryviews of its data (no per-record work).

    ``base_timestamp_ms`` is None for legacy items whose records carry no timestamp.
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

    def timestamps(self, start: int, stop: int) -> np.ndarray | None:
        """Per-record timestamps (ms) of records ``[start, stop)``; None for legacy items without timestamps."""
        if self.base_timestamp_ms is None:
            return None
        if self.timestamp_deltas is None:
            return np.full(stop - start, self.base_timestamp_ms, dtype=np.int64)
        return self.timestamp_deltas[start:stop] + self.base_timestamp_ms


def _prefix_sums(lengths: np.ndarray) -> np.ndarray:
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def decode_item(item: bytes | bytearray | memoryview, *, stream: str, lane: int, sequence: int) -> ItemView:
    """Decode one ring item.

    Raises:
        UnsupportedFormatVersionError: written by a newer format version than this library knows.
        FormatError: not a record batch, or corrupt; the message names stream, lane and sequence.
    """
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
    if version == FORMAT_VERSION:
        return _decode_v1(view, where)
    if version > FORMAT_VERSION:
        raise UnsupportedFormatVersionError(
            f"{where}: the ring item uses record format version {version}, but this meteor-spark only knows "
            f"versions 0..{FORMAT_VERSION}; upgrade meteor-spark on this reader to read it"
        )
    return _decode_v0(view, where)


def _decode_v1(view: memoryview, where: str) -> ItemView:
    if len(view) < HEADER_SIZE:
        raise FormatError(f"{where}: truncated ring item: {len(view)} bytes, shorter than the {HEADER_SIZE}-byte header")
    (_, version, flags, _, count, base_ts, producer_id, producer_seq, body_len, stored_len, crc) = _HEADER.unpack_from(
        view
    )
    stored = view[HEADER_SIZE:]
    if stored_len != len(stored):
        raise FormatError(
            f"{where}: truncated or padded ring item: the header announces {stored_len} body bytes, "
            f"{len(stored)} follow"
        )
    if zlib.crc32(stored, zlib.crc32(view[:_CRC_COVERED])) != crc:
        raise FormatError(f"{where}: checksum mismatch: the ring item is corrupt")
    if flags & ~_KNOWN_FLAGS:
        raise FormatError(f"{where}: unknown flags 0x{flags & ~_KNOWN_FLAGS:02x} in a version {version} item")
    if not 0 < count <= MAX_RECORDS_PER_ITEM:
        raise FormatError(f"{where}: record count {count} is outside 1..{MAX_RECORDS_PER_ITEM}")
    if flags & FLAG_LZ4:
        try:
            body = memoryview(lz4.block.decompress(stored, uncompressed_size=body_len))
        except lz4.block.LZ4BlockError as exc:
            raise FormatError(f"{where}: the LZ4 body does not decompress ({exc})") from None
        if len(body) != body_len:
            raise FormatError(f"{where}: the LZ4 body decompressed to {len(body)} bytes, {body_len} announced")
    else:
        if stored_len != body_len:
            raise FormatError(f"{where}: uncompressed body of {stored_len} bytes, {body_len} announced")
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
        version, count, producer_id, producer_seq, base_ts, deltas, value_lengths, value_data, key_lengths, key_data,
        header_counts, hkey_lengths, hkey_data, hvalue_lengths, hvalue_data,
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
        chunk = self.body[self.pos:end]
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


def _decode_v0(view: memoryview, where: str) -> ItemView:
    """Upgrade a legacy version 0 item (row-wise values) to the current in-memory shape."""
    if len(view) < _V0_HEADER.size:
        raise FormatError(f"{where}: truncated version 0 ring item ({len(view)} bytes)")
    _, _, count = _V0_HEADER.unpack_from(view)
    if not 0 < count <= MAX_RECORDS_PER_ITEM:
        raise FormatError(f"{where}: record count {count} is outside 1..{MAX_RECORDS_PER_ITEM}")
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
        chunks.append(view[pos:pos + size])
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


# --------------------------------------------------------------------------------------------------- batches


@dataclass(frozen=True)
class BatchPart:
    """Records ``[start, stop)`` of one decoded ring item of a lane."""

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

    def records(self) -> list[Record]:
        """Materialise this part's records (the per-record path; Arrow conversion avoids it)."""
        item, start, stop = self.item, self.start, self.stop
        if stop <= start:
            return []
        vo = item.value_offsets[start:stop + 1].tolist()
        vdata = bytes(item.value_data[vo[0]:vo[-1]])
        base = vo[0]
        values = [vdata[vo[i] - base:vo[i + 1] - base] for i in range(stop - start)]
        n = stop - start
        keys: list[bytes | None] = [None] * n
        if item.key_lengths is not None and item.key_data is not None:
            ko = item.key_offsets[start:stop + 1].tolist()
            kdata = bytes(item.key_data[ko[0]:ko[-1]])
            kl = item.key_lengths[start:stop].tolist()
            kb = ko[0]
            keys = [None if kl[i] < 0 else kdata[ko[i] - kb:ko[i + 1] - kb] for i in range(n)]
        headers: list[tuple[tuple[str, bytes], ...]] = [()] * n
        if item.header_counts is not None:
            headers = self._headers(n)
        stamps_arr = item.timestamps(start, stop)
        stamps: list[int | None] = [None] * n if stamps_arr is None else stamps_arr.tolist()
        first = self.sequence << INDEX_BITS | start
        stream, lane = self.stream, self.lane
        return [
            Record(values[i], keys[i], headers[i], stamps[i], first + i, lane, stream) for i in range(n)
        ]

    def _headers(self, n: int) -> list[tuple[tuple[str, bytes], ...]]:
        item = self.item
        assert item.hkey_data is not None and item.hvalue_data is not None
        ho = item.header_offsets[self.start:self.stop + 1].tolist()
        hko = item.hkey_offsets.tolist()
        hvo = item.hvalue_offsets.tolist()
        hkeys = bytes(item.hkey_data)
        hvalues = bytes(item.hvalue_data)
        out = []
        for i in range(n):
            out.append(
                tuple(
                    (hkeys[hko[j]:hko[j + 1]].decode("utf-8"), hvalues[hvo[j]:hvo[j + 1]])
                    for j in range(ho[i], ho[i + 1])
                )
            )
        return out


class RecordBatch(Sequence[Record]):
    """Records read in one go, possibly from several items and lanes; ``Record`` objects are made on demand.

    ``to_arrow()`` builds a ``pyarrow.RecordBatch`` straight from the items' buffers.
    """

    __slots__ = ("_parts", "_ends", "_cache")

    def __init__(self, parts: Iterable[BatchPart] = ()) -> None:
        self._parts = tuple(p for p in parts if p.stop > p.start)
        ends = []
        total = 0
        for part in self._parts:
            total += part.size
            ends.append(total)
        self._ends = ends
        self._cache: list[Record] | None = None

    @classmethod
    def empty(cls) -> "RecordBatch":
        return _EMPTY

    @property
    def parts(self) -> tuple[BatchPart, ...]:
        return self._parts

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def __bool__(self) -> bool:
        return bool(self._ends)

    @property
    def is_empty(self) -> bool:
        return not self._ends

    def _records(self) -> list[Record]:
        if self._cache is None:
            out: list[Record] = []
            for part in self._parts:
                out.extend(part.records())
            self._cache = out
        return self._cache

    @overload
    def __getitem__(self, index: int) -> Record: ...

    @overload
    def __getitem__(self, index: slice) -> list[Record]: ...

    def __getitem__(self, index: int | slice) -> Record | list[Record]:
        if isinstance(index, slice) or self._cache is not None:
            return self._records()[index]
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"record index {index} out of range for a batch of {n}")
        p = bisect_right(self._ends, index)
        part = self._parts[p]
        local = index - (self._ends[p] - part.size) + part.start
        return BatchPart(part.stream, part.lane, part.sequence, part.item, local, local + 1).records()[0]

    def __iter__(self) -> Iterator[Record]:
        if self._cache is not None:
            return iter(self._cache)
        return (r for part in self._parts for r in part.records())

    def first(self) -> Record:
        if not self:
            raise IndexError("first() of an empty record batch")
        return self[0]

    def last(self) -> Record:
        if not self:
            raise IndexError("last() of an empty record batch")
        return self[-1]

    def values(self) -> list[bytes]:
        """Just the values, in order (cheaper than building records)."""
        out: list[bytes] = []
        for part in self._parts:
            vo = part.item.value_offsets[part.start:part.stop + 1].tolist()
            data = bytes(part.item.value_data[vo[0]:vo[-1]])
            b = vo[0]
            out.extend(data[vo[i] - b:vo[i + 1] - b] for i in range(part.size))
        return out

    def last_offsets(self) -> dict[int, int]:
        """The offset of the last record of each lane present in the batch."""
        out: dict[int, int] = {}
        for part in self._parts:
            out[part.lane] = part.last_offset
        return out

    def to_arrow(self, include_headers: bool = False) -> pa.RecordBatch:
        """The records as a ``pyarrow.RecordBatch`` with ``ARROW_SCHEMA`` (plus headers when asked)."""
        return parts_to_arrow(self._parts, include_headers=include_headers)

    def __repr__(self) -> str:
        lanes = sorted({p.lane for p in self._parts})
        return f"RecordBatch({len(self)} records, lanes {lanes})"


_EMPTY = RecordBatch()


def decode_batch(item: bytes | bytearray | memoryview, *, stream: str, lane: int, sequence: int) -> RecordBatch:
    """Decode one ring item into a lazy ``RecordBatch`` (offsets, lane and stream assigned)."""
    view = decode_item(item, stream=stream, lane=lane, sequence=sequence)
    return RecordBatch([BatchPart(stream, lane, sequence, view, 0, view.count)])


# --------------------------------------------------------------------------------------------------- Arrow


def items_to_arrow(
    items: Sequence[bytes | bytearray | memoryview],
    sequences: Sequence[int],
    *,
    stream: str,
    lane: int,
    include_headers: bool,
    first_offset: int | None = None,
) -> pa.RecordBatch:
    """Decode consecutive ring items of one lane straight into one Arrow record batch (the Spark reader's path).

    ``first_offset`` (an offset inside the first item) drops that item's records before it.
    """
    if len(items) != len(sequences):
        raise ConfigError(f"items_to_arrow: {len(items)} items but {len(sequences)} sequences; give one per item")
    parts = []
    for i, (item, seq) in enumerate(zip(items, sequences)):
        view = decode_item(item, stream=stream, lane=lane, sequence=seq)
        start = 0
        if i == 0 and first_offset is not None:
            if sequence_of(first_offset) != seq:
                raise ConfigError(
                    f"items_to_arrow: first_offset {first_offset} is in ring sequence {sequence_of(first_offset)}, "
                    f"but the first item has sequence {seq}; pass an offset inside the first item"
                )
            start = min(index_of(first_offset), view.count)
        parts.append(BatchPart(stream, lane, seq, view, start, view.count))
    return parts_to_arrow(parts, include_headers=include_headers)


def parts_to_arrow(parts: Sequence[BatchPart], *, include_headers: bool) -> pa.RecordBatch:
    """Build the Arrow batch of the given parts column-wise (numpy on the items' length columns, one copy of data)."""
    schema = ARROW_SCHEMA_WITH_HEADERS if include_headers else ARROW_SCHEMA
    parts = [p for p in parts if p.stop > p.start]
    if not parts:
        return pa.RecordBatch.from_pylist([], schema=schema)
    counts = np.array([p.size for p in parts], dtype=np.int64)
    n = int(counts.sum())
    starts_in_batch = np.concatenate(([0], np.cumsum(counts)[:-1]))

    # values
    value_lengths = []
    value_chunks = []
    for p in parts:
        lengths, chunk = _part_column(p, "value")
        value_lengths.append(lengths)
        value_chunks.append(chunk)
    values = _binary_array(pa.binary(), n, _concat(value_lengths), value_chunks, None)

    # keys (-1 = no key)
    if any(p.item.key_lengths is not None for p in parts):
        key_lengths_list = []
        key_chunks = []
        for p in parts:
            it = p.item
            if it.key_lengths is None or it.key_data is None:
                key_lengths_list.append(np.full(p.size, -1, dtype=_I32))
                continue
            lengths, chunk = _part_column(p, "key")
            key_lengths_list.append(lengths)
            key_chunks.append(chunk)
        key_lengths = _concat(key_lengths_list)
        present = key_lengths >= 0
        keys = _binary_array(pa.binary(), n, np.maximum(key_lengths, 0), key_chunks, present)
    else:
        keys = pa.nulls(n, pa.binary())

    # stream and lane
    stream_names = {p.stream for p in parts}
    if len(stream_names) == 1:
        encoded = next(iter(stream_names)).encode("utf-8")
        stream_offsets = np.arange(n + 1, dtype=np.int64) * len(encoded)
        if stream_offsets[-1] > _MAX_I32:
            stream_col = pa.array([encoded.decode("utf-8")] * n, pa.string())
        else:
            stream_col = pa.Array.from_buffers(
                pa.string(), n, [None, pa.py_buffer(stream_offsets.astype(_I32)), pa.py_buffer(encoded * n)]
            )
    else:
        stream_col = pa.array(np.repeat(np.array([p.stream for p in parts], dtype=object), counts), pa.string())
    lane_values = np.repeat(np.array([p.lane for p in parts], dtype=_I32), counts)
    lanes = pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(lane_values)])

    # offsets: sequence << 16 | index, per part a run of consecutive numbers
    bases = np.array([p.first_offset for p in parts], dtype=np.int64) - starts_in_batch
    offset_values = np.arange(n, dtype=np.int64) + np.repeat(bases, counts)
    offsets = pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(offset_values)])

    # timestamps (ms -> us); legacy items without timestamps give nulls
    ts = np.empty(n, dtype=np.int64)
    ts_valid: np.ndarray | None = None
    for p, pos in zip(parts, starts_in_batch.tolist()):
        stamps = p.item.timestamps(p.start, p.stop)
        if stamps is None:
            if ts_valid is None:
                ts_valid = np.ones(n, dtype=bool)
            ts_valid[pos:pos + p.size] = False
            ts[pos:pos + p.size] = 0
        else:
            ts[pos:pos + p.size] = stamps
    ts *= 1000
    timestamps = pa.Array.from_buffers(
        TIMESTAMP_TYPE, n, [_validity(ts_valid), pa.py_buffer(ts)], null_count=_null_count(ts_valid)
    )

    columns = [keys, values, stream_col, lanes, offsets, timestamps]
    if include_headers:
        columns.append(_headers_array(parts, n))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _part_column(part: BatchPart, column: str) -> tuple[np.ndarray, Any]:
    """``(lengths, bytes)`` of a part's records in one column ("value" or "key") of its item; a whole item is used
    as it is (no slicing, no copy). Key lengths keep their -1 (no key)."""
    item = part.item
    lengths, data = getattr(item, f"{column}_lengths"), getattr(item, f"{column}_data")
    if part.start == 0 and part.stop == item.count:
        return lengths, data
    offsets = getattr(item, f"{column}_offsets")
    return lengths[part.start:part.stop], data[offsets[part.start]:offsets[part.stop]]


def _concat(arrays: list[np.ndarray]) -> np.ndarray:
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


def _validity(valid: np.ndarray | None) -> pa.Buffer | None:
    if valid is None or bool(valid.all()):
        return None
    return pa.py_buffer(np.packbits(valid, bitorder="little"))


def _null_count(valid: np.ndarray | None) -> int:
    return 0 if valid is None else int(len(valid) - np.count_nonzero(valid))


def _binary_array(
    type_: pa.DataType, n: int, lengths: np.ndarray, chunks: list[Any], valid: np.ndarray | None
) -> pa.Array:
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    if total > _MAX_I32:
        raise ConfigError(
            f"{total} bytes of data do not fit one Arrow binary column (2 GiB); convert fewer items at a time"
        )
    data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    return pa.Array.from_buffers(
        type_,
        n,
        [_validity(valid), pa.py_buffer(offsets.astype(_I32)), pa.py_buffer(data)],
        null_count=_null_count(valid),
    )


def _headers_array(parts: Sequence[BatchPart], n: int) -> pa.Array:
    count_list = []
    hkey_lengths = []
    hvalue_lengths = []
    hkey_chunks = []
    hvalue_chunks = []
    for p in parts:
        it = p.item
        if it.header_counts is None:
            count_list.append(np.zeros(p.size, dtype=_I32))
            continue
        assert it.hkey_lengths is not None and it.hvalue_lengths is not None
        assert it.hkey_data is not None and it.hvalue_data is not None
        count_list.append(it.header_counts[p.start:p.stop])
        ho = it.header_offsets
        h0, h1 = int(ho[p.start]), int(ho[p.stop])
        hkey_lengths.append(it.hkey_lengths[h0:h1])
        hvalue_lengths.append(it.hvalue_lengths[h0:h1])
        hko, hvo = it.hkey_offsets, it.hvalue_offsets
        hkey_chunks.append(it.hkey_data[hko[h0]:hko[h1]])
        hvalue_chunks.append(it.hvalue_data[hvo[h0]:hvo[h1]])
    counts = _concat(count_list)
    list_offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=list_offsets[1:])
    n_headers = int(list_offsets[-1])
    if n_headers:
        hk = _binary_array(pa.string(), n_headers, _concat(hkey_lengths), hkey_chunks, None)
        hv = _binary_array(pa.binary(), n_headers, _concat(hvalue_lengths), hvalue_chunks, None)
    else:
        hk = pa.array([], pa.string())
        hv = pa.array([], pa.binary())
    struct_array = pa.StructArray.from_arrays([hk, hv], fields=list(HEADER_STRUCT))
    return pa.Array.from_buffers(
        HEADERS_TYPE, n, [None, pa.py_buffer(list_offsets.astype(_I32))], children=[struct_array]
    )
