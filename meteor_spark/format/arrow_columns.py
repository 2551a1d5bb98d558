"""Records and Arrow, both directions: ring items to an Arrow record batch (the Spark reader's and
``RecordBatch.to_arrow``'s path) and Arrow columns to prepared columns for the wire format (``publish_arrow``'s
path). Both work column-wise on buffers, never record by record.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa

from meteor_spark.errors import ArgumentTypeError, ConfigError, SizeLimitError
from meteor_spark.format.item_encoding import PreparedColumns, header_bytes, prepare_columns
from meteor_spark.format.offsets import index_of, sequence_of
from meteor_spark.format.partitioning import lane_for_key
from meteor_spark.format.routing import check_message_id, check_topic, routing_headers
from meteor_spark.format.wire import ItemSlice, decode_item

_I32 = np.dtype("<i4")
_I64 = np.dtype("<i8")
_MAX_I32 = (1 << 31) - 1

HEADER_STRUCT = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
HEADERS_TYPE = pa.list_(pa.field("element", HEADER_STRUCT))
TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")
#: pyarrow's LZ4 block decompressor into bytes (cheaper than ``lz4.block`` or a pyarrow buffer; ``decode_item``
#: checks what it returns), or None (``lz4.block`` decompresses) when this pyarrow was built without the codec.
ARROW_LZ4 = partial(pa.Codec("lz4_raw").decompress, asbytes=True) if pa.Codec.is_available("lz4_raw") else None

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
#: The ``headers`` column as a map (Spark option ``headersAsMap``): one value per key, the last one of the record.
HEADERS_MAP_TYPE = pa.map_(pa.string(), pa.binary())
#: ``ARROW_SCHEMA`` plus ``headers: map<string, binary>``.
ARROW_SCHEMA_WITH_HEADERS_MAP = ARROW_SCHEMA.append(pa.field("headers", HEADERS_MAP_TYPE))


# --------------------------------------------------------------------------------------------------- items to Arrow


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
    for i, (item, seq) in enumerate(zip(items, sequences, strict=True)):
        view = decode_item(item, stream=stream, lane=lane, sequence=seq, decompress=ARROW_LZ4)
        start = 0
        if i == 0 and first_offset is not None:
            if sequence_of(first_offset) != seq:
                raise ConfigError(
                    f"items_to_arrow: first_offset {first_offset} is in ring sequence {sequence_of(first_offset)}, "
                    f"but the first item has sequence {seq}; pass an offset inside the first item"
                )
            start = min(index_of(first_offset), view.count)
        parts.append(ItemSlice(stream, lane, seq, view, start, view.count))
    return parts_to_arrow(parts, include_headers=include_headers)


def parts_to_arrow(parts: Sequence[ItemSlice], *, include_headers: bool) -> pa.RecordBatch:
    """Build the Arrow batch of the given parts column-wise (numpy on the items' length columns, one copy of data).

    Columns that are the same for every row of a batch (one stream, one lane, no keys: the usual case) are built
    once per size and reused by the next batches (``_REPEATED``): Arrow arrays are immutable, and a reader's
    batches mostly share one size.
    """
    schema = ARROW_SCHEMA_WITH_HEADERS if include_headers else ARROW_SCHEMA
    parts = [p for p in parts if p.stop > p.start]
    if not parts:
        return pa.RecordBatch.from_pylist([], schema=schema)
    counts = np.array([p.size for p in parts], dtype=np.int64)
    n = int(counts.sum())
    starts_in_batch = np.concatenate(([0], np.cumsum(counts)[:-1]))
    columns = [
        _keys_array(parts, n),
        _values_array(parts, n),
        _stream_array(parts, n, counts),
        _lane_array(parts, n, counts),
        _offsets_array(parts, n, counts, starts_in_batch),
        _timestamps_array(parts, n, starts_in_batch),
    ]
    if include_headers:
        columns.append(_headers_array(parts, n))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


#: Columns repeating one value, by (column, value, rows): at most ``_REPEATED_MAX``; a full cache is emptied (one
#: atomic ``clear``, safe for readers converting in several threads) and refills with the sizes in use.
_REPEATED: dict[tuple[str, Any, int], pa.Array] = {}
_REPEATED_MAX = 16


def _repeated(column: str, value: Any, n: int, build: Callable[[], pa.Array]) -> pa.Array:
    """The cached ``column`` of ``n`` rows all holding ``value`` (built by ``build`` the first time)."""
    key = (column, value, n)
    array = _REPEATED.get(key)
    if array is None:
        array = build()
        if len(_REPEATED) >= _REPEATED_MAX:
            _REPEATED.clear()
        _REPEATED[key] = array
    return array


def _lane_array(parts: Sequence[ItemSlice], n: int, counts: np.ndarray) -> pa.Array:
    """The ``lane`` column: one lane (always, for the Spark reader) is a cached constant column."""
    lanes = {p.lane for p in parts}
    if len(lanes) == 1:
        lane = next(iter(lanes))
        return _repeated("lane", lane, n, lambda: pa.array(np.full(n, lane, dtype=_I32)))
    lane_values = np.repeat(np.array([p.lane for p in parts], dtype=_I32), counts)
    return pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(lane_values)])


def _values_array(parts: Sequence[ItemSlice], n: int) -> pa.Array:
    """The ``value`` column: the parts' value bytes in one buffer, their lengths as Arrow offsets."""
    value_lengths = []
    value_chunks = []
    for p in parts:
        lengths, chunk = _part_column(p, "value")
        value_lengths.append(lengths)
        value_chunks.append(chunk)
    return _binary_array(pa.binary(), n, _concat(value_lengths), value_chunks, None)


def _keys_array(parts: Sequence[ItemSlice], n: int) -> pa.Array:
    """The ``key`` column: null where a record has no key (length -1, or an item without keys at all)."""
    if not any(p.item.key_lengths is not None for p in parts):
        return _repeated("key", None, n, lambda: pa.nulls(n, pa.binary()))
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
    return _binary_array(pa.binary(), n, np.maximum(key_lengths, 0), key_chunks, present)


def _stream_array(parts: Sequence[ItemSlice], n: int, counts: np.ndarray) -> pa.Array:
    """The ``stream`` column. One stream (the usual case) is its name repeated, built from buffers without a
    Python string per row (once per batch size: ``_repeated``), unless the repeated bytes would overflow Arrow's
    int32 offsets."""
    stream_names = {p.stream for p in parts}
    if len(stream_names) != 1:
        return pa.array(np.repeat(np.array([p.stream for p in parts], dtype=object), counts), pa.string())
    name = next(iter(stream_names))
    return _repeated("stream", name, n, lambda: _one_string(name, n))


def _one_string(name: str, n: int) -> pa.Array:
    encoded = name.encode("utf-8")
    if len(encoded) * n > _MAX_I32:
        return pa.array([name] * n, pa.string())
    stream_offsets = np.arange(n + 1, dtype=_I32) * np.int32(len(encoded))
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(stream_offsets), pa.py_buffer(encoded * n)])


def _offsets_array(parts: Sequence[ItemSlice], n: int, counts: np.ndarray, starts_in_batch: np.ndarray) -> pa.Array:
    """The ``offset`` column (sequence << 16 | index): per part a run of consecutive numbers."""
    bases = np.array([p.first_offset for p in parts], dtype=np.int64) - starts_in_batch
    offset_values = np.arange(n, dtype=np.int64) + np.repeat(bases, counts)
    return pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(offset_values)])


def _timestamps_array(parts: Sequence[ItemSlice], n: int, starts_in_batch: np.ndarray) -> pa.Array:
    """The ``timestamp`` column, ms turned into Spark's µs, written in place (an item whose records share one
    timestamp fills its rows with it, no per-item array); legacy items without timestamps give nulls."""
    ts = np.empty(n, dtype=np.int64)
    ts_valid: np.ndarray | None = None
    for p, pos in zip(parts, starts_in_batch.tolist(), strict=True):
        it = p.item
        rows = ts[pos : pos + p.size]
        if it.base_timestamp_ms is None:
            if ts_valid is None:
                ts_valid = np.ones(n, dtype=bool)
            ts_valid[pos : pos + p.size] = False
            rows[:] = 0
        elif it.timestamp_deltas is None:
            rows[:] = it.base_timestamp_ms * 1000
        else:
            np.add(it.timestamp_deltas[p.start : p.stop], it.base_timestamp_ms, out=rows)
            rows *= 1000
    return pa.Array.from_buffers(
        TIMESTAMP_TYPE, n, [_validity(ts_valid), pa.py_buffer(ts)], null_count=_null_count(ts_valid)
    )


def _part_column(part: ItemSlice, column: str) -> tuple[np.ndarray, Any]:
    """``(lengths, bytes)`` of a part's records in one column ("value" or "key") of its item; a whole item is used
    as it is (no slicing, no copy). Key lengths keep their -1 (no key)."""
    item = part.item
    lengths, data = getattr(item, f"{column}_lengths"), getattr(item, f"{column}_data")
    if part.start == 0 and part.stop == item.count:
        return lengths, data
    offsets = getattr(item, f"{column}_offsets")
    return lengths[part.start : part.stop], data[offsets[part.start] : offsets[part.stop]]


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
    """A binary (or string) array of ``n`` rows: offsets summed straight into Arrow's int32 (the total, checked
    first, is the chunks' bytes: ``lengths`` are theirs, nulls counted 0), the chunks' bytes joined once."""
    total = sum(memoryview(chunk).nbytes for chunk in chunks)
    if total > _MAX_I32:
        raise SizeLimitError(
            f"{total} bytes of data do not fit one Arrow binary column (2 GiB); convert fewer items at a time"
        )
    offsets = np.empty(n + 1, dtype=_I32)
    offsets[0] = 0
    np.cumsum(lengths, dtype=_I32, out=offsets[1:])
    data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    return pa.Array.from_buffers(
        type_,
        n,
        [_validity(valid), pa.py_buffer(offsets), pa.py_buffer(data)],
        null_count=_null_count(valid),
    )


def _headers_array(parts: Sequence[ItemSlice], n: int) -> pa.Array:
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
        count_list.append(it.header_counts[p.start : p.stop])
        ho = it.header_offsets
        h0, h1 = int(ho[p.start]), int(ho[p.stop])
        hkey_lengths.append(it.hkey_lengths[h0:h1])
        hvalue_lengths.append(it.hvalue_lengths[h0:h1])
        hko, hvo = it.hkey_offsets, it.hvalue_offsets
        hkey_chunks.append(it.hkey_data[hko[h0] : hko[h1]])
        hvalue_chunks.append(it.hvalue_data[hvo[h0] : hvo[h1]])
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


def headers_to_map(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` with its ``headers`` column (list<struct<key, value>>) as ``map<string, binary>``.

    A record that carries a header key more than once keeps the last value, like Kafka's ``Headers.lastHeader``
    (a map holds one value per key; the array form keeps them all). Column-wise: the deduplication only runs when
    some record repeats a key.
    """
    index = batch.schema.get_field_index("headers")
    column = batch.column(index)
    offsets = np.asarray(column.offsets, dtype=np.int64)
    entries = column.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))  # a sliced column's entries
    offsets = offsets - offsets[0]
    keys, values = entries.field("key"), entries.field("value")
    n_entries = len(entries)
    if n_entries:
        parents = np.repeat(np.arange(len(column), dtype=np.int64), np.diff(offsets))
        table = pa.table({"parent": parents, "key": keys, "position": np.arange(n_entries, dtype=np.int64)})
        last = table.group_by(["parent", "key"], use_threads=False).aggregate([("position", "max")])
        if last.num_rows < n_entries:
            keep = np.sort(np.asarray(last.column("position_max"), dtype=np.int64))
            counts = np.bincount(parents[keep], minlength=len(column))
            offsets = np.zeros(len(column) + 1, dtype=np.int64)
            np.cumsum(counts, out=offsets[1:])
            keys, values = keys.take(keep), values.take(keep)
    as_map = pa.MapArray.from_arrays(pa.array(offsets.astype(_I32)), keys, values, type=HEADERS_MAP_TYPE)
    return pa.RecordBatch.from_arrays(
        [*batch.columns[:index], as_map, *batch.columns[index + 1 :]],
        schema=batch.schema.set(index, pa.field("headers", HEADERS_MAP_TYPE)),
    )


# --------------------------------------------------------------------------------------------------- Arrow to items


class ArrowColumns:
    """Rows of an Arrow bulk bound for one lane (value/key binary, timestamps in ms), prepared for the wire format
    slice by slice, without Python objects per record.

    The length columns and buffers are taken once here, so a ring item's slice is a few array views (an Arrow
    bulk is cut into many items).
    """

    def __init__(
        self, values: pa.Array, keys: pa.Array | None, headers: list[Any] | None, stamps: np.ndarray | int
    ) -> None:
        self.values = values
        self.keys = keys
        self.headers = headers
        self.stamps = stamps
        self.count = len(values)
        self._value_offsets, self._value_lengths, self._value_data = _binary_parts(values)
        self._key_offsets: np.ndarray | None = None
        self._key_lengths: np.ndarray | None = None
        self._key_data = memoryview(b"")
        if keys is not None:
            self._key_offsets, self._key_lengths, self._key_data = _binary_parts(keys)
            if keys.null_count:
                self._key_lengths = np.where(np.asarray(keys.is_valid()), self._key_lengths, -1).astype(_I32)

    def cumulative_bytes(self) -> np.ndarray:
        """Prefix sums (``count + 1``, int64) of each row's bytes (value, key and headers), as the batching limits
        count them: straight from the Arrow offsets."""
        offsets = self._value_offsets
        cum = offsets.astype(np.int64)
        cum -= cum[0]
        if self._key_offsets is not None:
            cum += self._key_offsets
            cum -= int(self._key_offsets[0])
        if self.headers is not None:
            cum[1:] += np.cumsum(header_bytes(self.headers))
        return cum

    def prepare(self, start: int, stop: int) -> PreparedColumns:
        offsets = self._value_offsets
        value_data = self._value_data[int(offsets[start]) : int(offsets[stop])]
        value_lengths = self._value_lengths[start:stop]
        key_lengths = None
        key_data: Any = b""
        if self._key_offsets is not None:
            key_offsets = self._key_offsets
            key_lengths = self._key_lengths[start:stop]  # type: ignore[index]
            key_data = self._key_data[int(key_offsets[start]) : int(key_offsets[stop])]
        stamps = self.stamps if isinstance(self.stamps, int) else self.stamps[start:stop]
        columns = PreparedColumns(stop - start, value_lengths, value_data, stamps, key_lengths, key_data)
        if self.headers is not None and any(self.headers[start:stop]):
            with_headers = prepare_columns([b""] * (stop - start), headers=self.headers[start:stop], timestamps=0)
            columns = PreparedColumns(
                columns.count,
                value_lengths,
                value_data,
                stamps,
                key_lengths,
                key_data,
                with_headers.header_counts,
                with_headers.hkey_lengths,
                with_headers.hkey_data,
                with_headers.hvalue_lengths,
                with_headers.hvalue_data,
            )
        return columns


class ArrowInput:
    """The record columns of an Arrow table to publish, checked once.

    Columns: ``value`` (required; binary or string), optional ``key`` (binary/string, nulls allowed), ``headers``
    (list<struct<key: string, value: binary>>), ``timestamp`` (a timestamp type, or int64 ms; nulls = now),
    ``lane`` (integer; nulls = by key), ``topic`` and ``message_id`` (strings; nulls = none: they become the
    reserved headers of ``meteor_spark.format.routing``, ``message_ids`` keeps the ids per row). Other columns are
    ignored.
    """

    def __init__(self, batch: pa.RecordBatch | pa.Table) -> None:
        table = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
        columns = set(table.column_names)
        if "value" not in columns:
            raise ConfigError(f"publish_arrow needs a 'value' column (binary or string); got columns {sorted(columns)}")
        self.rows = table.num_rows
        self.table = table.combine_chunks() if self.rows else table
        if not self.rows:
            return
        self.values = _binary_column(self.table, "value", nullable=False)
        keys = _binary_column(self.table, "key", nullable=True) if "key" in columns else None
        self.keys = None if keys is not None and keys.null_count == len(keys) else keys
        self.stamps = _timestamps_column(self.table) if "timestamp" in columns else int(time.time() * 1000)
        self.headers = _headers_column(self.table) if "headers" in columns else None
        self.message_ids: list[str | None] | None = None
        if "topic" in columns or "message_id" in columns:
            self._route(columns)

    def _route(self, columns: set[str]) -> None:
        """Fold the ``topic`` / ``message_id`` columns into each row's headers (checked like ``Record``'s)."""
        nothing: list[str | None] = [None] * self.rows
        topics = _text_column(self.table, "topic", self.rows) if "topic" in columns else nothing
        ids = _text_column(self.table, "message_id", self.rows) if "message_id" in columns else nothing
        if all(t is None for t in topics) and all(i is None for i in ids):
            return
        base = self.headers or [()] * self.rows
        headers = []
        for row, (pairs, topic, mid) in enumerate(zip(base, topics, ids, strict=True)):
            topic = check_topic(topic or "", f"column 'topic' (row {row})")
            if mid is not None:
                check_message_id(mid, f"column 'message_id' (row {row}; null = none)")
            headers.append(routing_headers(pairs, topic, mid) if topic or mid is not None else pairs)
        self.headers = headers
        self.message_ids = None if all(i is None for i in ids) else ids

    def nbytes(self) -> int:
        """Bytes of the values and keys (headers not counted): what the rows weigh against the batching limits."""
        total = _data_bytes(self.values)
        if self.keys is not None:
            total += _data_bytes(self.keys)
        return total

    def largest_row(self) -> tuple[int, int]:
        """``(row, bytes)`` of the row carrying the most value, key and header bytes (read from the columns'
        offsets, nothing copied): what ``Publisher.publish_arrow`` weighs against the grid's frame limit."""
        sizes = np.diff(_offsets(self.values))  # int32 for values alone (a batch's own offsets); no int64 copy
        if self.keys is not None:
            sizes = sizes + np.diff(_offsets(self.keys)).astype(np.int64)
        if self.headers is not None:
            sizes = sizes + np.fromiter(
                (sum(len(k.encode()) + len(v) for k, v in pairs) for pairs in self.headers), np.int64, self.rows
            )
        row = int(np.argmax(sizes))
        return row, int(sizes[row])

    def lanes(self, lanes: int, stream: str, sticky: int) -> np.ndarray | None:
        """Per-row lanes (explicit ``lane`` column, else by key, else ``sticky``); None = no row has a lane of its
        own (spread the rows)."""
        explicit: np.ndarray | None = None
        if "lane" in self.table.column_names:
            column = _column(self.table, "lane")
            if not pa.types.is_integer(column.type):
                raise ArgumentTypeError(f"column 'lane' must be an integer column, got {column.type}")
            explicit = np.asarray(column.fill_null(-1).cast(pa.int64()))
            bad = explicit[(explicit >= lanes) | (explicit < -1)]
            if bad.size:
                raise ConfigError(
                    f"column 'lane' holds {int(bad[0])}, but stream {stream!r} has lanes 0..{lanes - 1} "
                    f"(null or -1 = by key)"
                )
        if self.keys is None and explicit is None:
            return None
        out = np.full(self.rows, -1, dtype=np.int64) if explicit is None else explicit.copy()
        if self.keys is not None:
            missing = np.flatnonzero(out < 0)
            if missing.size:
                key_list = self.keys.take(pa.array(missing)).to_pylist()
                out[missing] = [-1 if k is None else lane_for_key(k, lanes) for k in key_list]
        out[out < 0] = sticky
        return out

    def rows_of(self, rows: np.ndarray | slice) -> ArrowColumns:
        """The given rows (a contiguous slice, or row numbers in order) as columns for one lane."""
        keys, headers, stamps = self.keys, self.headers, self.stamps
        seg_stamps = stamps if isinstance(stamps, int) else stamps[rows]
        if isinstance(rows, slice):
            length = rows.stop - rows.start
            return ArrowColumns(
                self.values.slice(rows.start, length),
                None if keys is None else keys.slice(rows.start, length),
                None if headers is None else headers[rows],
                seg_stamps,
            )
        indices = pa.array(rows)
        return ArrowColumns(
            self.values.take(indices),
            None if keys is None else keys.take(indices),
            None if headers is None else [headers[i] for i in rows.tolist()],
            seg_stamps,
        )


def _offsets(array: pa.Array) -> np.ndarray:
    raw = np.frombuffer(array.buffers()[1], dtype=_I32)
    return raw[array.offset : array.offset + len(array) + 1]


def _data_bytes(array: pa.Array) -> int:
    offsets = _offsets(array)
    return int(offsets[-1]) - int(offsets[0])


def _binary_parts(array: pa.Array) -> tuple[np.ndarray, np.ndarray, memoryview]:
    """A binary array's offsets (``len + 1``, as stored: they need not start at 0), lengths (int32) and data."""
    offsets = _offsets(array)
    data = array.buffers()[2]
    return offsets, np.diff(offsets), memoryview(b"" if data is None else data)


def _column(table: pa.Table, name: str) -> pa.Array:
    """One column as a single array. ``ChunkedArray.combine_chunks`` copies even a lone chunk (the whole values
    buffer of a large batch), so a single chunk is taken as it is."""
    chunked = table.column(name)
    return chunked.chunk(0) if chunked.num_chunks == 1 else chunked.combine_chunks()


def _binary_column(table: pa.Table, name: str, *, nullable: bool) -> pa.Array:
    column = _column(table, name)
    kind = column.type
    if pa.types.is_string(kind):
        column = column.view(pa.binary())
    elif pa.types.is_large_string(kind) or pa.types.is_large_binary(kind):
        column = column.cast(pa.large_binary()).cast(pa.binary())
    elif not pa.types.is_binary(kind):
        raise ArgumentTypeError(f"column {name!r} must be binary or string, got {kind}")
    if not nullable and column.null_count:
        raise ConfigError(f"column {name!r} has {column.null_count} nulls; every record needs a value")
    return column


def _timestamps_column(table: pa.Table) -> np.ndarray | int:
    column = _column(table, "timestamp")
    now = int(time.time() * 1000)
    if pa.types.is_timestamp(column.type):
        millis = column.cast(pa.timestamp("ms", tz=column.type.tz)).cast(pa.int64())
    elif pa.types.is_integer(column.type):
        millis = column.cast(pa.int64())
    else:
        raise ArgumentTypeError(f"column 'timestamp' must be a timestamp or int64 milliseconds, got {column.type}")
    return np.asarray(millis.fill_null(now), dtype=np.int64)


def _text_column(table: pa.Table, name: str, rows: int) -> list[str | None]:
    column = _column(table, name)
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        raise ArgumentTypeError(f"column {name!r} must be a string column, got {column.type}")
    return column.to_pylist() if column.null_count < rows else [None] * rows


def _headers_column(table: pa.Table) -> list[tuple[tuple[str, bytes], ...]] | None:
    column = _column(table, "headers")
    if column.null_count == len(column):
        return None
    out: list[tuple[tuple[str, bytes], ...]] = []
    for row in column.to_pylist():
        if not row:
            out.append(())
            continue
        pairs = []
        for entry in row:
            if entry is None:
                continue
            if isinstance(entry, dict):
                key, value = entry.get("key"), entry.get("value")
            else:
                key, value = entry
            if isinstance(value, str):
                value = value.encode("utf-8")
            if not isinstance(key, str) or not isinstance(value, (bytes, bytearray)):
                raise ConfigError(
                    f"column 'headers' must be list<struct<key: string, value: binary>>; got an entry {entry!r}"
                )
            pairs.append((key, bytes(value)))
        out.append(tuple(pairs))
    return out if any(out) else None
