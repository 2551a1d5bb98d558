"""Encode-ahead: while a lane's ``add_all`` is in flight, the publisher encodes the next whole call, and sends it
the moment the first settles; order per lane, offsets and idempotent retries stay as without it."""

from __future__ import annotations

import threading
from typing import Any

from hazelcast.future import Future

from meteor_spark.errors import GridConnectionError
from meteor_spark.format.item_header import item_producer
from meteor_spark.format.offsets import first_offset_of
from meteor_spark.format.wire import decode_item
from meteor_spark.grid.client import Grid
from meteor_spark.grid.streams import StreamConfig
from meteor_spark.producer.publisher import Publisher
from meteor_spark.testing import wait_until

# Calls of 2 items of 10 records: 20 records make a whole call.
SMALL_CALLS = {"max_batch_records": 10, "max_items_per_call": 2, "linger_ms": 0}


class HeldCalls:
    """Wraps a lane's ``add_all_async``: every call goes to the grid at once, but its answer reaches the publisher
    only when the test releases it (but call ``lose_call``'s answer is lost, after it was stored)."""

    def __init__(self, ring: Any, lose_call: int | None = None) -> None:
        self.original = ring.add_all_async
        self.lose_call = lose_call
        self.calls: list[list[bytes]] = []
        self.held: list[tuple[Any, Future[Any]]] = []
        self.lock = threading.Lock()
        self.holding = True

    def __call__(self, items: Any, overflow_policy: int = 0) -> Future[Any]:
        real = self.original(items, overflow_policy)
        if not self.holding:
            return real
        answer: Future[Any] = Future()
        with self.lock:
            self.calls.append([bytes(item) for item in items])
            if len(self.calls) - 1 == self.lose_call:
                real.result()
                answer.set_exception(GridConnectionError("add_all: connection reset (test)"))
                return answer
            self.held.append((real, answer))
        return answer

    def __enter__(self) -> HeldCalls:
        return self

    def __exit__(self, *exc: object) -> None:
        """Stop holding answers (a failed test must not leave the publisher's close waiting for them)."""
        self.holding = False
        self.release_all()

    def release_all(self) -> None:
        with self.lock:
            held, self.held = self.held, []
        for real, answer in held:
            answer.set_result(real.result())


def _lane(grid: Grid, name: str) -> list[tuple[int, bytes]]:
    ring = grid.ring(f"meteor.stream::{name}.0")
    batch = ring.read_many(ring.head(), 0, 1000)
    return list(zip(batch.sequences, batch.items, strict=True))


def _call_values(items: list[bytes]) -> list[bytes]:
    out: list[bytes] = []
    for item in items:
        view = decode_item(item, stream="s", lane=0, sequence=0)
        data, offsets = bytes(view.value_data), view.value_offsets
        out.extend(data[offsets[i] : offsets[i + 1]] for i in range(view.count))
    return out


def _values(grid: Grid, name: str) -> list[bytes]:
    out: list[bytes] = []
    for sequence, item in _lane(grid, name):
        view = decode_item(item, stream=name, lane=0, sequence=sequence)
        data, offsets = bytes(view.value_data), view.value_offsets
        out.extend(data[offsets[i] : offsets[i + 1]] for i in range(view.count))
    return out


def test_the_next_call_is_encoded_while_one_is_in_flight_and_sent_when_it_settles(
    grid: Grid, unique_name: str, monkeypatch: Any
) -> None:
    values = [f"r{i:03d}".encode() for i in range(60)]
    with Publisher(grid, StreamConfig(unique_name), **SMALL_CALLS) as pub:  # type: ignore[arg-type]
        held = HeldCalls(pub._sender.rings[0])
        monkeypatch.setattr(pub._sender.rings[0], "add_all_async", held)
        with held:
            offsets = _publish_behind_a_held_call(pub, held, values)
    assert _values(grid, unique_name) == values  # every record once, in order
    stored = _lane(grid, unique_name)
    assert offsets[0] == first_offset_of(stored[0][0]) and len(set(offsets)) == len(values)
    producer_seqs = [item_producer(item, stream=unique_name, lane=0, sequence=seq).producer_seq for seq, item in stored]
    assert producer_seqs == sorted(producer_seqs)


def _publish_behind_a_held_call(pub: Publisher, held: HeldCalls, values: list[bytes]) -> list[int]:
    """Publish 5 records, hold the answer, queue 55 more behind them, then release the answers one by one."""
    first = pub.publish_many(values[:5])  # an idle lane: sent at once, its answer held
    wait_until(lambda: len(held.calls) == 1, timeout_s=10, message="the first call")
    rest = pub.publish_many(values[5:])  # 55 records queued behind it: whole calls of 20
    lane = pub._sender.acc.lanes[0]
    wait_until(lambda: lane.ahead is not None, timeout_s=10, message="a call encoded ahead")
    assert len(held.calls) == 1  # encoded, not sent: one add_all in flight per lane
    assert lane.ahead.n_records == 20 and lane.queued == 35
    held.release_all()  # the first call settles: the call encoded ahead leaves at once
    wait_until(lambda: len(held.calls) == 2, timeout_s=10, message="the call encoded ahead")
    assert _call_values(held.calls[1]) == values[5:25]  # the whole call encoded ahead, as it was cut
    while not (first.done() and rest.done()):
        held.release_all()
        wait_until(lambda: held.held or (first.done() and rest.done()), timeout_s=10, message="the next call")
    return first.result(10) + rest.result(10)


def test_a_call_encoded_ahead_whose_answer_is_lost_is_looked_up_with_the_items_it_was_encoded_with(
    grid: Grid, unique_name: str, monkeypatch: Any
) -> None:
    values = [f"v{i:03d}".encode() for i in range(45)]
    with Publisher(grid, StreamConfig(unique_name), idempotent=True, **SMALL_CALLS) as pub:  # type: ignore[arg-type]
        held = HeldCalls(pub._sender.rings[0], lose_call=1)
        monkeypatch.setattr(pub._sender.rings[0], "add_all_async", held)
        with held:
            first = pub.publish_many(values[:5])
            wait_until(lambda: len(held.calls) == 1, timeout_s=10, message="the first call")
            rest = pub.publish_many(values[5:])
            lane = pub._sender.acc.lanes[0]
            wait_until(lambda: lane.ahead is not None, timeout_s=10, message="a call encoded ahead")
            encoded_ahead = [bytes(item) for item in lane.ahead.items]
            held.release_all()  # the call encoded ahead leaves; it is stored but its answer is lost
            wait_until(lambda: pub.metrics()["recovered_calls"] == 1, timeout_s=10, message="the lost call found")
            while not (first.done() and rest.done()):
                held.release_all()
                wait_until(lambda: held.held or (first.done() and rest.done()), timeout_s=10, message="next call")
            first.result(10)
            rest.result(10)
        assert held.calls[1] == encoded_ahead
        assert pub.metrics()["resent_calls"] == 0
    assert _values(grid, unique_name) == values  # nothing twice, nothing lost, in order
    pairs = [
        (producer.producer_id, producer.producer_seq)
        for producer in (
            item_producer(item, stream=unique_name, lane=0, sequence=seq) for seq, item in _lane(grid, unique_name)
        )
    ]
    assert len(pairs) == len(set(pairs))
