"""The idempotent publisher's retries: an ``add_all`` whose outcome is unknown is looked up in its lane before it is
sent again, so a retry never stores a call's records twice.

An ``add_all`` that failed with a lost connection (the member's answer never came: ``GridConnectionError``) or an
invocation timeout may or may not have been applied. Kafka's broker drops a retried batch whose (producer id,
sequence) it already holds; a Hazelcast ring cannot, so the publisher asks instead. Every ring item carries its
publisher's id and its own sequence in the header (``wire.item_producer`` reads them without decoding the body),
and an ``add_all`` stores its items contiguously after whatever the lane held when it was sent. The retrier
therefore reads the lane from the first sequence the call could occupy (``PendingCall.start``: one past the lane's
last item this publisher stored, or past the tail read when the publisher started) up to the tail:

- the call's first item is there: the call was stored; its records settle with the sequences found, nothing is
  sent again;
- it is not: the same encoded items (same producer sequence) are sent again, and the search resumes after what was
  read, next time.

Attempts back off (50 ms doubling to 1 s) and stop at the call's delivery deadline (``delivery_timeout_ms`` after
its first attempt); its records then fail with ``PublishTimeoutError`` saying what is known of the outcome. Errors
that certainly stored nothing (a refused write, a bad argument) fail the records at once, as without idempotence.

What remains possible: a lost ``add_all`` still queued in the member can be applied *after* the lookup found
nothing, and then the resend stores the items a second time (same producer id and sequence). Readers close that
window by dropping an item whose (producer id, producer sequence) they already passed in the lane.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Generator, Sequence
from typing import Any, Protocol

from meteor_spark.errors import FormatError, GridConnectionError, GridError, GridOperationError, PublishTimeoutError
from meteor_spark.format.item_header import item_producer
from meteor_spark.grid.client import client_shut_down
from meteor_spark.producer.calls import PendingCall

logger = logging.getLogger("meteor_spark.producer.publisher")

#: Hazelcast's OperationTimeoutException: the client gave up on an invocation (it may have been applied).
OPERATION_TIMEOUT = 38
#: Hazelcast's StaleSequenceException: a read below the ring's head.
STALE_SEQUENCE = 51
#: Ring items read at a time while searching a lane (items are up to ``max_batch_bytes`` each).
SEARCH_CHUNK = 100

FIRST_BACKOFF_S = 0.05
MAX_BACKOFF_S = 1.0


def outcome_unknown(error: BaseException) -> bool:
    """True for a failed ``add_all`` that may nevertheless have been applied: the connection was lost before the
    answer came, or the invocation timed out. A client that was shut down is not worth retrying through."""
    if isinstance(error, GridConnectionError):
        return not client_shut_down(error)
    return isinstance(error, GridOperationError) and error.code == OPERATION_TIMEOUT


class StoredCallLost(Exception):
    """The part of the lane the call could occupy was overwritten before it was searched (never leaves this
    module: the call's records fail with ``PublishTimeoutError`` saying so)."""


def find_call(ring: Any, start: int, producer_id: int, first_seq: int) -> tuple[int | None, int]:
    """Search ``ring`` from ``start`` to its tail for the item ``(producer_id, first_seq)`` (blocking grid calls;
    the search itself is ``call_search``, which the asyncio publisher drives with awaited calls).

    Returns ``(sequence of that item or None, the sequence to resume a later search at)``.

    Raises:
        StoredCallLost: not found, and items from ``start`` on were overwritten before they could be searched (the
            call may have been among them).
        GridError: the grid could not be read.
    """
    steps = call_search(start, producer_id, first_seq)
    step = next(steps)
    while True:
        try:
            if step[0] == "head":
                answer: Any = ring.head()
            elif step[0] == "tail":
                answer = ring.tail()
            else:
                answer = ring.read_many(step[1], 0, step[2])
        except GridError as exc:
            try:
                step = steps.throw(exc)
            except StopIteration as done:
                return done.value
            continue
        try:
            step = steps.send(answer)
        except StopIteration as done:
            return done.value


#: What ``call_search`` asks its driver for: ``("head",)``, ``("tail",)`` or ``("read", sequence, count)``; the
#: driver sends back the ring's head, its tail or a ``ReadBatch``, or throws the ``GridError`` the call raised.
SearchStep = tuple[Any, ...]


def call_search(start: int, producer_id: int, first_seq: int) -> Generator[SearchStep, Any, tuple[int | None, int]]:
    """The search of ``find_call`` without its I/O: a generator that yields the grid calls it needs and returns
    ``(sequence of the item or None, the sequence to resume a later search at)``, so the threaded retrier and the
    asyncio publisher (``meteor_spark.aio``) run the same search. A read below the ring's head (the driver throws
    the grid's ``StaleSequenceException``) goes on from the new head; other errors propagate."""
    head = yield ("head",)
    tail = yield ("tail",)
    wanted = (producer_id, first_seq)
    seq = max(start, head)
    lost_from = start if start < head else None
    while seq <= tail:
        try:
            batch = yield ("read", seq, min(SEARCH_CHUNK, tail - seq + 1))
        except GridOperationError as exc:
            if exc.code != STALE_SEQUENCE:
                raise
            batch = None
        if batch is None or (batch.items and batch.sequences[0] > seq):
            # Overwritten while being searched: go on from the new head, remembering the gap.
            lost_from = start if lost_from is None else lost_from
            head = yield ("head",)
            seq = max(seq + 1, head)
            continue
        if not batch.items:
            break
        for item, sequence in zip(batch.items, batch.sequences, strict=True):
            if _producer_of(item, sequence) == wanted:
                return sequence, sequence
        seq = batch.next_sequence
    if lost_from is not None:
        raise StoredCallLost(f"ring items from sequence {lost_from} on were overwritten before they were searched")
    return None, max(seq, tail + 1)


class Retrier:
    """The thread that settles an idempotent publisher's calls whose outcome is unknown (module docstring).

    Args:
        stream: the stream's name (messages).
        rings: the lanes' rings.
        producer_id: the publisher's id, searched for in item headers.
        send: ``send(call)`` sends an attempt of the call (its answer comes back through the sender).
        settle: ``settle(call, last_sequence, error)`` completes the call's records (exactly one of the two set).
    """

    def __init__(
        self,
        stream: str,
        rings: Sequence[Any],
        producer_id: int,
        send: Callable[[PendingCall], None],
        settle: Callable[[PendingCall, int | None, BaseException | None], None],
    ) -> None:
        self.stream = stream
        self.rings = rings
        self.producer_id = producer_id
        self._send = send
        self._settle = settle
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._heap: list[PendingCall] = []
        self._order = itertools.count()
        self._stopping = False
        self._given_up: BaseException | None = None
        self.resent = 0  # add_all attempts sent again after an unknown outcome
        self.recovered = 0  # calls whose unknown outcome turned out stored (settled from the lane, not resent)
        self.unknown_outcomes = 0  # add_all attempts whose outcome was unknown
        # Started by the first call handed over: most publishers never need it.
        self._thread: threading.Thread | None = None

    def submit(self, call: PendingCall, error: BaseException | None = None) -> None:
        """Take over a call: its lane's start is not known yet (``error`` None), or its attempt failed with an
        unknown outcome (``error``). Runs on any thread, the grid client's included: nothing here blocks."""
        with self._lock:
            given_up = self._given_up
            if given_up is None:
                due = 0.0
                if error is not None:
                    call.failed(error, answer_lost=True)
                    self.unknown_outcomes += 1
                    backoff = min(MAX_BACKOFF_S, FIRST_BACKOFF_S * 2 ** max(0, call.attempts - 1))
                    due = time.monotonic() + backoff
                call.due_at(due, next(self._order))
                heapq.heappush(self._heap, call)
                self._wake.notify()
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._run, name=f"meteor-publisher-retry-{self.stream}", daemon=True
                    )
                    self._thread.start()
                return
        self._settle(call, None, timeout_error(self.stream, call, given_up, reason="the publisher was closed"))

    def give_up(self, error: BaseException) -> None:
        """Fail every call waiting for a retry, and those that come later, with ``error`` (a close whose deadline
        passed)."""
        with self._lock:
            self._given_up = error
            calls, self._heap = self._heap, []
        for call in calls:
            self._settle(call, None, timeout_error(self.stream, call, error, reason="the publisher was closed"))

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            self._wake.notify()
            thread = self._thread
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        while True:
            with self._lock:
                while True:
                    if self._heap:
                        wait = self._heap[0].due - time.monotonic()
                        if wait <= 0:
                            call = heapq.heappop(self._heap)
                            break
                    elif self._stopping:
                        return
                    else:
                        wait = None
                    self._wake.wait(wait)
            try:
                self._step(call)
            except Exception as exc:  # never lose a call: whatever went wrong settles its records
                logger.exception("stream %r lane %d: retrying a publish failed", self.stream, call.lane)
                self._settle(call, None, exc)

    def _step(self, call: PendingCall) -> None:
        """One step of a call: read the lane's tail, search the lane, or send again (blocking grid calls)."""
        lane = call.lane
        ring = self.rings[lane]
        if time.monotonic() >= call.deadline:
            self._settle(call, None, timeout_error(self.stream, call, call.last_error, reason=None))
            return
        try:
            if call.start is None:
                call.starts_at(ring.tail() + 1)
            elif call.sent:
                found, resume = find_call(ring, call.start, self.producer_id, call.first_seq)
                if found is not None:
                    self.recovered += 1
                    logger.info(
                        "stream %r lane %d: a publish whose answer was lost had been stored at sequence %d; not "
                        "sending it again",
                        self.stream,
                        lane,
                        found,
                    )
                    self._settle(call, found + call.n_items - 1, None)
                    return
                call.starts_at(resume)
                self.resent += 1
                logger.info(
                    "stream %r lane %d: a publish whose answer was lost was not stored; sending it again (attempt %d)",
                    self.stream,
                    lane,
                    call.attempts + 1,
                )
        except StoredCallLost as exc:
            self._settle(call, None, lost_call_error(self.stream, call, exc))
            return
        except GridError as exc:
            # A lost connection or a timed-out read changes nothing: look again once the grid answers.
            if not outcome_unknown(exc):
                self._settle(call, None, exc)
                return
            call.failed(exc, answer_lost=False)  # the grid is still unreachable: try again later
            with self._lock:
                call.due_at(time.monotonic() + MAX_BACKOFF_S / 2, next(self._order))
                heapq.heappush(self._heap, call)
            return
        self._send(call)


class RetriedCall(Protocol):
    """What the errors of a retried call read of it: the threaded ``PendingCall`` or the asyncio publisher's."""

    @property
    def lane(self) -> int: ...
    @property
    def n_records(self) -> int: ...
    @property
    def n_items(self) -> int: ...
    @property
    def sent(self) -> bool: ...
    @property
    def attempts(self) -> int: ...


def lost_call_error(stream: str, call: RetriedCall, exc: StoredCallLost) -> PublishTimeoutError:
    """The error of a call whose answer was lost and whose place in the lane was overwritten before the search."""
    return PublishTimeoutError(
        f"stream {stream!r} lane {call.lane}: {call.n_records} records in {call.n_items} ring items: "
        f"outcome unknown: the grid lost the answer to their add_all, and the part of the lane where they "
        f"may have been stored was overwritten before it could be searched ({exc}); the stream's capacity "
        f"is too small for the publishing rate"
    )


def timeout_error(
    stream: str, call: RetriedCall, cause: BaseException | None, reason: str | None
) -> PublishTimeoutError:
    """The error of a call that is not retried any more, saying what is known of its outcome."""
    if call.sent:
        outcome = (
            "outcome unknown: an attempt's answer was lost, so the records may be stored once (a reader that drops "
            "repeated producer sequences sees them at most once) or not at all"
        )
    else:
        outcome = "not stored"
    why = reason or f"delivery_timeout_ms passed after {call.attempts} attempts"
    error = PublishTimeoutError(
        f"stream {stream!r} lane {call.lane}: {call.n_records} records in {call.n_items} ring items: {outcome} "
        f"({why}; last error: {cause})"
    )
    error.__cause__ = cause
    return error


def _producer_of(item: bytes, sequence: int) -> tuple[int, int] | None:
    """``(producer_id, producer_seq)`` of an item from its header; None for one that is not a meteor item (an item
    the publisher cannot read is simply not one of its own)."""
    try:
        producer = item_producer(item, stream="", lane=0, sequence=sequence)  # the stream only names errors
    except FormatError:
        return None
    return producer.producer_id, producer.producer_seq
