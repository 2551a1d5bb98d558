"""The Publisher: micro-batches records into ring items, per lane, in order, with bounded buffering.

How a record travels:

1. ``publish_async`` (or a bulk call) checks the record, picks its lane (explicit ``lane``, else
   ``lane_for_key(key)``, else the publisher's choice) and appends it to that lane's queue. When more than
   ``max_buffered_records`` are accepted but not yet stored, the caller blocks up to ``max_block_ms``, then gets
   ``PublishTimeoutError`` (back-pressure instead of Meteor's unbounded queue).
2. The lane's queue is cut into ring items (``max_batch_records`` / ``max_batch_bytes``, after waiting up to
   ``linger_ms`` for a partly filled item) and up to ``max_items_per_call`` items go in one ``add_all``. At most one
   ``add_all`` per lane is in flight: Hazelcast does not promise the order of concurrent appends
   (hazelcast/hazelcast#13010), so this is what keeps a publisher's records in order per lane. With ``linger_ms=0``
   an idle lane is sent by the publishing thread itself (one record's latency is then one ``add_all``, with no
   hand-off to another thread); records that arrive while a call is in flight pile up in the next items, and the
   sender thread sends them when the call completes (or when their linger ends). Lanes are sent in parallel.
3. When the grid answers, the grid client's thread settles the outcome of the stored records (``add_all`` stores
   its items contiguously and returns the last sequence): a ``publish_async`` future reads its offset from there,
   so most futures cost no completion work at all, and threads blocked on one resume at once. User code
   (callbacks, done-callbacks) and bulk futures run on the publisher's completion thread, never on the grid
   client's I/O thread; a callback that raises is logged and the publisher goes on.

A failed ``add_all`` fails exactly the records it carried (their futures get the error); it is not retried,
because a call that timed out may still have been applied and retrying could duplicate it. ``flush()`` waits
until everything accepted so far is stored (or failed); ``close()`` flushes, so nothing accepted is lost.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
import uuid
from bisect import bisect_left, bisect_right, insort
from collections import deque
from concurrent.futures import Future
from concurrent.futures import _base as _futures_base
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import pyarrow as pa

from meteor_spark.errors import (
    ConfigError,
    GridError,
    MeteorError,
    PublisherClosedError,
    PublishTimeoutError,
)
from meteor_spark.grid import MAX_BATCH_ITEMS, Grid, result
from meteor_spark.offsets import INDEX_BITS
from meteor_spark.records import (
    COMPRESSIONS,
    ItemFraming,
    PreparedColumns,
    Record,
    encode_prepared,
    prepare_columns,
)
from meteor_spark.streams import StreamConfig, StreamInfo, lane_for_key, open_stream

logger = logging.getLogger(__name__)

#: ``callback(offset, error)``: exactly one of them is None.
PublishCallback = Callable[[int | None, BaseException | None], None]

_I32 = np.dtype("<i4")
_I64 = np.dtype("<i8")


_AFTER_ANY = float("inf")


def _START(outcome: tuple[int, int, int, BaseException | None]) -> int:
    return outcome[0]


def _INDEX(future: "_RecordFuture") -> int:
    return future._index


@dataclass(frozen=True)
class PublisherSettings:
    """A publisher's tuning, parsed once (the stream's stored batching settings fill what is not given)."""

    linger_ms: float
    max_batch_records: int
    max_batch_bytes: int
    max_buffered_records: int
    max_block_ms: float
    max_items_per_call: int
    compression: str
    compression_threshold: int

    @classmethod
    def parse(cls, config: StreamConfig, overrides: dict[str, Any]) -> "PublisherSettings":
        values = {
            "linger_ms": config.linger_ms,
            "max_batch_records": config.max_batch_records,
            "max_batch_bytes": config.max_batch_bytes,
            "max_buffered_records": 100_000,
            "max_block_ms": 60_000.0,
            "max_items_per_call": 64,
            "compression": config.compression,
            "compression_threshold": config.compression_threshold,
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        # StreamConfig validates the batching fields with its own messages.
        StreamConfig(
            config.name,
            compression=values["compression"],
            compression_threshold=values["compression_threshold"],
            max_batch_records=values["max_batch_records"],
            max_batch_bytes=values["max_batch_bytes"],
            linger_ms=values["linger_ms"],
        )
        for name, low in (("max_buffered_records", 1), ("max_items_per_call", 1)):
            value = values[name]
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"{name} must be an integer >= {low}, got {value!r}")
        if values["max_items_per_call"] > MAX_BATCH_ITEMS:
            raise ConfigError(
                f"max_items_per_call must be <= {MAX_BATCH_ITEMS} (Hazelcast's add_all limit), "
                f"got {values['max_items_per_call']}"
            )
        block = values["max_block_ms"]
        if isinstance(block, bool) or not isinstance(block, (int, float)) or block < 0:
            raise ConfigError(f"max_block_ms must be a number of milliseconds >= 0, got {block!r}")
        assert values["compression"] in COMPRESSIONS
        return cls(**values)


_FUTURE_LOCK = threading.Lock()
_DONE_STATES = (_futures_base.CANCELLED, _futures_base.CANCELLED_AND_NOTIFIED, _futures_base.FINISHED)
_LAZY_SYNC = ("_condition", "_waiters", "_done_callbacks")


class _LightFuture(Future):  # type: ignore[type-arg]
    """A ``concurrent.futures.Future`` that allocates its condition, waiter and callback lists only when used.

    A plain Future costs a Condition and an RLock, which (mostly through the garbage collector) is expensive for
    the many futures of a busy publisher. Nobody waits on most publish futures, so the synchronisation objects are
    created on first use instead; creation and completion agree under one module lock, so a waiter that arrives
    while the future completes is never missed. Futures start RUNNING: an accepted record cannot be cancelled.
    """

    def __init__(self) -> None:  # deliberately not calling Future.__init__ (that is what this avoids)
        self._state = _futures_base.RUNNING
        self._result: Any = None
        self._exception: BaseException | None = None

    def __getattr__(self, name: str) -> Any:
        # Only called for missing attributes: create the lazily allocated ones.
        if name in _LAZY_SYNC:
            with _FUTURE_LOCK:
                if name not in self.__dict__:
                    self.__dict__[name] = threading.Condition() if name == "_condition" else []
                return self.__dict__[name]
        raise AttributeError(name)

    def done(self) -> bool:
        return self._state in _DONE_STATES

    def result(self, timeout: float | None = None) -> Any:
        if self._state == _futures_base.FINISHED:
            if self._exception is not None:
                raise self._exception
            return self._result
        return super().result(timeout)

    def set_result(self, result: Any) -> None:
        if not self._finish(result, None):
            super().set_result(result)

    def set_exception(self, exception: BaseException | None) -> None:
        if not self._finish(None, exception):
            super().set_exception(exception)

    def _finish(self, result: Any, exception: BaseException | None) -> bool:
        """Complete without a condition when nobody created one; False = fall back to Future's path."""
        with _FUTURE_LOCK:
            if "_condition" in self.__dict__:
                return False
            if self._state in _DONE_STATES:
                raise _futures_base.InvalidStateError(f"{self!r} is already done")
            self._result = result
            self._exception = exception
            self._state = _futures_base.FINISHED
        self._invoke_callbacks()
        return True

    def _invoke_callbacks(self) -> None:
        if self.__dict__.get("_done_callbacks"):
            super()._invoke_callbacks()


@dataclass(frozen=True)
class LaneWritten:
    """What one bulk publish stored in one lane.

    Attributes:
        lane: the lane.
        records: records of the publish stored in it.
        first_offset: offset of the first of them.
        last_offset: offset of the last of them (records of other publishes may lie in between).
    """

    lane: int
    records: int
    first_offset: int
    last_offset: int


class _Sink(_LightFuture):
    """The future of one bulk publish, and where its offsets go: a list of records ("list", the offsets in order)
    or an Arrow bulk ("count", the number of records stored)."""

    def __init__(self, kind: str, size: int) -> None:
        super().__init__()
        self.kind = kind
        self.size = size
        self.offsets: np.ndarray | None = np.empty(size, dtype=np.int64) if kind == "list" else None
        self.remaining = size
        self.failed = False
        # lane -> [records, first offset, last offset]; updated once per stored piece (never per record), by the
        # completion thread only, and complete before the future's result is set.
        self.lanes: dict[int, list[int]] = {}


class ArrowPublishFuture(_Sink):
    """The future of ``Publisher.publish_arrow``: completes with the number of records stored (an ``int``, as
    ever) and then tells, per lane, how many records went there and their first and last offsets."""

    def __init__(self, size: int) -> None:
        super().__init__("count", size)

    def lanes_written(self) -> tuple[LaneWritten, ...]:
        """Per lane (sorted), what this publish stored; waits for the publish like ``result()``.

        Raises:
            the publish's error, like ``result()``.
        """
        self.result()
        return tuple(LaneWritten(lane, n, first, last) for lane, (n, first, last) in sorted(self.lanes.items()))


class _RecordFuture(Future):  # type: ignore[type-arg]
    """The future of one ``publish_async``: a position in its segment, whose outcome the segment holds.

    ``publish_async`` is meant to cost about a microsecond, so a record future is two attributes and no completion
    work of its own: storing an ``add_all`` records one outcome per piece of a segment
    (``_Segment.settle``), and every record future reads its offset or error from there. Only futures somebody
    waits on or attached a callback to (``watched``) are told individually, and that registration and the
    settling agree under the publisher's lock, so no completion is ever missed. ``concurrent.futures.wait`` and
    ``as_completed`` work: they only use ``_state``, ``_condition`` and ``_waiters``, which are provided here.
    """

    def __init__(self, segment: "_Segment", index: int) -> None:  # not calling Future.__init__ (too costly)
        self._segment = segment
        self._index = index

    @property
    def _state(self) -> str:  # type: ignore[override]
        return _futures_base.FINISHED if self._segment.outcome(self._index) is not None else _futures_base.RUNNING

    def __getattr__(self, name: str) -> Any:
        # Only called for missing attributes: a waiter or callback turns up, so this future must be told.
        if name in _LAZY_SYNC:
            self._segment.watch(self)
            return self.__dict__[name]
        raise AttributeError(name)

    def done(self) -> bool:
        return self._segment.outcome(self._index) is not None

    def running(self) -> bool:
        return not self.done()

    def cancelled(self) -> bool:
        return False

    def cancel(self) -> bool:
        return False  # an accepted record cannot be taken back

    def _outcome(self, timeout: float | None) -> tuple[int | None, BaseException | None]:
        outcome = self._segment.outcome(self._index)
        if outcome is None:
            condition = self._condition
            with condition:
                condition.wait_for(lambda: self._segment.outcome(self._index) is not None, timeout)
            outcome = self._segment.outcome(self._index)
            if outcome is None:
                raise TimeoutError()
        return outcome

    def result(self, timeout: float | None = None) -> int:
        offset, error = self._outcome(timeout)
        if error is not None:
            raise error
        return offset  # type: ignore[return-value]

    def exception(self, timeout: float | None = None) -> BaseException | None:
        return self._outcome(timeout)[1]

    def add_done_callback(self, fn: Callable[["Future[int]"], object]) -> None:
        if not self._segment.watch(self, fn):
            _run_done_callback(fn, self)

    def __repr__(self) -> str:
        outcome = self._segment.outcome(self._index)
        if outcome is None:
            return f"<publish future at {id(self):#x} state=running>"
        offset, error = outcome
        shown = f"raised {type(error).__name__}" if error is not None else f"offset={offset}"
        return f"<publish future at {id(self):#x} state=finished {shown}>"

    def set_running_or_notify_cancel(self) -> bool:
        raise RuntimeError("publish futures are completed by their publisher")

    def set_result(self, result: Any) -> None:
        raise RuntimeError("publish futures are completed by their publisher")

    def set_exception(self, exception: BaseException | None) -> None:
        raise RuntimeError("publish futures are completed by their publisher")

    def wake(self, error: BaseException | None) -> None:
        """Tell the waiters, once the segment holds this record's outcome (any thread: no user code runs)."""
        condition = self.__dict__.get("_condition")
        if condition is not None:
            with condition:
                for waiter in self.__dict__["_waiters"]:
                    if error is None:
                        waiter.add_result(self)
                    else:
                        waiter.add_exception(self)
                condition.notify_all()

    def has_callbacks(self) -> bool:
        return bool(self.__dict__.get("_done_callbacks")) or "callback" in self.__dict__

    def call_back(self, offset: int | None, error: BaseException | None) -> None:
        """Run the done-callbacks and the publish callback (completion thread only: user code)."""
        for fn in self.__dict__.get("_done_callbacks", ()):
            _run_done_callback(fn, self)
        callback = self.__dict__.get("callback")
        if callback is not None:
            _call_back(callback, offset, error)


def _run_done_callback(fn: Callable[[Any], object], future: Any) -> None:
    try:
        fn(future)
    except Exception:  # noqa: BLE001 - as concurrent.futures does: a done callback never breaks completion
        logger.exception("a done callback of a publish future raised")


class _Segment:
    """Records queued for one lane, in order: Python lists (single publishes, ``publish_many``) or Arrow arrays.

    ``targets`` maps runs of the segment's records to bulk sinks: ``(first record, count, sink, position in
    sink)``. Single records have ``_RecordFuture`` s instead, which read ``outcomes``: one ``(start, stop, base,
    error)`` per stored (or failed) piece, sorted by start; record ``i`` of a stored piece has offset ``base + i``.
    ``watched`` are the record futures, sorted by index, that must be told of their outcome.
    """

    __slots__ = (
        "lock", "values", "keys", "headers", "stamps", "arrow", "n", "pos", "nbytes", "open", "targets", "singles",
        "outcomes", "watched", "_cum", "_starts",
    )

    def __init__(self, lock: Any) -> None:
        self.lock = lock  # the publisher's
        self.values: list[bytes] = []
        self.keys: list[bytes | None] | None = None
        self.headers: list[tuple[tuple[str, bytes], ...]] | None = None
        self.stamps: list[int] = []
        self.arrow: _ArrowColumns | None = None
        self.n = 0
        self.pos = 0
        self.nbytes = 0
        self.open = True
        self.targets: list[tuple[int, int, _Sink, int]] = []
        self.singles = False  # holds records of publish_async (with record futures)
        # Only appended to, or replaced, so futures read it without the lock.
        self.outcomes: list[tuple[int, int, int, BaseException | None]] = []
        self.watched: list[_RecordFuture] = []
        self._cum: np.ndarray | None = None
        self._starts: list[int] | None = None

    # ----------------------------------------------------------------------------------------- record futures

    def outcome(self, index: int) -> tuple[int | None, BaseException | None] | None:
        """``(offset, None)`` or ``(None, error)`` once record ``index`` was stored or failed, else None."""
        outcomes = self.outcomes
        # Tuples compare by start first: no Python key function on this path.
        k = bisect_right(outcomes, (index, _AFTER_ANY)) - 1
        if k < 0:
            return None
        start, stop, base, error = outcomes[k]
        if index >= stop:
            return None
        return (None, error) if error is not None else (base + index, None)

    def watch(self, future: _RecordFuture, done_callback: Callable[[Any], object] | None = None) -> bool:
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

    def watch_locked(self, future: _RecordFuture) -> None:
        watched = self.watched
        if not watched or watched[-1]._index < future._index:
            watched.append(future)
        elif future not in watched:
            insort(watched, future, key=_INDEX)

    def settle(
        self, start: int, stop: int, base: int, error: BaseException | None
    ) -> list[_RecordFuture]:
        """Record the outcome of records ``[start, stop)`` (lock held); returns the watched futures among them."""
        if not self.singles:
            return []
        outcome = (start, stop, base, error)
        if not self.outcomes or self.outcomes[-1][0] < start:
            self.outcomes.append(outcome)  # in order (the usual case): readers see a consistent prefix
        else:
            outcomes = list(self.outcomes)  # out of order (close failing queued records): copy, then swap
            insort(outcomes, outcome, key=_START)
            self.outcomes = outcomes
        watched = self.watched
        if not watched:
            return []
        lo = bisect_left(watched, start, key=_INDEX)
        hi = bisect_left(watched, stop, lo, key=_INDEX)
        told = watched[lo:hi]
        del watched[lo:hi]
        return told

    # ----------------------------------------------------------------------------------------- appending

    def add(self, record: Record, stamp: int, sink: _Sink | None = None, sink_pos: int = 0) -> int:
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

    def add_values(self, values: list[bytes], stamp: int, sink: _Sink, sink_pos: int) -> int:
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

    def _target(self, sink: _Sink, sink_pos: int, count: int) -> None:
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
                sizes = self.arrow.sizes()
            else:
                sizes = np.fromiter(map(len, self.values), dtype=np.int64, count=self.n)
                if self.keys is not None:
                    sizes += np.fromiter((0 if k is None else len(k) for k in self.keys), dtype=np.int64, count=self.n)
                if self.headers is not None:
                    sizes += np.fromiter(
                        (sum(len(k) + len(v) for k, v in hs) for hs in self.headers), dtype=np.int64, count=self.n
                    )
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


class _ArrowColumns:
    """A bulk of records as Arrow arrays (value/key binary, timestamps in ms); encoded without Python objects."""

    def __init__(
        self, values: pa.Array, keys: pa.Array | None, headers: list[Any] | None, stamps: np.ndarray | int
    ) -> None:
        self.values = values
        self.keys = keys
        self.headers = headers
        self.stamps = stamps

    @staticmethod
    def _offsets(array: pa.Array) -> np.ndarray:
        raw = np.frombuffer(array.buffers()[1], dtype=_I32)
        return raw[array.offset:array.offset + len(array) + 1]

    def sizes(self) -> np.ndarray:
        sizes = np.diff(self._offsets(self.values)).astype(np.int64)
        if self.keys is not None:
            sizes += np.diff(self._offsets(self.keys))
        if self.headers is not None:
            sizes += np.fromiter(
                (sum(len(k) + len(v) for k, v in hs) for hs in self.headers), dtype=np.int64, count=len(self.headers)
            )
        return sizes

    def prepare(self, start: int, stop: int) -> PreparedColumns:
        value_lengths, value_data = _binary_slice(self.values, start, stop)
        key_lengths = None
        key_data: Any = b""
        if self.keys is not None:
            key_lengths, key_data = _binary_slice(self.keys, start, stop)
            if self.keys.null_count:
                valid = np.asarray(self.keys.slice(start, stop - start).is_valid())
                key_lengths = np.where(valid, key_lengths, -1).astype(_I32)
        stamps = self.stamps if isinstance(self.stamps, int) else self.stamps[start:stop]
        columns = PreparedColumns(stop - start, value_lengths, value_data, stamps, key_lengths, key_data)
        if self.headers is not None and any(self.headers[start:stop]):
            with_headers = prepare_columns([b""] * (stop - start), headers=self.headers[start:stop], timestamps=0)
            columns = PreparedColumns(
                columns.count,
                value_lengths,
                value_data,
                stamps,
                key_lengths,
                key_data,
                with_headers.header_counts,
                with_headers.hkey_lengths,
                with_headers.hkey_data,
                with_headers.hvalue_lengths,
                with_headers.hvalue_data,
            )
        return columns


def _binary_slice(array: pa.Array, start: int, stop: int) -> tuple[np.ndarray, memoryview]:
    offsets = _ArrowColumns._offsets(array)[start:stop + 1]
    data = array.buffers()[2]
    lengths = np.diff(offsets).astype(_I32)
    if data is None:
        return lengths, memoryview(b"")
    return lengths, memoryview(data)[int(offsets[0]):int(offsets[-1])]


@dataclass
class _Piece:
    segment: _Segment
    start: int
    stop: int
    item: int  # index of the ring item within its add_all call
    index: int  # index of the piece's first record within that item


class _Lane:
    __slots__ = ("lane", "ring", "lock", "segments", "queued", "queued_bytes", "since", "in_flight")

    def __init__(self, lane: int, ring: Any, lock: Any) -> None:
        self.lane = lane
        self.ring = ring
        self.lock = lock  # the publisher's
        self.segments: deque[_Segment] = deque()
        self.queued = 0
        self.queued_bytes = 0
        self.since = 0.0
        self.in_flight = False

    def open_segment(self) -> _Segment:
        if self.segments:
            last = self.segments[-1]
            if last.open and last.arrow is None:
                return last
        segment = _Segment(self.lock)
        self.segments.append(segment)
        return segment


class Publisher:
    """Publishes records to a stream.

    Args:
        grid: the grid connection.
        stream: a ``StreamConfig`` (the stream is created when missing) or the name of an existing stream.
        linger_ms, max_batch_records, max_batch_bytes, compression, compression_threshold: override the stream's
            stored batching settings for this publisher.
        max_buffered_records: records accepted but not yet stored, at most (back-pressure beyond).
        max_block_ms: how long a publish call waits for room before ``PublishTimeoutError``.
        max_items_per_call: ring items per ``add_all`` call.

    Examples:
        >>> with Publisher(grid, StreamConfig("orders", lanes=4)) as pub:          # doctest: +SKIP
        ...     offset = pub.publish(Record(b"{...}", key=b"customer-42"))
        ...     future = pub.publish_async(b"fire and forget")
    """

    def __init__(
        self,
        grid: Grid,
        stream: StreamConfig | str,
        *,
        linger_ms: float | None = None,
        max_batch_records: int | None = None,
        max_batch_bytes: int | None = None,
        max_buffered_records: int | None = None,
        max_block_ms: float | None = None,
        max_items_per_call: int | None = None,
        compression: str | None = None,
        compression_threshold: int | None = None,
    ) -> None:
        self._grid = grid
        self.info: StreamInfo = open_stream(grid, stream)
        self.settings = PublisherSettings.parse(
            self.info.config,
            {
                "linger_ms": linger_ms,
                "max_batch_records": max_batch_records,
                "max_batch_bytes": max_batch_bytes,
                "max_buffered_records": max_buffered_records,
                "max_block_ms": max_block_ms,
                "max_items_per_call": max_items_per_call,
                "compression": compression,
                "compression_threshold": compression_threshold,
            },
        )
        self.stream = self.info.name
        self.lanes = self.info.config.lanes
        self.producer_id = _producer_id(grid)
        self._max_buffered = self.settings.max_buffered_records
        self._items_per_call = min(self.settings.max_items_per_call, self.info.config.capacity)
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)  # the sender waits here
        self._room = threading.Condition(self._lock)  # publishers (back-pressure) and flush() wait here
        self._lanes = [_Lane(i, grid.ring(name), self._lock) for i, name in enumerate(self.info.ring_names)]
        self._outstanding = 0  # accepted, not yet completed
        self._flushing = 0
        self._closing = False
        self._closed = False
        self._sticky = 0
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
        logger.debug("publisher %x on stream %r started (%s)", self.producer_id, self.stream, self.settings)

    # ------------------------------------------------------------------------------------------------ publishing

    def publish(self, record: Record | bytes | str, timeout_s: float | None = None) -> int:
        """Publish one record and wait until it is stored; returns its offset.

        Raises:
            GridError: the grid refused or lost the write. PublishTimeoutError: no room, or not stored in
            ``timeout_s``. PublisherClosedError: after ``close()``.
        """
        future = self.publish_async(record)
        try:
            return future.result(timeout_s)
        except TimeoutError:
            raise PublishTimeoutError(
                f"record not stored in stream {self.stream!r} within {timeout_s} s; it may still be stored later"
            ) from None

    def publish_async(self, record: Record | bytes | str, callback: PublishCallback | None = None) -> "Future[int]":
        """Queue one record; the future (and ``callback(offset, error)``) completes once it is stored.

        The callback runs on the publisher's completion thread, never on the caller's or the grid client's.
        """
        if type(record) is bytes:
            # The hot path: a plain value needs no Record and no checks.
            rec = None
            lane = -1
            stamp = time.time_ns() // 1_000_000
        else:
            rec = _checked_record(record)
            lane = self._lane_of(rec)
            stamp = rec.timestamp_ms if rec.timestamp_ms is not None else int(time.time() * 1000)
        with self._lock:
            if self._closing or self._outstanding >= self._max_buffered:
                self._admit(1)
            else:
                self._outstanding += 1
            state = self._lanes[self._sticky if lane < 0 else lane]
            segments = state.segments
            segment = segments[-1] if segments else None
            if segment is None or not segment.open:  # (an Arrow segment is never open)
                segment = state.open_segment()
            segment.singles = True
            future = _RecordFuture(segment, segment.n)
            if rec is None and segment.keys is None and segment.headers is None:
                # add_value, inlined: this path runs a million times a second.
                segment.values.append(record)
                segment.stamps.append(stamp)
                segment.n += 1
                size = len(record)  # type: ignore[arg-type]
                segment.nbytes += size
            else:
                size = segment.add_value(record, stamp) if rec is None else segment.add(rec, stamp)  # type: ignore[arg-type]
            if callback is not None:
                future.callback = callback
                segment.watch_locked(future)
            if state.in_flight and state.queued:
                # _queued's answer for a lane in flight that has records queued already, inlined.
                state.queued += 1
                state.queued_bytes += size
                call = None
            else:
                call = self._claim(state) if self._queued(state, 1, size) else None
        if call is not None:
            self._send(*call)
        return future

    def publish_many(self, records: Iterable[Record | bytes | str]) -> "Future[list[int]]":
        """Queue many records at once (cheaper per record); the future completes with their offsets, in order.

        Keyless records without an explicit lane are spread over the lanes in contiguous runs.
        """
        items = records if isinstance(records, list) else list(records)
        sink = _Sink("list", len(items))
        if not items:
            sink.set_result([])
            return sink
        now = int(time.time() * 1000)
        if all(type(r) is bytes for r in items):
            # Fast path for plain values: no Record objects, contiguous runs over the lanes.
            values: list[bytes] = items  # type: ignore[assignment]
            with self._lock:
                self._admit(len(values))
                calls = []
                for lane, start, stop in self._spread(len(values)):
                    state = self._lanes[lane]
                    size = state.open_segment().add_values(values[start:stop], now, sink, start)
                    if self._queued(state, stop - start, size):
                        calls.append(self._claim(state))
            self._send_all(calls)
            return sink
        recs = [_checked_record(r) for r in items]
        by_lane = self._split_by_lane(recs)
        with self._lock:
            self._admit(len(recs))
            calls = []
            for lane, positions in by_lane.items():
                state = self._lanes[lane]
                segment = state.open_segment()
                size = 0
                for position in positions:
                    rec = recs[position]
                    size += segment.add(rec, now if rec.timestamp_ms is None else rec.timestamp_ms, sink, position)
                if self._queued(state, len(positions), size):
                    calls.append(self._claim(state))
        self._send_all(calls)
        return sink

    def publish_arrow(self, batch: pa.RecordBatch | pa.Table) -> ArrowPublishFuture:
        """Queue the rows of an Arrow batch or table; the future completes with the number of records stored.

        ``lanes_written()`` of the future then gives, per lane, the records stored and their first/last offsets.

        Columns: ``value`` (required; binary or string), optional ``key`` (binary/string, nulls allowed),
        ``headers`` (list<struct<key: string, value: binary>>), ``timestamp`` (a timestamp type, or int64 ms;
        nulls = now) and ``lane`` (integer; nulls = by key). Other columns are ignored.
        """
        table = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
        columns = set(table.column_names)
        if "value" not in columns:
            raise ConfigError(
                f"publish_arrow needs a 'value' column (binary or string); got columns {sorted(columns)}"
            )
        n = table.num_rows
        sink = ArrowPublishFuture(n)
        if n == 0:
            sink.set_result(0)
            return sink
        table = table.combine_chunks()
        values = _binary_column(table, "value", nullable=False)
        keys = _binary_column(table, "key", nullable=True) if "key" in columns else None
        if keys is not None and keys.null_count == len(keys):
            keys = None
        stamps = _timestamps_column(table) if "timestamp" in columns else int(time.time() * 1000)
        headers = _headers_column(table) if "headers" in columns else None
        lanes = self._arrow_lanes(table, keys)
        pieces: list[tuple[int, np.ndarray | slice]] = []
        if isinstance(lanes, np.ndarray):
            order = np.argsort(lanes, kind="stable")
            bounds = np.searchsorted(lanes[order], np.arange(self.lanes + 1))
            for lane in range(self.lanes):
                if bounds[lane + 1] > bounds[lane]:
                    pieces.append((lane, order[bounds[lane]:bounds[lane + 1]]))
        else:
            for lane, start, stop in self._spread(n):
                pieces.append((lane, slice(start, stop)))
        segments = []
        for lane, rows in pieces:
            if isinstance(rows, slice):
                length = rows.stop - rows.start
                seg_values = values.slice(rows.start, length)
                seg_keys = None if keys is None else keys.slice(rows.start, length)
                seg_stamps = stamps if isinstance(stamps, int) else stamps[rows]
                seg_headers = None if headers is None else headers[rows]
            else:
                indices = pa.array(rows)
                seg_values = values.take(indices)
                seg_keys = None if keys is None else keys.take(indices)
                seg_stamps = stamps if isinstance(stamps, int) else stamps[rows]
                seg_headers = None if headers is None else [headers[i] for i in rows.tolist()]
            segment = _Segment(self._lock)
            segment.arrow = _ArrowColumns(seg_values, seg_keys, seg_headers, seg_stamps)
            segment.n = len(seg_values)
            segment.nbytes = int(segment.cumulative_bytes()[-1])
            segment.open = False
            segment.targets = [(0, segment.n, sink, 0)]
            segments.append((lane, segment))
        with self._lock:
            self._admit(n)
            calls = []
            for lane, segment in segments:
                state = self._lanes[lane]
                state.segments.append(segment)
                if self._queued(state, segment.n, segment.nbytes):
                    calls.append(self._claim(state))
        self._send_all(calls)
        return sink

    # ------------------------------------------------------------------------------------------------ lifecycle

    def flush(self, timeout_s: float | None = None) -> None:
        """Send everything queued now (ignoring linger) and wait until all accepted records completed.

        Raises:
            PublishTimeoutError: records were still outstanding after ``timeout_s``.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._lock:
            self._flushing += 1
            self._work.notify()
            try:
                while self._outstanding:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        raise PublishTimeoutError(
                            f"flush of stream {self.stream!r}: {self._outstanding} records still not stored after "
                            f"{timeout_s} s; the grid is slow or unreachable"
                        )
                    self._room.wait(remaining)
            finally:
                self._flushing -= 1

    def close(self, timeout_s: float | None = None) -> None:
        """Stop accepting records, send and wait for everything accepted, then stop the threads.

        With ``timeout_s``, records still not stored when it passes get ``PublishTimeoutError`` in their futures
        (nothing is dropped silently).
        """
        with self._lock:
            if self._closed:
                return
            self._closing = True
        try:
            self.flush(timeout_s)
        except PublishTimeoutError as exc:
            self._fail_queued(exc)
            raise
        finally:
            with self._lock:
                self._closed = True
                self._work.notify_all()
            self._sender.join()
            self._completions.put(None)
            self._completer.join()
            logger.debug(
                "publisher %x on stream %r closed: %d records in %d items, %d calls, %d failed",
                self.producer_id, self.stream, self.records_sent, self.items_sent, self.calls, self.failed_records,
            )

    def __enter__(self) -> "Publisher":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def metrics(self) -> dict[str, int]:
        """Counters since creation: records/items sent, add_all calls, failed records, records outstanding."""
        with self._lock:
            outstanding = self._outstanding
        return {
            "records_sent": self.records_sent,
            "items_sent": self.items_sent,
            "calls": self.calls,
            "failed_records": self.failed_records,
            "outstanding": outstanding,
        }

    # ------------------------------------------------------------------------------------------------ accepting

    def _lane_of(self, record: Record) -> int:
        if record.lane >= 0:
            if record.lane >= self.lanes:
                raise ConfigError(
                    f"record lane {record.lane} does not exist in stream {self.stream!r} "
                    f"(lanes 0..{self.lanes - 1}); use -1 to choose by key"
                )
            return record.lane
        if record.key is not None:
            return lane_for_key(record.key, self.lanes)
        return -1  # the publisher chooses (the sticky lane, read under the lock)

    def _split_by_lane(self, records: list[Record]) -> dict[int, list[int]]:
        by_lane: dict[int, list[int]] = {}
        keyless: list[int] = []
        for position, rec in enumerate(records):
            if rec.lane >= 0 or rec.key is not None:
                by_lane.setdefault(self._lane_of(rec), []).append(position)
            else:
                keyless.append(position)
        if keyless:
            for lane, start, stop in self._spread(len(keyless)):
                by_lane.setdefault(lane, []).extend(keyless[start:stop])
                by_lane[lane].sort()
        return by_lane

    def _spread(self, n: int) -> list[tuple[int, int, int]]:
        """Contiguous runs of ``n`` keyless records over the lanes, starting at the sticky lane."""
        if self.lanes == 1:
            return [(0, 0, n)]
        per_lane = max(1, -(-n // self.lanes))
        runs = []
        lane = self._sticky
        for start in range(0, n, per_lane):
            runs.append((lane, start, min(n, start + per_lane)))
            lane = (lane + 1) % self.lanes
        self._sticky = lane
        return runs

    def _arrow_lanes(self, table: pa.Table, keys: pa.Array | None) -> np.ndarray | None:
        """Per-row lanes (explicit ``lane`` column, else by key, else the sticky lane); None = spread the rows."""
        explicit: np.ndarray | None = None
        if "lane" in table.column_names:
            column = _column(table, "lane")
            if not pa.types.is_integer(column.type):
                raise ConfigError(f"column 'lane' must be an integer column, got {column.type}")
            explicit = np.asarray(column.fill_null(-1).cast(pa.int64()))
            bad = explicit[(explicit >= self.lanes) | (explicit < -1)]
            if bad.size:
                raise ConfigError(
                    f"column 'lane' holds {int(bad[0])}, but stream {self.stream!r} has lanes 0..{self.lanes - 1} "
                    f"(null or -1 = by key)"
                )
        if keys is None and explicit is None:
            return None
        lanes = np.full(table.num_rows, -1, dtype=np.int64) if explicit is None else explicit.copy()
        if keys is not None:
            missing = np.flatnonzero(lanes < 0)
            if missing.size:
                key_list = keys.take(pa.array(missing)).to_pylist()
                lanes[missing] = [-1 if k is None else lane_for_key(k, self.lanes) for k in key_list]
        lanes[lanes < 0] = self._sticky
        return lanes

    def _admit(self, n: int) -> None:
        """Wait for room for ``n`` records (lock held). A bulk larger than the buffer waits for an empty buffer."""
        if self._closing:
            raise PublisherClosedError(f"the publisher of stream {self.stream!r} is closed; create a new one")
        limit = self.settings.max_buffered_records
        if self._outstanding + n <= limit or self._outstanding == 0:
            self._outstanding += n
            return
        deadline = time.monotonic() + self.settings.max_block_ms / 1000.0
        while self._outstanding + n > limit and self._outstanding > 0:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise PublishTimeoutError(
                    f"stream {self.stream!r}: {self._outstanding} records are waiting to be stored (max_buffered_"
                    f"records={limit}) and no room freed up within max_block_ms={self.settings.max_block_ms:g}; the "
                    f"grid is slower than the publishing rate, or unreachable"
                )
            self._room.wait(remaining)
            if self._closing:
                raise PublisherClosedError(f"the publisher of stream {self.stream!r} was closed while waiting")
        self._outstanding += n

    def _queued(self, state: _Lane, n: int, nbytes: int) -> bool:
        """Count records queued on a lane (lock held); True when the caller should send the lane now (``_claim``)."""
        first = state.queued == 0
        if first:
            state.since = time.monotonic()
        state.queued += n
        state.queued_bytes += nbytes
        # While the lane's call is in flight, its completion wakes the sender anyway.
        if state.in_flight:
            return False
        settings = self.settings
        if settings.linger_ms <= 0:
            # Nothing to wait for: sending from the publishing thread saves a hand-off to the sender thread (the
            # latency of one record), and the lane is claimed under the lock, so order per lane holds.
            return True
        # Wake the sender only when it has something new to decide: a lane that starts its linger, or a batch
        # that just filled up.
        if first or state.queued >= settings.max_batch_records or state.queued_bytes >= settings.max_batch_bytes:
            self._work.notify()
        return False

    def _claim(self, state: _Lane) -> tuple[_Lane, list["_Piece"], int, int]:
        """Take the next call's items off an idle lane and mark it in flight (lock held); ``_send`` sends them."""
        pieces, n_items, n_records = self._take(state)
        state.in_flight = True
        if self.lanes > 1 and state.lane == self._sticky:
            self._sticky = (self._sticky + 1) % self.lanes
        return state, pieces, n_items, n_records

    def _send_all(self, calls: list[tuple[_Lane, list["_Piece"], int, int]]) -> None:
        for call in calls:
            self._send(*call)

    # ------------------------------------------------------------------------------------------------ sending

    def _ready(self, state: _Lane, now: float) -> float | None:
        """0 when the lane should be sent now, else seconds until its linger ends (None: nothing to send)."""
        if state.in_flight or not state.queued:
            return None
        settings = self.settings
        if (
            self._flushing
            or self._closing
            or settings.linger_ms <= 0
            or state.queued >= settings.max_batch_records
            or state.queued_bytes >= settings.max_batch_bytes
        ):
            return 0.0
        return max(0.0, state.since + settings.linger_ms / 1000.0 - now)

    def _send_loop(self) -> None:
        while True:
            with self._lock:
                while True:
                    now = time.monotonic()
                    waits = [(self._ready(s, now), s) for s in self._lanes]
                    ready = [s for w, s in waits if w == 0.0]
                    if ready:
                        break
                    if self._closed and not any(s.queued or s.in_flight for s in self._lanes):
                        return
                    pending = [w for w, _ in waits if w is not None]
                    self._work.wait(min(pending) if pending else None)
                calls = [self._claim(state) for state in ready]
            self._send_all(calls)

    def _take(self, state: _Lane) -> tuple[list[_Piece], int, int]:
        """Cut up to ``max_items_per_call`` ring items off the lane's queue (lock held)."""
        max_records = self.settings.max_batch_records
        max_bytes = self.settings.max_batch_bytes
        pieces: list[_Piece] = []
        item = 0
        in_item = 0
        item_bytes = 0
        taken = 0
        taken_bytes = 0
        while state.segments and item < self._items_per_call:
            segment = state.segments[0]
            segment.open = False
            cum = segment.cumulative_bytes()
            p = segment.pos
            while p < segment.n and item < self._items_per_call:
                stop = min(segment.n, p + max_records - in_item)
                # The largest stop whose bytes still fit the item; an oversized record travels alone.
                fit = int(np.searchsorted(cum, cum[p] + (max_bytes - item_bytes), side="right")) - 1
                stop = min(stop, fit)
                if stop <= p:
                    if in_item == 0:
                        stop = p + 1
                    else:
                        item, in_item, item_bytes = item + 1, 0, 0
                        continue
                pieces.append(_Piece(segment, p, stop, item, in_item))
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

    def _send(self, state: _Lane, pieces: list[_Piece], n_items: int, n_records: int) -> None:
        try:
            items = []
            by_item: list[list[PreparedColumns]] = [[] for _ in range(n_items)]
            for piece in pieces:
                by_item[piece.item].append(piece.segment.prepare(piece.start, piece.stop))
                if piece.stop == piece.segment.n:
                    piece.segment.release()
            for prepared in by_item:
                framing = ItemFraming(
                    self.producer_id,
                    next(self._producer_seq),
                    self.settings.compression,
                    self.settings.compression_threshold,
                )
                items.append(encode_prepared(prepared, framing))
            future = state.ring.add_all_async(items)
        except BaseException as exc:  # noqa: BLE001 - whatever broke, these records' futures must hear of it
            self._stored(state, pieces, n_items, n_records, None, exc)
            return
        future.add_done_callback(lambda f: self._stored(state, pieces, n_items, n_records, f, None))

    def _stored(
        self,
        state: _Lane,
        pieces: list[_Piece],
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
        with self._lock:
            state.in_flight = False
            self.calls += 1
            if error is None:
                self.records_sent += n_records
                self.items_sent += n_items
            else:
                self.failed_records += n_records
            told: list[_RecordFuture] = []
            for piece in pieces:
                base = 0 if first_seq is None else ((first_seq + piece.item) << INDEX_BITS) + piece.index - piece.start
                told.extend(piece.segment.settle(piece.start, piece.stop, base, error))
            # Callbacks can no longer be added to settled futures (they would run at once), so this is final.
            called = [future for future in told if future.has_callbacks()]
            late = bool(called) or any(piece.segment.targets for piece in pieces)
            if not late:
                self._outstanding -= n_records
                self._room.notify_all()
            if state.queued or self._closed:
                self._work.notify()
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
                self._complete(lane, pieces, first_seq, error)
                for record_future in called:
                    record_future.call_back(*record_future._segment.outcome(record_future._index))  # type: ignore[misc]
            except Exception:  # noqa: BLE001 - the completion thread must survive anything
                logger.exception("stream %r lane %d: completing a publish failed", self.stream, lane)
            with self._lock:
                self._outstanding -= n_records
                self._room.notify_all()

    def _complete(
        self, lane: int, pieces: list[_Piece], first_seq: int | None, error: BaseException | None
    ) -> None:
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
                        self._fail(sink, error)  # type: ignore[arg-type]
                    else:
                        base = ((first_seq + piece.item) << INDEX_BITS) + piece.index - piece.start
                        self._deliver(sink, sink_pos + lo - t_start, base + lo, hi - lo, lane)
                i += 1

    def _deliver(self, sink: _Sink, position: int, first_offset: int, count: int, lane: int) -> None:
        if sink.failed:
            return
        written = sink.lanes.get(lane)
        if written is None:
            sink.lanes[lane] = [count, first_offset, first_offset + count - 1]
        else:
            written[0] += count
            written[1] = min(written[1], first_offset)
            written[2] = max(written[2], first_offset + count - 1)
        if sink.offsets is not None:
            if count == 1:
                sink.offsets[position] = first_offset
            else:
                sink.offsets[position:position + count] = np.arange(first_offset, first_offset + count)
        sink.remaining -= count
        if sink.remaining == 0 and not sink.done():
            sink.set_result(sink.offsets.tolist() if sink.offsets is not None else sink.size)

    def _fail(self, sink: _Sink, error: BaseException) -> None:
        if sink.failed:
            return
        sink.failed = True
        if not sink.done():
            sink.set_exception(error)

    def _fail_queued(self, error: BaseException) -> None:
        """Fail every record still queued (close with a deadline that passed)."""
        told: list[_RecordFuture] = []
        with self._lock:
            dropped = []
            for state in self._lanes:
                while state.segments:
                    segment = state.segments.popleft()
                    dropped.append(segment)
                    if segment.pos < segment.n:
                        told.extend(segment.settle(segment.pos, segment.n, 0, error))
                    self._outstanding -= segment.n - segment.pos
                    self.failed_records += segment.n - segment.pos
                state.queued = 0
                state.queued_bytes = 0
            self._room.notify_all()
        for segment in dropped:
            for t_start, t_count, sink, _ in segment.targets:
                if t_start + t_count > segment.pos:
                    self._fail(sink, error)
        for record_future in told:
            record_future.wake(error)
            record_future.call_back(None, error)


def _call_back(callback: PublishCallback, offset: int | None, error: BaseException | None) -> None:
    try:
        callback(offset, error)
    except Exception:  # noqa: BLE001 - a user's callback must never stop the publisher
        logger.exception("a publish callback raised; the publisher goes on")


def _checked_record(item: Record | bytes | str) -> Record:
    if isinstance(item, (bytes, bytearray)):
        return Record(bytes(item))
    if isinstance(item, str):
        return Record(item.encode("utf-8"))
    if not isinstance(item, Record):
        raise ConfigError(
            f"cannot publish a {type(item).__name__}: give a Record, bytes or str (encode other objects to bytes)"
        )
    if not isinstance(item.value, (bytes, bytearray)):
        raise ConfigError(f"Record.value must be bytes, got {type(item.value).__name__}; encode it first")
    if item.key is not None and not isinstance(item.key, (bytes, bytearray)):
        raise ConfigError(f"Record.key must be bytes or None, got {type(item.key).__name__}; encode it first")
    if item.headers:
        for pair in item.headers:
            if (
                not isinstance(pair, tuple)
                or len(pair) != 2
                or not isinstance(pair[0], str)
                or not isinstance(pair[1], (bytes, bytearray))
            ):
                raise ConfigError(
                    f"Record.headers must be (str, bytes) pairs, e.g. (('trace-id', b'abc'),); got {pair!r}"
                )
    if item.timestamp_ms is not None and (isinstance(item.timestamp_ms, bool) or not isinstance(item.timestamp_ms, int)):
        raise ConfigError(f"Record.timestamp_ms must be an int (ms since the epoch) or None, got {item.timestamp_ms!r}")
    return item


def _producer_id(grid: Grid) -> int:
    try:
        return grid.flake_id("meteor.producer")
    except GridError as exc:
        logger.debug("no FlakeIdGenerator (%s); using a random producer id", exc)
        return uuid.uuid4().int >> 65


def _column(table: pa.Table, name: str) -> pa.Array:
    """One column as a single array. ``ChunkedArray.combine_chunks`` copies even a lone chunk (the whole values
    buffer of a large batch), so a single chunk is taken as it is."""
    chunked = table.column(name)
    return chunked.chunk(0) if chunked.num_chunks == 1 else chunked.combine_chunks()


def _binary_column(table: pa.Table, name: str, *, nullable: bool) -> pa.Array:
    column = _column(table, name)
    kind = column.type
    if pa.types.is_string(kind):
        column = column.view(pa.binary())
    elif pa.types.is_large_string(kind) or pa.types.is_large_binary(kind):
        column = column.cast(pa.large_binary()).cast(pa.binary())
    elif not pa.types.is_binary(kind):
        raise ConfigError(f"column {name!r} must be binary or string, got {kind}")
    if not nullable and column.null_count:
        raise ConfigError(f"column {name!r} has {column.null_count} nulls; every record needs a value")
    return column


def _timestamps_column(table: pa.Table) -> np.ndarray | int:
    column = _column(table, "timestamp")
    now = int(time.time() * 1000)
    if pa.types.is_timestamp(column.type):
        millis = column.cast(pa.timestamp("ms", tz=column.type.tz)).cast(pa.int64())
    elif pa.types.is_integer(column.type):
        millis = column.cast(pa.int64())
    else:
        raise ConfigError(f"column 'timestamp' must be a timestamp or int64 milliseconds, got {column.type}")
    return np.asarray(millis.fill_null(now), dtype=np.int64)


def _headers_column(table: pa.Table) -> list[tuple[tuple[str, bytes], ...]] | None:
    column = _column(table, "headers")
    if column.null_count == len(column):
        return None
    out: list[tuple[tuple[str, bytes], ...]] = []
    for row in column.to_pylist():
        if not row:
            out.append(())
            continue
        pairs = []
        for entry in row:
            if entry is None:
                continue
            if isinstance(entry, dict):
                key, value = entry.get("key"), entry.get("value")
            else:
                key, value = entry
            if isinstance(value, str):
                value = value.encode("utf-8")
            if not isinstance(key, str) or not isinstance(value, (bytes, bytearray)):
                raise ConfigError(
                    f"column 'headers' must be list<struct<key: string, value: binary>>; got an entry {entry!r}"
                )
            pairs.append((key, bytes(value)))
        out.append(tuple(pairs))
    return out if any(out) else None
