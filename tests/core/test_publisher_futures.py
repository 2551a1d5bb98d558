"""The publisher's cheap per-record futures and its direct send (no hand-off when the lane is idle and linger is 0).

A ``publish_async`` future has no completion work of its own: it reads its outcome from its segment, and only the
futures somebody waits on or attached a callback to are told. These tests pin what a user can observe: offsets,
waiting from other threads, ``concurrent.futures`` helpers, callbacks on the completion thread, failures reaching
every future and callback, and order per lane.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import threading
import time
from concurrent.futures import Future
from typing import Any, cast

import pytest

from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.errors import GridError
from meteor_spark.format.offsets import make_offset
from meteor_spark.format.records import Record
from meteor_spark.grid.client import Grid
from meteor_spark.grid.streams import StreamConfig
from meteor_spark.producer.calls import Segment
from meteor_spark.producer.publisher import Publisher
from meteor_spark.testing import wait_until


def test_every_future_gets_its_own_offset_in_order(grid: Grid, unique_name: str) -> None:
    with Publisher(grid, StreamConfig(unique_name), max_batch_records=7) as pub:
        futures = [pub.publish_async(f"r{i}".encode()) for i in range(100)]
        mixed = pub.publish_async(Record(b"keyed", key=b"k"))
        pub.flush(10)
    offsets = [f.result(0) for f in futures] + [mixed.result(0)]
    assert offsets[0] == make_offset(0, 0)
    assert all(a < b for a, b in itertools.pairwise(offsets)), "one lane: offsets follow the publishing order"
    assert all(f.done() and not f.running() and not f.cancelled() and f.exception() is None for f in futures)
    # A kept future does not keep the records of its segment alive once they were sent.
    segments = [f._segment for f in futures]
    assert all(isinstance(segment, Segment) and segment.values == [] for segment in segments)


def test_waiting_from_other_threads_and_done_callbacks(grid: Grid, unique_name: str) -> None:
    # A long linger keeps the records queued while other threads start waiting on them.
    pub = Publisher(grid, StreamConfig(unique_name), linger_ms=60_000)
    try:
        futures = [pub.publish_async(b"x") for _ in range(20)]
        results: list[int] = []
        waiters = [threading.Thread(target=lambda f=f: results.append(f.result(10))) for f in futures[::4]]
        for thread in waiters:
            thread.start()
        seen: list[tuple[int, str]] = []
        futures[3].add_done_callback(lambda f: seen.append((f.result(), threading.current_thread().name)))
        with pytest.raises(concurrent.futures.TimeoutError):
            futures[0].result(0.01)
        assert not futures[0].cancel() and not futures[0].done() and "running" in repr(futures[0])
        pub.flush(10)
        for thread in waiters:
            thread.join(10)
        assert sorted(results) == [f.result() for f in futures[::4]]
        wait_until(lambda: len(seen) == 1, message="done callback")
        assert seen[0][0] == futures[3].result()
        assert seen[0][1].startswith("meteor-publisher-callbacks")  # never the grid client's thread
        late: list[int] = []
        futures[5].add_done_callback(lambda f: late.append(f.result()))  # already done: runs at once, here
        assert late == [futures[5].result()]
        # RecordFuture duck-types concurrent.futures.Future (meteor_spark.producer.futures); typeshed wants the class
        done, not_done = concurrent.futures.wait(cast("list[Future[int]]", futures), timeout=0)
        assert len(done) == 20 and not not_done
        with pytest.raises(RuntimeError, match="completed by their publisher"):
            futures[0].set_result(1)
        assert f"offset={futures[0].result()}" in repr(futures[0])
    finally:
        pub.close()


def test_concurrent_futures_helpers_on_records_still_queued(grid: Grid, unique_name: str) -> None:
    with Publisher(grid, StreamConfig(unique_name), linger_ms=200) as pub:
        futures = [pub.publish_async(b"y") for _ in range(10)]
        ordered = [f.result() for f in concurrent.futures.as_completed(cast("list[Future[int]]", futures), timeout=10)]
        assert sorted(ordered) == sorted(f.result() for f in futures)
        done, not_done = concurrent.futures.wait(
            cast("list[Future[int]]", [pub.publish_async(b"z")]),
            timeout=10,
            return_when=concurrent.futures.FIRST_COMPLETED,
        )
        assert len(done) == 1 and not not_done


def test_callbacks_run_in_order_on_the_completion_thread(grid: Grid, unique_name: str) -> None:
    calls: list[tuple[int | None, str]] = []

    def note(offset: int | None, error: BaseException | None) -> None:
        assert error is None
        calls.append((offset, threading.current_thread().name))

    with Publisher(grid, StreamConfig(unique_name), max_batch_records=3) as pub:
        futures = [pub.publish_async(b"c", callback=note) for _ in range(10)]
    assert [offset for offset, _ in calls] == [f.result() for f in futures]
    assert all(name.startswith("meteor-publisher-callbacks") for _, name in calls)


def test_a_failed_write_reaches_every_future_and_callback(grid: Grid, unique_name: str, monkeypatch: Any) -> None:
    errors: list[BaseException | None] = []
    pub = Publisher(grid, StreamConfig(unique_name))
    try:
        ring = pub._sender.rings[0]

        def refuse(items: Any, overflow_policy: int = 0) -> Any:
            raise GridError("the grid refused (test)")

        monkeypatch.setattr(ring, "add_all_async", refuse)
        failing = [pub.publish_async(b"lost", callback=lambda o, e: errors.append(e)) for _ in range(5)]
        watched = pub.publish_async(b"lost too")
        for future in failing + [watched]:
            with pytest.raises(GridError, match="refused"):
                future.result(10)
        wait_until(lambda: len(errors) == 5, message="failure callbacks")
        assert all(isinstance(e, GridError) for e in errors)
        monkeypatch.undo()
        assert pub.publish(b"fine", timeout_s=10) == make_offset(0, 0)  # the publisher goes on
        assert pub.metrics()["failed_records"] == 6
    finally:
        pub.close()


def test_an_idle_lane_is_sent_from_the_publishing_thread(grid: Grid, unique_name: str, monkeypatch: Any) -> None:
    with Publisher(grid, StreamConfig(unique_name, lanes=2)) as pub:
        senders: list[str] = []
        for ring in pub._sender.rings:
            original = ring.add_all_async

            def traced(items: Any, overflow_policy: int = 0, original: Any = original) -> Any:
                senders.append(threading.current_thread().name)
                return original(items, overflow_policy)

            monkeypatch.setattr(ring, "add_all_async", traced)
        pub.publish(b"one", timeout_s=10)
        pub.publish(Record(b"two", lane=1), timeout_s=10)
        assert senders == [threading.current_thread().name] * 2


def test_order_per_lane_with_direct_sends_from_many_threads(grid: Grid, unique_name: str) -> None:
    with Publisher(grid, StreamConfig(unique_name, lanes=3)) as pub:

        def publish(thread: int) -> list[tuple[int, Any]]:
            return [
                (i, pub.publish_async(Record(f"{thread}:{i}".encode(), key=f"t{thread}".encode()))) for i in range(300)
            ]

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            per_thread = list(pool.map(publish, range(4)))
    for sent in per_thread:
        offsets = [future.result(10) for _, future in sent]
        assert offsets == sorted(offsets), "records of one key (one lane) must keep the publishing order"


def test_plain_values_between_keyed_records_keep_their_order_and_fields(grid: Grid, unique_name: str) -> None:
    """Plain values take publish_async's hot path, records with a key or headers the general one, into the same
    lane's queue: what is stored follows the publishing order with each record's own fields."""
    sent: list[Record | bytes] = []
    for i in range(300):
        if i % 7 == 3:
            sent.append(Record(f"k{i}".encode(), key=b"key", lane=0))
        elif i % 11 == 5:
            sent.append(Record(f"h{i}".encode(), headers=(("n", str(i).encode()),)))
        else:
            sent.append(f"v{i}".encode())
    with Publisher(grid, StreamConfig(unique_name), max_batch_records=16) as pub:
        futures = [pub.publish_async(record) for record in sent]
        pub.flush(30)
    offsets = [f.result(0) for f in futures]
    assert all(a < b for a, b in itertools.pairwise(offsets))
    with Subscriber(grid, unique_name, initial_offset_scheme="earliest") as sub:
        stored: list[Record] = []
        wait_until(lambda: stored.extend(sub.poll(timeout_ms=100)) or len(stored) >= len(sent), timeout_s=30)
    assert [r.offset for r in stored] == offsets
    for record, original in zip(stored, sent, strict=True):
        if isinstance(original, Record):
            assert (record.value, record.key, record.headers) == (original.value, original.key, original.headers)
        else:
            assert (record.value, record.key, record.headers) == (original, None, ())


def test_plain_values_from_many_threads_are_each_stored_once_where_their_futures_say(
    grid: Grid, unique_name: str
) -> None:
    """Plain values behind a call in flight go to the lane's tail uncounted (``Accumulator.plain_publisher``): with
    four threads, a small buffer (admission waits) and small calls (encode-ahead), every value is stored exactly
    once, at its future's offset, and each thread's values keep their order."""
    config = StreamConfig(unique_name, max_batch_records=50)
    with Publisher(grid, config, max_buffered_records=300, max_items_per_call=2, max_call_bytes=2000) as pub:

        def publish(thread: int) -> list[tuple[bytes, Any]]:
            values = [f"{thread}:{i:05d}".encode() for i in range(2000)]
            return [(value, pub.publish_async(value)) for value in values]

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            sent = [pair for pairs in pool.map(publish, range(4)) for pair in pairs]
        pub.flush(60)
        assert pub.metrics()["outstanding"] == 0
    at = {future.result(0): value for value, future in sent}
    assert len(at) == len(sent)  # no two values at one offset
    with Subscriber(grid, unique_name, initial_offset_scheme="earliest") as sub:
        stored: list[Record] = []
        wait_until(lambda: stored.extend(sub.poll(timeout_ms=100)) or len(stored) >= len(sent), timeout_s=60)
    assert len(stored) == len(sent) and {r.offset: r.value for r in stored} == at
    by_thread: dict[bytes, list[bytes]] = {}
    for record in sorted(stored, key=lambda r: r.offset):
        by_thread.setdefault(record.value.split(b":")[0], []).append(record.value)
    assert all(values == sorted(values) for values in by_thread.values())


def test_plain_values_are_stored_with_the_millisecond_of_their_own_publish_call(
    grid: Grid, unique_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain value's timestamp is its own ``publish_async`` clock reading, in milliseconds (``Segment.plain``
    keeps them in runs): exact per record, across the tail and the counted way, small calls and a clock that steps
    back."""
    readings: list[float] = []
    clock = itertools.count()

    def fake_time() -> float:
        k = next(clock)
        # 0.35 ms apart, never within 0.02 ms of a millisecond's bound; steps back 5 ms at times.
        ms = 1_700_000_000_000 + k * 0.35 + 0.03 - (5 if k % 97 == 50 else 0)
        readings.append(ms / 1000)
        return ms / 1000

    monkeypatch.setattr(time, "time", fake_time)
    pub = Publisher(grid, StreamConfig(unique_name), max_batch_records=20, max_items_per_call=2)
    monkeypatch.undo()  # the publisher's plain path keeps the fake clock; nothing else reads it
    with pub:
        del readings[:]
        futures = [pub.publish_async(b"v%d" % i) for i in range(1500)]
        pub.flush(30)
    assert len(readings) == len(futures)
    expected = {future.result(0): int(reading * 1000) for future, reading in zip(futures, readings, strict=True)}
    with Subscriber(grid, unique_name, initial_offset_scheme="earliest") as sub:
        stored: list[Record] = []
        wait_until(lambda: stored.extend(sub.poll(timeout_ms=100)) or len(stored) >= len(futures), timeout_s=30)
    assert {record.offset: record.timestamp_ms for record in stored} == expected


def test_topic_and_message_id_are_taken_by_position_or_keyword_alike(grid: Grid, unique_name: str) -> None:
    """A plain publisher's ``publish_async`` (its own function) and a serializing one's (the method) take the same
    arguments the same ways."""
    config = StreamConfig(unique_name)
    with Publisher(grid, config) as plain, Publisher(grid, config, value_serializer="str") as serializing:
        for pub, value in ((plain, b"plain"), (serializing, "serialized")):
            pub.publish_async(value, None, "orders.by.position", "m-" + str(value))
            pub.publish_async(value, topic="orders.by.keyword", message_id="k-" + str(value))
        plain.flush(10)
        serializing.flush(10)
    with Subscriber(grid, config, initial_offset_scheme="earliest") as sub:
        got: list[tuple[str | None, str | None]] = []
        wait_until(lambda: bool(got.extend((r.topic, r.message_id) for r in sub.poll(0.2))) or len(got) >= 4)
    assert sorted(got) == sorted(
        [
            ("orders.by.position", "m-b'plain'"),
            ("orders.by.keyword", "k-b'plain'"),
            ("orders.by.position", "m-serialized"),
            ("orders.by.keyword", "k-serialized"),
        ]
    )
