"""The publisher's accumulator: records queued per lane, cut into ring items, with bounded buffering.

No grid and no threads here: the accumulator holds the queues and the counts under one lock, and answers the
sender's questions (which lane is ready, what goes in its next ``add_all``). Its rules:

- At most ``max_buffered_records`` records are accepted but not yet completed; ``admit`` waits up to
  ``max_block_ms`` for room, then raises ``PublishTimeoutError`` (a bulk larger than the buffer waits for an empty
  buffer).
- A lane is cut into ring items of at most ``max_batch_records`` records and ``max_batch_bytes`` bytes (a record
  larger than that travels alone), and calls of at most ``max_items_per_call`` items and ``max_call_bytes`` bytes
  (a record larger than that travels alone in its call). A call takes a further item only when that item fits
  whole (as far as the records of the segment it starts in show), so calls are not padded with a short item.
- At most one call per lane is in flight (``claim`` marks it, the sender's completion frees it): that is what keeps
  a publisher's records in order per lane.
- A lane is ready when it has records and no call in flight, and its linger ended, a batch filled up, or a flush or
  close is under way.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left, bisect_right, insort
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from meteor_spark.errors import ConfigError, PublisherClosedError, PublishTimeoutError
from meteor_spark.format.records import Record
from meteor_spark.format.wire import PreparedColumns, header_bytes, prepare_columns
from meteor_spark.grid.streams import lane_for_key
from meteor_spark.producer.futures import BulkFuture, RecordFuture

if TYPE_CHECKING:
    from meteor_spark.format.arrow_columns import ArrowColumns
    from meteor_spark.producer.batching import PublisherSettings
_AFTER_ANY = float("inf")


def _start_of(outcome: tuple[int, int, int, BaseException | None]) -> int:
    return outcome[0]


def _index_of(future: RecordFuture) -> int:
    return future._index


class Segment:
    """Records queued for one lane, in order: Python lists (single publishes, ``publish_many``) or Arrow arrays.

    ``targets`` maps runs of the segment's records to bulk futures: ``(first record, count, future, position in
    it)``. Single records have ``RecordFuture`` s instead, which read ``outcomes``: one ``(start, stop, base,
    error)`` per stored (or failed) piece, sorted by start; record ``i`` of a stored piece has offset ``base + i``.
    ``watched`` are the record futures, sorted by index, that must be told of their outcome.
    """

    __slots__ = (
        "_cum",
        "_starts",
        "arrow",
        "headers",
        "keys",
        "lock",
        "n",
        "nbytes",
        "open",
        "outcomes",
        "pos",
        "singles",
        "stamps",
        "targets",
        "values",
        "watched",
    )

    def __init__(self, lock: Any) -> None:
        self.lock = lock  # the accumulator's
        self.values: list[bytes] = []
        self.keys: list[bytes | None] | None = None
        self.headers: list[tuple[tuple[str, bytes], ...]] | None = None
        self.stamps: list[int] = []
        self.arrow: ArrowColumns | None = None
        self.n = 0
        self.pos = 0
        self.nbytes = 0
        self.open = True
        self.targets: list[tuple[int, int, BulkFuture, int]] = []
        self.singles = False  # holds records of publish_async (with record futures)
        # Only appended to, or replaced, so futures read it without the lock.
        self.outcomes: list[tuple[int, int, int, BaseException | None]] = []
        self.watched: list[RecordFuture] = []
        self._cum: np.ndarray | None = None
        self._starts: list[int] | None = None

    @classmethod
    def of_arrow(cls, lock: Any, columns: ArrowColumns, future: BulkFuture) -> Segment:
        """A closed segment holding the rows of one Arrow bulk for one lane."""
        segment = cls(lock)
        segment.arrow = columns
        segment.n = columns.count
        segment.nbytes = int(segment.cumulative_bytes()[-1])
        segment.open = False
        segment.targets = [(0, segment.n, future, 0)]
        return segment

    # ----------------------------------------------------------------------------------------- record futures

    def outcome(self, index: int) -> tuple[int | None, BaseException | None] | None:
        """``(offset, None)`` or ``(None, error)`` once record ``index`` was stored or failed, else None."""
        outcomes = self.outcomes
        # Tuples compare by start first: no Python key function on this path.
        k = bisect_right(outcomes, (index, _AFTER_ANY)) - 1
        if k < 0:
            return None
        _, stop, base, error = outcomes[k]
        if index >= stop:
            return None
        return (None, error) if error is not None else (base + index, None)

    def watch(self, future: RecordFuture, done_callback: Callable[[Any], object] | None = None) -> bool:
        """Give ``future`` its synchronisation objects and have it told of its outcome; False when already done."""
        with self.lock:
            state = future.__dict__
            if "_condition" not in state:
                state["_condition"] = threading.Condition()
                state["_waiters"] = []
                state["_done_callbacks"] = []
            if self.outcome(future._index) is not None:
                return False
            if done_callback is not None:
                state["_done_callbacks"].append(done_callback)
            self.watch_locked(future)
            return True

    def watch_locked(self, future: RecordFuture) -> None:
        watched = self.watched
        if not watched or watched[-1]._index < future._index:
            watched.append(future)
        elif future not in watched:
            insort(watched, future, key=_index_of)

    def settle(self, start: int, stop: int, base: int, error: BaseException | None) -> list[RecordFuture]:
        """Record the outcome of records ``[start, stop)`` (lock held); returns the watched futures among them."""
        if not self.singles:
            return []
        outcome = (start, stop, base, error)
        if not self.outcomes or self.outcomes[-1][0] < start:
            self.outcomes.append(outcome)  # in order (the usual case): readers see a consistent prefix
        else:
            outcomes = list(self.outcomes)  # out of order (close failing queued records): copy, then swap
            insort(outcomes, outcome, key=_start_of)
            self.outcomes = outcomes
        watched = self.watched
        if not watched:
            return []
        lo = bisect_left(watched, start, key=_index_of)
        hi = bisect_left(watched, stop, lo, key=_index_of)
        told = watched[lo:hi]
        del watched[lo:hi]
        return told

    # ----------------------------------------------------------------------------------------- appending

    def add(self, record: Record, stamp: int, sink: BulkFuture | None = None, sink_pos: int = 0) -> int:
        """Append one record; returns its size in bytes."""
        if sink is not None:
            self._target(sink, sink_pos, 1)
        self.values.append(record.value)
        size = len(record.value)
        if record.key is not None:
            if self.keys is None:
                self.keys = [None] * self.n
            self.keys.append(record.key)
            size += len(record.key)
        elif self.keys is not None:
            self.keys.append(None)
        if record.headers:
            if self.headers is None:
                self.headers = [()] * self.n
            self.headers.append(record.headers)
            size += sum(len(k) + len(v) for k, v in record.headers)
        elif self.headers is not None:
            self.headers.append(())
        self.stamps.append(stamp)
        self.n += 1
        self.nbytes += size
        return size

    def add_value(self, value: bytes, stamp: int) -> int:
        """Append one plain value (no key, no headers, no sink): ``publish_async``'s hot path; returns its size."""
        self.values.append(value)
        if self.keys is not None:
            self.keys.append(None)
        if self.headers is not None:
            self.headers.append(())
        self.stamps.append(stamp)
        self.n += 1
        size = len(value)
        self.nbytes += size
        return size

    def add_values(self, values: list[bytes], stamp: int, sink: BulkFuture, sink_pos: int) -> int:
        """Append plain values (no key, no headers); returns their size in bytes."""
        self._target(sink, sink_pos, len(values))
        self.values.extend(values)
        if self.keys is not None:
            self.keys.extend([None] * len(values))
        if self.headers is not None:
            self.headers.extend([()] * len(values))
        self.stamps.extend([stamp] * len(values))
        size = sum(map(len, values))
        self.n += len(values)
        self.nbytes += size
        return size

    def _target(self, sink: BulkFuture, sink_pos: int, count: int) -> None:
        targets = self.targets
        if targets:
            start, run, last_sink, last_pos = targets[-1]
            # Consecutive records of one bulk publish share one run (cheaper to complete).
            if last_sink is sink and start + run == self.n and last_pos + run == sink_pos:
                targets[-1] = (start, run + count, sink, last_pos)
                return
        targets.append((self.n, count, sink, sink_pos))

    def target_starts(self) -> list[int]:
        """First record of each target run (only called once the segment is closed)."""
        if self._starts is None:
            self._starts = [t[0] for t in self.targets]
        return self._starts

    def cumulative_bytes(self) -> np.ndarray:
        """Prefix sums of per-record sizes (only called once the segment is closed)."""
        if self._cum is None:
            if self.arrow is not None:
                self._cum = self.arrow.cumulative_bytes()
                return self._cum
            sizes = np.fromiter(map(len, self.values), dtype=np.int64, count=self.n)
            if self.keys is not None:
                sizes += np.fromiter((0 if k is None else len(k) for k in self.keys), dtype=np.int64, count=self.n)
            if self.headers is not None:
                sizes += header_bytes(self.headers)
            cum = np.zeros(self.n + 1, dtype=np.int64)
            np.cumsum(sizes, out=cum[1:])
            self._cum = cum
        return self._cum

    def release(self) -> None:
        """Drop the records once the last piece is encoded: a future kept by the user keeps its segment alive, and
        must not keep every record of it too (outcomes and counts stay)."""
        self.values = []
        self.keys = self.headers = None
        self.stamps = []
        self.arrow = None
        self._cum = None

    def prepare(self, start: int, stop: int) -> PreparedColumns:
        if self.arrow is not None:
            return self.arrow.prepare(start, stop)
        return prepare_columns(
            self.values[start:stop],
            keys=None if self.keys is None else self.keys[start:stop],
            headers=None if self.headers is None else self.headers[start:stop],
            timestamps=self.stamps[start:stop],
        )


@dataclass
class Piece:
    """Records ``[start, stop)`` of a segment, going as records ``index...`` of ring item ``item`` of a call."""

    segment: Segment
    start: int
    stop: int
    item: int  # index of the ring item within its add_all call
    index: int  # index of the piece's first record within that item


class LaneQueue:
    """What is queued for one lane: its segments, their count and bytes, and whether a call is in flight."""

    __slots__ = (
        "ahead",
        "encoding",
        "in_flight",
        "lane",
        "lock",
        "previous_done",
        "queued",
        "queued_bytes",
        "segments",
        "since",
    )

    def __init__(self, lane: int, lock: Any) -> None:
        self.lane = lane
        self.lock = lock  # the accumulator's
        self.segments: deque[Segment] = deque()
        self.queued = 0
        self.queued_bytes = 0
        self.since = 0.0
        self.in_flight = False
        # Encode-ahead (the sender's): the lane's next call, encoded while the current one is in flight, or being
        # encoded; ``previous_done`` says the call in flight settled while its successor was still being encoded
        # (the lane stays claimed: the encoder sends it).
        self.ahead: Any = None
        self.encoding = False
        self.previous_done = False

    def open_segment(self) -> Segment:
        if self.segments:
            last = self.segments[-1]
            if last.open and last.arrow is None:
                return last
        segment = Segment(self.lock)
        self.segments.append(segment)
        return segment


#: What ``claim`` (and ``cut``) hands the sender: the lane, its pieces, the number of ring items and of records, and
#: the producer sequence of its first item (its items take the sequences from there on).
Call = tuple[LaneQueue, list[Piece], int, int, int]


class Accumulator:
    """Per-lane queues and the buffer's accounting for one publisher (see the module docstring).

    Everything is guarded by ``lock``; the sender waits on ``work``, publishers blocked on a full buffer and
    ``flush`` wait on ``room``. ``outstanding`` counts records accepted and not yet completed.
    """

    def __init__(self, stream: str, lanes: int, settings: PublisherSettings, max_items_per_call: int) -> None:
        self.stream = stream
        self.lane_count = lanes
        self.settings = settings
        self.items_per_call = max_items_per_call
        #: Records queued behind a call in flight that make a whole call (or ``max_call_bytes`` bytes do).
        self.ahead_records = max_items_per_call * settings.max_batch_records
        self.ahead_bytes = settings.max_call_bytes
        self.lock = threading.Lock()
        self.work = threading.Condition(self.lock)
        self.room = threading.Condition(self.lock)
        self.lanes = [LaneQueue(i, self.lock) for i in range(lanes)]
        self.outstanding = 0
        self.flushing = 0
        self.closing = False
        self.closed = False
        self.sticky = 0
        #: The producer sequence of the next ring item cut (see ``cut``).
        self.producer_seq = 0

    # ------------------------------------------------------------------------------------------------ routing

    def lane_of(self, record: Record) -> int:
        """The record's lane: explicit, else by key, else -1 (the sticky lane, chosen under the lock)."""
        if record.lane >= 0:
            if record.lane >= self.lane_count:
                raise ConfigError(
                    f"record lane {record.lane} does not exist in stream {self.stream!r} "
                    f"(lanes 0..{self.lane_count - 1}); use -1 to choose by key"
                )
            return record.lane
        if record.key is not None:
            return lane_for_key(record.key, self.lane_count)
        return -1

    def split_by_lane(self, records: list[Record]) -> dict[int, list[int]]:
        """Positions of the records per lane; keyless records without a lane are spread in contiguous runs."""
        by_lane: dict[int, list[int]] = {}
        keyless: list[int] = []
        for position, rec in enumerate(records):
            if rec.lane >= 0 or rec.key is not None:
                by_lane.setdefault(self.lane_of(rec), []).append(position)
            else:
                keyless.append(position)
        if keyless:
            for lane, start, stop in self.spread(len(keyless)):
                by_lane.setdefault(lane, []).extend(keyless[start:stop])
                by_lane[lane].sort()
        return by_lane

    def spread(self, n: int, min_run: int = 1) -> list[tuple[int, int, int]]:
        """Contiguous runs ``(lane, start, stop)`` of ``n`` keyless records over the lanes, from the sticky lane, of
        at least ``min_run`` records each (but the last): a bulk smaller than ``min_run`` goes to one lane whole, and
        the next bulk to the next lane."""
        if self.lane_count == 1:
            return [(0, 0, n)]
        per_lane = max(1, min_run, -(-n // self.lane_count))
        runs = []
        lane = self.sticky
        for start in range(0, n, per_lane):
            runs.append((lane, start, min(n, start + per_lane)))
            lane = (lane + 1) % self.lane_count
        self.sticky = lane
        return runs

    # ------------------------------------------------------------------------------------------------ accepting

    def admit(self, n: int) -> None:
        """Wait for room for ``n`` records (lock held). A bulk larger than the buffer waits for an empty buffer."""
        if self.closing:
            raise PublisherClosedError(f"the publisher of stream {self.stream!r} is closed; create a new one")
        limit = self.settings.max_buffered_records
        if self.outstanding + n <= limit or self.outstanding == 0:
            self.outstanding += n
            return
        deadline = time.monotonic() + self.settings.max_block_ms / 1000.0
        while self.outstanding + n > limit and self.outstanding > 0:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise PublishTimeoutError(
                    f"stream {self.stream!r}: {self.outstanding} records are waiting to be stored (max_buffered_"
                    f"records={limit}) and no room freed up within max_block_ms={self.settings.max_block_ms:g}; the "
                    f"grid is slower than the publishing rate, or unreachable"
                )
            self.room.wait(remaining)
            if self.closing:
                raise PublisherClosedError(f"the publisher of stream {self.stream!r} was closed while waiting")
        self.outstanding += n

    def completed(self, n: int) -> None:
        """``n`` accepted records completed (stored or failed): room for more (lock held)."""
        self.outstanding -= n
        self.room.notify_all()

    def queued(self, state: LaneQueue, n: int, nbytes: int) -> bool:
        """Count records queued on a lane (lock held); True when the caller should send the lane now (``claim``)."""
        first = state.queued == 0
        if first:
            state.since = time.monotonic()
        state.queued += n
        state.queued_bytes += nbytes
        # While the lane's call is in flight, its completion wakes the sender anyway; a full call waiting behind
        # it wakes the sender now, to encode it ahead.
        if state.in_flight:
            if self.wants_ahead(state):
                self.work.notify()
            return False
        settings = self.settings
        if settings.linger_ms <= 0:
            # Nothing to wait for: sending from the publishing thread saves a hand-off to the sender thread (the
            # latency of one record), and the lane is claimed under the lock, so order per lane holds.
            return True
        # Wake the sender only when it has something new to decide: a lane that starts its linger, or a batch
        # that just filled up.
        if first or state.queued >= settings.max_batch_records or state.queued_bytes >= settings.max_item_bytes:
            self.work.notify()
        return False

    # ------------------------------------------------------------------------------------------------ cutting

    def ready(self, state: LaneQueue, now: float) -> float | None:
        """0 when the lane should be sent now, else seconds until its linger ends (None: nothing to send)."""
        if state.in_flight or not state.queued:
            return None
        settings = self.settings
        if (
            self.flushing
            or self.closing
            or settings.linger_ms <= 0
            or state.queued >= settings.max_batch_records
            or state.queued_bytes >= settings.max_item_bytes
        ):
            return 0.0
        return max(0.0, state.since + settings.linger_ms / 1000.0 - now)

    def wants_ahead(self, state: LaneQueue) -> bool:
        """A lane in flight has a whole call queued behind its call and nothing encoded ahead yet (lock held).

        Only a whole call is encoded ahead: a partial one would leave the records that arrive meanwhile to a call
        of their own (smaller calls, more of them).
        """
        return (
            state.in_flight
            and state.ahead is None
            and not state.encoding
            and (state.queued_bytes >= self.ahead_bytes or state.queued >= self.ahead_records)
        )

    def next_calls(self) -> tuple[list[Call], list[Call]] | None:
        """Wait until lanes are ready and claim them (lock held): the calls to send now, and the calls to encode
        ahead of lanes still in flight (marked ``encoding``). None once closed with nothing left to send."""
        while True:
            now = time.monotonic()
            waits = [(self.ready(s, now), s) for s in self.lanes]
            ready = [s for w, s in waits if w == 0.0]
            ahead = [s for s in self.lanes if self.wants_ahead(s)]
            if ready or ahead:
                for state in ahead:
                    state.encoding = True
                return [self.claim(state) for state in ready], [self.cut(s) for s in ahead]
            if self.closed and not any(s.queued or s.in_flight for s in self.lanes):
                return None
            pending = [w for w, _ in waits if w is not None]
            self.work.wait(min(pending) if pending else None)

    def claim(self, state: LaneQueue) -> Call:
        """Take the next call's items off an idle lane and mark it in flight (lock held)."""
        call = self.cut(state)
        state.in_flight = True
        if self.lane_count > 1 and state.lane == self.sticky:
            self.sticky = (self.sticky + 1) % self.lane_count
        return call

    def cut(self, state: LaneQueue) -> Call:
        """The lane's next call with the producer sequences of its items reserved (lock held).

        Sequences are reserved here, in the order calls are cut, and not when a call is encoded: two threads may
        encode calls of one lane at once (the publishing thread the call it claimed, the sender the next one
        ahead), and a reader drops an item whose sequence is not above the last one it passed on from that
        producer as a re-sent copy. Sequences taken while encoding would interleave, and a reader would drop
        real records.
        """
        pieces, n_items, n_records = self.take(state)
        first_seq = self.producer_seq
        self.producer_seq += n_items
        return state, pieces, n_items, n_records, first_seq

    def take(self, state: LaneQueue) -> tuple[list[Piece], int, int]:
        """Cut up to ``max_items_per_call`` ring items and ``max_call_bytes`` bytes off the lane's queue (lock
        held)."""
        settings = self.settings
        max_records = settings.max_batch_records
        max_bytes = settings.max_item_bytes
        max_call = settings.max_call_bytes
        if state.queued <= max_records and state.queued_bytes <= min(max_bytes, max_call):
            return self._take_all(state)
        pieces: list[Piece] = []
        item = 0
        in_item = 0
        item_bytes = 0
        taken = 0
        taken_bytes = 0
        full = False  # the call has no room for the next item
        while state.segments and item < self.items_per_call and not full:
            segment = state.segments[0]
            segment.open = False
            cum = segment.cumulative_bytes()
            p = segment.pos
            while p < segment.n and item < self.items_per_call:
                room = min(max_bytes - item_bytes, max_call - taken_bytes)
                stop = min(segment.n, p + max_records - in_item)
                # The largest stop whose bytes still fit the item and the call (searched only when the records up
                # to the record bound do not fit: with small records they do, for every item).
                fits = cum[stop] - cum[p] <= room
                fit = stop if fits else int(np.searchsorted(cum, cum[p] + room, side="right")) - 1
                if in_item == 0 and item > 0 and fit < stop:
                    # A further item goes into this call only whole (as the item bounds alone would cut it).
                    whole = int(np.searchsorted(cum, cum[p] + max_bytes, side="right")) - 1
                    whole = min(stop, max(whole, p + 1))
                    if cum[whole] - cum[p] > max_call - taken_bytes:
                        full = True
                        break
                stop = min(stop, fit)
                if stop <= p:
                    if in_item == 0:
                        stop = p + 1  # a record larger than an item (or than a call) travels alone
                    else:
                        item, in_item, item_bytes = item + 1, 0, 0
                        continue
                pieces.append(Piece(segment, p, stop, item, in_item))
                in_item += stop - p
                piece_bytes = int(cum[stop] - cum[p])
                item_bytes += piece_bytes
                taken_bytes += piece_bytes
                taken += stop - p
                p = stop
                if in_item >= max_records or item_bytes >= max_bytes:
                    item, in_item, item_bytes = item + 1, 0, 0
            segment.pos = p
            if p >= segment.n:
                state.segments.popleft()
        n_items = item + (1 if in_item else 0)
        state.queued -= taken
        state.queued_bytes -= taken_bytes
        if state.queued:
            state.since = time.monotonic()
        return pieces, n_items, taken

    def _take_all(self, state: LaneQueue) -> tuple[list[Piece], int, int]:
        """Everything queued, as one ring item (it fits one item and one call): no prefix sums to search, which is
        most of cutting a call of a few records (the latency of one record)."""
        pieces: list[Piece] = []
        in_item = 0
        while state.segments:
            segment = state.segments.popleft()
            segment.open = False
            if segment.pos < segment.n:
                pieces.append(Piece(segment, segment.pos, segment.n, 0, in_item))
                in_item += segment.n - segment.pos
                segment.pos = segment.n
        state.queued = 0
        state.queued_bytes = 0
        return pieces, (1 if in_item else 0), in_item

    def drop_queued(self, error: BaseException) -> tuple[list[Segment], list[RecordFuture], int]:
        """Take every record still queued off the lanes, settled with ``error`` (lock held).

        Returns the dropped segments (their bulk futures must fail), the watched record futures among the records,
        and how many records were dropped.
        """
        told: list[RecordFuture] = []
        dropped: list[Segment] = []
        n = 0
        for state in self.lanes:
            while state.segments:
                segment = state.segments.popleft()
                dropped.append(segment)
                if segment.pos < segment.n:
                    told.extend(segment.settle(segment.pos, segment.n, 0, error))
                n += segment.n - segment.pos
            state.queued = 0
            state.queued_bytes = 0
        self.completed(n)
        return dropped, told, n
