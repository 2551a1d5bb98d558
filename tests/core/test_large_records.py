"""Large records cross with few copies: the item checksum, LZ4 probing of large bodies, values joined once into the
item, items handed to the grid client already serialized, and values sliced once out of a read item."""

from __future__ import annotations

import os
import zlib
from typing import Any

import lz4.block
import pytest

from meteor_spark import compat_ring
from meteor_spark.format import item_encoding
from meteor_spark.format.checksum import IMPLEMENTATION, crc32
from meteor_spark.format.item_encoding import PROBE_FROM, encode_columns
from meteor_spark.format.item_header import FLAG_LZ4
from meteor_spark.format.records import decode_batch
from meteor_spark.grid.client import Grid


def test_the_checksum_is_zlibs_crc32_from_isal() -> None:
    assert IMPLEMENTATION == "isal"
    data = os.urandom(100_000)
    for seed in (0, 1, 0xFFFFFFFF):
        assert crc32(data, seed) == zlib.crc32(data, seed)
    assert crc32(memoryview(data)[7:]) == zlib.crc32(data[7:])


def _counting_compress(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    compressed: list[int] = []
    real = lz4.block.compress

    def compress(data: Any, **kwargs: Any) -> bytes:
        compressed.append(len(memoryview(data).cast("B")))
        return real(data, **kwargs)

    monkeypatch.setattr(item_encoding.lz4.block, "compress", compress)
    return compressed


def test_a_large_incompressible_body_is_only_probed(monkeypatch: pytest.MonkeyPatch) -> None:
    compressed = _counting_compress(monkeypatch)
    values = [os.urandom(10_240) for _ in range(100)]
    item = encode_columns(values, timestamps=0, producer_id=0, producer_seq=0)
    assert not item[5] & FLAG_LZ4
    assert sum(compressed) <= 3 * 8192  # three samples, not the 1 MB body
    assert decode_batch(item, stream="s", lane=0, sequence=0).values() == values


def test_a_large_body_compresses_when_any_region_does(monkeypatch: pytest.MonkeyPatch) -> None:
    compressed = _counting_compress(monkeypatch)
    # Random values first, then compressible ones: the probe's later samples find them.
    values = [os.urandom(10_240) for _ in range(50)] + [b"meteor " * 1500 for _ in range(100)]
    item = encode_columns(values, timestamps=0, producer_id=0, producer_seq=0)
    assert item[5] & FLAG_LZ4
    assert max(compressed) > PROBE_FROM  # compressed whole once a sample shrank
    assert decode_batch(item, stream="s", lane=0, sequence=0).values() == values


def test_values_kept_apart_make_the_same_item_as_joined_values(monkeypatch: pytest.MonkeyPatch) -> None:
    values: list[Any] = [os.urandom(2000) for _ in range(20)]
    keys = [b"k%d" % i for i in range(20)]
    headers = [(("h", b"v"),)] * 20
    kwargs: dict[str, Any] = {"keys": keys, "headers": headers, "timestamps": list(range(20))}
    apart = encode_columns(values, producer_id=1, producer_seq=2, compression="none", **kwargs)
    monkeypatch.setattr(item_encoding, "KEEP_APART_FROM", 1 << 30)
    joined = encode_columns(values, producer_id=1, producer_seq=2, compression="none", **kwargs)
    assert apart == joined
    monkeypatch.undo()
    mixed: list[Any] = [bytearray(v) if i % 2 else memoryview(v) for i, v in enumerate(values)]
    assert encode_columns(mixed, producer_id=1, producer_seq=2, compression="none", **kwargs) == joined
    batch = decode_batch(apart, stream="s", lane=0, sequence=0)
    assert [(r.value, r.key, r.headers) for r in batch] == list(zip(values, keys, headers, strict=True))


def test_read_values_are_bytes_that_outlive_the_item() -> None:
    values = [os.urandom(size) for size in (0, 1, 5000, 70_000, 3)]
    item = bytearray(encode_columns(values, timestamps=0, producer_id=0, producer_seq=0, compression="none"))
    batch = decode_batch(item, stream="s", lane=0, sequence=0)
    records = list(batch)
    assert batch.values() == values
    item[:] = bytes(len(item))  # the buffer reused or released: the records keep their own bytes
    assert [type(r.value) for r in records] == [bytes] * len(values)
    assert [r.value for r in records] == values


def test_items_reach_the_grid_and_come_back_as_bytes(grid: Grid, unique_name: str) -> None:
    compat_ring.check_read_path()
    ring = grid.ring(unique_name)
    items: list[Any] = [os.urandom(20_000), bytearray(os.urandom(10)), memoryview(os.urandom(70_000))]
    try:
        last = ring.add_all(items)
        batch = ring.read_many(last - 2, 3, 3)
        assert [bytes(i) for i in batch.items] == [bytes(i) for i in items]
        assert {type(i) for i in batch.items} == {bytes}  # deserialized in one copy (compat_ring)
        parked = ring.read_batch_async(last - 2, 3, 3).result()
        assert parked.items == batch.items and parked.sequences == batch.sequences
        assert ring._proxy._to_object(ring._proxy._to_data("not a byte array")) == "not a byte array"
    finally:
        ring.destroy()
