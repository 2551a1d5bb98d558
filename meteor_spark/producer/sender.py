"""The publisher's sender: the grid I/O of the ring items the accumulator cuts.

At most one ``add_all`` per lane is in flight (the accumulator's ``claim`` marks it): Hazelcast does not promise
the order of concurrent appends (hazelcast/hazelcast#13010), so this is what keeps a publisher's records in order
per lane. Lanes are sent in parallel, by the sender thread or, for an idle lane with ``linger_ms=0``, by the
publishing thread itself.

Encode-ahead: while a lane's call is in flight and a whole call (``max_items_per_call`` full items, or
``max_call_bytes``) is queued behind it, the sender thread cuts and encodes that call, producer sequences
included, and parks it on the lane; when the call in flight settles, the grid client's thread sends the parked
call at once. Encoding thus overlaps the grid's work instead of following it (at 1 KiB records it took about as
long as the call itself). One call in flight per lane still holds: the parked call is sent only after its
predecessor settled (retries included). A partial call is never encoded ahead: records arriving meanwhile would
otherwise go in calls of their own.

When the grid answers, the grid client's thread settles the outcome of the stored records (``add_all`` stores its
items contiguously and returns the last sequence), wakes threads blocked on a record future, and frees the lane.
User code (callbacks, done-callbacks) and bulk futures run on the completion thread, never on the grid client's
I/O thread.

A failed ``add_all`` whose outcome is unknown (connection lost before the answer, invocation timeout) may still
have been applied, so sending it again blindly could store its records twice. With ``idempotent`` (the default) the
call goes to the retrier (``meteor_spark.producer.idempotence``), which looks for the call's items in the lane by
producer id and sequence, settles the records from there when they were stored and sends the same items again when they
were not, until ``delivery_timeout_ms``; the lane stays claimed meanwhile, so order per lane holds. To know where to
look, the sender keeps per lane the first sequence its next call can occupy: one past its last stored item, and
before the lane's first call one past the lane's tail, read for every lane (in parallel) when the publisher starts.
Without ``idempotent`` such a call fails exactly the records it carried. A failure that stored nothing for sure (a
refused write, a bad argument) fails them either way.

Every item carries the lane's largest timestamp so far (``lane_max_ts``, the time index of
``meteor_spark.format.wire``). The sender continues it from the lane's last item: when the publisher starts, every
lane's tail is read and then its last item (in parallel, two round trips in all), and a lane's first call waits for that
answer before it is encoded; from there on the sender raises it with every item it encodes (in lane order: one call is
encoded at a time per lane). A publisher restart therefore continues the lane's value, never restarts it. Publishers
writing one lane at the same moment each continue the value they read when they started, so an item's ``lane_max_ts``
covers its own publisher's records and the lane as it was when that publisher started (see
``meteor_spark.grid.timestamps``).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from bisect import bisect_right
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np

from meteor_spark.errors import GridError, MeteorError
from meteor_spark.format.item_encoding import (
    ItemFraming,
    PreparedColumns,
    encode_items_and_lane_max,
    encode_small_item,
    shrank,
)
from meteor_spark.format.item_header import NO_TIMESTAMP
from meteor_spark.format.offsets import INDEX_BITS
from meteor_spark.format.wire import lane_max_after
from meteor_spark.grid.client import Ring, result, translate_errors
from meteor_spark.producer.accumulator import Accumulator, LaneQueue
from meteor_spark.producer.calls import Call, PendingCall, Piece
from meteor_spark.producer.futures import RecordFuture
from meteor_spark.producer.idempotence import Retrier, outcome_unknown

logger = logging.getLogger("meteor_spark.producer.publisher")


class Sender:
    """Sends what the accumulator hands out to the lanes' rings and completes the futures; owns two threads."""

    def __init__(
        self, accumulator: Accumulator, rings: Sequence[Any], producer_id: int, *, transactional: bool = False
    ) -> None:
        self.acc = accumulator
        accumulator.send_now = self.send
        self.transactional = transactional
        self.rings = list(rings)
        self.stream = accumulator.stream
        self.producer_id = producer_id
        self._completions: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.records_sent = 0
        self.items_sent = 0
        self.calls = 0
        self.failed_records = 0
        settings = accumulator.settings
        self.idempotent = settings.idempotent
        self._delivery_timeout_s = settings.delivery_timeout_ms / 1000.0
        # Per lane, the first ring sequence the next call can occupy (None: not known before the lane's first call).
        self._next_start: list[int | None] = [None] * len(self.rings)
        self.retrier = None
        if self.idempotent:
            self.retrier = Retrier(self.stream, self.rings, producer_id, self._attempt, self._settle_pending)
        # Every lane's tail, read at once and in parallel: the lower bound of the lane's first call (idempotence)
        # and where the lane's last item is, whose lane_max_ts the lane's first item continues. Ready (or nearly)
        # when the first call is encoded, so a short-lived publisher pays about two round trips, not two per lane.
        self._tails: list[Any] = [ring.tail_async() for ring in self.rings]
        self._last_items: list[Future[Any]] = [self._read_last(lane) for lane in range(len(self.rings))]
        # Per lane, the lane's largest timestamp so far (None: not known before the lane's first call).
        self._lane_max: list[int | None] = [None] * len(self.rings)
        # Per lane, whether LZ4 shrank the last item encoded: then the next call's first item is compressed without
        # probing a sample first (about 9 us a call of 100 KiB items), as the items behind it within a call are.
        self._shrank: list[bool] = [False] * len(self.rings)
        self._sender = threading.Thread(target=self._send_loop, name=f"meteor-publisher-{self.stream}", daemon=True)
        self._completer = threading.Thread(
            target=self._complete_loop, name=f"meteor-publisher-callbacks-{self.stream}", daemon=True
        )
        self._sender.start()
        self._completer.start()

    def stop(self) -> None:
        """Wait for the sender thread to send what is left (the accumulator is closed), then stop both threads."""
        self._sender.join()
        if self.retrier is not None:
            self.retrier.stop()
        self._completions.put(None)
        self._completer.join()

    def lane_floor(self, lane: int) -> int:
        """A ring sequence at or below where this publisher's next write in ``lane`` lands: one past its last item
        stored there (idempotent publishers track it), else one past the tail read when the publisher started."""
        start = self._next_start[lane]
        if start is not None:
            return start
        return result(self._tails[lane], f"tail of stream {self.stream!r} lane {lane}") + 1

    # ------------------------------------------------------------------------------------------------ sending

    def send_all(self, calls: list[Call]) -> None:
        for call in calls:
            self.send(call)

    def _send_loop(self) -> None:
        while True:
            with self.acc.lock:
                work = self.acc.next_calls()
            if work is None:
                return
            calls, ahead = work
            self.send_all(calls)
            for call in ahead:
                self._encode_ahead(call)

    def send(self, call: Call) -> None:
        """Encode a claimed call and send it (the lane is claimed: nothing else sends on it meanwhile)."""
        try:
            pending = self._encode(call)
        except BaseException as exc:
            self._settle(call, None, exc)
            return
        self._dispatch(pending, may_block=True)

    def _encode_ahead(self, call: Call) -> None:
        """Encode the next call of a lane whose call is in flight (the sender thread), so that it leaves the moment
        that call settles: encoding overlaps the grid's work instead of following it. The encoded call keeps its
        producer sequences, after the ones in flight; the lane stays claimed throughout, so order holds."""
        acc = self.acc
        try:
            pending: PendingCall | None = self._encode(call)
        except BaseException as exc:
            self._settle(call, None, exc, ends_call=False)
            pending = None
        with acc.lock:
            send_now = acc.encoded_ahead(call.state, pending)
        if send_now and pending is not None:
            self._dispatch(pending, may_block=True)

    def _encode(self, call: Call) -> PendingCall:
        """The ring items of a call, each with its producer id and sequence (the idempotence key): ``first_seq``
        on, as the accumulator reserved them when it cut the call."""
        settings = self.acc.settings
        pieces = call.pieces
        small = None
        if len(pieces) == 1:  # one item of one piece: few records may skip the columns (``encode_small_item``)
            piece = pieces[0]
            small = piece.segment.small_values(piece.start, piece.stop)
        by_item: list[list[PreparedColumns]] = [[] for _ in range(call.n_items)]
        # Counted once per segment and call, not per piece: an Arrow bulk's segment is cut into many items of one
        # call, and each count takes the accumulator's lock (contended by the publishing thread).
        counts: dict[Any, int] = {}
        try:
            for piece in pieces:
                if small is None:
                    by_item[piece.item].append(piece.segment.prepare(piece.start, piece.stop))
                counts[piece.segment] = counts.get(piece.segment, 0) + piece.stop - piece.start
        finally:  # the pieces prepared before one that failed count, as when each was counted on its own
            for segment, count in counts.items():
                segment.prepared(count)
        lane = call.state.lane
        lane_max = self._lane_max[lane]
        if lane_max is None:
            lane_max = self._lane_max_at_start(lane)
        framing = ItemFraming(
            self.producer_id,
            call.first_seq,
            settings.compression,
            settings.compression_threshold,
            self.transactional,
            lane_max,
            not self._shrank[lane],
        )
        if small is not None:
            item, self._lane_max[lane] = encode_small_item(*small, framing)
            items = [item]
        else:
            items, self._lane_max[lane] = encode_items_and_lane_max(by_item, framing)
        self._shrank[lane] = shrank(items[-1])
        return PendingCall(call, items)

    def _read_last(self, lane: int) -> Future[Any]:
        """The lane's last item once the tail read answers (None for an empty lane), read without blocking."""
        found: Future[Any] = Future()

        def read(tail_future: Any) -> None:
            try:
                tail = tail_future.result()
                if tail < 0:
                    found.set_result(None)
                    return
                self.rings[lane].read_many_async(tail, 0, 1).add_done_callback(got)
            except BaseException as exc:
                found.set_exception(exc)

        def got(read_future: Any) -> None:
            try:
                batch = Ring.to_batch(read_future.result())
                found.set_result((batch.sequences[0], batch.items[0]) if batch.items else None)
            except BaseException as exc:
                found.set_exception(exc)

        self._tails[lane].add_done_callback(read)
        return found

    def _lane_max_at_start(self, lane: int) -> int:
        """The lane's largest timestamp when this publisher started (its last item's, see ``wire.lane_max_after``).
        Waits for the read started with the publisher; when that read failed, reads again (an error here fails the
        call like a failed send). An undecodable last item adds nothing (logged): the lane continues from the
        publisher's own records."""
        last: tuple[int, Any] | None
        try:
            with translate_errors(f"last item of stream {self.stream!r} lane {lane}"):
                last = self._last_items[lane].result()
        except GridError:
            ring = self.rings[lane]
            tail = ring.tail()
            batch = ring.read_many(tail, 0, 1) if tail >= 0 else None
            last = (batch.sequences[0], batch.items[0]) if batch is not None and batch.items else None
        if last is None:
            return NO_TIMESTAMP
        sequence, item = last
        try:
            return lane_max_after(item, stream=self.stream, lane=lane, sequence=sequence)
        except MeteorError as exc:
            logger.warning(
                "stream %r lane %d: %s; the lane's largest timestamp starts from this publisher's records",
                self.stream,
                lane,
                exc,
            )
            return NO_TIMESTAMP

    def _dispatch(self, pending: PendingCall, *, may_block: bool) -> None:
        """Send an encoded call. ``may_block`` False on the grid client's thread (a call encoded ahead, sent when
        its predecessor settles): a lane start not known yet is then left to the retrier instead of waited for."""
        call = pending.call
        try:
            if self.retrier is not None:
                self._dispatch_idempotent(pending, may_block)
                return
            future = self.rings[call.state.lane].add_all_async(pending.items)
        except BaseException as exc:
            self._settle(call, None, exc)
            return
        future.add_done_callback(lambda f: self._stored(call, f))

    def _dispatch_idempotent(self, pending: PendingCall, may_block: bool) -> None:
        """Send the first attempt of an idempotent call once the first ring sequence it can occupy is known (else
        the retrier takes it over)."""
        assert self.retrier is not None
        lane = pending.lane
        pending.begin(time.monotonic() + self._delivery_timeout_s, self._next_start[lane])
        if pending.start is None:
            # The lane's first call lands after the tail read when the publisher started.
            tail = self._tails[lane]
            if not may_block and not tail.done():
                self.retrier.submit(pending)  # it reads the tail once the grid answers, then sends
                return
            try:
                pending.starts_at(result(tail, f"tail of stream {self.stream!r} lane {lane}") + 1)
            except GridError as exc:
                if not outcome_unknown(exc):
                    raise
                self.retrier.submit(pending)
                return
        self._attempt(pending)

    def _attempt(self, call: PendingCall) -> None:
        """Send one attempt of an idempotent call (from the publishing, sender or retry thread)."""
        call.attempted()
        try:
            future = self.rings[call.lane].add_all_async(call.items)
        except BaseException as exc:
            self._answered(call, None, exc)
            return
        future.add_done_callback(lambda f: self._answered(call, f, None))

    def _answered(self, call: PendingCall, future: Any, error: BaseException | None) -> None:
        """Runs on the grid client's thread: settle an idempotent call, or hand it to the retrier when its outcome
        is unknown."""
        if error is None:
            try:
                last_seq = result(future, f"publish to stream {self.stream!r} lane {call.lane}")
            except MeteorError as exc:
                error = exc
        if error is not None and outcome_unknown(error) and self.retrier is not None:
            logger.info(
                "stream %r lane %d: the answer to publishing %d items was lost (%s); checking the lane before retrying",
                self.stream,
                call.lane,
                call.n_items,
                error,
            )
            self.retrier.submit(call, error)
            return
        if error is not None:
            self._settle_pending(call, None, error)
        else:
            self._settle_pending(call, last_seq, None)

    def _settle_pending(self, call: PendingCall, last_seq: int | None, error: BaseException | None) -> None:
        if error is None and last_seq is not None and last_seq >= 0:
            self._next_start[call.lane] = last_seq + 1
        self._settle(call.call, last_seq, error)

    def _stored(self, call: Call, future: Any) -> None:
        """Runs on the grid client's thread: the answer to a call of a publisher without idempotence."""
        last_seq = None
        error: BaseException | None = None
        try:
            last_seq = result(future, f"publish to stream {self.stream!r} lane {call.state.lane}")
        except MeteorError as exc:
            error = exc
        self._settle(call, last_seq, error)

    def _settle(self, call: Call, last_seq: int | None, error: BaseException | None, *, ends_call: bool = True) -> None:
        """Settle the records' outcomes and pass the lane on (the grid client's thread, or the retrier's): to the
        call encoded ahead, sent at once; to the encoder still at it; or free.

        Record futures are done by then and their waiters are woken here; callbacks and bulk futures are handed
        to the completion thread (user code never runs on the grid client's thread). ``ends_call`` False: the
        records of a call that never went out (failed encoding ahead, dropped at close); the lane stays as it is.
        """
        state = call.state
        if error is None and (last_seq is None or last_seq < 0):
            error = GridError(
                f"stream {self.stream!r} lane {state.lane}: the grid refused the write (add_all returned {last_seq})"
            )
        if error is not None:
            logger.warning(
                "stream %r lane %d: publishing %d items failed: %s", self.stream, state.lane, call.n_items, error
            )
        first_seq = None if error is not None else last_seq - call.n_items + 1  # type: ignore[operator]
        acc = self.acc
        following: PendingCall | None = None
        with acc.lock:
            if ends_call:
                following = acc.call_settled(state)  # the call encoded ahead, if any: the lane stays claimed for it
                self.calls += 1
            if error is None:
                self.records_sent += call.n_records
                self.items_sent += call.n_items
            else:
                self.failed_records += call.n_records
            told = _settle_pieces(call.pieces, first_seq, error)
            # Callbacks can no longer be added to settled futures (they would run at once), so this is final.
            called = [future for future in told if future.has_callbacks()]
            late = bool(called) or any(piece.segment.targets for piece in call.pieces)
            if not late:
                acc.completed(call.n_records)
            acc.wake_for(state)
        if following is not None:
            self._dispatch(following, may_block=False)
        for future in told:
            future.wake(error)  # a blocked publish() resumes without waiting for the completion thread
        if late:
            self._completions.put((call, first_seq, called, error))

    # ------------------------------------------------------------------------------------------------ completing

    def complete_later(self, work: Any) -> None:
        """Run ``work()`` on the completion thread, after what is queued there (user callbacks run only there)."""
        self._completions.put(work)

    def _complete_loop(self) -> None:
        while True:
            work = self._completions.get()
            if work is None:
                return
            if callable(work):
                try:
                    work()
                except Exception:
                    logger.exception("stream %r: completing a publish failed", self.stream)
                continue
            call, first_seq, called, error = work
            try:
                _complete_bulk(call.state.lane, call.pieces, first_seq, error)
                for record_future in called:
                    record_future.call_back()
            except Exception:
                logger.exception("stream %r lane %d: completing a publish failed", self.stream, call.state.lane)
            with self.acc.lock:
                self.acc.completed(call.n_records)

    def fail_queued(self, error: BaseException) -> None:
        """Fail every record still queued, and every call waiting for a retry (close with a deadline that passed)."""
        if self.retrier is not None:
            self.retrier.give_up(error)
        with self.acc.lock:
            dropped, told, n = self.acc.drop_queued(error)
            self.failed_records += n
            ahead = [pending for pending in map(LaneQueue.drop_ahead, self.acc.lanes) if pending is not None]
        for pending in ahead:
            self._settle(pending.call, None, error, ends_call=False)
        for segment in dropped:
            for t_start, t_count, sink, _ in segment.targets:
                if t_start + t_count > segment.pos:
                    sink.fail(error)
        for record_future in told:
            record_future.wake(error)
            record_future.call_back()


def _settle_pieces(pieces: list[Piece], first_seq: int | None, error: BaseException | None) -> list[RecordFuture]:
    """Record the outcome of a call's pieces in their segments (lock held); returns the watched record futures."""
    told: list[RecordFuture] = []
    for piece in pieces:
        base = 0 if first_seq is None else ((first_seq + piece.item) << INDEX_BITS) + piece.index - piece.start
        told.extend(piece.segment.settle(piece.start, piece.stop, base, error))
    return told


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
                    if isinstance(sink_pos, np.ndarray):
                        sink.deliver(sink_pos[lo - t_start : hi - t_start], base + lo, hi - lo, lane)
                    else:
                        sink.deliver(sink_pos + lo - t_start, base + lo, hi - lo, lane)
            i += 1
