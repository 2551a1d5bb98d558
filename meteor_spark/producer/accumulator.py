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
- Behind a call in flight, ``publish_async`` puts plain values on the lane's tail without counting them; every other
  step under the lock counts them first (``_fold``), so the counts it reads are whole (``plain_publisher``).
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from meteor_spark.errors import ConfigError, PublisherClosedError, PublishTimeoutError
from meteor_spark.format.partitioning import lane_for_key
from meteor_spark.format.records import Record
from meteor_spark.producer.calls import Call, Segment
from meteor_spark.producer.futures import BareRecordFuture, BulkFuture, PublishAsync, PublishCallback, RecordFuture
from meteor_spark.producer.lane_queue import LaneQueue
from meteor_spark.producer.sticky import sticky_run, sticky_runs
from meteor_spark.producer.tail_token import TailToken

if TYPE_CHECKING:
    from meteor_spark.format.arrow_columns import ArrowInput
    from meteor_spark.producer.batching import PublisherSettings

__all__ = ["Accumulator", "LaneQueue"]


def _no_sender(call: Call) -> None:
    raise RuntimeError("the accumulator has no sender to send a call with")


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
        self.ahead_records, self.ahead_bytes = max_items_per_call * settings.max_batch_records, settings.max_call_bytes
        #: ``append`` and ``_append_plain`` go through ``admit`` once ``outstanding`` reaches this: the buffer's bound,
        #: or -1 once closing (``admit`` then refuses). One comparison instead of two: they run a million times a
        #: second.
        self.admit_at = settings.max_buffered_records
        self.lock = threading.Lock()
        self.work = threading.Condition(self.lock)
        self.room = threading.Condition(self.lock)
        self.lanes = [LaneQueue(i, self.lock) for i in range(lanes)]
        self.outstanding = 0
        self.flushing = 0
        self.closing = False
        self.closed = False
        #: The lane keyless records go to, and how many ``spread`` put there since it became the sticky lane: it
        #: moves on when that lane is claimed (its records are being sent) or holds a whole run (``run_of``).
        self.sticky = 0
        self.sticky_fill = 0
        #: The producer sequence of the next ring item cut (see ``cut``).
        self.producer_seq = 0
        #: The sender was woken and has not looked at the lanes since (``nudge_sender``).
        self.sender_nudged = False
        #: Sends a call claimed by ``publish_async`` from the publishing thread (the sender's ``send``, once started).
        self.send_now: Callable[[Call], None] = _no_sender
        #: The segment of plain values ``publish_async`` appends to without counting them, on lane ``tail_lane``,
        #: under ``tail_token`` (``plain_publisher``); ``no_tail`` (no room) when the next value takes the counted way.
        self.no_tail = Segment(self.lock)
        self.no_tail.close()
        self.tail = self.no_tail
        self.tail_lane = self.lanes[0]
        self.tail_token = TailToken()

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
        """Positions of the records per lane; keyless records without a lane go in sticky runs (``spread``)."""
        by_lane: dict[int, list[int]] = {}
        keyless: list[int] = []
        keyless_bytes = 0
        lanes = self.lane_count
        for position, rec in enumerate(records):
            if rec.lane >= 0:
                by_lane.setdefault(self.lane_of(rec), []).append(position)
            elif rec.key is not None:
                by_lane.setdefault(lane_for_key(rec.key, lanes), []).append(position)
            else:
                keyless.append(position)
                keyless_bytes += len(rec.value)
        if keyless:
            for lane, start, stop in self.spread(len(keyless), self.run_of(len(keyless), keyless_bytes)):
                positions = by_lane.setdefault(lane, [])
                mixed = bool(positions)
                positions.extend(keyless[start:stop])
                if mixed:
                    positions.sort()
        return by_lane

    def run_of(self, n: int, nbytes: int) -> int:
        """Keyless records per sticky run for a bulk of ``n`` records of ``nbytes`` bytes (``sticky_run``)."""
        return sticky_run(n, nbytes, self.ahead_records, self.ahead_bytes)

    def spread(self, n: int, run: int = 1) -> list[tuple[int, int, int]]:
        """Contiguous runs ``(lane, start, stop)`` of ``n`` keyless records over the lanes (lock held; ``sticky_runs``).
        The sticky lane also moves on when it is claimed (``claim``), so over many bulks every lane gets its share."""
        self._fold()
        runs, self.sticky, self.sticky_fill = sticky_runs(n, self.lane_count, run, self.sticky, self.sticky_fill)
        return runs

    # ------------------------------------------------------------------------------------------------ plain values

    def plain_publisher(
        self, max_record_bytes: int, context_now: Callable[[], Any], general: PublishAsync
    ) -> PublishAsync:
        """A ``publish_async`` that queues plain values of up to ``max_record_bytes`` itself and hands every other
        call to ``general`` (the publisher's method); ``context_now()`` is true while a trace context is current
        (the value may then be traced, which ``general`` does). One frame, constants in closure cells (a second
        frame and a dozen attribute reads cost 13 %); ``topic`` and ``message_id`` not keyword-only, as in the
        method: CPython 3.11 inlines the call of a function without keyword-only parameters (30 ns less).

        While the tail (``tail``: the open plain segment of a lane with a call in flight) has room, a value is
        appended there and nothing else is written: the lane's counts, ``outstanding`` and the segment's ``n``
        take it when the tail is folded (``_fold``), which every other step under the lock does first (counting
        each value cost the publishing thread a third of its time). The tail's room (``_open_tail``) ends before
        the value that reaches the buffer's bound or a whole call to encode ahead: that value takes the counted way
        (``_append_plain``), which admits it (``admit``) and wakes the sender as ever.

        The append holds ``tail_token`` (``TailToken``: taken without waiting, else the value takes the counted way);
        only its holder reads or writes ``tail``, its ``limit`` and values past ``n``: here, ``_fold`` and
        ``_open_tail`` (lock, then token). A fold so counts each value appended before it once, none after.
        """
        tail_token = self.tail_token
        tokens = tail_token.tokens
        publish_counted = self._publish_counted
        new_future = BareRecordFuture
        clock = time.time  # a float: see ``Segment.plain``
        acc = self

        def publish_async(
            record: Any,
            callback: PublishCallback | None = None,
            topic: str | None = None,
            message_id: str | None = None,
        ) -> RecordFuture:
            if type(record) is not bytes or callback is not None or topic is not None or message_id is not None:
                return general(record, callback, topic=topic, message_id=message_id)
            if len(record) > max_record_bytes or context_now():
                return general(record)  # refused with the general path's error, or traced
            stamp = clock()
            try:
                token = tokens.pop()
            except IndexError:  # held by a step under the lock, or by another publishing thread's append
                return publish_counted(record, stamp)
            try:
                segment = acc.tail
                values = segment.values
                index = len(values)
                if index < segment.limit:
                    values.append(record)
                    if not segment.ms_lo <= stamp < segment.ms_hi:
                        segment.stamp_from(index, stamp)  # a new millisecond (``Segment.plain``)
                else:
                    index = -1  # no room: the counted way, once the token is given back
            finally:
                tokens.append(token)
                if tail_token.waiters:
                    tail_token.given_back()
            if index < 0:
                return publish_counted(record, stamp)
            future = new_future()  # its fields set here (``BareRecordFuture``)
            future._segment = segment
            future._index = index
            return future

        publish_async.__doc__ = general.__doc__
        publish_async.__signature__ = inspect.signature(general)  # type: ignore[attr-defined]
        return publish_async

    def _publish_counted(self, value: bytes, stamp: float) -> RecordFuture:
        """``plain_publisher``'s value when the tail has no room (or its token is held): appended the counted way."""
        with self.lock:
            segment, index, call = self._append_plain(value, stamp, len(value))
        if call is not None:
            self.send_now(call)  # an idle lane's call, claimed under the lock: sent by this thread
        return RecordFuture(segment, index)

    def _append_plain(self, value: bytes, stamp: float, size: int) -> tuple[Segment, int, Call | None]:
        """Accept a plain value of ``publish_async`` on the sticky lane, counted (lock held): its segment and index
        in it, and the call the caller sends at once (the lane was idle). Opens the tail when the lane is in
        flight. ``stamp`` is a ``time.time()`` reading (``Segment.plain``)."""
        self._fold()
        if self.outstanding >= self.admit_at:
            self.admit(1)
        else:
            self.outstanding += 1
        state = self.lanes[self.sticky]
        segments = state.segments
        segment = segments[-1] if segments else None
        if segment is None or not segment.plain or not segment.open:
            segment = state.open_plain()
        index = segment.n
        segment.add_plain(value, stamp)
        if self.queued(state, 1, size):
            return segment, index, self.claim(state)
        self._open_tail(state, segment, size)
        return segment, index, None

    def _open_tail(self, state: LaneQueue, segment: Segment, size: int) -> None:
        """Make ``segment`` (open, plain, the last of ``state``, its last value ``size`` bytes) the tail while its
        lane has a call in flight (lock held, counts folded), for as many values as room is left.

        Room, in values only (a bound on bytes too cost 13 % of the append): up to the buffer's bound, exact; and,
        while the sender may still be woken to encode a whole call ahead (``wants_ahead``), short of one: of
        ``ahead_records`` values, and of ``ahead_bytes`` if they are of ``size`` bytes. Larger values may reach a
        whole call's bytes uncounted: it is then encoded after the call in flight settled, not ahead of it (the
        next tail, opened at a value of their size, is bounded right). Order, admission and cutting are exact.
        """
        if not state.in_flight or self.admit_at <= 0:
            return  # an idle lane's values are claimed and sent, or lingered, by the counted way; closing refuses
        records = self.admit_at - self.outstanding
        if not self.sender_nudged and state.ahead is None and not state.encoding:
            bytes_left = self.ahead_bytes - 1 - state.queued_bytes
            records = min(records, self.ahead_records - 1 - state.queued, bytes_left // max(size, 1))
        if records > 0:
            token = self.tail_token.take()
            segment.limit = segment.n + records
            self.tail = segment
            self.tail_lane = state
            self.tail_token.give(token)

    def _fold(self) -> None:
        """Count the values appended to the tail since it opened, and close it (lock held): the next value takes
        the counted way. Every step that reads or changes the counts or a lane's queue folds first."""
        segment = self.tail
        if segment is self.no_tail:
            return
        token = self.tail_token.take()
        self.tail = self.no_tail
        self.tail_token.give(token)  # the segment takes no more values: they are counted now
        added = len(segment.values) - segment.n
        if added:
            state = self.tail_lane
            state.queued += added
            state.queued_bytes += segment.count_plain(added)
            self.outstanding += added

    # ------------------------------------------------------------------------------------------------ accepting

    def append(
        self, record: bytes | Record, lane: int, stamp: int, callback: PublishCallback | None
    ) -> tuple[RecordFuture, Call | None]:
        """Accept one record of ``publish_async`` (a plain value or a checked ``Record``) on ``lane`` (-1: the
        sticky lane): waits for room like ``admit``. Returns its future, and the call the caller sends at once
        (the lane was idle and nothing lingers) or None (the sender thread, or the completion of the lane's call
        in flight, sends it). The steps of ``open_segment`` and ``queued`` are inlined (a million times a second).
        """
        with self.lock:
            self._fold()
            if self.outstanding >= self.admit_at:
                self.admit(1)
            else:
                self.outstanding += 1
            state = self.lanes[self.sticky if lane < 0 else lane]
            segments = state.segments
            segment = segments[-1] if segments else None
            if segment is None or not segment.open or segment.plain:  # (an Arrow segment is never open)
                segment = state.open_segment()
            future = RecordFuture(segment, segment.n)
            size = segment.add_single(record, stamp)
            if callback is not None:
                segment.call_back_on(future, callback)
            if state.in_flight and state.queued:
                # ``queued``'s answer for a lane in flight that has records queued already.
                state.queued += 1
                state.queued_bytes += size
                whole = state.queued_bytes >= self.ahead_bytes or state.queued >= self.ahead_records
                if whole and state.ahead is None and not state.encoding:
                    self.nudge_sender()  # a whole call waits behind the one in flight: the sender encodes it ahead
                return future, None
            return future, (self.claim(state) if self.queued(state, 1, size) else None)

    def nudge_sender(self) -> None:
        """Wake the sender thread to look at the lanes again (lock held), once until it has looked.

        ``Condition.notify`` costs about a microsecond even with nobody waiting, and the sender may take
        milliseconds to get the GIL: a notify per record until then cost every record that much. ``next_calls``
        clears ``sender_nudged`` when it looks (under the lock): a change after that wakes it again.
        """
        if not self.sender_nudged:
            self.sender_nudged = True
            self.work.notify()

    def append_values(self, values: list[bytes], stamp: int, sink: BulkFuture) -> list[Call]:
        """Accept the plain values of one ``publish_many`` (over the lanes in sticky runs of a whole call each,
        ``spread``); returns the calls the caller sends at once."""
        calls: list[Call] = []
        run = self.run_of(len(values), sum(map(len, values)))
        with self.lock:
            self._fold()
            self.admit(len(values))
            for lane, start, stop in self.spread(len(values), run):
                state = self.lanes[lane]
                size = state.open_segment().add_values(values[start:stop], stamp, sink, start)
                if self.queued(state, stop - start, size):
                    calls.append(self.claim(state))
        return calls

    def append_records(self, records: list[Record], stamp: int, sink: BulkFuture) -> list[Call]:
        """Accept the checked records of one ``publish_many`` (``stamp`` for those without a timestamp), per lane
        (``split_by_lane``); returns the calls the caller sends at once."""
        calls: list[Call] = []
        with self.lock:
            self._fold()
            by_lane = self.split_by_lane(records)
            self.admit(len(records))
            for lane, positions in by_lane.items():
                state = self.lanes[lane]
                size = state.open_segment().add_records(records, positions, stamp, sink)
                if self.queued(state, len(positions), size):
                    calls.append(self.claim(state))
        return calls

    def append_arrow(self, bulk: ArrowInput, sink: BulkFuture) -> None:
        """Accept the rows of one ``publish_arrow`` (checked, at least one), as one closed segment per lane; the
        sender thread encodes and sends them."""
        n = bulk.rows
        lanes = bulk.lanes(self.lane_count, self.stream, self.sticky)
        pieces: list[tuple[int, np.ndarray | slice]] = []
        if isinstance(lanes, np.ndarray):
            order = np.argsort(lanes, kind="stable")
            bounds = np.searchsorted(lanes[order], np.arange(self.lane_count + 1))
            for lane in range(self.lane_count):
                if bounds[lane + 1] > bounds[lane]:
                    pieces.append((lane, order[bounds[lane] : bounds[lane + 1]]))
        else:
            run = self.run_of(n, bulk.nbytes())
            with self.lock:
                runs = self.spread(n, run)
            for lane, start, stop in runs:
                pieces.append((lane, slice(start, stop)))
        self._append_segments(
            n, [(lane, Segment.of_arrow(self.lock, bulk.rows_of(rows), sink)) for lane, rows in pieces]
        )

    def _append_segments(self, n: int, segments: list[tuple[int, Segment]]) -> None:
        with self.lock:
            self._fold()
            self.admit(n)
            ready = False
            for lane, segment in segments:
                state = self.lanes[lane]
                state.segments.append(segment)
                ready = self.queued(state, segment.n, segment.nbytes) or ready
            if ready:
                # The sender thread encodes and sends: the caller goes back to producing the next batch (a Spark
                # task to reading it from the JVM) while this one is encoded and on the wire.
                self.work.notify()

    def admit(self, n: int) -> None:
        """Wait for room for ``n`` records (lock held). A bulk larger than the buffer waits for an empty buffer."""
        self._fold()
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
            self._fold()
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
                self.nudge_sender()
            return False
        settings = self.settings
        if settings.linger_ms <= 0:
            # Nothing to wait for: sending from the publishing thread saves a hand-off to the sender thread (the
            # latency of one record), and the lane is claimed under the lock, so order per lane holds.
            return True
        # Wake the sender only when it has something new to decide: a lane that starts its linger, or a batch
        # that just filled up.
        if first or state.queued >= settings.max_batch_records or state.queued_bytes >= settings.max_item_bytes:
            self.nudge_sender()
        return False

    # ------------------------------------------------------------------------------------------------ lifecycle

    def flush(self, deadline: float | None) -> int:
        """Send everything queued now (ignoring linger) and wait until every accepted record completed or
        ``deadline`` (``time.monotonic()``; None: no limit) passed; returns the records outstanding then (0: all)."""
        with self.lock:
            self._fold()
            self.flushing += 1
            self.work.notify()
            try:
                while self.outstanding:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        return self.outstanding
                    self.room.wait(remaining)
                return 0
            finally:
                self.flushing -= 1

    def begin_close(self) -> bool:
        """Refuse new records from now on; False when the accumulator was closed already."""
        with self.lock:
            self._fold()
            if self.closed:
                return False
            self.closing = True
            self.admit_at = -1
            return True

    def mark_closed(self) -> None:
        """Closed: the sender thread sends what is left and stops."""
        with self.lock:
            self._fold()
            self.closed = True
            self.work.notify_all()

    def outstanding_records(self) -> int:
        """Records accepted and not yet completed."""
        with self.lock:
            self._fold()
            return self.outstanding

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
            self._fold()
            self.sender_nudged = False  # looking now: a change from here on wakes it again
            now = time.monotonic()
            waits = [(self.ready(s, now), s) for s in self.lanes]
            ready = [s for w, s in waits if w == 0.0]
            ahead = [s for s in self.lanes if self.wants_ahead(s)]
            if ready or ahead:
                for state in ahead:
                    state.begin_encoding()
                return [self.claim(state) for state in ready], [self.cut(s) for s in ahead]
            if self.closed and not any(s.queued or s.in_flight for s in self.lanes):
                return None
            pending = [w for w, _ in waits if w is not None]
            self.work.wait(min(pending) if pending else None)

    def call_settled(self, state: LaneQueue) -> Any:
        """The lane's call in flight settled (lock held): ``LaneQueue.call_settled`` (the call encoded ahead to send
        now, or None), the tail folded first, as its lane may go idle."""
        self._fold()
        return state.call_settled()

    def encoded_ahead(self, state: LaneQueue, pending: Any) -> bool:
        """The sender finished encoding the lane's next call ahead (lock held; ``pending`` None: it failed):
        ``LaneQueue.encoded``, the tail folded first. True: the encoder sends ``pending`` itself now."""
        self._fold()
        send_now = state.encoded(pending)
        if send_now and pending is None:
            self.work.notify()  # the call in flight settled meanwhile, and this one failed: the lane is free
        return send_now

    def wake_for(self, state: LaneQueue) -> None:
        """Wake the sender when ``state`` has records queued or the publisher is closed (lock held): a call of the
        lane settled, and the sender sends what waited behind it."""
        self._fold()
        if state.queued or self.closed:
            self.work.notify()

    def claim(self, state: LaneQueue) -> Call:
        """Take the next call's items off an idle lane and mark it in flight (lock held)."""
        call = self.cut(state)
        state.in_flight = True
        if self.lane_count > 1 and state.lane == self.sticky:
            self.sticky = (self.sticky + 1) % self.lane_count
            self.sticky_fill = 0
        return call

    def cut(self, state: LaneQueue) -> Call:
        """The lane's next call with the producer sequences of its items reserved (lock held).

        Reserved in the order calls are cut, not when encoded: two threads may encode calls of one lane at once (the
        publishing thread the call it claimed, the sender the next one ahead), and a reader drops an item whose
        sequence is not above the last it passed on from that producer (a re-sent copy): sequences taken while
        encoding would interleave, and readers drop real records.
        """
        self._fold()
        pieces, n_items, n_records = state.take(self.settings, self.items_per_call)
        first_seq = self.producer_seq
        self.producer_seq += n_items
        return Call(state, pieces, n_items, n_records, first_seq)

    def drop_queued(self, error: BaseException) -> tuple[list[Segment], list[RecordFuture], int]:
        """Take every record still queued off the lanes, settled with ``error`` (lock held). Returns the dropped
        segments (their bulk futures must fail), the watched record futures among them, and how many were dropped.
        """
        self._fold()
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
