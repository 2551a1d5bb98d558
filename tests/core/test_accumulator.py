"""The publisher's accumulator on its own: lanes, item cutting and buffer accounting (unit tests, no grid)."""

from __future__ import annotations

import concurrent.futures
import inspect
import itertools
import sys
import threading
import time
from typing import cast

import numpy as np
import pyarrow as pa
import pytest

from meteor_spark.errors import ConfigError, PublisherClosedError, PublishTimeoutError
from meteor_spark.format.arrow_columns import ArrowInput
from meteor_spark.format.item_encoding import ItemFraming, encode_prepared
from meteor_spark.format.item_header import item_count
from meteor_spark.format.partitioning import lane_for_key
from meteor_spark.format.records import Record, decode_batch
from meteor_spark.format.wire import decode_item
from meteor_spark.grid.streams import Batching, StreamConfig
from meteor_spark.producer.accumulator import Accumulator
from meteor_spark.producer.batching import PublisherSettings
from meteor_spark.producer.calls import Call, Segment
from meteor_spark.producer.futures import BulkFuture, RecordFuture
from meteor_spark.producer.lane_queue import LaneQueue
from meteor_spark.producer.sticky import sticky_runs
from meteor_spark.validate import check_int


def _accumulator(lanes: int = 1, items_per_call: int = 64, **settings: object) -> Accumulator:
    return Accumulator("s", lanes, PublisherSettings(**settings), items_per_call)  # type: ignore[arg-type]


def _queue(acc: Accumulator, lane: int, values: list[bytes]) -> None:
    with acc.lock:
        acc.admit(len(values))
        state = acc.lanes[lane]
        size = sum(state.open_segment().add_value(v, 0) for v in values)
        acc.queued(state, len(values), size)


def _items(acc: Accumulator, lane: int) -> list[list[bytes]]:
    """Claim the lane and encode its next call's items; the values per item."""
    with acc.lock:
        call = acc.claim(acc.lanes[lane])
    by_item: list[list[bytes]] = [[] for _ in range(call.n_items)]
    for piece in call.pieces:
        by_item[piece.item].extend(piece.segment.values[piece.start : piece.stop])
    assert sum(map(len, by_item)) == call.n_records
    return by_item


def test_items_respect_the_record_and_byte_limits_and_an_oversized_record_goes_alone() -> None:
    acc = _accumulator(max_batch_records=3, max_batch_bytes=10)
    _queue(acc, 0, [b"a", b"b", b"c", b"d", b"0123456789xyz", b"eeeee", b"fffff", b"g"])
    assert _items(acc, 0) == [[b"a", b"b", b"c"], [b"d"], [b"0123456789xyz"], [b"eeeee", b"fffff"], [b"g"]]
    assert acc.lanes[0].in_flight and acc.lanes[0].queued == 0 and acc.lanes[0].queued_bytes == 0


def test_a_call_carries_at_most_max_items_per_call_and_the_rest_stays_queued() -> None:
    acc = _accumulator(items_per_call=2, max_batch_records=2)
    _queue(acc, 0, [bytes([i]) for i in range(7)])
    assert _items(acc, 0) == [[b"\x00", b"\x01"], [b"\x02", b"\x03"]]
    assert acc.lanes[0].queued == 3
    with acc.lock:
        assert acc.ready(acc.lanes[0], 0.0) is None  # one call per lane in flight: the lane waits for it
        acc.lanes[0].in_flight = False
        assert acc.ready(acc.lanes[0], 0.0) == 0.0
    assert _items(acc, 0) == [[b"\x04", b"\x05"], [b"\x06"]]


def _calls(acc: Accumulator, lane: int) -> list[list[list[bytes]]]:
    """Every call the lane's queue is cut into, one after the other (each completed before the next)."""
    calls = []
    while acc.lanes[lane].queued:
        calls.append(_items(acc, lane))
        with acc.lock:
            acc.lanes[lane].in_flight = False
    return calls


def test_a_call_carries_at_most_max_call_bytes_in_whole_items() -> None:
    acc = _accumulator(max_batch_records=100, max_batch_bytes=4, max_call_bytes=10)
    _queue(acc, 0, [b"aa"] * 11)
    # Items of 4 bytes; a third item would leave the call only 2 bytes of room: it waits for the next call whole.
    assert _calls(acc, 0) == [
        [[b"aa", b"aa"], [b"aa", b"aa"]],
        [[b"aa", b"aa"], [b"aa", b"aa"]],
        [[b"aa", b"aa"], [b"aa"]],
    ]


def test_items_stay_cut_by_records_when_those_are_the_smaller_bound() -> None:
    acc = _accumulator(max_batch_records=2, max_batch_bytes=100, max_call_bytes=5)
    _queue(acc, 0, [b"a"] * 7)
    assert _calls(acc, 0) == [[[b"a", b"a"], [b"a", b"a"]], [[b"a", b"a"], [b"a"]]]


def test_max_call_bytes_below_max_batch_bytes_bounds_the_items_too() -> None:
    acc = _accumulator(max_batch_records=100, max_batch_bytes=1000, max_call_bytes=5)
    _queue(acc, 0, [b"ab", b"cd", b"ef", b"g"])
    assert acc.settings.max_item_bytes == 5
    assert _calls(acc, 0) == [[[b"ab", b"cd"]], [[b"ef", b"g"]]]


def test_a_record_larger_than_a_call_travels_alone_and_the_next_ones_follow() -> None:
    acc = _accumulator(max_batch_records=100, max_batch_bytes=4, max_call_bytes=8)
    big = b"x" * 20
    _queue(acc, 0, [b"aa", big, b"bb", b"cc", b"dd", b"ee", b"ff"])
    assert _calls(acc, 0) == [[[b"aa"]], [[big]], [[b"bb", b"cc"], [b"dd", b"ee"]], [[b"ff"]]]


@pytest.mark.parametrize("size", [100, 1024, 10 * 1024, 64 * 1024, 1 << 20, 3 << 20])
def test_default_calls_and_items_are_bounded_by_bytes_at_every_record_size(size: int) -> None:
    """With the default settings no item exceeds max_batch_bytes and no call max_call_bytes (one record bigger
    than an item travels alone), from 100-byte records to 3 MiB ones; every record is cut exactly once."""
    settings = PublisherSettings()
    acc = Accumulator("s", 1, settings, settings.max_items_per_call)
    value = bytes(size)
    count = max(10, (24 << 20) // size)
    _queue(acc, 0, [value] * count)
    calls = _calls(acc, 0)
    assert sum(len(item) for call in calls for item in call) == count
    for call in calls:
        assert len(call) <= settings.max_items_per_call
        for item in call:
            assert len(item) <= settings.max_batch_records
            assert len(item) == 1 or len(item) * size <= settings.max_batch_bytes
        assert len(call) == 1 or sum(len(item) for item in call) * size <= settings.max_call_bytes


def test_a_lane_lingers_until_its_batch_fills_or_a_flush() -> None:
    acc = _accumulator(linger_ms=1000, max_batch_records=3)
    _queue(acc, 0, [b"a"])
    state = acc.lanes[0]
    with acc.lock:
        wait = acc.ready(state, state.since)
        assert wait == pytest.approx(1.0)
        assert acc.ready(state, state.since + 2) == 0.0  # linger over
        acc.flushing += 1
        assert acc.ready(state, state.since) == 0.0
        acc.flushing -= 1
    _queue(acc, 0, [b"b", b"c"])
    with acc.lock:
        assert acc.ready(state, state.since) == 0.0  # full batch


def test_without_linger_the_publishing_thread_is_told_to_send_an_idle_lane() -> None:
    acc = _accumulator()
    with acc.lock:
        acc.admit(2)
        state = acc.lanes[0]
        assert acc.queued(state, 1, state.open_segment().add_value(b"x", 0)) is True
        acc.claim(state)
        # a lane in flight is sent by the completion of its call, not by the publisher
        assert acc.queued(state, 1, state.open_segment().add_value(b"y", 0)) is False


def test_admit_bounds_the_buffer_blocks_then_times_out_and_completion_makes_room() -> None:
    acc = _accumulator(max_buffered_records=2, max_block_ms=50)
    with acc.lock:
        acc.admit(2)
        with pytest.raises(PublishTimeoutError, match="max_buffered_records=2"):
            acc.admit(1)
        assert acc.outstanding == 2

    waiting = _accumulator(max_buffered_records=1, max_block_ms=10_000)
    admitted = threading.Event()

    def publisher() -> None:
        with waiting.lock:
            waiting.admit(1)
        admitted.set()

    with waiting.lock:
        waiting.admit(1)
    thread = threading.Thread(target=publisher)
    thread.start()
    assert not admitted.wait(0.05)  # blocked: the buffer is full
    with waiting.lock:
        waiting.completed(1)
    thread.join(10)
    assert admitted.is_set() and waiting.outstanding == 1


def test_a_bulk_larger_than_the_buffer_waits_for_an_empty_buffer_only() -> None:
    acc = _accumulator(max_buffered_records=2)
    with acc.lock:
        acc.admit(5)  # empty buffer: admitted whole
        assert acc.outstanding == 5


def test_a_closing_accumulator_refuses_new_records() -> None:
    acc = _accumulator()
    acc.closing = True
    with acc.lock, pytest.raises(PublisherClosedError, match="closed"):
        acc.admit(1)


def test_routing_explicit_lane_by_key_and_sticky_runs() -> None:
    acc = _accumulator(lanes=4)
    assert acc.lane_of(Record(b"v", lane=2)) == 2
    assert acc.lane_of(Record(b"v", key=b"k")) == lane_for_key(b"k", 4)
    assert acc.lane_of(Record(b"v")) == -1
    with pytest.raises(ConfigError, match="lane 4 does not exist"):
        acc.lane_of(Record(b"v", lane=4))
    # Runs of at least n / lanes: a bulk larger than a run per lane is cut evenly, the sticky lane left partly
    # filled (its next bulk tops it up first).
    assert acc.spread(10) == [(0, 0, 3), (1, 3, 6), (2, 6, 9), (3, 9, 10)]
    assert (acc.sticky, acc.sticky_fill) == (3, 1)
    # Sticky runs of ``run`` records: a small bulk goes to the sticky lane whole, filling it up to the run, then
    # the next lane.
    assert acc.spread(5, 4) == [(3, 0, 3), (0, 3, 5)]
    assert (acc.sticky, acc.sticky_fill) == (0, 2)
    assert acc.spread(2, 4) == [(0, 0, 2)]
    assert (acc.sticky, acc.sticky_fill) == (1, 0)
    # A bulk that fits a run but not what is left of the sticky lane's goes whole to the next lane (no sliver).
    acc.sticky, acc.sticky_fill = 0, 3
    assert acc.spread(2, 4) == [(1, 0, 2)]
    assert (acc.sticky, acc.sticky_fill) == (1, 2)
    assert sticky_runs(10_000, 4, 10_486, 2, 10_000) == ([(3, 0, 10_000)], 3, 10_000)  # Spark's Arrow batches
    # A bulk that would wrap around to the partly filled sticky lane starts on the next lane instead.
    acc.spread(1, 4)
    assert acc.spread(16, 4) == [(2, 0, 4), (3, 4, 8), (0, 8, 12), (1, 12, 16)]
    # Claiming the sticky lane (its records are being sent) moves it on, emptied.
    acc.spread(1, 100)
    with acc.lock:
        acc.claim(acc.lanes[acc.sticky])
    assert (acc.sticky, acc.sticky_fill) == (3, 0)
    acc.sticky = 0
    by_lane = acc.split_by_lane([Record(b"a", lane=3), Record(b"b"), Record(b"c"), Record(b"d", key=b"k")])
    assert sorted(p for ps in by_lane.values() for p in ps) == [0, 1, 2, 3]
    assert 0 in by_lane[3]


def test_record_futures_read_their_outcome_from_the_segment_and_waiters_are_told() -> None:
    acc = _accumulator()
    segment = Segment(acc.lock)
    segment.singles = True
    futures = [RecordFuture(segment, i) for i in range(3)]
    for _ in futures:
        segment.add_value(b"x", 0)
    assert not futures[0].done() and futures[0]._state == "RUNNING"
    seen: list[int] = []
    futures[1].add_done_callback(lambda f: seen.append(f.result()))
    with acc.lock:
        told = segment.settle(0, 2, 100, None)
    assert told == [futures[1]]
    assert [f.done() for f in futures] == [True, True, False]
    assert futures[1].result() == 101 and futures[0]._state == "FINISHED"
    futures[1].call_back()
    assert seen == [101]
    with acc.lock:
        segment.settle(2, 3, 0, ConfigError("failed (test)"))
    assert isinstance(futures[2].exception(), ConfigError)
    with pytest.raises(RuntimeError, match="completed by their publisher"):
        futures[0].set_result(5)


def test_bulk_futures_complete_with_offsets_in_order_and_per_lane_figures() -> None:
    bulk = BulkFuture("list", 3)
    bulk.deliver(2, 50, 1, lane=1)
    assert not bulk.done()
    bulk.deliver(0, 10, 2, lane=0)
    assert bulk.result(0) == [10, 11, 50] and bulk.lanes == {0: [2, 10, 11], 1: [1, 50, 50]}
    failed = BulkFuture("count", 2)
    failed.fail(ConfigError("no (test)"))
    failed.deliver(0, 1, 2, lane=0)  # a failed publish stays failed
    assert isinstance(failed.exception(0), ConfigError)


def test_drop_queued_settles_every_queued_record_and_frees_the_buffer() -> None:
    acc = _accumulator(lanes=2)
    _queue(acc, 0, [b"a", b"b"])
    _queue(acc, 1, [b"c"])
    error = PublishTimeoutError("gone (test)")
    with acc.lock:
        dropped, _, n = acc.drop_queued(error)
    assert n == 3 and acc.outstanding == 0 and len(dropped) == 2
    assert all(lane.queued == 0 and not lane.segments for lane in acc.lanes)


def test_arrow_rows_are_cut_like_records_and_encode_to_the_same_item() -> None:
    table = pa.table({"value": [b"a", b"bb", b"ccc"], "key": [b"k", None, b"k"], "timestamp": [1, 2, 3]})
    bulk = ArrowInput(table)
    acc = _accumulator(max_batch_records=2)
    future = BulkFuture("count", 3)
    segment = Segment.of_arrow(acc.lock, bulk.rows_of(slice(0, 3)), future)
    with acc.lock:
        acc.admit(3)
        acc.lanes[0].segments.append(segment)
        acc.queued(acc.lanes[0], segment.n, segment.nbytes)
        call = acc.claim(acc.lanes[0])
    n_items, pieces = call.n_items, call.pieces
    assert n_items == 2 and [(p.start, p.stop) for p in pieces] == [(0, 2), (2, 3)]
    framing = ItemFraming(1, 0, "none", 1024)
    item = encode_prepared([segment.prepare(0, 2)], framing)
    view = decode_item(item, stream="s", lane=0, sequence=0)
    assert (view.count, view.key_lengths.tolist()) == (2, [1, -1])  # type: ignore[union-attr]
    assert item_count(item, stream="s", lane=0, sequence=0) == 2


def test_batching_is_validated_once_with_the_same_words_everywhere() -> None:
    assert StreamConfig("s", max_batch_records=7, linger_ms=5).batching == Batching(max_batch_records=7, linger_ms=5)
    for bad in ({"max_batch_records": 0}, {"max_batch_records": True}, {"linger_ms": -1}, {"compression": "zip"}):
        name = next(iter(bad))
        with pytest.raises(ConfigError, match=name):
            Batching(**bad)
        with pytest.raises(ConfigError, match=name):
            StreamConfig("s", **bad)
        with pytest.raises(ConfigError, match=name):
            PublisherSettings.parse(StreamConfig("s"), bad)
    with pytest.raises(ConfigError, match=r"max_items_per_call must be an integer in \[1, 999\], got 1000"):
        PublisherSettings(max_items_per_call=1000)
    with pytest.raises(ConfigError, match=r"max_call_bytes must be an integer in \[1, 2147483647\], got 0"):
        PublisherSettings(max_call_bytes=0)


def test_check_int_rejects_bools_and_names_the_range() -> None:
    assert check_int("lanes", 3, 1, 8) == 3
    with pytest.raises(ConfigError, match=r"^lanes must be an integer in \[1, 8\], got True$"):
        check_int("lanes", True, 1, 8)
    with pytest.raises(ConfigError, match=r"got 9 \(the stream has 8 lanes\)$"):
        check_int("lane", 9, 1, 8, what="(the stream has 8 lanes)")
    with pytest.raises(ConfigError, match="got '3'"):
        check_int("lanes", "3", 1, 8)


def _general(record: object, callback: object = None, **routing: object) -> RecordFuture:
    raise AssertionError(f"{record!r} left the plain path")


def test_plain_publish_queues_plain_values_in_order_in_segments_of_their_own() -> None:
    acc = _accumulator()
    publish = acc.plain_publisher(100, bool, _general)
    sent: list[Call] = []
    acc.send_now = sent.append
    before = time.time()
    first = publish(b"a")
    assert [call.n_records for call in sent] == [1]  # an idle lane without linger: the caller sends it
    second = publish(b"bb")
    assert len(sent) == 1  # the lane is in flight: its completion sends what queued behind
    keyed, _ = acc.append(Record(b"k", key=b"x"), 0, 12, None)
    third = publish(b"c")  # after a keyed record: a plain segment of its own again
    after = time.time()
    plain, mixed, last = list(acc.lanes[0].segments)
    assert [(f._segment, f._index) for f in (second, keyed, third)] == [(plain, 0), (mixed, 0), (last, 0)]
    assert (plain.plain, mixed.plain, last.plain) == (True, False, True)
    assert (plain.open, mixed.open, last.open) == (False, False, True)
    assert (plain.values, mixed.values, mixed.keys, last.values) == ([b"bb"], [b"k"], [b"x"], [b"c"])
    assert int(before * 1000) <= plain.stamps[0] <= last.stamps[0] <= int(after * 1000) and mixed.stamps == [12]
    assert isinstance(first, RecordFuture) and not first.done()
    state = acc.lanes[0]
    assert (state.queued, state.queued_bytes, acc.outstanding) == (3, 5, 4)
    with acc.lock:
        state.in_flight = False
        call = acc.claim(state)
    prepared = [piece.segment.prepare(piece.start, piece.stop) for piece in call.pieces]
    stamps = [int(t) for p in prepared for t in np.atleast_1d(p.timestamps)]  # one int: the piece's records share it
    assert stamps == [plain.stamps[0], 12, last.stamps[0]]  # milliseconds on the wire


def test_a_plain_segment_keeps_each_records_own_millisecond_in_runs() -> None:
    """Plain values keep their ``time.time()`` stamp's millisecond as runs (``Segment.plain``): every record gets its
    own exactly, from any piece, also when the clock steps back."""
    segment = LaneQueue(0, threading.Lock()).open_plain()
    base = 1_700_000_000_000  # ms
    # (ms, microseconds into it): the first and last microsecond of a millisecond, a step back, a run resumed.
    at = [(5, 0), (5, 999), (6, 0), (6, 1), (4, 7), (6, 0), (6, 500), (8, 999)]
    stamps = [(base + ms) / 1000 + us / 1_000_000 for ms, us in at]
    for i, stamp in enumerate(stamps):
        segment.add_plain(b"v%d" % i, stamp)
    assert segment.n == 8 and segment.values == [b"v%d" % i for i in range(8)]
    assert (segment.ms_starts, segment.stamps) == ([0, 2, 4, 5, 7], [base + 5, base + 6, base + 4, base + 6, base + 8])
    expected = [base + ms for ms, _ in at]
    for start in range(8):
        for stop in range(start + 1, 9):
            got = segment.plain_ms(start, stop)
            assert list(np.broadcast_to(got, (stop - start,))) == expected[start:stop], (start, stop)
            assert segment.small_values(start, stop) == (segment.values[start:stop], expected[start:stop])
            assert (
                list(np.broadcast_to(segment.prepare(start, stop).timestamps, (stop - start,))) == expected[start:stop]
            )
    assert isinstance(segment.plain_ms(2, 4), int)  # one run: one timestamp for the piece, no column


def test_a_plain_segment_counts_the_bytes_of_values_taken_uncounted_and_keeps_their_sizes() -> None:
    """The fold counts the values the tail took (``Segment.count_plain``); the sizes it measured serve the cut
    (``cumulative_bytes``), counted values in between included."""
    segment = LaneQueue(0, threading.Lock()).open_plain()
    values = [b"x" * (i * 7 % 13) for i in range(12)]
    segment.add_plain(values[0], 1)
    segment.add_plain(values[1], 1)
    segment.values.extend(values[2:5])  # taken by the tail, uncounted
    assert segment.count_plain(3) == sum(map(len, values[2:5])) and segment.n == 5
    assert segment.count_plain(0) == 0 and segment.n == 5
    segment.add_plain(values[5], 1)
    segment.values.extend(values[6:9])
    assert segment.count_plain(3) == sum(map(len, values[6:9])) and segment.n == 9
    segment.add_plain(values[9], 1)  # counted after the last fold: measured by the cut
    segment.close()
    assert segment.cumulative_bytes().tolist() == [sum(map(len, values[:i])) for i in range(11)]


def test_plain_values_from_many_threads_racing_folds_and_cuts_are_each_taken_once_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The tail's append holds ``tail_token``, not the lock (``plain_publisher``): four publishing threads against
    a thread that folds, cuts and settles calls all the time, switching threads as often as CPython lets them (and
    inside the append, where a new millisecond starts a run). No value is lost or taken twice, each thread's values
    keep their order, each future names its value and its own millisecond, and the counts end at zero."""
    clock = itertools.count()  # a new millisecond every other reading, each a quarter into its half

    def fake_time() -> float:
        reading = (1_700_000_000_000 + next(clock) / 2 + 0.25) / 1000
        readings.setdefault(threading.get_ident(), []).append(reading)
        return reading

    readings: dict[int, list[float]] = {}
    stamp_from = Segment.stamp_from

    def switching_stamp_from(segment: Segment, index: int, stamp: float) -> None:
        time.sleep(0)  # not a wait: lets another thread run inside the append's exclusion
        stamp_from(segment, index, stamp)

    acc = _accumulator(items_per_call=2, max_batch_records=7, max_buffered_records=300)
    monkeypatch.setattr(time, "time", fake_time)
    publish_one = acc.plain_publisher(100, bool, _general)  # keeps the fake clock
    monkeypatch.undo()
    monkeypatch.setattr(Segment, "stamp_from", switching_stamp_from)
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    in_flight: list[Call] = []  # the lane's call, handed over by whoever claimed it
    acc.send_now = in_flight.append
    publishing = threading.Event()
    publishing.set()
    taken: list[bytes] = []

    def settle_and_cut() -> None:
        state = acc.lanes[0]
        while publishing.is_set() or in_flight or acc.outstanding_records():
            with acc.lock:
                if in_flight:
                    call = in_flight.pop()
                    taken.extend(p.segment.values[i] for p in call.pieces for i in range(p.start, p.stop))
                    assert acc.call_settled(state) is None
                    acc.completed(call.n_records)
                acc.wake_for(state)  # folds the tail
                if not state.in_flight and state.queued:
                    in_flight.append(acc.claim(state))

    def publish(thread: int) -> list[tuple[bytes, RecordFuture, float]]:
        values = [b"%d:%05d" % (thread, i) for i in range(3000)]
        futures = [publish_one(value) for value in values]
        return list(zip(values, futures, readings[threading.get_ident()], strict=True))

    settler = threading.Thread(target=settle_and_cut)
    settler.start()
    try:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            sent = [one for ones in pool.map(publish, range(4)) for one in ones]
    finally:
        publishing.clear()
        settler.join(60)
        sys.setswitchinterval(switch_interval)
    assert not settler.is_alive()
    assert sorted(taken) == sorted(value for value, _, _ in sent)  # each value once
    for thread in range(4):
        mine = [value for value in taken if value.startswith(b"%d:" % thread)]
        assert mine == sorted(mine)  # in each thread's order
    for value, future, reading in sent:
        segment, index = cast(Segment, future._segment), future._index
        assert segment.values[index] == value and segment.plain_ms(index, index + 1) == int(reading * 1000)
    state = acc.lanes[0]
    assert acc.outstanding_records() == 0 and (state.queued, state.queued_bytes) == (0, 0)


def test_a_whole_call_behind_the_one_in_flight_wakes_the_sender_once_until_it_looks() -> None:
    acc = _accumulator(items_per_call=1, max_batch_records=2)  # a whole call: 2 records
    notified: list[int] = []
    acc.work.notify = lambda n=1: notified.append(n)  # type: ignore[method-assign]
    acc.send_now = lambda call: None
    publish = acc.plain_publisher(100, bool, _general)
    publish(b"a")  # claimed: in flight
    for value in (b"b", b"c", b"d", b"e"):
        publish(value)
    assert notified == [1], "one wake-up for the whole call queued behind, not one per record"
    with acc.lock:
        calls, ahead = acc.next_calls()  # type: ignore[misc]
        assert calls == [] and [call.n_records for call in ahead] == [2]
        assert not acc.sender_nudged  # it looked: the next change wakes it again


def test_plain_publish_hands_every_other_call_to_the_general_path() -> None:
    acc = _accumulator()
    acc.send_now = lambda call: None
    seen: list[tuple[object, object, dict[str, object]]] = []

    def general(record: object, callback: object = None, **routing: object) -> RecordFuture:
        seen.append((record, callback, routing))
        return cast(RecordFuture, None)

    tracing = [False]
    publish = acc.plain_publisher(8, lambda: tracing[0], general)

    def callback(offset: int | None, error: BaseException | None) -> None:
        pass

    publish("str")
    publish(bytearray(b"ba"))
    publish(b"cb", callback)
    publish(b"t", topic="orders")
    publish(b"m", message_id="id-1")
    publish(b"too large")  # over max_record_bytes: refused there
    tracing[0] = True
    publish(b"traced")
    tracing[0] = False
    publish(b"p", None, "by-position")  # its parameters are not keyword-only (a call CPython inlines)
    assert [record for record, _, _ in seen] == [
        "str",
        bytearray(b"ba"),
        b"cb",
        b"t",
        b"m",
        b"too large",
        b"traced",
        b"p",
    ]
    assert seen[2][1] is callback and seen[3][2]["topic"] == "orders" and seen[4][2]["message_id"] == "id-1"
    assert seen[7][2] == {"topic": "by-position", "message_id": None}
    assert inspect.signature(publish) == inspect.signature(general)  # it shows the method's
    assert acc.outstanding == 0 and not acc.lanes[0].segments  # nothing of them queued here


def test_a_segment_keeps_its_records_until_every_piece_of_it_was_prepared() -> None:
    """Two threads may encode calls of one segment at once (one the publishing thread claimed, the next one the
    sender encodes ahead): the piece that ends the segment may be prepared first, and the records must outlive it
    until the earlier piece was prepared too (dropping them then failed a whole call)."""
    segment = Segment(threading.Lock())
    values = [b"v%d" % i for i in range(10)]
    segment.add_values(values, 7, BulkFuture("list", 10), 0)
    segment.close()
    late = segment.prepare(5, 10)  # the next call, encoded ahead, first
    segment.prepared(5)
    early = segment.prepare(0, 5)
    segment.prepared(5)
    framing = ItemFraming(1, 0, "none")
    batch = decode_batch(encode_prepared([early, late], framing), stream="s", lane=0, sequence=0)
    assert [record.value for record in batch] == values
    assert segment.values == [] and segment.stamps == []  # every record prepared: dropped


def test_values_taken_uncounted_by_the_tail_are_counted_before_anything_reads_the_counts() -> None:
    """Behind a call in flight, plain values go to the tail uncounted; every step that reads the counts (the
    sender's look, a claim, ``outstanding_records``, flush) counts them first, so none is missed or counted twice."""
    acc = _accumulator()
    sent: list[Call] = []
    acc.send_now = sent.append
    publish = acc.plain_publisher(100, bool, _general)
    futures = [publish(b"v%d" % i) for i in range(50)]
    assert [call.n_records for call in sent] == [1]  # the first one, then the lane is in flight
    assert acc.tail is acc.lanes[0].segments[-1]  # the rest went to the tail
    assert acc.outstanding_records() == 50
    state = acc.lanes[0]
    assert (state.queued, state.queued_bytes) == (49, sum(len(b"v%d" % i) for i in range(1, 50)))
    more = [publish(b"w") for _ in range(3)]  # the tail opens again after the count
    with acc.lock:
        following = acc.call_settled(state)  # the call in flight settled: the lane is free
        assert following is None and not state.in_flight
        calls, ahead = acc.next_calls()  # type: ignore[misc]
    assert ahead == [] and [call.n_records for call in calls] == [52]
    taken = [piece.segment.values[i] for piece in calls[0].pieces for i in range(piece.start, piece.stop)]
    assert taken == [b"v%d" % i for i in range(1, 50)] + [b"w"] * 3  # in order, each once
    assert [(f._segment, f._index) for f in futures[1:] + more] == [(calls[0].pieces[0].segment, i) for i in range(52)]
    assert acc.outstanding_records() == 53 and state.queued == 0


def test_the_tail_keeps_the_buffer_bound_and_a_closing_publisher_refuses() -> None:
    acc = _accumulator(max_buffered_records=5, max_block_ms=20)
    acc.send_now = lambda call: None
    publish = acc.plain_publisher(100, bool, _general)
    for _ in range(5):
        publish(b"x")  # one in flight, four behind it (three of them uncounted)
    with pytest.raises(PublishTimeoutError):
        publish(b"x")  # the sixth waits for room that never comes
    assert acc.outstanding_records() == 5
    with acc.lock:
        acc.completed(5)
    publish(b"y")
    acc.begin_close()
    with pytest.raises(PublisherClosedError):
        publish(b"z")
    assert acc.outstanding_records() == 1


def test_a_lane_that_goes_idle_takes_no_more_values_on_its_tail() -> None:
    """The tail only takes values while its lane has a call in flight (the call's completion sends them): once the
    lane is free, the next value is claimed and sent at once, as ever."""
    acc = _accumulator()
    sent: list[Call] = []
    acc.send_now = sent.append
    publish = acc.plain_publisher(100, bool, _general)
    publish(b"a")
    publish(b"b")
    with acc.lock:
        acc.call_settled(acc.lanes[0])
        (call,), _ = acc.next_calls()  # type: ignore[misc]
        acc.call_settled(acc.lanes[0])  # that one settled too: the lane is idle and empty
    publish(b"c")
    assert [c.n_records for c in sent] == [1, 1] and call.n_records == 1
    assert acc.tail is acc.no_tail or acc.lanes[0].in_flight


def test_a_whole_call_of_bytes_behind_the_one_in_flight_wakes_the_sender_at_the_value_that_fills_it() -> None:
    acc = _accumulator(max_call_bytes=10)  # a whole call: 10 bytes
    notified: list[int] = []
    acc.work.notify = lambda n=1: notified.append(n)  # type: ignore[method-assign]
    acc.send_now = lambda call: None
    publish = acc.plain_publisher(100, bool, _general)
    publish(b"aaa")  # claimed: in flight
    for value in (b"bbb", b"ccc", b"ddd"):
        publish(value)
    assert notified == [] and acc.outstanding_records() == 4  # 9 bytes behind: not a whole call yet
    publish(b"eee")
    assert notified == [1], "the value that makes 10 bytes wakes the sender, once"
    publish(b"fff")
    assert notified == [1]
    with acc.lock:
        _, (ahead,) = acc.next_calls()  # type: ignore[misc]
    assert ahead.n_records == 3  # a whole call (9 bytes; a fourth value would not fit), encoded ahead
