"""Items of a few plain values framed without numpy (``encode_small_item``) are the bytes the general encoder
writes: the item format does not change with the path a publisher takes."""

from __future__ import annotations

import os

import pytest

from meteor_spark.errors import ConfigError
from meteor_spark.format.item_encoding import (
    PROBE_FROM,
    ItemFraming,
    encode_items_and_lane_max,
    encode_small_item,
    prepare_columns,
)
from meteor_spark.format.item_header import NO_TIMESTAMP
from meteor_spark.format.records import decode_batch
from meteor_spark.grid.client import Grid
from meteor_spark.grid.streams import StreamConfig, open_stream
from meteor_spark.producer.publisher import Publisher

VALUES = {
    "one small": [b"x" * 100],
    "empty and small": [b"", b"a", b"bc"],
    "compressible": [bytes(300)] * 16,
    "kept apart": [os.urandom(3000) for _ in range(4)],
    "probed, incompressible": [os.urandom(PROBE_FROM + 10)],
    "probed, compressible": [bytes(PROBE_FROM + 10), os.urandom(100)],
    "mixed buffers": [bytearray(b"ab"), memoryview(b"cde"), b"f" * 2500],
}


@pytest.mark.parametrize("name", sorted(VALUES))
@pytest.mark.parametrize("compression", ["lz4", "none"])
def test_a_small_item_is_the_general_encoders_item(name: str, compression: str) -> None:
    values = VALUES[name]
    for stamps, lane_max, transactional in (
        ([1_700_000_000_000] * len(values), NO_TIMESTAMP, False),
        ([1_700_000_000_000 + 7 * i for i in range(len(values))][::-1], 1_800_000_000_000, True),
    ):
        framing = ItemFraming(5, 9, compression, 1024, transactional, lane_max)
        general = encode_items_and_lane_max([[prepare_columns(values, timestamps=stamps)]], framing)
        item, top = encode_small_item(values, stamps, framing)
        assert ([item], top) == general
        batch = decode_batch(item, stream="s", lane=0, sequence=0)
        assert [bytes(r.value) for r in batch] == [bytes(v) for v in values]
        assert [r.timestamp_ms for r in batch] == stamps


def test_a_small_item_refuses_what_the_general_encoder_refuses() -> None:
    framing = ItemFraming(1, 0)
    with pytest.raises(ConfigError, match="record 1: value is a str, not bytes"):
        encode_small_item([b"a", "b"], [0, 0], framing)  # type: ignore[list-item]
    with pytest.raises(ConfigError, match="got 1 timestamps for 2 values"):
        encode_small_item([b"a", b"b"], [0], framing)
    with pytest.raises(ConfigError, match="records, got 0"):
        encode_small_item([], [], framing)
    with pytest.raises(ConfigError, match="compression 'zstd' is not supported"):
        encode_small_item([b"a"], [0], ItemFraming(1, 0, "zstd"))


def test_one_published_record_is_stored_as_the_general_encoders_item(grid: Grid, unique_name: str) -> None:
    """``publish_async`` to an idle lane sends its one-record item from the publishing thread, framed as a small
    item: read raw, it is the item the general encoder makes of the same record."""
    with Publisher(grid, StreamConfig(unique_name)) as pub:
        pub.publish_async(b"one record").result(10)
        producer = pub.producer_id
    ring = grid.ring(open_stream(grid, unique_name).ring_names[0])
    stored = ring.read_many(0, 1, 1).items[0]
    stamp = decode_batch(stored, stream=unique_name, lane=0, sequence=0)[0].timestamp_ms
    general = encode_items_and_lane_max(
        [[prepare_columns([b"one record"], timestamps=stamp)]], ItemFraming(producer, 0, "lz4", 1024)
    )
    assert bytes(stored) == general[0][0]
