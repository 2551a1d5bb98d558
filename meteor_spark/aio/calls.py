"""What the asyncio publisher's calls are made of (``meteor_spark.aio.publisher``): the sink a call's offsets go to,
a run of queued records (columns), a lane's state, an ``add_all`` under retry, and the lookup of a call whose
answer was lost.

The lookup is the threaded retrier's search (``meteor_spark.producer.idempotence.call_search``), each grid call it
asks for awaited on an ``AsyncRing``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from bisect import bisect_right
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import accumulate, islice
from typing import Any

import numpy as np

from meteor_spark.aio.record_future import PublishFuture, RunOutcomes
from meteor_spark.errors import GridError, MeteorError
from meteor_spark.format.item_encoding import (
    SMALL_ITEM_RECORDS,
    ItemFraming,
    PreparedColumns,
    encode_items,
    encode_small_item,
    prepare_columns,
)
from meteor_spark.format.item_header import NO_TIMESTAMP, item_lane_max_timestamp
from meteor_spark.format.offsets import make_offset
from meteor_spark.format.wire import lane_max_after
from meteor_spark.grid.aio_client import AsyncGrid, AsyncRing
from meteor_spark.producer.batching import PublisherSettings
from meteor_spark.producer.idempotence import (
    FIRST_BACKOFF_S,
    MAX_BACKOFF_S,
    StoredCallLost,
    call_search,
    lost_call_error,
    outcome_unknown,
    timeout_error,
)
from meteor_spark.producer.publisher import random_producer_id

logger = logging.getLogger("meteor_spark.aio.publisher")

_NS_PER_MS = 1_000_000


class Sink:
    """Where the offsets of one ``publish`` / ``publish_many`` call go: its future completes once every record of
    the call is stored (with the offset, or the list of offsets), or with the first error."""

    __slots__ = ("future", "left", "offsets", "single")

    def __init__(self, future: asyncio.Future[Any], count: int, single: bool) -> None:
        self.future = future
        self.left = count
        self.offsets = [0] * count
        self.single = single

    def stored(self, run: Run, lo: int, hi: int, first_offset: int) -> None:
        """Records ``[lo, hi)`` of ``run`` were stored, the first at ``first_offset`` (the others follow it)."""
        n = hi - lo
        if run.indices is None:
            start = run.sink_start + lo
            self.offsets[start : start + n] = range(first_offset, first_offset + n)
        else:
            for k, index in enumerate(run.indices[lo:hi]):
                self.offsets[index] = first_offset + k
        self.left -= n
        if self.left == 0 and not self.future.done():
            self.future.set_result(self.offsets[0] if self.single else self.offsets)

    def failed(self, error: BaseException, lo: int = 0, hi: int | None = None) -> None:
        """The call failed with ``error`` (the first error ends the whole call: ``lo`` / ``hi`` do not matter)."""
        if not self.future.done():
            self.future.set_exception(error)
            self.future.exception()  # retrieved: a fire-and-forget publish_async does not log "never retrieved"


class Run:
    """Records of one ``publish`` / ``publish_many`` call queued on one lane, in order, and how far the lane's calls
    have taken them (``pos``). Columns, not record objects: cutting a run into ring items costs per item, not per
    record (``cum`` holds the running sum of the records' sizes: value, key and header bytes).

    Attributes:
        values, keys, headers, stamps: the records' columns (``keys`` / ``headers`` None: none has any).
        cum: ``cum[i]`` = the sizes of records ``0..i`` together; a run of one-record calls extends it only when it
            is cut (``sized``), not on every append.
        sink, sink_start, indices: where the records' offsets go: positions ``sink_start + i``, or ``indices[i]``.
        outcomes: a run of one-record calls' ``RunOutcomes`` (also its sink: each record's future reads its outcome
            there), else None.
        ns_stamps: ``stamps`` are ``time.time_ns()`` readings (a run of one-record calls), made milliseconds per
            ring item when it is encoded (``item_columns``), not per record.
    """

    __slots__ = (
        "cum",
        "headers",
        "indices",
        "keys",
        "ns_stamps",
        "outcomes",
        "pos",
        "sink",
        "sink_start",
        "stamps",
        "values",
    )

    def __init__(
        self,
        values: list[bytes],
        keys: list[bytes | None] | None,
        headers: list[tuple[tuple[str, bytes], ...]] | None,
        stamps: list[int],
        sizes: Iterable[int],
        sink: Sink | RunOutcomes,
        sink_start: int = 0,
        indices: list[int] | None = None,
    ) -> None:
        self.values = values
        self.keys = keys
        self.headers = headers
        self.stamps = stamps
        self.cum = list(accumulate(sizes))
        self.sink = sink
        self.sink_start = sink_start
        self.indices = indices
        self.pos = 0
        self.outcomes: RunOutcomes | None = None
        self.ns_stamps = False

    @classmethod
    def of_singles(cls, loop: asyncio.AbstractEventLoop) -> Run:
        """An empty run for one-record calls of plain values: their outcomes for their ``PublishFuture`` s, stamps
        in nanoseconds."""
        values: list[bytes] = []
        outcomes = RunOutcomes(loop, values)
        run = cls(values, None, None, [], (), outcomes)
        run.outcomes = outcomes
        run.ns_stamps = True
        return run

    def sized(self) -> None:
        """Extend ``cum`` over the records appended since it was last extended."""
        known = len(self.cum)
        if known < len(self.values):
            below = self.cum[-1] if known else 0
            self.cum += islice(accumulate(map(len, self.values[known:]), initial=below), 1, None)

    def ms_stamps(self, lo: int, hi: int) -> list[int]:
        """Records ``[lo, hi)``'s timestamps in milliseconds."""
        stamps = self.stamps[lo:hi]
        return [stamp // _NS_PER_MS for stamp in stamps] if self.ns_stamps else stamps


#: A piece of a ring item: records ``[lo, hi)`` of a run.
Piece = tuple[Run, int, int]


@dataclass(slots=True, eq=False)
class Lane:
    """One lane of the publisher: its queue, the task sending it, where its next call lands and its largest
    timestamp so far (the time index every item carries).

    ``singles`` is the run that one-record calls of plain values append to (``AsyncPublisher.publish_async``); it is
    always the queue's last run, and it is closed (set to None) when another run is queued after it, when the queue
    is cut empty, or once a call took records from it: a run that keeps receiving records while calls are cut from
    it would hold every value it ever carried.
    """

    ring: AsyncRing
    number: int = 0  # the lane's number in its stream
    queue: deque[Run] = field(default_factory=deque)
    queued: int = 0  # records in the queue not yet cut into a call
    task: asyncio.Task[None] | None = None  # None once the sending task has emptied the queue
    next_start: int = 0
    lane_max: int = NO_TIMESTAMP
    singles: Run | None = None

    def open_singles(self, loop: asyncio.AbstractEventLoop) -> Run:
        """A new run for one-record calls, queued last."""
        run = self.singles = Run.of_singles(loop)
        self.queue.append(run)
        return run

    def append_plain(self, loop: asyncio.AbstractEventLoop, value: bytes) -> PublishFuture:
        """Queue the plain value of a one-record call on ``singles``; its future (``AsyncPublisher.publish_async``
        does the same inline)."""
        run = self.singles or self.open_singles(loop)
        future = PublishFuture()
        future._outcomes, future._index = run.outcomes, len(run.values)  # type: ignore[assignment]
        run.values.append(value)
        run.stamps.append(time.time_ns())
        self.queued += 1
        return future

    def append_run(self, run: Run) -> None:
        """Queue ``run`` (records of one ``publish`` / ``publish_many`` call) after the others."""
        self.queue.append(run)
        self.queued += len(run.values)
        self.singles = None

    def after_cut(self) -> None:
        """Close the run of one-record calls once a call took records from it (see the class docs)."""
        if self.singles is not None and (self.singles.pos or not self.queue):
            self.singles = None


async def lane_at_start(stream: str, lane: int, ring: AsyncRing) -> Lane:
    """A lane's state when a publisher starts: the first sequence its next call can occupy, and its last item's
    running maximum timestamp (an undecodable last item adds nothing, as in the threaded sender)."""
    tail = await ring.tail()
    state = Lane(ring, lane, next_start=tail + 1)
    if tail >= 0:
        batch = await ring.read_many(tail, 0, 1)
        if batch.items:
            try:
                state.lane_max = lane_max_after(batch.items[0], stream=stream, lane=lane, sequence=tail)
            except MeteorError as exc:
                logger.warning("stream %r lane %d: %s; the lane's largest timestamp starts anew", stream, lane, exc)
    return state


@dataclass
class Attempts:
    """An ``add_all`` call under retry: what the idempotence errors read (``RetriedCall``)."""

    lane: int
    n_records: int
    n_items: int
    sent: bool = False
    attempts: int = 0


def cut_call(queue: deque[Run], settings: PublisherSettings) -> list[list[Piece]]:
    """The next call's ring items from the head of a lane's ``queue``: up to ``max_items_per_call`` items of up to
    ``max_batch_records`` records and ``max_item_bytes`` bytes each, ``max_call_bytes`` in all (a larger record
    travels alone). Per item, not per record: a run's running sizes say how many of its records fit."""
    max_records, max_item_bytes, max_call_bytes = (
        settings.max_batch_records,
        settings.max_item_bytes,
        settings.max_call_bytes,
    )
    items: list[list[Piece]] = []
    call_bytes = 0
    while queue and len(items) < settings.max_items_per_call and call_bytes < max_call_bytes:
        item: list[Piece] = []
        count = item_bytes = 0
        while queue and count < max_records:
            run = queue[0]
            run.sized()
            lo = run.pos
            below = run.cum[lo - 1] if lo else 0
            room = min(max_item_bytes - item_bytes, max_call_bytes - call_bytes)
            by_count = min(len(run.values), lo + max_records - count)
            hi = bisect_right(run.cum, below + room, lo, by_count)
            if hi == lo:
                if count:
                    break  # the next record does not fit in this item
                hi = lo + 1  # a record larger than the room travels alone
            size = run.cum[hi - 1] - below
            item.append((run, lo, hi))
            count += hi - lo
            item_bytes += size
            call_bytes += size
            run.pos = hi
            if hi == len(run.values):
                queue.popleft()
            if hi < by_count:
                break  # the bytes limit ends this item
        items.append(item)
    return items


def item_columns(pieces: list[Piece]) -> PreparedColumns:
    """One ring item's records as columns, from its pieces (many one-record runs, or slices of large ones)."""
    if len(pieces) == 1:
        run, lo, hi = pieces[0]
        keys = None if run.keys is None else run.keys[lo:hi]
        headers = None if run.headers is None else run.headers[lo:hi]
        stamps: list[int] | np.ndarray = run.stamps[lo:hi]
        if run.ns_stamps:
            stamps = np.array(stamps, dtype=np.int64) // _NS_PER_MS
        return prepare_columns(run.values[lo:hi], keys=keys, headers=headers, timestamps=stamps)
    values: list[bytes] = []
    all_stamps: list[int] = []
    keyed = any(run.keys is not None for run, _, _ in pieces)
    with_headers = any(run.headers is not None for run, _, _ in pieces)
    all_keys: list[bytes | None] = []
    all_headers: list[tuple[tuple[str, bytes], ...]] = []
    for run, lo, hi in pieces:
        values += run.values[lo:hi]
        all_stamps += run.ms_stamps(lo, hi)
        if keyed:
            all_keys += [None] * (hi - lo) if run.keys is None else run.keys[lo:hi]
        if with_headers:
            all_headers += [()] * (hi - lo) if run.headers is None else run.headers[lo:hi]
    return prepare_columns(
        values, keys=all_keys if keyed else None, headers=all_headers if with_headers else None, timestamps=all_stamps
    )


def encode_call(stream: str, lane: Lane, taken: list[list[Piece]], framing: ItemFraming) -> list[bytes]:
    """One call's ring items (``framing`` carries the lane's running maximum timestamp), that maximum moved on to the
    last item's. One item of a few keyless, headerless records (one record in flight) is framed by
    ``encode_small_item``: the same bytes, packed with struct instead of numpy, whose fixed cost per call was most
    of encoding it."""
    if len(taken) == 1 and len(taken[0]) == 1:  # one item of one piece: few plain values skip numpy's columns
        run, lo, hi = taken[0][0]
        if hi - lo <= SMALL_ITEM_RECORDS and run.keys is None and run.headers is None:
            item, lane.lane_max = encode_small_item(run.values[lo:hi], run.ms_stamps(lo, hi), framing)
            return [item]
    prepared = [[item_columns(item)] for item in taken]
    items = encode_items(prepared, framing)
    written = item_lane_max_timestamp(items[-1], stream=stream, lane=lane.number, sequence=-1)
    lane.lane_max = NO_TIMESTAMP if written is None else written  # None only for the older formats
    return items


def settle_pieces(taken: list[list[Piece]], first: int) -> None:
    """A call's records were stored, its first item at sequence ``first``: each piece's records get their offsets."""
    for i, item in enumerate(taken):
        index = 0
        for run, lo, hi in item:
            run.sink.stored(run, lo, hi, make_offset(first + i, index))
            index += hi - lo


def fail_pieces(taken: list[list[Piece]], error: BaseException) -> None:
    """A call's records failed with ``error``."""
    for item in taken:
        for run, lo, hi in item:
            run.sink.failed(error, lo, hi)


async def find_call_async(ring: AsyncRing, start: int, producer_id: int, first_seq: int) -> tuple[int | None, int]:
    """``meteor_spark.producer.idempotence.find_call`` on an ``AsyncRing``: its search (``call_search``), each grid
    call it asks for awaited."""
    steps = call_search(start, producer_id, first_seq)
    answer: Any = None
    error: GridError | None = None
    while True:
        try:
            step = steps.send(answer) if error is None else steps.throw(error)
        except StopIteration as done:
            return done.value
        answer, error = None, None
        try:
            if step[0] == "read":
                answer = await ring.read_many(step[1], 0, step[2])
            else:
                answer = await (ring.head() if step[0] == "head" else ring.tail())
        except GridError as exc:
            error = exc


async def recover_call(
    stream: str,
    ring: AsyncRing,
    call: Attempts,
    start: int,
    producer_id: int,
    first_seq: int,
    deadline: float,
    error: BaseException,
) -> tuple[int | None, int]:
    """Search the lane for a call whose answer was lost, backing off while the grid is unreachable; returns
    ``(its first item's sequence or None, where to search from next time)``. The errors are the threaded
    retrier's: ``PublishTimeoutError`` past ``deadline``, ``DataLossError`` when the call's items were overwritten."""
    backoff = FIRST_BACKOFF_S
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise timeout_error(stream, call, error, reason=None)
        await asyncio.sleep(min(backoff, left))
        backoff = min(MAX_BACKOFF_S, backoff * 2)
        try:
            return await find_call_async(ring, start, producer_id, first_seq)
        except StoredCallLost as exc:
            raise lost_call_error(stream, call, exc) from exc
        except GridError as exc:
            if not outcome_unknown(exc):
                raise
            error = exc


async def producer_id_of(grid: AsyncGrid) -> int:
    try:
        return await grid.flake_id("meteor.producer")
    except GridError as exc:
        logger.debug("no FlakeIdGenerator (%s); using a random producer id", exc)
        return random_producer_id()
