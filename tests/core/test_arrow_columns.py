"""Ring items to Arrow: the columns built once per batch size (stream, lane, null keys) belong to their own batch,
and timestamps written in place keep every item's own (one shared timestamp, one per record, none)."""

from __future__ import annotations

import pyarrow as pa

from meteor_spark.format.arrow_columns import items_to_arrow
from meteor_spark.format.item_encoding import encode_batch_v0, encode_columns

T = 1_700_000_000_000


def _item(values: list[bytes], stamps: list[int] | int) -> bytes:
    return encode_columns(values, timestamps=stamps, producer_id=1, producer_seq=0)


def test_batches_of_one_size_keep_their_own_stream_lane_and_keys() -> None:
    items = [_item([b"a", b"b"], T)]
    first = items_to_arrow(items, [0], stream="s-one", lane=0, include_headers=False)
    second = items_to_arrow(items, [0], stream="s-two", lane=3, include_headers=False)
    keyed = items_to_arrow(
        [encode_columns([b"a", b"b"], keys=[b"k", None], timestamps=T, producer_id=1, producer_seq=0)],
        [0],
        stream="s-one",
        lane=0,
        include_headers=False,
    )
    assert first.column("stream").to_pylist() == ["s-one", "s-one"]
    assert second.column("stream").to_pylist() == ["s-two", "s-two"]
    assert (first.column("lane").to_pylist(), second.column("lane").to_pylist()) == ([0, 0], [3, 3])
    assert first.column("key").to_pylist() == [None, None]
    assert keyed.column("key").to_pylist() == [b"k", None]


def test_timestamps_shared_per_record_and_missing_in_one_batch() -> None:
    items = [_item([b"a", b"b"], T), _item([b"c", b"d", b"e"], [T + 1, T + 5, T + 2]), encode_batch_v0([b"f"])]
    batch = items_to_arrow(items, [0, 1, 2], stream="s", lane=0, include_headers=False, first_offset=1)
    assert batch.column("value").to_pylist() == [b"b", b"c", b"d", b"e", b"f"]
    micros = batch.column("timestamp").cast(pa.int64()).to_pylist()
    assert micros == [T * 1000, (T + 1) * 1000, (T + 5) * 1000, (T + 2) * 1000, None]
    assert batch.column("offset").to_pylist() == [1, 1 << 16, (1 << 16) + 1, (1 << 16) + 2, 2 << 16]
