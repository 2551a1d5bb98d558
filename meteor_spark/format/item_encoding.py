"""Writing ring items: records given as Python lists (or prepared columns) framed as items of the current format.

``meteor_spark.format.wire`` describes the format and decodes it. Writing is apart because it is the publishers' hot
path (column preparation, joining pieces of one item, LZ4 only when it pays) while readers never need it.
``encode_item_v1`` and ``encode_batch_v0`` write the older versions so the upgrade-on-read path stays tested.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import lz4.block
import numpy as np

from meteor_spark.errors import ConfigError, SizeLimitError
from meteor_spark.format.checksum import crc32
from meteor_spark.format.item_header import (
    FLAG_HEADERS,
    FLAG_KEYS,
    FLAG_LZ4,
    FLAG_TIMESTAMPS,
    FLAG_TRANSACTIONAL,
    HEADER,
    HEADER_SIZE,
    HEADER_SIZE_V1,
    HEADER_V1,
    MAGIC,
    NO_TIMESTAMP,
    U32,
    V0_HEADER,
    pack_item,
)
from meteor_spark.format.offsets import MAX_RECORDS_PER_ITEM

#: Where the flags byte lies in an item (``HEADER``: magic, version, flags).
_FLAGS_AT = 5
#: Values of ``ItemFraming.compression``.
COMPRESSIONS = ("lz4", "none")
_MAX_U32 = (1 << 32) - 1

#: The body's column types: lengths and counts are int32, timestamp deltas int64 (little-endian).
I32 = np.dtype("<i4")
I64 = np.dtype("<i8")


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
        probe_first: probe the first large body for compressibility before LZ4 compresses it whole (``_framed``);
            False when the writer's previous item of the lane shrank (``shrank``), as the items behind a shrunk
            one within a call are not probed either.
    """

    producer_id: int
    producer_seq: int
    compression: str = "lz4"
    compression_threshold: int = 1024
    transactional: bool = False
    lane_max_timestamp: int = NO_TIMESTAMP
    probe_first: bool = True


@dataclass(slots=True)
class PreparedColumns:
    """Records of one ring item (or of a piece of one) as length columns plus data, ready to be framed.

    Lengths are little-endian int32 numpy arrays (``key_lengths`` -1 = no key); ``timestamps`` is one int for
    every record or an int64 array; the header fields are all None when no record has headers.

    Not frozen: one is made per item a publisher encodes, and a frozen dataclass's ``__init__`` (``object.__setattr__``
    per field) cost 0.9 us against 0.15 with slots; nothing changes one after it is made.
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


#: Values of this mean size or more are kept as they are (a list) until the item is joined: copied once, not twice.
KEEP_APART_FROM = 2048


def _value_column(values: Sequence[bytes], lengths: np.ndarray | None = None) -> tuple[np.ndarray, Any]:
    """The values' lengths (``lengths`` when given: counted already), and their data: joined, or the values
    themselves when they are ``bytes`` (immutable, ``len`` their size) of ``KEEP_APART_FROM`` bytes or more on
    average."""
    count = len(values)
    try:
        if lengths is None:
            lengths = np.fromiter(map(len, values), dtype=I32, count=count)
        return lengths, _value_data(values, int(lengths.sum()))
    except TypeError:
        raise _bad_column("value", values, allow_none=False) from None


def _value_data(values: Sequence[bytes], total: int) -> Any:
    """The values' data (``total`` bytes): the values themselves (a list) when they are ``bytes`` of
    ``KEEP_APART_FROM`` bytes or more on average, else their join."""
    if values and total >= len(values) * KEEP_APART_FROM and set(map(type, values)) == {bytes}:
        return list(values)
    return b"".join(values)


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
    value_lengths: np.ndarray | None = None,
) -> PreparedColumns:
    """Length columns and data of records given as Python lists (validated: bytes, str header keys). The values'
    data is their join, or, for ``bytes`` values of ``KEEP_APART_FROM`` bytes or more on average, the values
    themselves (a list): the item joins them once, with the rest of its body.

    ``value_lengths``: the values' lengths (int32, one per value) when the caller counted them already (a
    publisher's segment does, to cut its calls): counting them again cost a third of preparing 100-byte values.
    """
    count = len(values)
    if value_lengths is not None and len(value_lengths) != count:
        raise ConfigError(f"value_lengths: got {len(value_lengths)} lengths for {count} values; give one per value")
    value_lengths, value_data = _value_column(values, value_lengths)
    key_lengths = None
    key_data = b""
    if keys is not None and any(k is not None for k in keys):
        if len(keys) != count:
            raise ConfigError(f"keys: got {len(keys)} keys for {count} values; give one key (or None) per value")
        try:
            key_lengths = np.fromiter((-1 if k is None else len(k) for k in keys), dtype=I32, count=count)
            key_data = b"".join([k for k in keys if k is not None])
        except TypeError:
            raise _bad_column("key", keys, allow_none=True) from None
    stamps: np.ndarray | int
    if isinstance(timestamps, (int, np.integer)):
        stamps = int(timestamps)
    else:
        stamps = np.asarray(timestamps, dtype=I64)
        if stamps.shape != (count,):
            raise ConfigError(f"timestamps: got {stamps.size} timestamps for {count} values; give one per value")
    header_counts = hkey_lengths = hvalue_lengths = None
    hkey_data = hvalue_data = b""
    if headers is not None and any(headers):
        if len(headers) != count:
            raise ConfigError(f"headers: got {len(headers)} header lists for {count} values; give one per value")
        try:
            header_counts = np.fromiter(map(len, headers), dtype=I32, count=count)
            hkeys = [k.encode("utf-8") for hs in headers for k, _ in hs]
            hvalues = [v for hs in headers for _, v in hs]
            hkey_data = b"".join(hkeys)
            hvalue_data = b"".join(hvalues)
        except (TypeError, AttributeError, ValueError):
            raise ConfigError(
                "headers must be (str key, bytes value) pairs, e.g. (('trace-id', b'abc'),); got "
                f"{_first_bad_headers(headers)!r}"
            ) from None
        hkey_lengths = np.fromiter(map(len, hkeys), dtype=I32, count=len(hkeys))
        hvalue_lengths = np.fromiter(map(len, hvalues), dtype=I32, count=len(hvalues))
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
    cheaper to store as it is. A body of ``PROBE_FROM`` bytes or more is compressed only when a sample of it
    shrinks (``_may_shrink``).

    The records' bytes are copied once, into the item, unless LZ4 compresses them.
    """
    return encode_items([pieces], framing)[0]


#: Items of up to this many records without keys or headers may be framed by ``encode_small_item``: below about
#: 300 100-byte records ``struct`` packs them faster than numpy (5 us instead of 16 for one, 21 instead of 38 for 64).
SMALL_ITEM_RECORDS = 64


def encode_small_item(values: Sequence[bytes], stamps: Sequence[int], framing: ItemFraming) -> tuple[bytes, int]:
    """One ring item of a few values without keys or headers (``stamps``: their timestamps, ms), and the lane's
    largest timestamp once it is stored: the very bytes ``encode_items_and_lane_max`` writes for them as one item.

    Why: the columns are packed with ``struct`` instead of numpy. For one record (``publish_async`` to an idle lane,
    which the publishing thread sends itself) numpy's fixed cost per call (``fromiter``, reductions, views) was
    most of encoding the item. Meant for up to ``SMALL_ITEM_RECORDS`` records; any count is encoded right.
    """
    count = len(values)
    if not 0 < count <= MAX_RECORDS_PER_ITEM:
        raise ConfigError(f"a ring item holds 1..{MAX_RECORDS_PER_ITEM} records, got {count}")
    if len(stamps) != count:
        raise ConfigError(f"timestamps: got {len(stamps)} timestamps for {count} values; give one per value")
    lz4_from = _lz4_from(framing)
    try:
        lengths = [len(v) for v in values]
        parts: list[Any] = [struct.pack(f"<{count}i", *lengths), *_blobs(_value_data(values, sum(lengths)))]
    except TypeError:
        raise _bad_column("value", values, allow_none=False) from None
    flags = FLAG_TRANSACTIONAL if framing.transactional else 0
    base_ts = min(stamps)
    max_ts = max(stamps)
    if max_ts != base_ts:
        flags |= FLAG_TIMESTAMPS
        parts.insert(1, struct.pack(f"<{count}q", *[ts - base_ts for ts in stamps]))
    lane_max = max(framing.lane_max_timestamp, max_ts)
    item = _framed(parts, flags, count, base_ts, lz4_from, framing.producer_id, framing.producer_seq, lane_max)
    return item, lane_max


def encode_items(items: Sequence[Sequence[PreparedColumns]], framing: ItemFraming) -> list[bytes]:
    """Frame the ring items of one ``add_all`` call, each from its prepared pieces (see ``encode_prepared``);
    item ``i`` gets producer sequence ``framing.producer_seq + i``. The framing is checked once per call."""
    return encode_items_and_lane_max(items, framing)[0]


def encode_items_and_lane_max(
    items: Sequence[Sequence[PreparedColumns]], framing: ItemFraming
) -> tuple[list[bytes], int]:
    """``encode_items``, and the ``lane_max_ts`` written into the last item: the lane's largest timestamp once
    the call is stored, which the publisher's next call continues (without reading it back from the header)."""
    lz4_from = _lz4_from(framing)
    flags = FLAG_TRANSACTIONAL if framing.transactional else 0
    producer_id, first_seq = framing.producer_id, framing.producer_seq
    lane_max = framing.lane_max_timestamp
    out: list[bytes] = []
    probe = framing.probe_first
    for i, pieces in enumerate(items):
        p = pieces[0] if len(pieces) == 1 else _joined(pieces)
        item, lane_max = _encode_item(p, flags, lz4_from, producer_id, first_seq + i, lane_max, probe)
        out.append(item)
        # A call's items hold records of one stream one after the other: behind an item LZ4 shrank, the next one
        # is compressed without probing a sample first (1.5-2 us an item of 100 KiB). An item that then does not
        # shrink costs one wasted compression, and the items after it are probed again.
        probe = not shrank(item)
    return out, lane_max


def shrank(item: bytes) -> bool:
    """Whether LZ4 compressed the body of ``item`` (an item this module framed): a writer's next item of the same
    records probably compresses too (``ItemFraming.probe_first``)."""
    return bool(item[_FLAGS_AT] & FLAG_LZ4)


def _lz4_from(framing: ItemFraming) -> int | None:
    """The body size from which LZ4 is tried (None: never), after checking the framing's compression."""
    if framing.compression not in COMPRESSIONS:
        raise ConfigError(f"compression {framing.compression!r} is not supported; use one of {', '.join(COMPRESSIONS)}")
    return framing.compression_threshold if framing.compression == "lz4" else None


def _joined(pieces: Sequence[PreparedColumns]) -> PreparedColumns:
    """The pieces of one item as one: columns concatenated, data kept as a list of blobs (joined with the body)."""
    count = sum(p.count for p in pieces)
    keys = None
    if any(p.key_lengths is not None for p in pieces):
        keys = _join_arrays(
            [p.key_lengths if p.key_lengths is not None else np.full(p.count, -1, I32) for p in pieces], I32
        )
    stamps: np.ndarray | int
    if all(isinstance(p.timestamps, int) for p in pieces) and len({p.timestamps for p in pieces}) == 1:
        stamps = int(pieces[0].timestamps)
    else:
        stamps = np.concatenate(
            [
                np.full(p.count, p.timestamps, dtype=I64) if isinstance(p.timestamps, int) else p.timestamps
                for p in pieces
            ]
        ).astype(I64, copy=False)
    header_counts = hkey_lengths = hvalue_lengths = None
    hkey_data: Any = []
    hvalue_data: Any = []
    if any(p.header_counts is not None for p in pieces):
        with_headers = [p for p in pieces if p.header_counts is not None]
        header_counts = _join_arrays(
            [p.header_counts if p.header_counts is not None else np.zeros(p.count, I32) for p in pieces], I32
        )
        hkey_lengths = _join_arrays([p.hkey_lengths for p in with_headers], I32)
        hvalue_lengths = _join_arrays([p.hvalue_lengths for p in with_headers], I32)
        hkey_data = _flat([p.hkey_data for p in with_headers])
        hvalue_data = _flat([p.hvalue_data for p in with_headers])
    return PreparedColumns(
        count,
        _join_arrays([p.value_lengths for p in pieces], I32),
        _flat([p.value_data for p in pieces]),
        stamps,
        keys,
        _flat([p.key_data for p in pieces if p.key_lengths is not None]),
        header_counts,
        hkey_lengths,
        hkey_data,
        hvalue_lengths,
        hvalue_data,
    )


def _flat(data: list[Any]) -> list[Any]:
    """The blobs of pieces' data, each a blob or a list of them, as one list."""
    return [blob for d in data for blob in _blobs(d)]


def _view(array: Any, dtype: np.dtype) -> memoryview:
    """A column's bytes, in the wire's dtype (a view when it already is one), as a byte view (``len`` = bytes)."""
    contiguous: Any = np.ascontiguousarray(array, dtype=dtype)
    return memoryview(contiguous).cast("B")


def _blobs(data: Any) -> list[Any]:
    return data if isinstance(data, list) else [data]


def _encode_item(
    p: PreparedColumns,
    flags: int,
    lz4_from: int | None,
    producer_id: int,
    producer_seq: int,
    lane_max: int,
    probe: bool = True,
) -> tuple[bytes, int]:
    """One framed item and the lane's largest timestamp once it is stored (``probe``: see ``_framed``)."""
    count = p.count
    if not 0 < count <= MAX_RECORDS_PER_ITEM:
        raise ConfigError(f"a ring item holds 1..{MAX_RECORDS_PER_ITEM} records, got {count}")
    parts: list[Any] = [_view(p.value_lengths, I32)]
    blobs = _blobs(p.value_data)
    if p.key_lengths is not None:
        flags |= FLAG_KEYS
        parts.append(_view(p.key_lengths, I32))
        blobs = blobs + _blobs(p.key_data)
    stamps = p.timestamps
    if isinstance(stamps, (int, np.integer)):
        base_ts = max_ts = int(stamps)
    elif count == 1:  # one record (publish_async, one in flight): a numpy reduction costs more than the item
        base_ts = max_ts = int(stamps[0])
    else:
        stamps = np.asarray(stamps, dtype=I64)
        base_ts = int(stamps.min())
        max_ts = int(stamps.max())
        if max_ts != base_ts:
            flags |= FLAG_TIMESTAMPS
            parts.append(_view(stamps - base_ts, I64))
    lane_max = max(lane_max, max_ts)
    if p.header_counts is not None:
        flags |= FLAG_HEADERS
        parts += [
            _view(p.header_counts, I32),
            _view(p.hkey_lengths, I32),
            _view(p.hvalue_lengths, I32),
        ]
        blobs = blobs + _blobs(p.hkey_data) + _blobs(p.hvalue_data)
    item = _framed(parts + blobs, flags, count, base_ts, lz4_from, producer_id, producer_seq, lane_max, probe)
    return item, lane_max


def _framed(
    pieces: list[Any],
    flags: int,
    count: int,
    base_ts: int,
    lz4_from: int | None,
    producer_id: int,
    producer_seq: int,
    lane_max: int,
    probe: bool = True,
) -> bytes:
    """The item of a body given as pieces (its columns, then its data): LZ4-compressed when that pays
    (``encode_prepared``; ``probe`` False: a large body is compressed without ``_may_shrink`` first), then framed
    with its header."""
    body_len = sum(map(len, pieces))
    if body_len > _MAX_U32:
        raise SizeLimitError(
            f"a ring item of {body_len} bytes exceeds the 4 GiB format limit; lower max_batch_bytes/max_batch_records"
        )
    if lz4_from is not None and body_len >= lz4_from and (not probe or _may_shrink(pieces, body_len)):
        body = b"".join(pieces)
        packed = lz4.block.compress(body, store_size=False)
        if len(packed) <= body_len - (body_len >> 4):
            pieces = [packed]
            flags |= FLAG_LZ4
        else:
            pieces = [body]
    return pack_item(flags, count, base_ts, producer_id, producer_seq, lane_max, body_len, pieces)


#: Bodies from this size on are probed before LZ4 compresses them whole (``_may_shrink``).
PROBE_FROM = 48 * 1024
#: The probe: this many samples spread over the body, each 1/48 of it and at most ``PROBE_BYTES``.
PROBE_SAMPLES = 3
PROBE_BYTES = 8 * 1024


def _may_shrink(pieces: Sequence[Any], body_len: int) -> bool:
    """Whether LZ4 may save 1/16 of a body given as pieces: True for bodies below ``PROBE_FROM``; above, True
    when any of ``PROBE_SAMPLES`` samples spread over the body shrinks by 1/16.

    Why: LZ4 over a body it cannot shrink (random or already compressed values) cost 0.96 ms per MiB, more than
    the rest of publishing such records; the samples cost at most 1/16 of that (2 % for a 1 MiB body). A body
    some sample shrinks is compressed whole and kept only when it saves 1/16, as small bodies are.
    """
    if body_len < PROBE_FROM:
        return True
    compress = lz4.block.compress
    size = min(PROBE_BYTES, body_len // (16 * PROBE_SAMPLES))
    for k in range(PROBE_SAMPLES):
        sample = _window(pieces, body_len * (2 * k + 1) // (2 * PROBE_SAMPLES), size)
        if len(compress(sample, store_size=False)) <= len(sample) - (len(sample) >> 4):
            return True
    return False


def _window(pieces: Sequence[Any], at: int, size: int) -> memoryview:
    """Up to ``size`` bytes of the piece holding body position ``at``, around it (never across pieces)."""
    for piece in pieces:
        n = len(piece)
        if at < n:
            start = max(0, min(at - size // 2, n - size))
            return memoryview(piece)[start : start + size]
        at -= n
    raise AssertionError("a body position past the body")


def _join_arrays(arrays: Sequence[Any], dtype: np.dtype) -> np.ndarray:
    if len(arrays) == 1:
        return np.ascontiguousarray(arrays[0], dtype=dtype)
    return np.concatenate(arrays).astype(dtype, copy=False)


def encode_item_v1(values: Sequence[bytes], *, timestamps: Sequence[int] | int, producer_id: int = 0) -> bytes:
    """Write format version 1 (version 2 without ``lane_max_ts``). Kept so the upgrade-on-read path stays tested."""
    item = encode_columns(values, timestamps=timestamps, producer_id=producer_id, producer_seq=0, compression="none")
    _, _, flags, _, count, base_ts, pid, pseq, _, _, _, _ = HEADER.unpack_from(item)
    stored = item[HEADER_SIZE:]
    prefix = HEADER_V1.pack(MAGIC, 1, flags, 0, count, base_ts, pid, pseq, len(stored), len(stored), 0)
    crc = crc32(stored, crc32(memoryview(prefix)[: HEADER_SIZE_V1 - 4]))
    return b"".join((prefix[: HEADER_SIZE_V1 - 4], U32.pack(crc), stored))


def encode_batch_v0(values: Sequence[bytes]) -> bytes:
    """Write the legacy format version 0 (values only, row-wise). Kept so the upgrade-on-read path stays tested."""
    parts = [V0_HEADER.pack(MAGIC, 0, len(values))]
    for value in values:
        parts += [U32.pack(len(value)), value]
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
