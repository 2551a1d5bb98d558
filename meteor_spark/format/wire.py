"""The versioned ring-item wire format, and decoding it (no pyarrow here).

The format has three modules: ``item_header`` (the header's layout and the reads of a header alone),
``item_encoding`` (writing items) and this one (the description below, and decoding items into ``ItemView``). Each
name is imported from the module that defines it.

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
the body reaches the compression threshold and actually shrinks. ``decode_item`` decompresses with ``lz4.block``
unless given another decompressor of the same block format (the Spark path passes pyarrow's ``lz4_raw`` codec,
``arrow_columns.ARROW_LZ4``, about a third cheaper; this module never imports pyarrow, so the subscriber's import stays
light). Such a decompressor may not report how many bytes it wrote, so a body it returns is checked: its last bytes
must be the block's last bytes (an LZ4 block ends with at least 5 literal bytes, copied as they are), and any other
outcome is decided by ``lz4.block`` itself (refused with the byte counts, or accepted as an unusual but valid block).

Versions: a reader that meets a version newer than ``FORMAT_VERSION`` raises ``UnsupportedFormatVersionError``
(upgrade the library); older versions are upgraded on read into the current in-memory shape. Version 0 is the
legacy row-wise layout ``magic, 0, count u32, then count x (length u32, value bytes)``: values only, no keys,
headers, timestamps or checksum (``encode_batch_v0`` writes it so the upgrade path stays tested; ``encode_item_v1``
does the same for version 1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from functools import cached_property
from typing import Any

import lz4.block
import numpy as np

from meteor_spark.errors import FormatError
from meteor_spark.format.item_encoding import (
    I32,
    I64,
)
from meteor_spark.format.item_header import (
    FLAG_HEADERS,
    FLAG_KEYS,
    FLAG_LZ4,
    FLAG_TIMESTAMPS,
    FLAG_TRANSACTIONAL,
    NO_TIMESTAMP,
    U32,
    V0_HEADER,
    item_lane_max_timestamp,
    open_item,
    read_header,
    v0_count,
)
from meteor_spark.format.offsets import INDEX_BITS

#: The format's names, wherever they are defined: code reads and writes ring items through this module.
__all__ = ["ItemSlice", "ItemView", "decode_item", "lane_max_after"]

_MAX_I32 = (1 << 31) - 1
_U32 = np.dtype("<u4")
#: A decompressor of LZ4 blocks: ``(stored bytes, body_length) -> the body``; it raises any exception on a block it
#: cannot decompress (``decode_item`` turns it into a ``FormatError``).
Decompress = Callable[[memoryview, int], Any]
#: Bytes at the end of an LZ4 block that a conforming encoder always writes as literals (the block format's rule).
_LAST_LITERALS = 5

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


_ITEM_VIEW_FIELDS = tuple(f.name for f in fields(ItemView))


def _item_view(*values: Any) -> ItemView:
    """An ``ItemView`` of ``values`` in field order, built in half the time of its ``__init__``: a frozen
    dataclass sets each of its 17 fields through ``object.__setattr__``, a tenth of decoding a 1,000-record item;
    here they go at once into the instance's ``__dict__``, where that ``__init__`` puts them."""
    view: ItemView = object.__new__(ItemView)
    view.__dict__.update(zip(_ITEM_VIEW_FIELDS, values, strict=True))
    return view


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


def decode_item(
    item: bytes | bytearray | memoryview, *, stream: str, lane: int, sequence: int, decompress: Decompress | None = None
) -> ItemView:
    """Decode one ring item; an LZ4 body with ``decompress`` when given (see the module's notes), else ``lz4.block``.

    Raises:
        UnsupportedFormatVersionError: written by a newer format version than this library knows.
        FormatError: not a record batch, or corrupt; the message names stream, lane and sequence.
    """
    view, where, version = open_item(item, stream, lane, sequence)
    if version:
        return _decode_v1(view, where, version, decompress)
    return _decode_v0(view, where)


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


def _decode_v1(view: memoryview, where: str, version: int, decompress: Decompress | None) -> ItemView:
    h = read_header(view, where, version, check_crc=True)
    flags, count, body_len = h.flags, h.records, h.body_len
    stored = view[h.size :]
    if flags & FLAG_LZ4:
        body = _lz4_body(stored, body_len, where, decompress)
    else:
        if h.stored_len != body_len:
            raise FormatError(f"{where}: uncompressed body of {h.stored_len} bytes, {body_len} announced")
        body = stored
    reader = _BodyReader(body, where)
    value_lengths = reader.array(I32, count, "value lengths")
    key_lengths = reader.array(I32, count, "key lengths") if flags & FLAG_KEYS else None
    deltas = reader.array(I64, count, "timestamp deltas") if flags & FLAG_TIMESTAMPS else None
    header_counts = hkey_lengths = hvalue_lengths = None
    if flags & FLAG_HEADERS:
        header_counts = reader.array(I32, count, "header counts")
        n_headers = reader.total(header_counts, "header count")
        hkey_lengths = reader.array(I32, n_headers, "header key lengths")
        hvalue_lengths = reader.array(I32, n_headers, "header value lengths")
    value_data = reader.blob(reader.total(value_lengths, "value length"), "values")
    key_data = None
    if key_lengths is not None:
        if count and int(key_lengths.min()) < -1:
            raise FormatError(f"{where}: negative key length in the item")
        key_data = reader.blob(int(np.maximum(key_lengths, 0).sum()), "keys")
    hkey_data = hvalue_data = None
    if hkey_lengths is not None and hvalue_lengths is not None:
        hkey_data = reader.blob(reader.total(hkey_lengths, "header key length"), "header keys")
        hvalue_data = reader.blob(reader.total(hvalue_lengths, "header value length"), "header values")
    reader.finish()
    # In field order (the locals are named after the fields).
    return _item_view(
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

    def total(self, lengths: np.ndarray, what: str) -> int:
        """The sum of ``lengths``, all checked non-negative, in one numpy reduction instead of two: read as
        unsigned, a negative length counts 2**31 or more, so a sum past the rest of the body (or that large) is the
        only case where the minimum is taken, to name the fault."""
        if len(lengths) == 1:
            self.non_negative(lengths, what)
            return int(lengths[0])
        total = int(lengths.view(_U32).sum(dtype=np.uint64))
        if total > len(self.body) - self.pos or total > _MAX_I32:
            self.non_negative(lengths, what)
        return total

    def non_negative(self, lengths: np.ndarray, what: str) -> None:
        # One length (an item of one record) is read directly: a numpy reduction costs more than the decoding.
        if len(lengths) and int(lengths[0] if len(lengths) == 1 else lengths.min()) < 0:
            raise FormatError(f"{self.where}: negative {what} in the item")

    def finish(self) -> None:
        if self.pos != len(self.body):
            raise FormatError(f"{self.where}: {len(self.body) - self.pos} unexpected bytes after the last column")


def _lz4_body(stored: memoryview, body_len: int, where: str, decompress: Decompress | None) -> memoryview:
    """The decompressed body, ``body_len`` bytes exactly (see the module's notes on decompressors)."""
    if decompress is not None:
        try:
            body = memoryview(decompress(stored, body_len))
        except Exception:  # any refusal is settled by lz4.block below, which names the fault
            pass
        else:
            tail = min(_LAST_LITERALS, len(stored), body_len)
            if len(body) == body_len and body[body_len - tail :] == stored[len(stored) - tail :]:
                return body
    try:
        body = memoryview(lz4.block.decompress(stored, uncompressed_size=body_len))
    except lz4.block.LZ4BlockError as exc:
        raise FormatError(f"{where}: the LZ4 body does not decompress ({exc})") from None
    if len(body) != body_len:
        raise FormatError(f"{where}: the LZ4 body decompressed to {len(body)} bytes, {body_len} announced")
    return body


def _decode_v0(view: memoryview, where: str) -> ItemView:
    """Upgrade a legacy version 0 item (row-wise values) to the current in-memory shape."""
    count = v0_count(view, where)
    lengths = np.empty(count, dtype=I32)
    chunks: list[memoryview] = []
    pos = V0_HEADER.size
    for i in range(count):
        if pos + 4 > len(view):
            raise FormatError(f"{where}: truncated version 0 item at record {i}")
        (size,) = U32.unpack_from(view, pos)
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
