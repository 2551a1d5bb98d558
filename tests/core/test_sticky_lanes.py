"""How ``publish_many`` spreads records over many lanes, against the real client over TCP: keyless records go in
sticky runs of a whole call (ring items stay full however many lanes), every lane still gets its share over many
calls, keyed records keep their lane and their order, and each record's offset comes back where it was stored."""

from __future__ import annotations

import pytest

from meteor_spark.format.partitioning import lane_for_key
from meteor_spark.format.records import Record, decode_batch
from meteor_spark.grid.client import Grid
from meteor_spark.grid.reading import read_range
from meteor_spark.grid.streams import StreamConfig, StreamInfo, lane_bounds, open_stream
from meteor_spark.producer.publisher import Publisher

LANES = 64


def _items_per_lane(grid: Grid, name: str) -> dict[int, int]:
    """Ring items written per lane (nothing was overwritten: every ring's head is still 0)."""
    bounds = lane_bounds(grid, open_stream(grid, name))
    assert all(head == 0 for head, _ in bounds.values())
    return {lane: end for lane, (_, end) in bounds.items()}


def _read_all(grid: Grid, info: StreamInfo) -> dict[int, list[Record]]:
    out: dict[int, list[Record]] = {}
    for lane, (head, end) in lane_bounds(grid, info).items():
        out[lane] = [
            record
            for items, seqs in read_range(grid, info, lane, head, end)
            for item, seq in zip(items, seqs, strict=True)
            for record in decode_batch(item, stream=info.name, lane=lane, sequence=seq)
        ]
    return out


def test_keyless_bulks_on_64_lanes_are_cut_into_full_items_not_one_per_lane(grid: Grid, unique_name: str) -> None:
    """20 bulks of 5,000 keyless records: about 5 full items each (100 in all), where slivers of n / lanes records
    had cost every bulk 64 items of 79 records."""
    bulks, per_bulk, per_item = 20, 5000, 1000
    config = StreamConfig(unique_name, lanes=LANES, capacity=1000, max_batch_records=per_item)
    with Publisher(grid, config) as pub:
        futures = [pub.publish_many([b"%09d" % (b * per_bulk + i) for i in range(per_bulk)]) for b in range(bulks)]
        for future in futures:
            assert len(future.result(30)) == per_bulk
    items = sum(_items_per_lane(grid, unique_name).values())
    full = bulks * per_bulk // per_item
    print(f"{bulks * per_bulk} keyless records on {LANES} lanes: {items} ring items (full: {full})")
    assert items <= 1.2 * bulks * per_bulk / per_item


@pytest.mark.parametrize("linger_ms", [0.0, 5.0])
def test_over_many_bulks_every_lane_gets_a_fair_share(grid: Grid, unique_name: str, linger_ms: float) -> None:
    """Bulks far smaller than a run, each stored before the next: the sticky lane moves on as each lane is sent,
    so no lane starves. (Bulks sent back to back while the sender is busy fill the sticky lane up to a run first,
    as Kafka's sticky partitioner fills a batch: how many depends on the machine's speed, so they are not
    counted here.)"""
    bulks, per_bulk = 4 * LANES, 200
    config = StreamConfig(unique_name, lanes=LANES, capacity=1000, linger_ms=linger_ms)
    with Publisher(grid, config) as pub:
        for b in range(bulks):
            pub.publish_many([b"%06d" % (b * per_bulk + i) for i in range(per_bulk)]).result(10)
        pub.flush()
    by_lane = _read_all(grid, open_stream(grid, unique_name))
    counts = sorted(len(records) for records in by_lane.values())
    print(f"linger_ms={linger_ms:g}: records per lane, fewest {counts[0]}, most {counts[-1]}, mean {per_bulk * 4}")
    assert len(counts) == LANES and counts[0] > 0
    assert counts[-1] <= 4 * per_bulk * 4
    values = sorted(r.value for records in by_lane.values() for r in records)
    assert values == [b"%06d" % i for i in range(bulks * per_bulk)]  # none lost, none twice
    for records in by_lane.values():  # each lane holds its records in publishing order
        assert [r.value for r in records] == sorted(r.value for r in records)


def test_keyed_and_keyless_records_keep_their_lanes_order_and_offsets(grid: Grid, unique_name: str) -> None:
    """Keyed records go to their key's lane in publishing order; each future's offsets are where each record
    landed (a lane's records of one bulk are scattered over it, so their offsets are delivered by position)."""
    config = StreamConfig(unique_name, lanes=LANES, capacity=1000)
    sent: list[Record] = []
    with Publisher(grid, config) as pub:
        futures = []
        for b in range(5):
            bulk = [
                Record(b"%02d-%05d" % (b, i), key=None if i % 10 == 0 else b"k%d" % (i % 97), lane=3 if i == 7 else -1)
                for i in range(3000)
            ]
            sent.extend(bulk)
            futures.append(pub.publish_many(bulk))
        offsets = [offset for future in futures for offset in future.result(30)]
    by_lane = _read_all(grid, open_stream(grid, unique_name))
    stored = {r.value: r for records in by_lane.values() for r in records}
    assert len(stored) == len(sent)
    for record, offset in zip(sent, offsets, strict=True):
        got = stored[record.value]
        assert got.offset == offset and got.key == record.key
        if record.lane >= 0:
            assert got.lane == record.lane
        elif record.key is not None:
            assert got.lane == lane_for_key(record.key, LANES)
    for records in by_lane.values():
        per_key: dict[bytes | None, list[bytes]] = {}
        for r in records:
            per_key.setdefault(r.key, []).append(r.value)
        assert all(values == sorted(values) for values in per_key.values())
