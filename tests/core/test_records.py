"""The ring-item wire format and its Arrow conversion (unit tests, no grid)."""

from __future__ import annotations

import struct
import subprocess
import sys
import zlib
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from meteor_spark.errors import ConfigError, FormatError, UnsupportedFormatVersionError
from meteor_spark.format.arrow_columns import ARROW_SCHEMA, ARROW_SCHEMA_WITH_HEADERS, items_to_arrow
from meteor_spark.format.item_encoding import (
    ItemFraming,
    encode_batch_v0,
    encode_columns,
    encode_item_v1,
    encode_items,
    encode_prepared,
    prepare_columns,
)
from meteor_spark.format.item_header import (
    FLAG_LZ4,
    FORMAT_VERSION,
    HEADER_SIZE,
    HEADER_SIZE_V1,
    MAGIC,
    item_count,
    item_lane_max_timestamp,
    item_producer,
)
from meteor_spark.format.offsets import make_offset
from meteor_spark.format.records import BatchPart, Record, RecordBatch, decode_batch, encode_batch
from meteor_spark.format.wire import decode_item, lane_max_after


def _records() -> list[Record]:
    return [
        Record(
            value=f"value-{i}".encode() * (i % 4),
            key=None if i % 3 == 0 else f"key-{i}".encode(),
            headers=(("trace", f"t{i}".encode()), ("ünï", b"\x00\xff")) if i % 2 else (),
            timestamp_ms=1_700_000_000_000 + i * 7,
        )
        for i in range(50)
    ]


def _same(a: Record, b: Record) -> bool:
    return (a.value, a.key, a.headers, a.timestamp_ms) == (b.value, b.key, b.headers, b.timestamp_ms)


def test_round_trip_keeps_every_field_and_assigns_offsets() -> None:
    records = _records()
    item = encode_batch(records, producer_id=42, producer_seq=7, compression="none")
    batch = decode_batch(item, stream="orders", lane=3, sequence=9)
    assert len(batch) == len(records)
    for i, (got, sent) in enumerate(zip(batch, records, strict=True)):
        assert _same(got, sent)
        assert (got.offset, got.lane, got.stream) == (make_offset(9, i), 3, "orders")
    view = decode_item(item, stream="orders", lane=3, sequence=9)
    assert (view.producer_id, view.producer_seq, view.version) == (42, 7, FORMAT_VERSION)


@pytest.mark.parametrize("compression", ["none", "lz4"])
def test_records_read_are_the_records_the_constructor_makes(compression: str) -> None:
    """Records made from a read item equal, hash and print as constructed ones, and are as frozen."""
    records = _records()
    item = encode_batch(records, producer_id=1, producer_seq=0, compression=compression)
    view = decode_item(item, stream="orders", lane=2, sequence=4)
    got = BatchPart("orders", 2, 4, view, 5, 40).records()
    expected = [
        Record(r.value, r.key, r.headers, r.timestamp_ms, make_offset(4, 5 + i), 2, "orders")
        for i, r in enumerate(records[5:40])
    ]
    assert got == expected
    assert [hash(r) for r in got] == [hash(r) for r in expected]
    assert [repr(r) for r in got] == [repr(r) for r in expected]
    assert all(type(r) is Record for r in got)
    with pytest.raises(AttributeError):
        got[0].value = b"changed"  # type: ignore[misc]
    plain = encode_columns([b"x", b"yz"], timestamps=7, producer_id=1, producer_seq=0)  # no optional columns
    assert BatchPart("s", 0, 0, decode_item(plain, stream="s", lane=0, sequence=0), 0, 2).records() == [
        Record(b"x", None, (), 7, 0, 0, "s"),
        Record(b"yz", None, (), 7, 1, 0, "s"),
    ]


def test_plain_values_and_uniform_timestamps_need_no_optional_columns() -> None:
    item = encode_columns([b"a", b"", b"ccc"], timestamps=123, producer_id=1, producer_seq=2, compression="none")
    flags = item[5]
    assert flags == 0  # no keys, no headers, no per-record timestamps
    batch = decode_batch(item, stream="s", lane=0, sequence=0)
    assert [(r.value, r.key, r.headers, r.timestamp_ms) for r in batch] == [
        (b"a", None, (), 123),
        (b"", None, (), 123),
        (b"ccc", None, (), 123),
    ]


def test_lz4_is_used_above_the_threshold_and_only_when_it_pays() -> None:
    values = [b"x" * 100] * 100
    small = encode_columns(values[:2], timestamps=0, producer_id=0, producer_seq=0, compression_threshold=10_000)
    assert not small[5] & FLAG_LZ4
    big = encode_columns(values, timestamps=0, producer_id=0, producer_seq=0, compression_threshold=1024)
    assert big[5] & FLAG_LZ4
    assert len(big) < 100 * 100 / 4
    assert decode_batch(big, stream="s", lane=0, sequence=0).values() == values
    random = [bytes(np.random.default_rng(1).integers(0, 256, 2000, dtype=np.uint8))]
    incompressible = encode_columns(random, timestamps=0, producer_id=0, producer_seq=0, compression_threshold=0)
    assert not incompressible[5] & FLAG_LZ4
    # Random values behind a compressible length column shrink by ~4%: not worth a decompression per reader.
    rng = np.random.default_rng(2)
    barely = [bytes(rng.integers(0, 256, 100, dtype=np.uint8)) for _ in range(1000)]
    item = encode_columns(barely, timestamps=0, producer_id=0, producer_seq=0, compression_threshold=0)
    assert not item[5] & FLAG_LZ4
    assert decode_batch(item, stream="s", lane=0, sequence=0).values() == barely
    none = encode_columns(values, timestamps=0, producer_id=0, producer_seq=0, compression="none")
    assert not none[5] & FLAG_LZ4


def test_prepared_pieces_concatenate_into_one_item() -> None:
    a = prepare_columns([b"a1", b"a2"], timestamps=5)
    b = prepare_columns([b"b1"], keys=[b"k"], headers=[(("h", b"v"),)], timestamps=[9])
    item = encode_prepared([a, b], ItemFraming(producer_id=0, producer_seq=0))
    got = [(r.value, r.key, r.headers, r.timestamp_ms) for r in decode_batch(item, stream="s", lane=0, sequence=0)]
    assert got == [(b"a1", None, (), 5), (b"a2", None, (), 5), (b"b1", b"k", (("h", b"v"),), 9)]


def test_a_calls_items_take_rising_sequences_and_each_keeps_its_own_pieces() -> None:
    a = prepare_columns([b"a1", b"a2"], timestamps=5)
    b = prepare_columns([b"b1"], keys=[b"k"], headers=[(("h", b"v"),)], timestamps=[9])
    c = prepare_columns([b"c1"], timestamps=[4])
    items = encode_items([[a], [a, b], [c]], ItemFraming(producer_id=3, producer_seq=10, transactional=True))
    assert [item_producer(item, stream="s", lane=0, sequence=i).producer_seq for i, item in enumerate(items)] == [
        10,
        11,
        12,
    ]
    got = [
        [(r.value, r.key, r.headers, r.timestamp_ms) for r in decode_batch(item, stream="s", lane=0, sequence=i)]
        for i, item in enumerate(items)
    ]
    assert got == [
        [(b"a1", None, (), 5), (b"a2", None, (), 5)],
        [(b"a1", None, (), 5), (b"a2", None, (), 5), (b"b1", b"k", (("h", b"v"),), 9)],
        [(b"c1", None, (), 4)],
    ]
    # One item of a call is what encode_prepared makes of it alone.
    assert items[1] == encode_prepared([a, b], ItemFraming(producer_id=3, producer_seq=11, transactional=True))


def test_encoding_rejects_bad_input_naming_the_record() -> None:
    with pytest.raises(ConfigError, match="record 1: value is a str"):
        encode_columns([b"ok", "text"], timestamps=0, producer_id=0, producer_seq=0)  # type: ignore[list-item]
    with pytest.raises(ConfigError, match=r"1\.\.65536 records"):
        encode_columns([], timestamps=0, producer_id=0, producer_seq=0)
    with pytest.raises(ConfigError, match="compression 'zstd'"):
        encode_columns([b"x"], timestamps=0, producer_id=0, producer_seq=0, compression="zstd")
    with pytest.raises(ConfigError, match="headers must be"):
        encode_columns([b"x"], headers=[((b"k", b"v"),)], timestamps=0, producer_id=0, producer_seq=0)  # type: ignore[list-item]


def test_newer_format_version_asks_for_an_upgrade() -> None:
    item = bytearray(encode_columns([b"x"], timestamps=0, producer_id=0, producer_seq=0))
    item[4] = FORMAT_VERSION + 1
    newer = rf"version {FORMAT_VERSION + 1}.*upgrade meteor-spark"
    with pytest.raises(UnsupportedFormatVersionError, match=newer) as info:
        decode_item(bytes(item), stream="orders", lane=1, sequence=77)
    assert "stream 'orders' lane 1 sequence 77" in str(info.value)


def test_legacy_version_0_items_are_upgraded_on_read() -> None:
    item = encode_batch_v0([b"old-1", b"", b"old-3"])
    assert item[:4] == MAGIC and item[4] == 0
    batch = decode_batch(item, stream="s", lane=0, sequence=4)
    assert [(r.value, r.key, r.timestamp_ms, r.offset) for r in batch] == [
        (b"old-1", None, None, make_offset(4, 0)),
        (b"", None, None, make_offset(4, 1)),
        (b"old-3", None, None, make_offset(4, 2)),
    ]
    table = items_to_arrow([item], [4], stream="s", lane=0, include_headers=True)
    assert table.schema == ARROW_SCHEMA_WITH_HEADERS
    assert table.column("timestamp").null_count == 3
    assert table.column("value").to_pylist() == [b"old-1", b"", b"old-3"]


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda b: b[: HEADER_SIZE - 3], "truncated ring item"),
        (lambda b: b[:-1], "announces"),
        (lambda b: b[: HEADER_SIZE + 4] + bytes([b[HEADER_SIZE + 4] ^ 0x40]) + b[HEADER_SIZE + 5 :], "checksum"),
        (lambda b: b"XXXX" + b[4:], "bad magic"),
        (lambda b: b"", "bad magic"),
    ],
)
def test_corrupt_items_raise_format_error_naming_stream_lane_and_sequence(damage, message) -> None:
    item = encode_batch(_records(), producer_id=0, producer_seq=0)
    with pytest.raises(FormatError, match=message) as info:
        decode_item(damage(item), stream="pay", lane=2, sequence=1234)
    assert "stream 'pay' lane 2 sequence 1234" in str(info.value)


def test_a_consistent_checksum_does_not_hide_inconsistent_lengths() -> None:
    # Rewrite the first value length and fix the checksum: the structural checks still catch it.
    item = bytearray(encode_columns([b"abc", b"de"], timestamps=0, producer_id=0, producer_seq=0, compression="none"))
    struct.pack_into("<i", item, HEADER_SIZE, 99)
    crc = zlib.crc32(bytes(item[HEADER_SIZE:]), zlib.crc32(bytes(item[: HEADER_SIZE - 4])))
    struct.pack_into("<I", item, HEADER_SIZE - 4, crc)
    with pytest.raises(FormatError, match="too short"):
        decode_item(bytes(item), stream="s", lane=0, sequence=0)


def test_arrow_schema_is_exactly_the_contract() -> None:
    assert (
        pa.schema(
            [
                pa.field("key", pa.binary(), nullable=True),
                pa.field("value", pa.binary(), nullable=True),
                pa.field("stream", pa.string(), nullable=True),
                pa.field("lane", pa.int32(), nullable=True),
                pa.field("offset", pa.int64(), nullable=True),
                pa.field("timestamp", pa.timestamp("us", tz="UTC"), nullable=True),
            ]
        )
        == ARROW_SCHEMA
    )
    element = pa.struct([pa.field("key", pa.string(), nullable=True), pa.field("value", pa.binary(), nullable=True)])
    headers = pa.field("headers", pa.list_(pa.field("element", element, nullable=True)), nullable=True)
    assert ARROW_SCHEMA.append(headers) == ARROW_SCHEMA_WITH_HEADERS
    assert ARROW_SCHEMA_WITH_HEADERS.field("headers").type.value_field.name == "element"


def test_items_to_arrow_matches_the_records_and_validates() -> None:
    records = _records()
    items = [
        encode_batch(records[:20], producer_id=1, producer_seq=0),
        encode_batch(records[20:], producer_id=1, producer_seq=1),
    ]
    batch = items_to_arrow(items, [5, 6], stream="orders", lane=2, include_headers=True)
    batch.validate(full=True)
    assert batch.schema == ARROW_SCHEMA_WITH_HEADERS
    rows = batch.to_pylist()
    assert len(rows) == 50
    for i, (row, sent) in enumerate(zip(rows, records, strict=True)):
        assert row["value"] == sent.value and row["key"] == sent.key
        assert [(h["key"], h["value"]) for h in row["headers"]] == list(sent.headers)
        assert row["stream"] == "orders" and row["lane"] == 2
        assert row["offset"] == (make_offset(5, i) if i < 20 else make_offset(6, i - 20))
        assert int(row["timestamp"].timestamp() * 1000) == sent.timestamp_ms
    without = items_to_arrow(items, [5, 6], stream="orders", lane=2, include_headers=False)
    assert without.schema == ARROW_SCHEMA
    assert without.column("key").null_count == sum(1 for r in records if r.key is None)


def test_items_to_arrow_resumes_mid_item_with_first_offset() -> None:
    item = encode_columns([b"a", b"b", b"c"], timestamps=0, producer_id=0, producer_seq=0)
    batch = items_to_arrow(
        [item, item], [8, 9], stream="s", lane=0, include_headers=False, first_offset=make_offset(8, 2)
    )
    assert batch.column("value").to_pylist() == [b"c", b"a", b"b", b"c"]
    expected = [make_offset(8, 2), make_offset(9, 0), make_offset(9, 1), make_offset(9, 2)]
    assert batch.column("offset").to_pylist() == expected
    past_end = items_to_arrow([item], [8], stream="s", lane=0, include_headers=False, first_offset=make_offset(8, 5))
    assert past_end.num_rows == 0 and past_end.schema == ARROW_SCHEMA
    with pytest.raises(ConfigError, match="first_offset"):
        items_to_arrow([item], [8], stream="s", lane=0, include_headers=False, first_offset=make_offset(7, 0))


def test_record_batch_is_a_lazy_sequence_over_parts_of_several_lanes() -> None:
    item = encode_columns([b"a", b"b", b"c"], timestamps=1, producer_id=0, producer_seq=0)
    view = decode_item(item, stream="s", lane=0, sequence=0)
    batch = RecordBatch([BatchPart("s", 0, 3, view, 1, 3), BatchPart("s", 1, 0, view, 0, 2)])
    assert len(batch) == 4
    assert batch[0].value == b"b" and batch[0].offset == make_offset(3, 1)
    assert batch[-1].value == b"b" and batch[-1].lane == 1
    assert [r.value for r in batch] == [b"b", b"c", b"a", b"b"]
    assert batch.first().value == b"b" and batch.last().offset == make_offset(0, 1)
    assert batch.last_offsets() == {0: make_offset(3, 2), 1: make_offset(0, 1)}
    table = batch.to_arrow()
    assert table.column("lane").to_pylist() == [0, 0, 1, 1]
    assert table.column("offset").to_pylist() == [r.offset for r in batch]
    empty = RecordBatch.empty()
    assert len(empty) == 0 and not empty and empty.to_arrow().num_rows == 0
    with pytest.raises(IndexError):
        empty.first()


def test_to_arrow_slices_keys_and_values_of_partial_parts() -> None:
    item = encode_columns(
        [b"v0", b"v1", b"v2", b"v3"], keys=[b"k0", None, b"k22", b"k3"], timestamps=0, producer_id=0, producer_seq=0
    )
    view = decode_item(item, stream="s", lane=0, sequence=4)
    table = RecordBatch([BatchPart("s", 0, 4, view, 1, 3), BatchPart("s", 0, 5, view, 0, 4)]).to_arrow()
    assert table.column("value").to_pylist() == [b"v1", b"v2", b"v0", b"v1", b"v2", b"v3"]
    assert table.column("key").to_pylist() == [None, b"k22", b"k0", None, b"k22", b"k3"]


def test_item_count_reads_the_header_alone_and_rejects_a_header_that_fails_its_checks() -> None:
    item = encode_batch(_records(), producer_id=1, producer_seq=0, compression="lz4", compression_threshold=0)
    where: dict[str, Any] = {"stream": "orders", "lane": 0, "sequence": 4}
    assert item_count(item, **where) == 50
    body_corrupt = item[:-1] + bytes([item[-1] ^ 0xFF])
    assert item_count(body_corrupt, **where) == 50  # the body is not looked at...
    with pytest.raises(FormatError):
        decode_item(body_corrupt, **where)  # ...decoding it is what checks it
    assert item_count(encode_batch_v0([b"a", b"b"]), **where) == 2
    with pytest.raises(FormatError, match="bad magic"):
        item_count(b"not a meteor batch", **where)
    with pytest.raises(FormatError, match="truncated or padded"):
        item_count(item[:-3], **where)
    zero_count = item[:8] + struct.pack("<I", 0) + item[12:]
    with pytest.raises(FormatError, match="record count 0"):
        item_count(zero_count, **where)
    with pytest.raises(UnsupportedFormatVersionError):
        item_count(item[:4] + bytes([FORMAT_VERSION + 1]) + item[5:], **where)


def test_the_value_types_and_the_wire_format_load_without_pyarrow() -> None:
    code = "import sys, meteor_spark.format.records, meteor_spark.format.wire; print('pyarrow' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "False"


def test_version_1_items_are_read_and_version_2_carries_the_lanes_running_maximum() -> None:
    """Version 1 (the 48-byte header without ``lane_max_ts``) is still decoded; version 2 items carry the lane's
    largest timestamp so far, continued from ``ItemFraming.lane_max_timestamp`` item by item."""
    old = encode_item_v1([b"a", b"b"], timestamps=[5, 3], producer_id=7)
    view = decode_item(old, stream="s", lane=0, sequence=0)
    assert (view.version, view.producer_id, view.lane_max_timestamp_ms) == (1, 7, None)
    assert bytes(view.value_data) == b"ab" and list(view.value_lengths) == [1, 1]
    stamps = view.timestamps(0, None)
    assert stamps is not None and list(stamps) == [5, 3]
    assert item_count(old, stream="s", lane=0, sequence=0) == 2
    assert lane_max_after(old, stream="s", lane=0, sequence=0) == 5
    pieces = [[prepare_columns([b"x"], timestamps=[s])] for s in (8, 2, 20, 1)]
    items = encode_items(pieces, ItemFraming(producer_id=1, producer_seq=0, lane_max_timestamp=10))
    assert [item_lane_max_timestamp(i, stream="s", lane=0, sequence=0) for i in items] == [10, 10, 20, 20]
    assert [decode_item(i, stream="s", lane=0, sequence=0).base_timestamp_ms for i in items] == [8, 2, 20, 1]
    assert len(items[0]) - len(bytes(items[0])[HEADER_SIZE:]) == HEADER_SIZE == HEADER_SIZE_V1 + 8
