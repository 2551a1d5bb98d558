"""The encoder's shortcuts write the bytes the general encoder writes: items of a few plain values framed without
numpy (``encode_small_item``), and a segment's pieces prepared from the sizes it counted to cut them and from the one
timestamp its records share (``Segment.prepare``). The item format does not change with the path a publisher takes."""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np
import pytest

from meteor_spark.errors import ConfigError
from meteor_spark.format.item_encoding import (
    PROBE_FROM,
    SMALL_ITEM_RECORDS,
    ItemFraming,
    encode_items_and_lane_max,
    encode_small_item,
    prepare_columns,
)
from meteor_spark.format.item_header import NO_TIMESTAMP
from meteor_spark.format.records import decode_batch
from meteor_spark.grid.client import Grid
from meteor_spark.grid.streams import StreamConfig, open_stream
from meteor_spark.producer.calls import Segment
from meteor_spark.producer.futures import BulkFuture
from meteor_spark.producer.publisher import Publisher

VALUES: dict[str, list[Any]] = {
    "one small": [b"x" * 100],
    "empty and small": [b"", b"a", b"bc"],
    "compressible": [bytes(300)] * 16,
    "as many as a small item takes": [os.urandom(i % 90) for i in range(SMALL_ITEM_RECORDS)],
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
    assert stamp is not None
    general = encode_items_and_lane_max(
        [[prepare_columns([b"one record"], timestamps=stamp)]], ItemFraming(producer, 0, "lz4", 1024)
    )
    assert bytes(stored) == general[0][0]


def _clock_stamp(i: int) -> float:
    return (1_700_000_000_000 + i * 0.4 + 0.05) / 1000  # the time.time() reading of a plain segment's record i


def _segment(plain: bool) -> Segment:
    segment = Segment(threading.Lock())
    values = [os.urandom(n % 300) for n in range(500)]
    if plain:
        segment.plain = segment.singles = True
        for i, value in enumerate(values):
            segment.add_plain(value, _clock_stamp(i))
    else:
        segment.add_values(values[:300], 1_700_000_000_000, BulkFuture("list", 300), 0)
        segment.add_values(values[300:], 1_700_000_000_005, BulkFuture("list", 200), 0)
    segment.close()
    return segment


@pytest.mark.parametrize("plain", [True, False])
def test_a_segment_prepares_the_columns_of_its_records_from_what_it_counted(plain: bool) -> None:
    segment = _segment(plain)
    framing = ItemFraming(3, 4, "none")
    for start, stop in ((0, 1), (0, 300), (250, 350), (300, 500)):
        ms = [int(_clock_stamp(i) * 1000) for i in range(start, stop)]
        expected: list[int] = ms if plain else segment.stamps[start:stop]
        general = encode_items_and_lane_max(
            [[prepare_columns(segment.values[start:stop], timestamps=expected)]], framing
        )
        assert encode_items_and_lane_max([[segment.prepare(start, stop)]], framing) == general  # sizes not counted
        segment.cumulative_bytes()  # counted, as a call's cut counts them
        assert encode_items_and_lane_max([[segment.prepare(start, stop)]], framing) == general
        segment._cum = None


def test_value_lengths_given_must_be_one_per_value() -> None:
    with pytest.raises(ConfigError, match="value_lengths: got 1 lengths for 2 values"):
        prepare_columns([b"a", b"b"], timestamps=0, value_lengths=np.array([1], dtype=np.int32))


@pytest.fixture
def probed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the bodies ``item_encoding`` probes for compressibility, in order (the probe still runs)."""
    from meteor_spark.format import item_encoding

    sizes: list[int] = []
    real = item_encoding._may_shrink
    monkeypatch.setattr(item_encoding, "_may_shrink", lambda pieces, n: sizes.append(n) or real(pieces, n))
    return sizes


def test_behind_an_item_lz4_shrank_the_next_is_compressed_without_a_probe_and_a_raw_one_is_probed_again(
    probed: list[int],
) -> None:
    from meteor_spark.format.item_header import FLAG_LZ4

    shrinks, does_not = [bytes(PROBE_FROM + 10)], [os.urandom(PROBE_FROM + 10)]
    bodies = [shrinks, shrinks, does_not, does_not, shrinks]
    items, _ = encode_items_and_lane_max(
        [[prepare_columns(values, timestamps=0)] for values in bodies], ItemFraming(1, 0, "lz4", 1024)
    )
    # Compressed only where it saves 1/16, probe or not; probed: the first item and those behind a raw one.
    assert [bool(item[5] & FLAG_LZ4) for item in items] == [True, True, False, False, True]
    assert len(probed) == 3
    for item, values in zip(items, bodies, strict=True):
        assert [bytes(r.value) for r in decode_batch(item, stream="s", lane=0, sequence=0)] == values


def test_a_call_behind_a_shrunk_item_is_compressed_without_a_probe_and_a_raw_body_still_stays_raw(
    probed: list[int],
) -> None:
    from meteor_spark.format import item_encoding
    from meteor_spark.format.item_header import FLAG_LZ4

    shrinks, does_not = [bytes(PROBE_FROM + 10)], [os.urandom(PROBE_FROM + 10)]
    first, _ = encode_items_and_lane_max([[prepare_columns(shrinks, timestamps=0)]], ItemFraming(1, 0, "lz4", 1024))
    assert item_encoding.shrank(first[-1]) and len(probed) == 1
    # The writer's next call of the lane: its first item is not probed (the previous one shrank) ...
    framing = ItemFraming(1, 1, "lz4", 1024, probe_first=not item_encoding.shrank(first[-1]))
    items, _ = encode_items_and_lane_max([[prepare_columns(v, timestamps=0)] for v in (does_not, does_not)], framing)
    # ... yet a body LZ4 cannot shrink by 1/16 is stored as it is, and the item behind it is probed again.
    assert [bool(item[5] & FLAG_LZ4) for item in items] == [False, False]
    assert not item_encoding.shrank(items[-1])
    assert len(probed) == 2
    for item in items:
        assert [bytes(r.value) for r in decode_batch(item, stream="s", lane=0, sequence=0)] == does_not


def test_a_publishers_calls_of_a_lane_carry_whether_its_last_item_shrank(
    grid: Grid, unique_name: str, probed: list[int]
) -> None:
    """The sender probes a large body only where the lane's previous item did not shrink: once for three calls of
    compressible bulks, again after an incompressible one; every item reads back as published."""
    import pyarrow as pa

    from meteor_spark.format import item_encoding

    bulks = [[bytes(PROBE_FROM + 10)], [b"m" * (PROBE_FROM + 10)], [bytes(PROBE_FROM + 20)], [os.urandom(PROBE_FROM)]]
    bulks.append([bytes(PROBE_FROM + 30)])
    with Publisher(grid, StreamConfig(unique_name)) as pub:
        for values in bulks:
            pub.publish_arrow(pa.record_batch([pa.array(values, pa.binary())], names=["value"])).result(10)
    assert len(probed) == 2  # the lane's first call, and the one behind the incompressible item
    ring = grid.ring(open_stream(grid, unique_name).ring_names[0])
    stored = ring.read_many(0, len(bulks), len(bulks)).items
    flags = [bool(item[5] & item_encoding.FLAG_LZ4) for item in stored]
    assert flags == [True, True, True, False, True]
    for seq, (item, values) in enumerate(zip(stored, bulks, strict=True)):
        assert [bytes(r.value) for r in decode_batch(item, stream=unique_name, lane=0, sequence=seq)] == values
