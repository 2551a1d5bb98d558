"""Transactions and the item gate over the real client: read_committed / read_uncommitted subscribers on items of
committed, aborted, open and timed-out transactions; the commit-vs-timeout race; re-sent items dropped."""

from __future__ import annotations

import threading
import time

import pytest

from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.errors import ConfigError, TransactionAbortedError
from meteor_spark.format.item_encoding import ItemFraming, encode_batch_v0, encode_prepared, prepare_columns
from meteor_spark.format.item_header import FLAG_TRANSACTIONAL, HEADER_SIZE, ItemProducer, item_producer
from meteor_spark.format.offsets import first_offset_of
from meteor_spark.format.records import encode_batch
from meteor_spark.format.wire import decode_item
from meteor_spark.grid import transactions
from meteor_spark.grid.client import Grid
from meteor_spark.grid.item_gate import ItemGate, stable_end
from meteor_spark.grid.streams import StreamConfig, open_stream
from meteor_spark.groups.admin import lag_report, seek_group
from meteor_spark.producer.publisher import Publisher
from meteor_spark.testing import wait_until


def _publish(grid: Grid, stream: str, key: str, values: list[bytes], timeout_ms: int = 60_000) -> int:
    """Publish ``values`` as one transactional producer of transaction ``key``; returns the producer id."""
    with Publisher(grid, stream, transactional=True) as pub:
        transactions.begin(grid, key, pub.producer_id, timeout_ms, stream=stream)
        for value in values:
            pub.publish_async(value)
        pub.flush()
        return pub.producer_id


def _plain(grid: Grid, stream: str, values: list[bytes]) -> None:
    with Publisher(grid, stream) as pub:
        for value in values:
            pub.publish_async(value)
        pub.flush()


def _read(sub: Subscriber, count: int, timeout_s: float = 15.0) -> list[bytes]:
    got: list[bytes] = []
    wait_until(
        lambda: got.extend(r.value for r in sub.poll(50)) or len(got) >= count, timeout_s, message=f"{count} records"
    )
    return got


def _drain(sub: Subscriber, polls: int = 5) -> list[bytes]:
    return [r.value for _ in range(polls) for r in sub.poll(30)]


def _subscribers(grid: Grid, stream: str) -> tuple[Subscriber, Subscriber]:
    return (
        Subscriber(grid, stream, initial_offset_scheme="earliest", isolation="read_committed"),
        Subscriber(grid, stream, initial_offset_scheme="earliest", isolation="read_uncommitted"),
    )


def test_committed_transaction_delivers_only_the_committed_producers(grid: Grid, unique_name: str) -> None:
    stream = StreamConfig(unique_name, lanes=1)
    open_stream(grid, stream)
    key = f"{unique_name}/t1"
    failed = _publish(grid, unique_name, key, [b"attempt-1-a", b"attempt-1-b"])  # a task attempt that failed
    good = _publish(grid, unique_name, key, [b"attempt-2-a", b"attempt-2-b"])
    _plain(grid, unique_name, [b"plain"])
    decided = transactions.commit(grid, key, [good])
    assert decided.state == transactions.COMMITTED and decided.producers == {good}
    assert transactions.commit(grid, key, [good]) == decided  # a retried commit is a no-op
    committed, uncommitted = _subscribers(grid, unique_name)
    with committed, uncommitted:
        assert _read(committed, 3) == [b"attempt-2-a", b"attempt-2-b", b"plain"]
        assert committed.metrics()["aborted_records"] == 2 and committed.item_gate.aborted_items >= 1
        assert _read(uncommitted, 5) == [b"attempt-1-a", b"attempt-1-b", b"attempt-2-a", b"attempt-2-b", b"plain"]
        assert uncommitted.metrics()["aborted_records"] == 0
    assert failed != good


def test_aborted_transaction_is_never_delivered_read_committed(grid: Grid, unique_name: str) -> None:
    open_stream(grid, StreamConfig(unique_name, lanes=1))
    key = f"{unique_name}/t1"
    _publish(grid, unique_name, key, [b"a", b"b"])
    assert transactions.abort(grid, key, "Spark aborted the batch").state == transactions.ABORTED  # type: ignore[union-attr]
    _plain(grid, unique_name, [b"after"])
    with pytest.raises(TransactionAbortedError, match="aborted first"):
        transactions.commit(grid, key, [1])
    committed, uncommitted = _subscribers(grid, unique_name)
    with committed, uncommitted:
        assert _read(committed, 1) == [b"after"]
        assert _drain(committed) == []
        assert committed.metrics()["aborted_records"] == 2
        assert _read(uncommitted, 3) == [b"a", b"b", b"after"]


def test_open_transaction_holds_the_lane_until_it_commits(grid: Grid, unique_name: str) -> None:
    open_stream(grid, StreamConfig(unique_name, lanes=1))
    _plain(grid, unique_name, [b"before"])
    key = f"{unique_name}/t1"
    producer = _publish(grid, unique_name, key, [b"in-txn"])
    _plain(grid, unique_name, [b"after"])  # behind the open transaction: held too (last stable offset)
    committed, uncommitted = _subscribers(grid, unique_name)
    with committed, uncommitted:
        assert _read(committed, 1) == [b"before"]
        assert _drain(committed) == []
        assert committed.position(0) == first_offset_of(1)  # the lane stays at the open transaction's item
        assert _read(uncommitted, 3) == [b"before", b"in-txn", b"after"]
        info = open_stream(grid, unique_name)
        gate = ItemGate(grid, "read_committed")
        tail = grid.ring(info.ring_names[0]).tail() + 1
        assert stable_end(gate, grid, info, 0, 0, tail) == 1  # the item of the open transaction
        assert transactions.open_in(grid, unique_name) and not transactions.open_in(grid, f"{unique_name}-other")
        transactions.commit(grid, key, [producer])
        assert not transactions.open_in(grid, unique_name)  # the fast path: no scan of the lane
        assert _read(committed, 2) == [b"in-txn", b"after"]
        assert stable_end(ItemGate(grid, "read_committed"), grid, info, 0, 0, tail) == tail


def test_timed_out_transaction_is_aborted_by_the_reader(grid: Grid, unique_name: str) -> None:
    open_stream(grid, StreamConfig(unique_name, lanes=1))
    key = f"{unique_name}/t1"
    producer = _publish(grid, unique_name, key, [b"zombie"], timeout_ms=300)
    _plain(grid, unique_name, [b"after"])
    started = time.monotonic()
    committed, uncommitted = _subscribers(grid, unique_name)
    with committed, uncommitted:
        assert _read(committed, 1, timeout_s=10) == [b"after"]
        waited = time.monotonic() - started
        assert transactions.state_of(grid, key).state == transactions.ABORTED  # type: ignore[union-attr]
        assert committed.metrics()["aborted_records"] == 1
        assert _read(uncommitted, 2) == [b"zombie", b"after"]
    with pytest.raises(TransactionAbortedError, match="timed out"):
        transactions.commit(grid, key, [producer])
    with pytest.raises(TransactionAbortedError, match="already aborted"):
        transactions.begin(grid, key, producer + 1, 1000, stream=unique_name)
    print(f"[txn] timed-out transaction (timeout 0.3 s) passed over after {waited:.2f} s")


def test_commit_and_timeout_abort_race_has_exactly_one_winner(grid: Grid, unique_name: str) -> None:
    outcomes = {"committed": 0, "aborted": 0}
    for round_ in range(40):
        key = f"{unique_name}/t{round_}"
        transactions.begin(grid, key, 1000 + round_, timeout_ms=-1, stream=unique_name)  # already past its deadline
        results: dict[str, object] = {}
        barrier = threading.Barrier(2)

        def committer(key: str = key, results: dict[str, object] = results, producer: int = 1000 + round_) -> None:
            barrier.wait()
            try:
                results["commit"] = transactions.commit(grid, key, [producer])
            except TransactionAbortedError as exc:
                results["commit"] = exc

        def reader(key: str = key, results: dict[str, object] = results) -> None:
            barrier.wait()
            results["abort"] = transactions.abort_expired(grid, key)

        threads = [threading.Thread(target=committer), threading.Thread(target=reader)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        final = transactions.state_of(grid, key)
        assert final is not None and final.decided
        commit_won = isinstance(results["commit"], transactions.TxnState)
        assert commit_won == (final.state == transactions.COMMITTED)
        assert results["abort"] == final  # the reader sees the one decision, whoever made it
        outcomes[final.state] += 1
    print(f"[txn] commit vs timeout abort, 40 races: {outcomes}")
    assert sum(outcomes.values()) == 40


def test_resent_item_is_dropped_counted_and_logged(
    grid: Grid, unique_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    info = open_stream(grid, StreamConfig(unique_name, lanes=1))
    ring = grid.ring(info.ring_names[0])
    first = encode_batch([b"a", b"b"], producer_id=77, producer_seq=0)
    second = encode_batch([b"c"], producer_id=77, producer_seq=1)
    # A publisher retry whose first attempt had been stored: the same item (same producer and sequence) twice.
    ring.add_all([first, first, second, second, encode_batch([b"d"], producer_id=78, producer_seq=0)])
    for isolation in ("read_uncommitted", "read_committed"):
        with Subscriber(grid, unique_name, initial_offset_scheme="earliest", isolation=isolation) as sub:
            assert _read(sub, 4) == [b"a", b"b", b"c", b"d"]
            assert _drain(sub) == []
            assert (sub.metrics()["duplicate_items"], sub.metrics()["duplicate_records"]) == (2, 3)
            assert "dropped the ring item at sequence 1 (2 records) as a re-sent copy: its producer 77" in caplog.text
            sub.seek(0, lane=0)  # reading again on purpose is not duplication
            assert _read(sub, 4) == [b"a", b"b", b"c", b"d"]


def test_unknown_isolation_is_refused(grid: Grid, unique_name: str) -> None:
    open_stream(grid, StreamConfig(unique_name, lanes=1))
    with pytest.raises(ConfigError, match="is not supported; use one of"):
        Subscriber(grid, unique_name, isolation="serializable")


def test_lag_report_shows_the_last_stable_offset(grid: Grid, unique_name: str) -> None:
    info = open_stream(grid, StreamConfig(unique_name, lanes=1))
    _plain(grid, unique_name, [b"before"])
    key = f"{unique_name}/t1"
    producer = _publish(grid, unique_name, key, [b"in-txn"], timeout_ms=1)  # past its deadline: still only looked at
    _plain(grid, unique_name, [b"after"])
    seek_group(grid, info, "g", {0: 0})
    (lane,) = lag_report(grid, info, "g", count_records=True)
    assert (lane.stable_sequence, lane.next_sequence, lane.records) == (1, 3, 3)
    assert transactions.state_of(grid, key).state == transactions.OPEN  # type: ignore[union-attr]  # tools never abort
    transactions.abort(grid, key, "test")
    (lane,) = lag_report(grid, info, "g", count_records=True)
    assert lane.stable_sequence is None
    assert producer


def test_transactional_items_differ_from_plain_ones_by_one_flag_bit_only() -> None:
    columns = prepare_columns([b"a", b"bc"], timestamps=5)
    plain = encode_prepared([columns], ItemFraming(producer_id=9, producer_seq=3))
    flagged = encode_prepared([columns], ItemFraming(producer_id=9, producer_seq=3, transactional=True))
    assert len(plain) == len(flagged)
    differing = [i for i, (a, b) in enumerate(zip(plain, flagged, strict=True)) if a != b]
    crc = range(HEADER_SIZE - 4, HEADER_SIZE)
    assert differing[0] == 5 and all(i == 5 or i in crc for i in differing)  # the flags byte and the CRC
    assert flagged[5] == plain[5] | FLAG_TRANSACTIONAL
    assert not decode_item(plain, stream="s", lane=0, sequence=0).transactional
    assert decode_item(flagged, stream="s", lane=0, sequence=0).transactional
    assert item_producer(flagged, stream="s", lane=0, sequence=0) == ItemProducer(9, 3, True, 2)
    assert item_producer(encode_batch_v0([b"x"]), stream="s", lane=0, sequence=0) == ItemProducer(0, 0, False, 1)


def test_open_index_entries_of_decided_transactions_are_cleaned_by_readers(grid: Grid, unique_name: str) -> None:
    key = f"{unique_name}/t1"
    transactions.begin(grid, key, 5, 60_000, stream=unique_name)
    transactions.commit(grid, key, [5])
    # A decider that died between its decision and removing the entry leaves it behind: readers clean it up.
    grid.map(transactions.OPEN_MAP).put(f"{key}\t{unique_name}", unique_name)
    assert not transactions.open_in(grid, unique_name)
    assert grid.map(transactions.OPEN_MAP).get(f"{key}\t{unique_name}") is None
