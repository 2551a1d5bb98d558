"""The record value types and the record-level conveniences over the wire format.

``Record`` is what is published and read; ``BatchPart`` and ``RecordBatch`` are records read, made into ``Record``
objects only on demand; ``encode_batch`` / ``decode_batch`` turn records into one ring item and back. The wire
format itself (``ItemView``, a decoded item as column views) lives in ``meteor_spark.format.wire``, the conversions to
and from Arrow in ``meteor_spark.format.arrow_columns``; neither imports this module, so the layers point one way
(``wire`` <- ``records``, ``wire`` <- ``arrow_columns``; ``RecordBatch.to_arrow`` loads the latter on use).
"""

from __future__ import annotations

import time
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, fields
from itertools import pairwise, repeat
from typing import TYPE_CHECKING, Any, overload

from meteor_spark.errors import ArgumentTypeError
from meteor_spark.format.item_decoding_small import Columns, SmallItemView, decode_item_for_records
from meteor_spark.format.item_encoding import ItemFraming, encode_prepared, prepare_columns
from meteor_spark.format.offsets import INDEX_BITS
from meteor_spark.format.routing import routing_headers, routing_of
from meteor_spark.format.wire import ItemSlice

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass(frozen=True, slots=True)
class Record:
    """One record: a value with an optional key, headers, timestamp, topic and message id.

    ``timestamp_ms`` left None is set to the publish time by the publisher. ``offset``, ``lane`` and ``stream``
    are assigned when the record is read; when publishing, ``lane`` may name the lane explicitly (-1 = by key,
    or the publisher's choice for records without a key). ``topic`` routes the record to the subscribers whose
    ``topics`` match it (``""``: no topic); ``message_id`` is what a stream's deduplication window compares. Both
    travel as reserved headers (``meteor_spark.format.routing``) and are filled from them when a record is read.
    """

    value: bytes
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp_ms: int | None = None
    offset: int = -1
    lane: int = -1
    stream: str = ""
    topic: str = ""
    message_id: str | None = None


def as_record(item: Record | bytes | bytearray | memoryview | str) -> Record:
    """A ``Record`` from a record or the shortcut forms (bytes-like or str value)."""
    if isinstance(item, Record):
        return item
    if isinstance(item, (bytes, bytearray, memoryview)):
        return Record(bytes(item))
    if isinstance(item, str):
        return Record(item.encode("utf-8"))
    raise ArgumentTypeError(
        f"cannot publish a {type(item).__name__}: give a Record, bytes or str (encode other objects to bytes first)"
    )


def with_routing(record: Record) -> Record:
    """``record`` with its topic and message id in its headers, as they are written to a ring item."""
    r = record
    headers = routing_headers(r.headers, r.topic, r.message_id)
    # the constructor, not dataclasses.replace: this runs per record on the publishing path, and is 3x cheaper
    return Record(r.value, r.key, headers, r.timestamp_ms, r.offset, r.lane, r.stream, r.topic, r.message_id)


# --------------------------------------------------------------------------------------------------- batches


@dataclass(frozen=True)
class BatchPart(ItemSlice):
    """Records ``[start, stop)`` of one decoded ring item of a lane, made into ``Record`` objects on demand."""

    def records(
        self, value: Callable[[bytes], Any] | None = None, key: Callable[[bytes], Any] | None = None
    ) -> list[Record]:
        """Materialise this part's records (the per-record path; Arrow conversion avoids it), with ``value`` /
        ``key`` (keys that are set) through the given deserializers; whatever they raise propagates."""
        item, start, stop = self.item, self.start, self.stop
        if stop <= start:
            return []
        values: list[Any]
        keys: list[Any] | None
        stamps: list[int] | None
        if type(item) is SmallItemView:  # decoded without numpy: its columns are ready
            values, keys, headers, stamps = item.columns(start, stop)
        else:
            values, keys, headers, stamps = self._columns()
        if value is not None:
            values = list(map(value, values))
        if key is not None and keys is not None:
            keys = [None if k is None else key(k) for k in keys]
        return _make_records(values, keys, headers, stamps, self.sequence << INDEX_BITS | start, self.lane, self.stream)

    def values(self) -> list[bytes]:
        """This part's values, each its own ``bytes`` (cheaper than building records)."""
        item = self.item
        if type(item) is SmallItemView:  # decoded without numpy: its columns are ready
            return item.columns(self.start, self.stop)[0]
        return _values(item.value_data, item.value_offsets[self.start : self.stop + 1].tolist())

    def _columns(self) -> Columns:
        """Values, keys, headers and timestamps of this part's records, cut out of the item's numpy columns."""
        item, start, stop = self.item, self.start, self.stop
        values = self.values()
        n = stop - start
        keys: list[bytes | None] | None = None
        if item.key_lengths is not None and item.key_data is not None:
            ko = item.key_offsets[start : stop + 1].tolist()
            kdata = bytes(item.key_data[ko[0] : ko[-1]])
            kl = item.key_lengths[start:stop].tolist()
            kb = ko[0]
            keys = [None if kl[i] < 0 else kdata[ko[i] - kb : ko[i + 1] - kb] for i in range(n)]
        headers = self._headers(n) if item.header_counts is not None else None
        stamps_arr = item.timestamps(start, stop)
        return values, keys, headers, None if stamps_arr is None else stamps_arr.tolist()

    def _headers(self, n: int) -> list[tuple[tuple[str, bytes], ...]]:
        item = self.item
        assert item.hkey_data is not None and item.hvalue_data is not None
        ho = item.header_offsets[self.start : self.stop + 1].tolist()
        hko = item.hkey_offsets.tolist()
        hvo = item.hvalue_offsets.tolist()
        hkeys = bytes(item.hkey_data)
        hvalues = bytes(item.hvalue_data)
        out = []
        for i in range(n):
            out.append(
                tuple(
                    (hkeys[hko[j] : hko[j + 1]].decode("utf-8"), hvalues[hvo[j] : hvo[j + 1]])
                    for j in range(ho[i], ho[i + 1])
                )
            )
        return out


#: Values of this mean size or more are copied out of the item one by one; smaller ones through one joint copy.
SLICE_APART_FROM = 2048


def _values(data: memoryview, bounds: list[int]) -> list[bytes]:
    """The values between consecutive ``bounds`` of an item's value data, each its own ``bytes`` (valid whatever
    becomes of the item's buffer). Large values are copied once each; small ones are copied out together, then
    sliced, which is cheaper than a view per value (at 10 KiB: 0.10 against 0.17 ms per MiB; at 256 B: 1.2
    against 0.7)."""
    first, last = bounds[0], bounds[-1]
    if last - first >= SLICE_APART_FROM * (len(bounds) - 1):
        return [bytes(data[a:b]) for a, b in pairwise(bounds)]
    joint = bytes(data[first:last])
    return [joint[a - first : b - first] for a, b in pairwise(bounds)]


_new_object = object.__new__
(
    _SET_VALUE,
    _SET_KEY,
    _SET_HEADERS,
    _SET_TIMESTAMP,
    _SET_OFFSET,
    _SET_LANE,
    _SET_STREAM,
    _SET_TOPIC,
    _SET_MESSAGE_ID,
) = (Record.__dict__[f.name].__set__ for f in fields(Record))


def with_values(records: list[Record], values: list[Any]) -> list[Record]:
    """Copies of ``records`` carrying ``values`` (one each), made as ``_make_records`` makes records: a deserializer
    that needs each record's headers (a typed stream's) runs per record, and ``dataclasses.replace`` would cost more
    than the decoding."""
    out: list[Record] = []
    new = _new_object
    for record, value in zip(records, values, strict=True):
        copy = new(Record)
        _SET_VALUE(copy, value)
        _SET_KEY(copy, record.key)
        _SET_HEADERS(copy, record.headers)
        _SET_TIMESTAMP(copy, record.timestamp_ms)
        _SET_OFFSET(copy, record.offset)
        _SET_LANE(copy, record.lane)
        _SET_STREAM(copy, record.stream)
        _SET_TOPIC(copy, record.topic)
        _SET_MESSAGE_ID(copy, record.message_id)
        out.append(copy)
    return out


def _make_records(
    values: list[Any],
    keys: list[Any] | None,
    headers: list[tuple[tuple[str, bytes], ...]] | None,
    stamps: list[int] | None,
    first: int,
    lane: int,
    stream: str,
) -> list[Record]:
    """``Record(values[i], keys[i], headers[i], stamps[i], first + i, lane, stream)`` for each value (None / ``()``
    where a column is None; topic and message id from the headers), the same frozen objects the constructor makes,
    made 2-3x faster: a frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``; this sets
    the slots directly."""
    out: list[Record] = []
    append = out.append
    new = _new_object
    set_value, set_key, set_headers, set_timestamp = _SET_VALUE, _SET_KEY, _SET_HEADERS, _SET_TIMESTAMP
    set_offset, set_lane, set_stream, set_topic, set_message_id = (
        _SET_OFFSET,
        _SET_LANE,
        _SET_STREAM,
        _SET_TOPIC,
        _SET_MESSAGE_ID,
    )
    offset = first
    for value, key, record_headers, stamp in zip(
        values,
        repeat(None) if keys is None else keys,
        repeat(()) if headers is None else headers,
        repeat(None) if stamps is None else stamps,
        strict=False,  # absent columns are endless repeats; the others have one entry per value
    ):
        record = new(Record)
        set_value(record, value)
        set_key(record, key)
        set_headers(record, record_headers)
        set_timestamp(record, stamp)
        set_offset(record, offset)
        set_lane(record, lane)
        set_stream(record, stream)
        if record_headers:
            topic, message_id = routing_of(record_headers)
            set_topic(record, topic)
            set_message_id(record, message_id)
        else:
            set_topic(record, "")
            set_message_id(record, None)
        append(record)
        offset += 1
    return out


class RecordBatch(Sequence[Record]):
    """Records read in one go, possibly from several items and lanes; ``Record`` objects are made on demand.

    ``to_arrow()`` builds a ``pyarrow.RecordBatch`` straight from the items' buffers.

    A subscriber with deserializers gives ``records``: the same records with their value / key deserialized; the
    batch then hands out those (``values()`` included), while ``to_arrow()`` still gives the stored bytes.
    """

    __slots__ = ("_cache", "_ends", "_parts")

    def __init__(self, parts: Iterable[BatchPart] = (), records: list[Record] | None = None) -> None:
        self._parts = tuple(p for p in parts if p.stop > p.start)
        ends = []
        total = 0
        for part in self._parts:
            total += part.size
            ends.append(total)
        self._ends = ends
        if records is not None and len(records) != total:
            raise ValueError(f"{len(records)} records given for parts holding {total}")
        self._cache: list[Record] | None = records

    @classmethod
    def empty(cls) -> RecordBatch:
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
        if self._cache is not None:
            return [r.value for r in self._cache]
        out: list[bytes] = []
        for part in self._parts:
            out.extend(part.values())
        return out

    def last_offsets(self) -> dict[int, int]:
        """The offset of the last record of each lane present in the batch."""
        out: dict[int, int] = {}
        for part in self._parts:
            out[part.lane] = part.last_offset
        return out

    def to_arrow(self, include_headers: bool = False) -> pa.RecordBatch:
        """The records as a ``pyarrow.RecordBatch`` with ``ARROW_SCHEMA`` (plus headers when asked)."""
        # Imported here so that the value types and the wire format load without pyarrow.
        from meteor_spark.format.arrow_columns import parts_to_arrow

        return parts_to_arrow(self._parts, include_headers=include_headers)

    def __repr__(self) -> str:
        lanes = sorted({p.lane for p in self._parts})
        return f"RecordBatch({len(self)} records, lanes {lanes})"


_EMPTY = RecordBatch()


# ------------------------------------------------------------------------------------------ records and ring items


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
    recs = [r if not r.topic and r.message_id is None else with_routing(r) for r in recs]
    now = int(time.time() * 1000)
    columns = prepare_columns(
        [r.value for r in recs],
        keys=[r.key for r in recs],
        headers=[r.headers for r in recs],
        timestamps=[now if r.timestamp_ms is None else r.timestamp_ms for r in recs],
    )
    return encode_prepared([columns], ItemFraming(producer_id, producer_seq, compression, compression_threshold))


def decode_batch(item: bytes | bytearray | memoryview, *, stream: str, lane: int, sequence: int) -> RecordBatch:
    """Decode one ring item into a lazy ``RecordBatch`` (offsets, lane and stream assigned)."""
    view = decode_item_for_records(item, stream=stream, lane=lane, sequence=sequence)
    return RecordBatch([BatchPart(stream, lane, sequence, view, 0, view.count)])
