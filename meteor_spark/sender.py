"""The publisher's sender: the grid I/O of the ring items the accumulator cuts.

At most one ``add_all`` per lane is in flight (the accumulator's ``claim`` marks it): Hazelcast does not promise
the order of concurrent appends (hazelcast/hazelcast#13010), so this is what keeps a publisher's records in order
per lane. Lanes are sent in parallel, by the sender thread or, for an idle lane with ``linger_ms=0``, by the
publishing thread itself.

When the grid answers, the grid client's thread settles the outcome of the stored records (``add_all`` stores its
items contiguously and returns the last sequence), wakes threads blocked on a record future, and frees the lane.
User code (callbacks, done-callbacks) and bulk futures run on the completion thread, never on the grid client's
I/O thread. A failed ``add_all`` fails exactly the records it carried; it is not retried, because a call that
timed out may still have been applied and retrying could duplicate it.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from bisect import bisect_right
from collections.abc import Sequence
from typing import Any

from meteor_spark.accumulator import Accumulator, Call, LaneQueue, Piece
from meteor_spark.errors import GridError, MeteorError
from meteor_spark.grid import result
from meteor_spark.offsets import INDEX_BITS
from meteor_spark.publish_futures import RecordFuture
from meteor_spark.wire import ItemFraming, PreparedColumns, encode_prepared

logger = logging.getLogger("meteor_spark.publisher")


class Sender:
    """Sends what the accumulator hands out to the lanes' rings and completes the futures; owns two threads."""

    def __init__(
        self, accumulator: Accumulator, rings: Sequence[Any], producer_id: int, *, transactional: bool = False
    ) -> None:
        self.acc = accumulator
        self.transactional = transactional
        self.rings = list(rings)
        self.stream = accumulator.stream
        self.producer_id = producer_id
        self._producer_seq = itertools.count()
        self._completions: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.records_sent = 0
        self.items_sent = 0
        self.calls = 0
        self.failed_records = 0
        self._sender = threading.Thread(target=self._send_loop, name=f"meteor-publisher-{self.stream}", daemon=True)
        self._completer = threading.Thread(
            target=self._complete_loop, name=f"meteor-publisher-callbacks-{self.stream}", daemon=True
        )
        self._sender.start()
        self._completer.start()

    def stop(self) -> None:
        """Wait for the sender thread to send what is left (the accumulator is closed), then stop both threads."""
        self._sender.join()
        self._completions.put(None)
        self._completer.join()

    # ------------------------------------------------------------------------------------------------ sending

    def send_all(self, calls: list[Call]) -> None:
        for call in calls:
            self.send(*call)

    def _send_loop(self) -> None:
        while True:
            with self.acc.lock:
                calls = self.acc.next_calls()
            if calls is None:
                return
            self.send_all(calls)

    def send(self, state: LaneQueue, pieces: list[Piece], n_items: int, n_records: int) -> None:
        settings = self.acc.settings
        try:
            items = []
            by_item: list[list[PreparedColumns]] = [[] for _ in range(n_items)]
            for piece in pieces:
                by_item[piece.item].append(piece.segment.prepare(piece.start, piece.stop))
                if piece.stop == piece.segment.n:
                    piece.segment.release()
            for prepared in by_item:
                framing = ItemFraming(
                    self.producer_id, next(self._producer_seq), settings.compression, settings.compression_threshold,
                    self.transactional,
                )
                items.append(encode_prepared(prepared, framing))
            future = self.rings[state.lane].add_all_async(items)
        except BaseException as exc:
            self._stored(state, pieces, n_items, n_records, None, exc)
            return
        future.add_done_callback(lambda f: self._stored(state, pieces, n_items, n_records, f, None))

    def _stored(
        self,
        state: LaneQueue,
        pieces: list[Piece],
        n_items: int,
        n_records: int,
        future: Any,
        error: BaseException | None,
    ) -> None:
        """Runs on the grid client's thread: settle the records' outcomes and free the lane at once.

        Record futures are done by then and their waiters are woken here; callbacks and bulk futures are handed
        to the completion thread (user code never runs on the grid client's thread).
        """
        last_seq = None
        if error is None:
            try:
                last_seq = result(future, f"publish to stream {self.stream!r} lane {state.lane}")
            except MeteorError as exc:
                error = exc
        if error is None and (last_seq is None or last_seq < 0):
            error = GridError(
                f"stream {self.stream!r} lane {state.lane}: the grid refused the write (add_all returned {last_seq})"
            )
        if error is not None:
            logger.warning("stream %r lane %d: publishing %d items failed: %s", self.stream, state.lane, n_items, error)
        first_seq = None if error is not None else last_seq - n_items + 1  # type: ignore[operator]
        acc = self.acc
        with acc.lock:
            state.in_flight = False
            self.calls += 1
            if error is None:
                self.records_sent += n_records
                self.items_sent += n_items
            else:
                self.failed_records += n_records
            told: list[RecordFuture] = []
            for piece in pieces:
                base = 0 if first_seq is None else ((first_seq + piece.item) << INDEX_BITS) + piece.index - piece.start
                told.extend(piece.segment.settle(piece.start, piece.stop, base, error))
            # Callbacks can no longer be added to settled futures (they would run at once), so this is final.
            called = [future for future in told if future.has_callbacks()]
            late = bool(called) or any(piece.segment.targets for piece in pieces)
            if not late:
                acc.completed(n_records)
            if state.queued or acc.closed:
                acc.work.notify()
        for future in told:
            future.wake(error)  # a blocked publish() resumes without waiting for the completion thread
        if late:
            self._completions.put((state.lane, pieces, n_records, first_seq, called, error))

    # ------------------------------------------------------------------------------------------------ completing

    def _complete_loop(self) -> None:
        while True:
            work = self._completions.get()
            if work is None:
                return
            lane, pieces, n_records, first_seq, called, error = work
            try:
                _complete_bulk(lane, pieces, first_seq, error)
                for record_future in called:
                    record_future.call_back()
            except Exception:
                logger.exception("stream %r lane %d: completing a publish failed", self.stream, lane)
            with self.acc.lock:
                self.acc.completed(n_records)

    def fail_queued(self, error: BaseException) -> None:
        """Fail every record still queued (close with a deadline that passed)."""
        with self.acc.lock:
            dropped, told, n = self.acc.drop_queued(error)
            self.failed_records += n
        for segment in dropped:
            for t_start, t_count, sink, _ in segment.targets:
                if t_start + t_count > segment.pos:
                    sink.fail(error)
        for record_future in told:
            record_future.wake(error)
            record_future.call_back()


def _complete_bulk(lane: int, pieces: list[Piece], first_seq: int | None, error: BaseException | None) -> None:
    """Give the bulk futures (``publish_many``, ``publish_arrow``) their part of the stored pieces."""
    for piece in pieces:
        segment = piece.segment
        targets = segment.targets
        if not targets:
            continue
        i = 0 if len(targets) == 1 else max(0, bisect_right(segment.target_starts(), piece.start) - 1)
        while i < len(targets):
            t_start, t_count, sink, sink_pos = targets[i]
            if t_start >= piece.stop:
                break
            lo = max(t_start, piece.start)
            hi = min(t_start + t_count, piece.stop)
            if hi > lo:
                if first_seq is None:
                    sink.fail(error)  # type: ignore[arg-type]
                else:
                    base = ((first_seq + piece.item) << INDEX_BITS) + piece.index - piece.start
                    sink.deliver(sink_pos + lo - t_start, base + lo, hi - lo, lane)
            i += 1
