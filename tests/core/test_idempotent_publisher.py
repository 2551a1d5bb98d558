"""Idempotent publishing: an ``add_all`` whose answer was lost is looked up in its lane and sent again only when it
was not stored, so a retry never yields a record twice.

The fault test cuts the client's connections (a TCP proxy between the client and the member) while ``add_all`` calls
are in flight, many times during one publish, then reads the lanes raw (no reader-side deduplication) and counts
every ring item by (producer id, producer sequence) and every record by value.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hazelcast.future import Future

from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.errors import GridConnectionError, PublishTimeoutError
from meteor_spark.format.item_header import item_producer
from meteor_spark.format.offsets import INDEX_BITS
from meteor_spark.format.wire import decode_item
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.streams import StreamConfig
from meteor_spark.producer import sender
from meteor_spark.producer.idempotence import StoredCallLost, find_call
from meteor_spark.producer.publisher import Publisher
from meteor_spark.testing import TcpProxy, wait_until


def _lost_answer() -> Future[Any]:
    future: Future[Any] = Future()
    future.set_exception(GridConnectionError("add_all: the grid is unreachable (connection reset, test)"))
    return future


def _raw_lane(grid: Grid, name: str, lane: int) -> list[tuple[int, bytes]]:
    """``(ring sequence, item)`` of every item of a lane, read raw."""
    ring = grid.ring(f"meteor.stream::{name}.{lane}")
    out: list[tuple[int, bytes]] = []
    seq = ring.head()
    tail = ring.tail()
    while seq <= tail:
        batch = ring.read_many(seq, 0, 500)
        out.extend(zip(batch.sequences, batch.items, strict=True))
        seq = batch.next_sequence
    return out


def _census(grid: Grid, name: str, lanes: int) -> tuple[collections.Counter[bytes], int, int]:
    """Every stored record's value counted, the number of ring items, and how many of them repeat a (producer,
    sequence) pair already seen in their lane."""
    values: collections.Counter[bytes] = collections.Counter()
    items = duplicates = 0
    for lane in range(lanes):
        seen: set[tuple[int, int]] = set()
        for sequence, item in _raw_lane(grid, name, lane):
            items += 1
            producer = item_producer(item, stream=name, lane=lane, sequence=sequence)
            pair = (producer.producer_id, producer.producer_seq)
            duplicates += pair in seen
            seen.add(pair)
            view = decode_item(item, stream=name, lane=lane, sequence=sequence)
            offsets = view.value_offsets
            data = bytes(view.value_data)
            for i in range(view.count):
                values[data[offsets[i] : offsets[i + 1]]] += 1
    return values, items, duplicates


# ------------------------------------------------------------------------------------------------ unit level


def test_a_call_whose_answer_was_lost_but_was_stored_is_settled_from_the_lane(
    grid: Grid, unique_name: str, monkeypatch: Any
) -> None:
    with Publisher(grid, StreamConfig(unique_name), idempotent=True) as pub:
        first = pub.publish(b"before", timeout_s=10)
        ring = pub._sender.rings[0]
        original = ring.add_all_async
        attempts: list[int] = []

        def stored_but_answer_lost(items: Any, overflow_policy: int = 0) -> Any:
            attempts.append(len(items))
            if len(attempts) == 1:
                original(items, overflow_policy).result()  # stored in the grid ...
                return _lost_answer()  # ... and the answer lost on the way back
            return original(items, overflow_policy)

        monkeypatch.setattr(ring, "add_all_async", stored_but_answer_lost)
        futures = pub.publish_many([b"a", b"b", b"c"])
        offsets = futures.result(10)
        assert attempts == [1], "the call was found in the lane, not sent again"
        assert offsets == [(1 << INDEX_BITS) | i for i in range(3)]
        assert first == 0
        metrics = pub.metrics()
        assert (metrics["unknown_outcomes"], metrics["recovered_calls"], metrics["resent_calls"]) == (1, 1, 0)
        assert metrics["failed_records"] == 0
    values, items, duplicates = _census(grid, unique_name, 1)
    assert (values, items, duplicates) == (collections.Counter([b"before", b"a", b"b", b"c"]), 2, 0)


def test_a_call_whose_answer_was_lost_and_was_not_stored_is_sent_again(
    grid: Grid, unique_name: str, monkeypatch: Any
) -> None:
    with Publisher(grid, StreamConfig(unique_name), idempotent=True) as pub:
        pub.publish(b"before", timeout_s=10)
        ring = pub._sender.rings[0]
        original = ring.add_all_async
        sent: list[list[bytes]] = []

        def lost_before_storing(items: Any, overflow_policy: int = 0) -> Any:
            sent.append([bytes(i) for i in items])
            if len(sent) == 1:
                return _lost_answer()
            return original(items, overflow_policy)

        monkeypatch.setattr(ring, "add_all_async", lost_before_storing)
        assert pub.publish(b"x", timeout_s=10) == 1 << INDEX_BITS
        assert len(sent) == 2 and sent[0] == sent[1], "the same encoded items (same producer sequence) again"
        metrics = pub.metrics()
        assert (metrics["unknown_outcomes"], metrics["recovered_calls"], metrics["resent_calls"]) == (1, 0, 1)
    values, items, duplicates = _census(grid, unique_name, 1)
    assert (values, items, duplicates) == (collections.Counter([b"before", b"x"]), 2, 0)


def test_the_delivery_timeout_fails_the_records_saying_the_outcome_is_unknown(
    grid: Grid, unique_name: str, monkeypatch: Any
) -> None:
    pub = Publisher(grid, StreamConfig(unique_name), idempotent=True, delivery_timeout_ms=300)
    try:
        pub.publish(b"before", timeout_s=10)
        ring = pub._sender.rings[0]
        monkeypatch.setattr(ring, "add_all_async", lambda items, overflow_policy=0: _lost_answer())
        future = pub.publish_async(b"never")
        with pytest.raises(PublishTimeoutError, match=r"1 records in 1 ring items: outcome unknown") as caught:
            future.result(20)
        assert "delivery_timeout_ms passed after" in str(caught.value)
        assert isinstance(caught.value.__cause__, GridConnectionError)
        assert pub.metrics()["failed_records"] == 1
        assert pub.metrics()["resent_calls"] >= 1
        monkeypatch.undo()
        assert pub.publish(b"after", timeout_s=10) == 1 << INDEX_BITS  # the lane goes on, in order
    finally:
        pub.close()


def test_close_with_a_deadline_gives_up_a_call_being_retried(grid: Grid, unique_name: str, monkeypatch: Any) -> None:
    pub = Publisher(grid, StreamConfig(unique_name), idempotent=True, delivery_timeout_ms=600_000)
    ring = pub._sender.rings[0]
    monkeypatch.setattr(ring, "add_all_async", lambda items, overflow_policy=0: _lost_answer())
    future = pub.publish_async(b"never answered")
    wait_until(lambda: pub.metrics()["unknown_outcomes"] >= 1, message="a lost answer")
    with pytest.raises(PublishTimeoutError, match="still not stored"):
        pub.close(timeout_s=0.5)  # returns long before delivery_timeout_ms
    with pytest.raises(PublishTimeoutError, match=r"outcome unknown.*the publisher was closed"):
        future.result(5)
    assert pub.metrics()["failed_records"] == 1


def test_the_search_reports_a_lane_overwritten_before_it_was_searched(grid: Grid, unique_name: str) -> None:
    with Publisher(grid, StreamConfig(unique_name, capacity=4), idempotent=False) as pub:
        for n in range(10):
            pub.publish(f"{n}".encode(), timeout_s=10)
        ring = pub._sender.rings[0]
        found, resume = find_call(ring, 6, pub.producer_id, 7)  # items 6.. are still there
        assert (found, resume) == (7, 7)
        assert find_call(ring, 8, pub.producer_id, 99) == (None, 10)  # searched to the tail, not there
        assert find_call(ring, 2, pub.producer_id, 7) == (7, 7)  # found above the overwritten part
        with pytest.raises(StoredCallLost, match="overwritten"):
            find_call(ring, 2, pub.producer_id, 99)  # not found, and items 2..5 are gone: it may have been there


def test_without_idempotence_a_lost_answer_fails_the_records_at_once(
    grid: Grid, unique_name: str, monkeypatch: Any
) -> None:
    with Publisher(grid, StreamConfig(unique_name), idempotent=False) as pub:
        ring = pub._sender.rings[0]
        monkeypatch.setattr(ring, "add_all_async", lambda items, overflow_policy=0: _lost_answer())
        with pytest.raises(GridConnectionError, match="connection reset"):
            pub.publish(b"lost", timeout_s=10)
        assert pub.metrics()["unknown_outcomes"] == 0


def test_producer_sequences_rise_in_ring_order_while_two_threads_encode_calls_of_one_lane(
    grid: Grid, unique_name: str, monkeypatch: Any
) -> None:
    """One thread encodes the call it claimed while the sender encodes the lane's next call ahead (queued by a second
    publishing thread). The items must still carry rising producer sequences in ring order: a reader drops an item
    whose sequence is not above the last one it passed on as a re-sent copy, so interleaved sequences lost real
    records."""
    encode = sender.encode_items_and_lane_max

    def slow_encode(*args: Any, **kwargs: Any) -> tuple[list[bytes], int]:
        time.sleep(0.001)  # lets the other encoder run in between, as a busy machine does
        return encode(*args, **kwargs)

    monkeypatch.setattr(sender, "encode_items_and_lane_max", slow_encode)
    chunks = [[b"t%d-%05d" % (t, i) for i in range(j, j + 400)] for t in range(2) for j in range(0, 2000, 400)]
    with Publisher(grid, StreamConfig(unique_name), max_batch_records=10, max_call_bytes=2048) as pub:
        workers = [
            threading.Thread(target=lambda mine=chunks[t::2]: [pub.publish_many(c) for c in mine]) for t in range(2)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        pub.flush()
    sequences = [
        item_producer(item, stream=unique_name, lane=0, sequence=sequence).producer_seq
        for sequence, item in _raw_lane(grid, unique_name, 0)
    ]
    assert sequences == sorted(set(sequences))  # strictly rising in ring order
    expected = sorted(v for chunk in chunks for v in chunk)
    got: list[bytes] = []
    with Subscriber(grid, unique_name, initial_offset_scheme="earliest") as reader:
        wait_until(
            lambda: got.extend(r.value for r in reader.poll(100)) or len(got) >= len(expected),
            30,
            message=f"{len(expected)} records",
        )
        assert reader.item_gate.duplicate_items == 0
    assert sorted(got) == expected


def test_idempotence_settings_are_checked() -> None:
    from meteor_spark.errors import ArgumentTypeError, ConfigError
    from meteor_spark.producer.batching import PublisherSettings

    assert PublisherSettings().idempotent is True
    assert PublisherSettings().delivery_timeout_ms == 120_000
    with pytest.raises(ArgumentTypeError, match="idempotent must be True or False, got 'yes'"):
        PublisherSettings(idempotent="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="delivery_timeout_ms must be a number"):
        PublisherSettings(delivery_timeout_ms=0)


# ------------------------------------------------------------------------------------------------ fault


@pytest.fixture
def proxy(grid_settings: GridSettings) -> Iterator[TcpProxy]:
    with TcpProxy(grid_settings.members[0]) as running:
        yield running


def _publish_while_cutting(
    grid_settings: GridSettings, proxy: TcpProxy, name: str, *, idempotent: bool, records: int, cut_every: int
) -> dict[str, Any]:
    """Publish ``records`` numbered records in many small ``add_all`` calls, cutting every connection right after
    every ``cut_every``-th call was handed to the client (so the call is in flight). A cut that finds no connection
    open (the client still reconnecting after the previous one, which takes longer on a loaded machine) is made at
    the next call instead, so the run cuts as often whatever the load."""
    lanes = 2
    through = proxy.connect(grid_settings)
    try:
        pub = Publisher(
            through,
            StreamConfig(name, lanes=lanes, capacity=100_000),
            idempotent=idempotent,
            max_batch_records=20,
            max_items_per_call=2,
            delivery_timeout_ms=60_000,
        )
        calls, owed = [0], [0]  # add_all calls made; cuts due and not yet made
        lock = threading.Lock()
        for ring in pub._sender.rings:
            original = ring.add_all_async

            def cutting(items: Any, overflow_policy: int = 0, original: Any = original) -> Any:
                future = original(items, overflow_policy)
                with lock:
                    calls[0] += 1
                    owed[0] += calls[0] % cut_every == 0
                    cut = owed[0] > 0
                if cut and proxy.drop():
                    with lock:
                        owed[0] -= 1
                return future

            ring.add_all_async = cutting
        futures = [
            pub.publish_many([f"{n}".encode() for n in range(i, min(records, i + 200))]) for i in range(0, records, 200)
        ]
        pub.flush(120)
        errors = [repr(f.exception()) for f in futures if f.exception() is not None]
        failed = len(errors)
        if errors:
            print(f"\nfailed bulks: {errors}")
        metrics = pub.metrics()
        pub.close()
    finally:
        through.close()
    return {"failed_bulks": failed, "bulks": len(futures), "add_all": calls[0], **metrics}


@pytest.mark.fault
@pytest.mark.slow
def test_cutting_connections_mid_add_all_loses_and_duplicates_nothing(
    grid: Grid, grid_settings: GridSettings, proxy: TcpProxy, unique_name: str
) -> None:
    records = 6000
    figures = _publish_while_cutting(grid_settings, proxy, unique_name, idempotent=True, records=records, cut_every=12)
    values, _, duplicates = _census(grid, unique_name, 2)
    lost = sum(1 for n in range(records) if values[f"{n}".encode()] == 0)
    repeated = sum(count - 1 for count in values.values() if count > 1)
    print(
        f"\nidempotent publish through a cut connection: {records} records, {figures['add_all']} add_all attempts, "
        f"{proxy.dropped} connections dropped, {figures['unknown_outcomes']} answers lost, "
        f"{figures['recovered_calls']} calls found stored, {figures['resent_calls']} resent; "
        f"lost {lost}, duplicated records {repeated}, duplicate items {duplicates}, "
        f"failed bulks {figures['failed_bulks']}"
    )
    assert proxy.dropped >= 10, "the run must really cut connections"
    assert figures["unknown_outcomes"] >= 5, "cuts must hit add_all calls in flight"
    assert (lost, repeated, duplicates) == (0, 0, 0)
    assert figures["failed_bulks"] == 0 and figures["failed_records"] == 0
    assert sum(values.values()) == records and figures["records_sent"] == records


@pytest.mark.fault
@pytest.mark.slow
def test_without_idempotence_the_same_cuts_fail_records(
    grid: Grid, grid_settings: GridSettings, proxy: TcpProxy, unique_name: str
) -> None:
    records = 3000
    figures = _publish_while_cutting(grid_settings, proxy, unique_name, idempotent=False, records=records, cut_every=12)
    values, _, _ = _census(grid, unique_name, 2)
    stored = sum(values.values())
    print(
        f"\nnon-idempotent publish through a cut connection: {records} records, {proxy.dropped} connections "
        f"dropped, {figures['failed_records']} records failed ({stored - (records - figures['failed_records'])} of "
        f"them stored all the same), {figures['failed_bulks']} of {figures['bulks']} bulks failed, {stored} stored"
    )
    assert figures["failed_records"] > 0, "the cuts hit calls in flight, and without idempotence they fail"
    assert stored >= records - figures["failed_records"]


def test_a_client_shut_down_fails_the_records_at_once(grid_settings: GridSettings, unique_name: str) -> None:
    own = Grid(grid_settings)
    pub = Publisher(own, StreamConfig(unique_name), idempotent=True)
    pub.publish(b"before", timeout_s=10)
    own.close()
    with pytest.raises(GridConnectionError):
        pub.publish(b"after", timeout_s=10)  # not retried until delivery_timeout_ms: the client is gone
    pub.close(timeout_s=10)
