"""The asyncio publisher's call encoding writes the same bytes whichever path frames an item: a call of one item of a
few plain values (one record in flight) is framed by ``encode_small_item``, every other call by the columns."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from meteor_spark.aio.calls import Lane, Run, encode_call, item_columns
from meteor_spark.format.item_encoding import SMALL_ITEM_RECORDS, ItemFraming, encode_items_and_lane_max
from meteor_spark.format.item_header import NO_TIMESTAMP
from meteor_spark.format.records import decode_batch


@pytest.mark.parametrize(
    "values",
    [
        [b"x" * 100],
        [b"", b"a", b"bc"],
        [bytes(300)] * 16,
        [bytes([i % 251]) * (i % 90) for i in range(SMALL_ITEM_RECORDS)],
    ],
    ids=["one", "small and empty", "compressible", "a small item's most"],
)
@pytest.mark.parametrize("lane_max", [NO_TIMESTAMP, 2**50])
def test_one_item_of_plain_values_is_the_columns_bytes(values: list[bytes], lane_max: int) -> None:
    loop = asyncio.new_event_loop()
    try:
        run = Run.of_singles(loop)
        run.values.extend(values)
        run.stamps.extend(time.time_ns() + i * 1_500_000 for i in range(len(values)))
        framing = ItemFraming(7, 11, "lz4", 1024, False, lane_max)
        lane = Lane(ring=Any, lane_max=lane_max)  # type: ignore[arg-type]  # the ring is not used to encode
        items = encode_call("s", lane, [[(run, 0, len(values))]], framing)
        expected, expected_max = encode_items_and_lane_max([[item_columns([(run, 0, len(values))])]], framing)
        assert items == expected
        assert lane.lane_max == expected_max
        assert [bytes(r.value) for r in decode_batch(items[0], stream="s", lane=0, sequence=0)] == values
    finally:
        loop.close()
