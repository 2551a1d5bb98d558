"""Small items decoded without numpy (``item_decoding_small``) give what ``wire.decode_item`` gives: the same
fields, the same records, the same errors for a damaged item; and a subscriber reading one-record items gets them."""

from __future__ import annotations

import os
import struct
from dataclasses import fields
from typing import Any

import numpy as np
import pytest

from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.errors import FormatError
from meteor_spark.format.item_decoding_small import SMALL_DECODE_RECORDS, SmallItemView, decode_item_for_records
from meteor_spark.format.item_encoding import encode_batch_v0, encode_columns, encode_item_v1
from meteor_spark.format.item_header import HEADER, HEADER_SIZE, pack_item
from meteor_spark.format.records import BatchPart, Record, RecordBatch, decode_batch
from meteor_spark.format.wire import ItemView, decode_item
from meteor_spark.grid.client import Grid
from meteor_spark.grid.streams import StreamConfig, open_stream
from meteor_spark.producer.publisher import Publisher
from meteor_spark.testing import wait_until

BASE = 1_700_000_000_000


def _case(count: int, keys: str, headers: bool, stamps: str, sizes: str) -> dict[str, Any]:
    values = [b"" if sizes == "empty" else os.urandom((i * 37) % 120 + (sizes == "large") * 3000) for i in range(count)]
    key_column: list[bytes | None] | None = None
    if keys == "all":
        key_column = [b"k%d" % i for i in range(count)]
    elif keys == "some":
        key_column = [None if i % 2 else (b"" if i % 3 else b"key-%d" % i) for i in range(count)]
    header_column = None
    if headers:
        header_column = [
            tuple((f"h{j}-é", os.urandom(j)) for j in range(i % 3)) + ((("meteor.topic", b"t.a"),) if i % 2 else ())
            for i in range(count)
        ]
    stamp_column: list[int] | int = BASE if stamps == "one" else [BASE + (i * 7919) % 1000 for i in range(count)]
    return {"values": values, "keys": key_column, "headers": header_column, "timestamps": stamp_column}


CASES = {
    f"{count}-{keys}-{'headers' if headers else 'plain'}-{stamps}-{sizes}": _case(count, keys, headers, stamps, sizes)
    for count in (1, 2, 3, SMALL_DECODE_RECORDS)
    for keys in ("none", "all", "some")
    for headers in (False, True)
    for stamps in ("one", "many")
    for sizes in ("small", "empty")
}
CASES["1-large"] = _case(1, "all", True, "one", "large")
CASES["3-large"] = _case(3, "some", False, "many", "large")


def _item(case: dict[str, Any], compression: str = "none") -> bytes:
    return encode_columns(**case, producer_id=11, producer_seq=12, compression=compression, compression_threshold=64)


def _same_view(small: ItemView, general: ItemView) -> None:
    for field in fields(ItemView):
        a, b = getattr(small, field.name), getattr(general, field.name)
        if isinstance(b, np.ndarray):
            assert isinstance(a, np.ndarray) and a.dtype == b.dtype and a.tolist() == b.tolist(), field.name
        elif isinstance(b, memoryview):
            assert isinstance(a, memoryview) and bytes(a) == bytes(b), field.name
        else:
            assert a == b, field.name
    for offsets in ("value_offsets", "key_offsets", "header_offsets", "hkey_offsets", "hvalue_offsets"):
        if getattr(general, offsets.replace("offsets", "lengths").replace("header_lengths", "header_counts")) is None:
            continue
        assert getattr(small, offsets).tolist() == getattr(general, offsets).tolist(), offsets


def _records(view: ItemView, start: int, stop: int, **deserializers: Any) -> list[Record]:
    return BatchPart("s", 0, 0, view, start, stop).records(**deserializers)


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_small_item_decodes_to_what_the_general_path_gives(name: str) -> None:
    item = _item(CASES[name])
    small = decode_item_for_records(item, stream="s", lane=3, sequence=9)
    general = decode_item(item, stream="s", lane=3, sequence=9)
    assert type(small) is SmallItemView
    count = general.count
    for start, stop in ((0, count), (count - 1, count), (0, 1), (count // 2, count)):
        assert _records(small, start, stop) == _records(general, start, stop)
    assert _records(small, 0, count, value=len, key=bytes.upper) == _records(
        general, 0, count, value=len, key=bytes.upper
    )
    assert RecordBatch([BatchPart("s", 3, 9, small, 0, count)]).values() == [
        r.value for r in _records(general, 0, count)
    ]
    # The numpy columns, made on first use, are the general path's (fresh views: columns asked for first).
    _same_view(decode_item_for_records(item, stream="s", lane=3, sequence=9), general)
    _same_view(small, general)


@pytest.mark.parametrize("name", ["3-all-headers-many-small", "64-some-plain-one-small", "1-large"])
def test_a_small_items_arrow_batch_is_the_general_paths(name: str) -> None:
    pytest.importorskip("pyarrow")
    item = _item(CASES[name])
    small = decode_item_for_records(item, stream="s", lane=3, sequence=9)
    general = decode_item(item, stream="s", lane=3, sequence=9)
    for include_headers in (False, True):
        got = RecordBatch([BatchPart("s", 3, 9, small, 1 if small.count > 1 else 0, small.count)])
        want = RecordBatch([BatchPart("s", 3, 9, general, 1 if general.count > 1 else 0, general.count)])
        assert got.to_arrow(include_headers).equals(want.to_arrow(include_headers))


def test_items_this_path_does_not_take_go_to_the_general_path() -> None:
    compressed = _item({"values": [bytes(400)] * 3, "keys": None, "headers": None, "timestamps": BASE}, "lz4")
    assert HEADER.unpack_from(compressed)[2] & 0x01  # LZ4 body
    large = _item({"values": [b"v"] * (SMALL_DECODE_RECORDS + 1), "keys": None, "headers": None, "timestamps": BASE})
    for item in (compressed, large, encode_item_v1([b"a", b"b"], timestamps=BASE), encode_batch_v0([b"a", b"bc"])):
        view = decode_item_for_records(item, stream="s", lane=0, sequence=0)
        general = decode_item(item, stream="s", lane=0, sequence=0)
        assert type(view) is ItemView
        assert _records(view, 0, view.count) == _records(general, 0, general.count)
    not_bytes = bytearray(_item(CASES["2-all-plain-one-small"]))
    assert type(decode_item_for_records(not_bytes, stream="s", lane=0, sequence=0)) is ItemView


def _resealed(item: bytes, body: bytes, **header: int) -> bytes:
    """``item`` with ``body`` and some header fields replaced, its lengths and checksum made consistent."""
    (_, _, flags, _, count, base_ts, pid, pseq, lane_max, _, _, _) = HEADER.unpack_from(item)
    fields_ = {"flags": flags, "count": count, "body_len": len(body)} | header
    return pack_item(fields_["flags"], fields_["count"], base_ts, pid, pseq, lane_max, fields_["body_len"], [body])


def _damaged(item: bytes) -> dict[str, bytes]:
    body = item[HEADER_SIZE:]
    count = HEADER.unpack_from(item)[4]
    flags = HEADER.unpack_from(item)[2]
    out = {
        "checksum": item[:-1] + bytes([item[-1] ^ 0x40]) if len(body) else item[:20] + b"\xff" + item[21:],
        "header byte": item[:30] + bytes([item[30] ^ 1]) + item[31:],
        "truncated": item[:-1],
        "truncated header": item[: HEADER_SIZE - 3],
        "padded": item + b"\0",
        "bad magic": b"XTRB" + item[4:],
        "newer version": item[:4] + b"\x03" + item[5:],
        "unknown flag": _resealed(item, body, flags=flags | 0x40),
        "no records": _resealed(item, body, count=0),
        "count past the columns": _resealed(item, body, count=count + 1),
        "bytes after the columns": _resealed(item, body + b"\0"),
        "body cut": _resealed(item, body[:-1]),
        "body length wrong": _resealed(item, body, body_len=len(body) + 1),
        "negative value length": _resealed(item, struct.pack("<i", -5) + body[4:]),
        "value length past the body": _resealed(item, struct.pack("<i", len(body)) + body[4:]),
    }
    if flags & 0x02:
        out["key length below -1"] = _resealed(item, body[: 4 * count] + struct.pack("<i", -2) + body[4 * count + 4 :])
    return out


@pytest.mark.parametrize("name", ["1-none-plain-one-small", "3-some-headers-many-small", "1-all-headers-one-empty"])
def test_a_damaged_small_item_fails_as_the_general_path_fails(name: str) -> None:
    for damage, item in _damaged(_item(CASES[name])).items():
        with pytest.raises(Exception) as general:  # whatever it is, the small path must raise the same
            decode_item(item, stream="s", lane=1, sequence=2)
        with pytest.raises(type(general.value)) as small:
            decode_item_for_records(item, stream="s", lane=1, sequence=2)
        assert str(small.value) == str(general.value), damage
        assert isinstance(general.value, FormatError), damage


def test_a_header_key_that_is_not_utf8_fails_when_read_as_with_the_general_path() -> None:
    item = _item({"values": [b"v"], "keys": None, "headers": [(("ab", b"c"),)], "timestamps": BASE})
    body = item[HEADER_SIZE:]
    bad = _resealed(item, body.replace(b"abv", b"\xff\xfev") if b"abv" in body else body.replace(b"ab", b"\xff\xfe"))
    view = decode_item_for_records(bad, stream="s", lane=0, sequence=0)
    with pytest.raises(UnicodeDecodeError):
        _records(view, 0, 1)
    with pytest.raises(UnicodeDecodeError):
        _records(decode_item(bad, stream="s", lane=0, sequence=0), 0, 1)


def test_a_subscriber_reads_one_record_items(grid: Grid, unique_name: str) -> None:
    """Published one at a time, each record is a one-record item the subscriber decodes here; what it delivers is
    what the general path makes of the stored items."""
    config = StreamConfig(unique_name, lanes=1)
    sent = [
        Record(b"", key=b"k", timestamp_ms=BASE),
        Record(os.urandom(100), headers=(("a", b"1"),), timestamp_ms=BASE + 1),
        Record(b"third", key=b"k", topic="t.x", message_id="m-3", timestamp_ms=BASE + 2),
    ]
    got: list[Record] = []
    with Subscriber(grid, config) as sub, Publisher(grid, config) as pub:
        for record in sent:
            pub.publish(record)
            polled: list[RecordBatch] = []
            wait_until(lambda: bool(polled.append(sub.poll(50)) or polled[-1]), 10, message="the record")
            assert len(polled[-1]) == 1 and type(polled[-1].parts[0].item) is SmallItemView
            got.extend(polled[-1])
    stored = grid.ring(open_stream(grid, unique_name).ring_names[0]).read_many(0, 3, 3).items
    expected = [
        BatchPart(unique_name, 0, i, decode_item(item, stream=unique_name, lane=0, sequence=i), 0, 1).records()[0]
        for i, item in enumerate(stored)
    ]
    assert got == expected
    assert [(r.value, r.key, r.timestamp_ms, r.topic, r.message_id) for r in got] == [
        (r.value, r.key, r.timestamp_ms, r.topic, r.message_id) for r in sent
    ]
    assert decode_batch(_item(CASES["2-all-plain-one-small"]), stream="s", lane=0, sequence=0).parts[0].item.count == 2
