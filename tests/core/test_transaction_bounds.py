"""Bounded transaction state: the four transaction maps stop growing however many transactions run, stale open
entries are cleared by core readers, and a read_committed reader's memory of producers is bounded."""

from __future__ import annotations

import time

import pytest

from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.format.item_encoding import encode_columns
from meteor_spark.format.item_header import ItemProducer
from meteor_spark.grid import item_gate, transactions
from meteor_spark.grid.client import Grid
from meteor_spark.grid.item_gate import DELIVER, ItemGate
from meteor_spark.grid.streams import StreamConfig, open_stream
from meteor_spark.producer.publisher import Publisher
from meteor_spark.testing import wait_until

MAPS = (transactions.TXNS_MAP, transactions.PRODUCERS_MAP, transactions.BATCHES_MAP, transactions.OPEN_MAP)


def _mine(grid: Grid, prefix: str) -> dict[str, int]:
    """Entries of each transaction map that belong to this test (keys or values starting with ``prefix``)."""
    sizes = {}
    for name in MAPS:
        entries = grid.map(name).entries()
        sizes[name] = sum(1 for k, v in entries.items() if k.startswith(prefix) or v.startswith(prefix))
    return sizes


def test_transaction_maps_stop_growing(grid: Grid, unique_name: str) -> None:
    """1,200 micro-batch transactions (begin, one item in a lane, commit; every 10th aborted instead) on a stream
    of 2 lanes x 16 items: committed transactions leave once their lanes moved past them, aborted ones after their
    retention, batch records beyond the last KEEP_BATCHES, open entries at the decision. Sizes printed."""
    info = open_stream(grid, StreamConfig(unique_name, lanes=2, capacity=16))
    rings = [grid.ring(name) for name in info.ring_names]
    item = encode_columns([b"x" * 100], timestamps=0, producer_id=1, producer_seq=0)
    total, sample = 1200, 200
    history: list[dict[str, int]] = []
    later = lambda: int(time.time() * 1000) + transactions.ABORTED_RETENTION_MS + 1  # noqa: E731
    for n in range(total):
        key = f"{unique_name}/q/{n}"
        producer = 10_000_000 + n
        transactions.begin(grid, key, producer, 60_000, stream=unique_name, batch_key=f"{unique_name}/sink/q/{n}")
        rings[n % 2].add(item)
        if n % 10 == 9:
            transactions.abort(grid, key, "test")
        else:
            transactions.commit(grid, key, [producer])
        if (n + 1) % sample == 0:
            report = transactions.sweep(grid, now_ms=later())
            sizes = _mine(grid, unique_name)
            history.append(sizes)
            print(
                f"after {n + 1} transactions: {sizes} (swept {report.committed} committed, {report.aborted} "
                f"aborted, {report.producers} producers, {report.batches} batches)"
            )
    # Per map after warm-up: txns and producers at most what 2 lanes x 16 items can still hold (plus the aborted
    # ones of the last sample, already past retention here), batches at most KEEP_BATCHES, no open entry.
    for sizes in history[1:]:
        assert sizes[transactions.TXNS_MAP] <= 2 * 16 + 1, sizes
        assert sizes[transactions.PRODUCERS_MAP] <= 2 * 16 + 1, sizes
        assert sizes[transactions.BATCHES_MAP] <= transactions.KEEP_BATCHES, sizes
        assert sizes[transactions.OPEN_MAP] == 0, sizes
    assert history[-1] == history[1], "sizes flat after warm-up"


def test_read_committed_reader_after_a_sweep(grid: Grid, unique_name: str) -> None:
    """A committed transaction whose items can still be read survives the sweep and is delivered; an aborted one
    removed by the sweep (its items still in the ring) is dropped as aborted, not an error."""
    open_stream(grid, StreamConfig(unique_name, lanes=1))
    published = {}
    for name, decide in (("kept", "commit"), ("gone", "abort")):
        key = f"{unique_name}/{name}"
        with Publisher(grid, unique_name, transactional=True) as pub:
            transactions.begin(grid, key, pub.producer_id, 60_000, stream=unique_name)
            pub.publish(name.encode())
            published[name] = pub.producer_id
        if decide == "commit":
            transactions.commit(grid, key, [pub.producer_id])
        else:
            transactions.abort(grid, key, "test")
    transactions.sweep(grid, now_ms=int(time.time() * 1000) + transactions.ABORTED_RETENTION_MS + 1)
    assert transactions.state_of(grid, f"{unique_name}/kept") is not None
    assert transactions.state_of(grid, f"{unique_name}/gone") is None
    assert transactions.transaction_of_producer(grid, published["gone"]) is None
    with Subscriber(grid, unique_name, initial_offset_scheme="earliest", isolation="read_committed") as sub:
        got: list[bytes] = []
        wait_until(
            lambda: got.extend(r.value for r in sub.poll(50)) or sub.item_gate.aborted_items >= 1,
            message="the removed transaction's item dropped",
        )
        got.extend(r.value for r in sub.poll(50))
        assert got == [b"kept"]


def test_stale_open_entries_are_cleared_by_a_core_reader(
    grid: Grid, unique_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transaction whose task died before writing anything (no item a reader could meet) and whose driver died
    too: a core read_committed subscriber finds its open entry past the deadline and aborts it."""
    open_stream(grid, StreamConfig(unique_name, lanes=1))
    key = f"{unique_name}/abandoned"
    transactions.begin(grid, key, 7, 1, stream=unique_name)
    entry = f"{key}\t{unique_name}"
    assert grid.map(transactions.OPEN_MAP).get(entry) is not None
    monkeypatch.setattr(transactions, "SWEEP_INTERVAL_S", 0.0)
    with Publisher(grid, unique_name) as pub:
        pub.publish(b"plain")
    with Subscriber(grid, unique_name, initial_offset_scheme="earliest", isolation="read_committed") as sub:
        wait_until(lambda: [r.value for r in sub.poll(50)] == [b"plain"], message="the plain record")
    wait_until(lambda: grid.map(transactions.OPEN_MAP).get(entry) is None, message="the stale entry cleared")
    state = transactions.state_of(grid, key)
    assert state is not None and state.state == transactions.ABORTED and "timed out" in state.reason


def test_a_gate_remembers_a_bounded_number_of_producers_per_lane(grid: Grid) -> None:
    gate = ItemGate(grid)
    limit = item_gate.PRODUCERS_PER_LANE
    for n in range(3 * limit):
        assert gate.check(0, n, ItemProducer(1000 + n, 0, False, 1)) == DELIVER
    remembered = gate._last_seq[0]
    print(f"producers remembered for lane 0 after {3 * limit}: {len(remembered)}")
    assert len(remembered) == limit and min(remembered) == 1000 + 2 * limit
    # The most recent ones still catch a re-sent copy.
    assert gate.check(0, 3 * limit, ItemProducer(1000 + 3 * limit - 1, 0, False, 1)) == item_gate.DUPLICATE


def test_an_open_entry_of_a_removed_transaction_is_cleared(grid: Grid, unique_name: str) -> None:
    """A task attempt that begins after its transaction was decided and removed leaves an open entry behind (begin
    notes it before finding the transaction decided); the second sweep that finds it without a transaction removes
    it (the first could be looking between the two writes of a begin)."""
    open_stream(grid, StreamConfig(unique_name, lanes=1))
    entry = f"{unique_name}/gone\t{unique_name}"
    grid.map(transactions.OPEN_MAP).put(entry, unique_name)
    transactions.sweep(grid)
    assert grid.map(transactions.OPEN_MAP).get(entry) is not None
    report = transactions.sweep(grid)
    assert grid.map(transactions.OPEN_MAP).get(entry) is None and report.open_entries >= 1
