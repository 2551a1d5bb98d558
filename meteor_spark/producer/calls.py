"""What a publisher's ``add_all`` calls are made of: the records queued for a lane (``Segment``, like kafka-python's
``ProducerBatch`` it also holds their outcomes), the pieces of segments a call takes (``Piece``), the call the
accumulator cuts off a lane (``Call``), and the encoded call the sender sends and settles (``PendingCall``; the
idempotent publisher's retrier takes it over while its outcome is unknown).

A call is one object from the moment it is cut until it settles, so the sender, the retrier and the completion
thread all carry the same value (no tuple to unpack and re-pack on each hop).
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from meteor_spark.format.item_encoding import I32, SMALL_ITEM_RECORDS, PreparedColumns, header_bytes, prepare_columns
from meteor_spark.format.records import Record
from meteor_spark.producer.futures import BulkFuture, Outcomes

if TYPE_CHECKING:
    from meteor_spark.format.arrow_columns import ArrowColumns
    from meteor_spark.producer.accumulator import LaneQueue


class Segment(Outcomes):
    """Records queued for one lane, in order: Python lists (single publishes, ``publish_many``) or Arrow arrays.

    ``targets`` maps runs of the segment's records to bulk futures: ``(first record, count, future, position in
    it)``, the position an array of ``count`` positions when the run's records are not contiguous in their bulk
    (a keyed ``publish_many`` scatters a call's records over the lanes). Single records have ``RecordFuture`` s
    instead, which read the segment's outcomes (``Outcomes``, whose ``lock`` is the accumulator's).

    ``plain``: the segment holds only plain values of ``publish_async`` (``Accumulator.plain_publisher``), and their
    timestamps in runs: ``stamps`` holds a millisecond per run and ``ms_starts`` the index of the run's first record;
    a value whose ``time.time()`` reading lies in ``[ms_lo, ms_hi)`` (the last run's millisecond, in seconds as
    floats compare) joins that run, any other starts a run (``stamp_from``). Each record so keeps the millisecond of
    its own reading, a clock stepping back included, for one comparison: an integer kept per record, divided and
    converted one by one when encoded, cost the publishing thread and the sender more. A float reading, not
    ``time_ns()``'s integer: CPython 3.11 compares floats in a specialized instruction, integers of 64 bits not
    (11 ns a value less); the float's resolution (0.24 us today) is far below a millisecond. No other record goes
    into such a segment (``LaneQueue.open_segment`` starts a new one after it). ``nbytes`` (read for Arrow
    segments) is not kept for a plain segment: the lane's ``queued_bytes`` counts its records.
    """

    __slots__ = (
        "_cum",
        "_sized",
        "_sizes",
        "_starts",
        "arrow",
        "encoded",
        "headers",
        "keys",
        "limit",
        "ms_hi",
        "ms_lo",
        "ms_starts",
        "n",
        "nbytes",
        "open",
        "plain",
        "pos",
        "stamps",
        "targets",
        "values",
    )

    def __init__(self, lock: Any) -> None:
        super().__init__(lock)
        self.values: list[bytes] = []
        self.keys: list[bytes | None] | None = None
        self.headers: list[tuple[tuple[str, bytes], ...]] | None = None
        self.stamps: list[int] = []
        self.arrow: ArrowColumns | None = None
        self.n = 0
        self.pos = 0
        self.encoded = 0  # records prepared for calls (``prepared``)
        self.nbytes = 0
        self.open = True
        self.plain = False
        # While the segment is its accumulator's tail: it takes values uncounted up to index ``limit``
        # (``Accumulator.plain_publisher``).
        self.limit = 0
        self.ms_lo = self.ms_hi = 0.0  # floats always: the comparison stays specialized
        self.ms_starts: list[int] = []
        self.targets: list[tuple[int, int, BulkFuture, int | np.ndarray]] = []
        self._cum: np.ndarray | None = None
        self._starts: list[int] | None = None
        # A plain segment's value sizes, counted by ``count_plain`` for its first ``_sized`` records.
        self._sizes: list[np.ndarray] = []
        self._sized = 0

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

    def add_single(self, record: bytes | Record, stamp: int) -> int:
        """Append the record of one ``publish_async`` (a plain value or a checked ``Record``), whose future reads its
        outcome here; returns its size. A plain value's steps are inlined: this runs a million times a second."""
        self.singles = True
        if type(record) is not bytes:
            return self.add(record, stamp)  # type: ignore[arg-type]
        if self.keys is not None or self.headers is not None:
            return self.add_value(record, stamp)
        self.values.append(record)
        self.stamps.append(stamp)
        self.n += 1
        size = len(record)
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

    def add_plain(self, value: bytes, stamp: float) -> None:
        """Append a plain value of ``publish_async`` stamped ``stamp`` (``time.time()``) to a plain segment."""
        index = self.n
        self.values.append(value)
        if not self.ms_lo <= stamp < self.ms_hi:
            self.stamp_from(index, stamp)
        self.n = index + 1

    def stamp_from(self, index: int, stamp: float) -> None:
        """A plain segment's records from ``index`` on carry the millisecond of ``stamp`` (``time.time()``), until
        one stamped outside it. The millisecond is the one whose bounds (``ms / 1000``, ``(ms + 1) / 1000``) hold
        ``stamp`` as floats compare, so a record's millisecond does not depend on the run it joins (``floor`` of
        ``stamp * 1000`` may round across a bound: one step back or on corrects it)."""
        ms = math.floor(stamp * 1000.0)
        if stamp < ms / 1000.0:
            ms -= 1
        elif stamp >= (ms + 1) / 1000.0:
            ms += 1
        self.ms_starts.append(index)
        self.stamps.append(ms)
        self.ms_lo = ms / 1000.0
        self.ms_hi = (ms + 1) / 1000.0

    def count_plain(self, added: int) -> int:
        """Count ``added`` values appended to a plain segment past ``n`` uncounted (the accumulator's ``_fold``,
        lock held); returns their bytes. The sizes are kept for ``cumulative_bytes``, which so makes no second pass
        over the values (each pass calls ``len`` per value: most of what counting costs)."""
        if not added:
            return 0
        self._size_up_to(self.n + added)  # its last chunk ends with the added values (``_sized`` <= ``n`` before)
        self.n += added
        return int(self._sizes[-1][-added:].sum())

    def _size_up_to(self, stop: int) -> None:
        sized = self._sized
        if stop > sized:
            self._sizes.append(np.fromiter(map(len, self.values[sized:stop]), dtype=np.int64, count=stop - sized))
            self._sized = stop

    def plain_ms(self, start: int, stop: int) -> np.ndarray | int:
        """The milliseconds of a plain segment's records ``[start, stop)``: one int when they share one."""
        starts = self.ms_starts
        first = bisect_right(starts, start) - 1  # the first run starts at record 0
        last = bisect_left(starts, stop, first)
        if last - first == 1:
            return self.stamps[first]
        bounds = np.array(starts[first:last] + [stop], dtype=np.int64)
        bounds[0] = start
        return np.repeat(np.array(self.stamps[first:last], dtype=np.int64), np.diff(bounds))

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

    def add_records(self, records: list[Record], positions: list[int], stamp: int, sink: BulkFuture) -> int:
        """Append the checked records at ``positions`` (ascending) of one bulk publish, ``stamp`` for those without
        a timestamp; returns their size in bytes.

        One pass per column and one target for them all, however scattered their positions: per record, a keyed
        bulk over many lanes cost a target (and a delivery on completion) each.
        """
        recs = [records[p] for p in positions] if len(positions) < len(records) else records
        count = len(recs)
        if positions[-1] - positions[0] + 1 == count:
            self._target(sink, positions[0], count)
        else:
            self.targets.append((self.n, count, sink, np.array(positions, dtype=np.int64)))
        values = [r.value for r in recs]
        size = sum(map(len, values))
        keys = [r.key for r in recs]
        if self.keys is not None or any(k is not None for k in keys):
            if self.keys is None:
                self.keys = [None] * self.n
            self.keys.extend(keys)
            size += sum([len(k) for k in keys if k is not None])
        headers = [r.headers for r in recs]
        if self.headers is not None or any(headers):
            if self.headers is None:
                self.headers = [()] * self.n
            self.headers.extend(headers)
            size += sum([len(k) + len(v) for h in headers if h for k, v in h])
        self.values.extend(values)
        self.stamps.extend([stamp if r.timestamp_ms is None else r.timestamp_ms for r in recs])
        self.n += count
        self.nbytes += size
        return size

    def _target(self, sink: BulkFuture, sink_pos: int, count: int) -> None:
        targets = self.targets
        if targets:
            start, run, last_sink, last_pos = targets[-1]
            # Consecutive records of one bulk publish share one run (cheaper to complete).
            if (
                last_sink is sink
                and start + run == self.n
                and not isinstance(last_pos, np.ndarray)
                and last_pos + run == sink_pos
            ):
                targets[-1] = (start, run + count, sink, last_pos)
                return
        targets.append((self.n, count, sink, sink_pos))

    def close(self) -> None:
        """No more records go into this segment (its first records are being cut into a call)."""
        self.open = False

    def advance(self, pos: int) -> None:
        """Records before ``pos`` were cut into calls."""
        self.pos = pos

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
            if self.plain:
                self._size_up_to(self.n)
                sizes = np.concatenate(self._sizes) if self._sizes else np.zeros(0, dtype=np.int64)
            else:
                sizes = np.fromiter(map(len, self.values), dtype=np.int64, count=self.n)
            if self.keys is not None:
                sizes += np.fromiter((0 if k is None else len(k) for k in self.keys), dtype=np.int64, count=self.n)
            if self.headers is not None:
                sizes += header_bytes(self.headers)
            cum = np.zeros(self.n + 1, dtype=np.int64)
            np.cumsum(sizes, out=cum[1:])
            self._cum = cum
        return self._cum

    def prepared(self, count: int) -> None:
        """``count`` of the records were prepared for a call (any thread, the lock not held); once all of them were,
        they are dropped (``release``). Counted, not inferred from the piece that ends the segment: two threads may
        prepare pieces of one segment at once (a call the publishing thread claimed, the next one encoded ahead by the
        sender thread), and the last piece may be prepared before an earlier one, which then found no records."""
        with self.lock:
            self.encoded += count
            done = self.encoded >= self.n
        if done:
            self.release()

    def release(self) -> None:
        """Drop the records once the last piece is encoded: a future kept by the user keeps its segment alive, and
        must not keep every record of it too (outcomes and counts stay)."""
        self.values = []
        self.keys = self.headers = None
        self.stamps = []
        self.ms_starts = []
        self._sizes = []
        self.arrow = None
        self._cum = None

    def small_values(self, start: int, stop: int) -> tuple[list[bytes], list[int]] | None:
        """Records ``[start, stop)`` as their values and timestamps (ms) when they are few (``SMALL_ITEM_RECORDS``)
        and the segment holds no keys, headers or Arrow rows: what ``encode_small_item`` frames without numpy.
        None otherwise (``prepare`` gives their columns)."""
        if stop - start > SMALL_ITEM_RECORDS or self.arrow is not None or self.keys is not None or self.headers:
            return None
        if self.plain:
            ms = self.plain_ms(start, stop)
            return self.values[start:stop], [ms] * (stop - start) if isinstance(ms, int) else ms.tolist()
        return self.values[start:stop], self.stamps[start:stop]

    def prepare(self, start: int, stop: int) -> PreparedColumns:
        """The columns of records ``[start, stop)``, reusing what the segment knows already: the value sizes it
        counted to cut the call (``cumulative_bytes``, when they are values alone), and one timestamp for all when
        the records share one (a ``publish_many``'s), which then needs no column."""
        if self.arrow is not None:
            return self.arrow.prepare(start, stop)
        timestamps: np.ndarray | list[int] | int
        if self.plain:
            timestamps = self.plain_ms(start, stop)
        else:
            timestamps = self.stamps[start:stop]
            if timestamps and timestamps.count(timestamps[0]) == len(timestamps):
                timestamps = timestamps[0]
        lengths = None
        if self._cum is not None and self.keys is None and self.headers is None:
            lengths = np.diff(self._cum[start : stop + 1]).astype(I32)
        return prepare_columns(
            self.values[start:stop],
            keys=None if self.keys is None else self.keys[start:stop],
            headers=None if self.headers is None else self.headers[start:stop],
            timestamps=timestamps,
            value_lengths=lengths,
        )


@dataclass(slots=True)
class Piece:
    """Records ``[start, stop)`` of a segment, going as records ``index...`` of ring item ``item`` of a call."""

    segment: Segment
    start: int
    stop: int
    item: int  # index of the ring item within its add_all call
    index: int  # index of the piece's first record within that item


@dataclass(frozen=True, slots=True)
class Call:
    """One ``add_all`` of a lane as the accumulator cut it (``Accumulator.claim`` / ``cut``).

    Attributes:
        state: the lane's queue (the lane stays claimed until the call settles).
        pieces: the records of the call, per ring item.
        n_items, n_records: ring items and records in the call.
        first_seq: producer sequence of its first item, reserved when it was cut (its items take the sequences from
            there on).
    """

    state: LaneQueue
    pieces: list[Piece]
    n_items: int
    n_records: int
    first_seq: int

    @property
    def lane(self) -> int:
        return self.state.lane


@dataclass(eq=False)
class PendingCall:
    """An encoded call, from its first attempt until it settles (retries of an idempotent publisher included).

    Attributes:
        call: the accumulator's call (its lane stays claimed meanwhile).
        items: the encoded ring items, sent unchanged on every attempt.
        deadline: ``time.monotonic()`` after which the call is not retried any more.
        start: the first ring sequence the items can occupy (None: not known yet, the lane's tail is read first).
        sent: an attempt was sent whose outcome is unknown (the items may be in the lane).
        attempts: ``add_all`` attempts sent.
        last_error: the error of the last failed step.
        due, order: when the retrier takes the call up next (``time.monotonic()``), and the tiebreak.
    """

    call: Call
    items: list[bytes]
    deadline: float = 0.0
    start: int | None = None
    sent: bool = False
    attempts: int = 0
    last_error: BaseException | None = None
    due: float = 0.0
    order: int = 0

    def __lt__(self, other: PendingCall) -> bool:
        return (self.due, self.order) < (other.due, other.order)

    # The steps of a call's life, for the sender and the retrier (each under its own discipline: the sender before
    # the call is handed over, the retrier while it holds it).

    def begin(self, deadline: float, start: int | None) -> None:
        """Before the first attempt: retried until ``deadline``, its items land from ``start`` on (None: unknown)."""
        self.deadline = deadline
        self.start = start

    def starts_at(self, start: int) -> None:
        """Its items land from ring sequence ``start`` on (a search for them resumes there)."""
        self.start = start

    def attempted(self) -> None:
        """One more ``add_all`` attempt goes out."""
        self.attempts += 1

    def failed(self, error: BaseException, *, answer_lost: bool) -> None:
        """A step failed with ``error``; ``answer_lost``: an attempt whose answer was lost (its items may be
        stored)."""
        if answer_lost:
            self.sent = True
        self.last_error = error

    def due_at(self, due: float, order: int) -> None:
        """The retrier takes the call up again at ``due`` (``time.monotonic()``), ``order`` breaking ties."""
        self.due = due
        self.order = order

    @property
    def lane(self) -> int:
        return self.call.state.lane

    @property
    def n_items(self) -> int:
        return self.call.n_items

    @property
    def n_records(self) -> int:
        return self.call.n_records

    @property
    def first_seq(self) -> int:
        """Producer sequence of the first item (the one the lookup searches for)."""
        return self.call.first_seq
