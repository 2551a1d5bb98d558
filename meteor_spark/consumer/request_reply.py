"""Request/reply over two streams: a ``Requester`` publishes requests, a ``Responder`` answers them.

A request is a record of the request stream with two headers: ``meteor.correlation_id`` (unique per request) and
``meteor.reply_to`` (the requester's own reply stream). The responder calls its handler with the request and
publishes what it returns to that reply stream, with the same correlation id; the requester's receiver thread hands
each reply to the future waiting for its correlation id. Many requests of one requester can be in flight at once.

- Reply stream: created by the requester (one lane, named ``<request stream>.reply.<random>``), read from its first
  record, and deleted by ``close()``. A thread waiting in ``request()`` reads it itself when no other thread does,
  so a reply reaches its caller without a hand-off between threads; the requester's own thread reads it for
  ``request_async`` futures nobody waits on that way.
- Timeout: a request whose reply has not come within its timeout fails with ``RequestTimeoutError``; a reply that
  comes later is dropped (counted in ``late_replies`` when it is read, with the replies of later requests). The
  request itself is not withdrawn: the responder may still handle it.
- Handler errors: a handler that raises is logged by the responder, which answers with an *error reply* (header
  ``meteor.error`` = the exception's type, value = its message); the requester's future fails with
  ``RequestError`` carrying both. So a requester learns of a failure at once instead of waiting for its timeout.
- Requests without the two headers are not answerable: the responder logs them and counts them (``malformed``).
- Delivery: requests are read like any records. An ungrouped responder reads from the moment it starts (LATEST);
  responders sharing a ``group`` split the request stream's lanes, and a grouped responder confirms a batch of
  requests once their replies are stored (at-least-once: a responder that dies mid-batch leaves those requests to
  the next holder of the lane, which answers them again; the requester keeps the first reply and drops the other).

The protocol's decisions (headers, names, what a reply means, the errors' wording) are pure functions of
``meteor_spark.consumer.request_rules``, which the asyncio twins (``meteor_spark.aio.request_reply``) call too.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

from meteor_spark.consumer.request_rules import (
    CORRELATION_ID,
    ERROR,
    REPLY_TO,
    check_request_timeout,
    closed_error,
    header,
    new_correlation_id,
    outgoing_request,
    reply_outcome,
    reply_stream_name,
    timeout_error,
)
from meteor_spark.consumer.responding import ResponderSteps
from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.errors import MeteorError
from meteor_spark.format.records import Record, RecordBatch
from meteor_spark.grid.client import Grid
from meteor_spark.grid.steps import drive
from meteor_spark.grid.streams import StreamConfig
from meteor_spark.groups.admin import delete_stream
from meteor_spark.producer.publisher import Publisher

__all__ = ["CORRELATION_ID", "ERROR", "REPLY_TO", "Handler", "Requester", "Responder", "header"]

logger = logging.getLogger(__name__)

#: ``handler(request) -> reply``: the reply as bytes, str or a ``Record`` (its key and headers are kept).
Handler = Callable[[Record], "Record | bytes | str"]


class Requester:
    """Sends requests to a stream and waits for their replies on a reply stream of its own.

    Who reads the reply stream: a thread waiting in ``request()`` reads it itself when no other thread does (one
    reader at a time; the others wait for their reply or their turn), so a reply reaches its caller straight from
    the grid client, without a hand-off between threads. The requester's own thread reads only for requests
    nobody waits on in ``request()`` (``request_async`` futures), and fails requests whose timeout passed.

    Args:
        grid: the grid connection.
        request_stream: the stream responders read (a ``StreamConfig`` creates it when missing).
        timeout_ms: default time a request waits for its reply.
        reply_capacity: ring items the reply stream keeps.

    Examples:
        >>> with Requester(grid, "prices") as requester:                # doctest: +SKIP
        ...     reply = requester.request(b'{"sku": 42}')
        ...     futures = [requester.request_async(q) for q in queries]
    """

    #: Longest single read of the reply stream: a reader comes back this often to let others take a turn.
    POLL_MS = 50

    def __init__(
        self,
        grid: Grid,
        request_stream: StreamConfig | str,
        *,
        timeout_ms: float = 30_000,
        reply_capacity: int = 10_000,
    ) -> None:
        self.timeout_ms = check_request_timeout(timeout_ms)
        self._grid = grid
        self._publisher = Publisher(grid, request_stream)
        self.request_stream = self._publisher.stream
        self.reply_stream = reply_stream_name(self.request_stream)
        self._reply_to = self.reply_stream.encode()
        self._lock = threading.Lock()
        # Threads in request() wait here for their reply or the reader's turn; the requester's thread waits on
        # _work (an earlier deadline, a request nobody waits on, the turn it waits for, close), so a request or a
        # reply of request() does not wake it.
        self._turn = threading.Condition(self._lock)
        self._work = threading.Condition(self._lock)
        self._pending: dict[bytes, Future[Record]] = {}
        self._deadlines: list[tuple[float, int, bytes]] = []
        self._order = itertools.count()
        self._reading = False  # a thread is reading the reply stream
        self._callers = 0  # threads waiting in request()
        self._closed = False
        self.late_replies = 0
        self.read_errors = 0
        self._pause = threading.Event()  # set on close: a reader pausing after an error stops at once
        try:
            replies = StreamConfig(self.reply_stream, lanes=1, capacity=reply_capacity)
            self._subscriber = Subscriber(grid, replies, initial_offset_scheme="earliest")
        except BaseException:
            self._publisher.close()
            delete_stream(grid, self.reply_stream)
            raise
        self._thread = threading.Thread(target=self._run, name=f"meteor-requester-{self.reply_stream}", daemon=True)
        self._thread.start()

    def request_async(self, request: Record | bytes | str, *, timeout_ms: float | None = None) -> Future[Record]:
        """Publish a request; the future completes with the reply ``Record`` (its value, key and headers).

        The future fails with ``RequestTimeoutError`` when no reply came within ``timeout_ms`` (default: the
        requester's), ``RequestError`` for an error reply, or the publish's error when the request was not stored.
        """
        wait_ms = self.timeout_ms if timeout_ms is None else check_request_timeout(timeout_ms)
        correlation_id = new_correlation_id()
        future: Future[Record] = Future()
        future.set_running_or_notify_cancel()
        with self._lock:
            if self._closed:
                raise closed_error(self.request_stream, waiting=False)
            self._pending[correlation_id] = future
            deadline = time.monotonic() + wait_ms / 1000.0
            heapq.heappush(self._deadlines, (deadline, next(self._order), correlation_id))
            if self._deadlines[0][2] == correlation_id or len(self._pending) > self._callers:
                self._work.notify()
        outgoing = outgoing_request(request, correlation_id, self._reply_to)

        def published(offset: int | None, error: BaseException | None) -> None:
            if error is not None:
                self._finish(correlation_id, None, error)

        self._publisher.publish_async(outgoing, callback=published)
        return future

    def request(self, request: Record | bytes | str, *, timeout_ms: float | None = None) -> Record:
        """Publish a request and wait for its reply (see ``request_async``); this thread reads the reply stream
        while no other does."""
        with self._lock:
            self._callers += 1  # before the request exists: the requester's thread must not read for it
        try:
            future = self.request_async(request, timeout_ms=timeout_ms)
            while True:
                with self._lock:
                    while not future.done() and self._reading:
                        self._turn.wait()
                    if future.done():
                        break
                    self._reading = True
                self._read_once()
        finally:
            with self._lock:
                self._callers -= 1
        return future.result()

    @property
    def pending(self) -> int:
        """Requests waiting for their reply."""
        with self._lock:
            return len(self._pending)

    def _read_once(self) -> None:
        """Read the reply stream once and hand out the replies, then give up the reader's turn (which the caller
        took): handing out first, so a waiting thread whose reply is in this batch never starts a read of its own."""
        try:
            try:
                batch = self._subscriber.poll(self.POLL_MS)
            except MeteorError as exc:
                with self._lock:
                    closed = self._closed
                    if not closed:
                        self.read_errors += 1
                if not closed:
                    logger.warning("reply stream %r: reading failed (%s); reading again", self.reply_stream, exc)
                    self._pause.wait(0.1)
                return
            for reply in batch:
                self._on_reply(reply)
        finally:
            with self._lock:
                self._reading = False
                self._turn.notify_all()
                if len(self._pending) > self._callers:
                    self._work.notify()

    def _on_reply(self, reply: Record) -> None:
        outcome = reply_outcome(reply, self.reply_stream, self.request_stream)
        if outcome is not None and not self._finish(outcome[0], reply, outcome[1]):
            with self._lock:
                self.late_replies += 1

    def _finish(self, correlation_id: bytes, reply: Record | None, error: BaseException | None) -> bool:
        """Complete the request's future; False when it is not waiting any more (timed out, or answered)."""
        with self._lock:
            future = self._pending.pop(correlation_id, None)
        if future is None:
            return False
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(reply)  # type: ignore[arg-type]
        with self._lock:
            self._turn.notify_all()
        return True

    def _run(self) -> None:
        """The requester's thread: fail requests whose timeout passed; read replies for requests nobody waits on in
        ``request()``."""
        with self._lock:
            while not self._closed:
                now = time.monotonic()
                expired: list[tuple[bytes, Future[Record]]] = []
                while self._deadlines and self._deadlines[0][0] <= now:
                    _, _, correlation_id = heapq.heappop(self._deadlines)
                    future = self._pending.pop(correlation_id, None)
                    if future is not None:
                        expired.append((correlation_id, future))
                if expired:
                    self._lock.release()
                    try:
                        for correlation_id, future in expired:
                            future.set_exception(timeout_error(correlation_id, self.request_stream))
                    finally:
                        self._lock.acquire()
                    self._turn.notify_all()  # callers whose request timed out
                    continue
                if not self._reading and len(self._pending) > self._callers:
                    self._reading = True
                    self._lock.release()
                    try:
                        self._read_once()
                    finally:
                        self._lock.acquire()
                    continue
                self._work.wait(self._deadlines[0][0] - now if self._deadlines else None)

    def close(self) -> None:
        """Fail the requests still waiting (``RequestError``), stop reading replies, delete the reply stream."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pending, self._pending = self._pending, {}
            self._turn.notify_all()
            self._work.notify()
        self._pause.set()
        for future in pending.values():
            future.set_exception(closed_error(self.request_stream, waiting=True))
        self._thread.join()
        try:
            self._publisher.close()
        finally:
            self._subscriber.close()
            delete_stream(self._grid, self.reply_stream)

    def __enter__(self) -> Requester:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Responder(ResponderSteps):
    """Answers the requests of a stream on a background thread: ``handler(request)`` gives the reply.

    Args:
        grid: the grid connection.
        request_stream: the stream requests arrive on (created with the defaults when missing).
        handler: ``handler(request) -> bytes | str | Record``; the reply goes to the request's ``meteor.reply_to``
            stream with its ``meteor.correlation_id``. A handler that raises gets an error reply (module docstring).
        group: share the request stream's lanes with the other responders of this group (None: read every lane).
        initial_offset_scheme: where reading starts without a confirmed offset (default LATEST: requests published
            before the responder started are not answered, as their requesters have likely given up).
        poll_timeout_ms: how long one poll of the request stream waits.
        max_reply_publishers: publishers to reply streams kept open (least recently used ones are closed).
    """

    def __init__(
        self,
        grid: Grid,
        request_stream: StreamConfig | str,
        handler: Handler,
        *,
        group: str | None = None,
        initial_offset_scheme: str = "latest",
        poll_timeout_ms: float = 100,
        max_reply_publishers: int = 32,
    ) -> None:
        super().__init__(handler, max_reply_publishers)
        self._grid = grid
        self._subscriber = Subscriber(grid, request_stream, group=group, initial_offset_scheme=initial_offset_scheme)
        self.request_stream = self._subscriber.stream
        self.group = group
        self._receiver = self._subscriber.attach_receiver(self._answer, poll_timeout_ms, per_batch=True)

    def _answer(self, batch: RecordBatch) -> None:
        drive(self._answer_steps(batch))

    def _open_publisher(self, stream: str) -> Publisher:
        return Publisher(self._grid, stream)

    def _send_reply(self, publisher: Publisher, reply: Record) -> None:
        publisher.publish_async(reply)

    @property
    def lanes(self) -> list[int]:
        """The request stream's lanes this responder answers now (all of them ungrouped)."""
        return self._subscriber.lanes

    @property
    def errors(self) -> int:
        """Failures of the receiver itself (poll errors), as ``Receiver.errors``."""
        return self._receiver.errors

    def close(self) -> None:
        """Stop answering, then flush and close the reply publishers."""
        self._subscriber.close()
        for publisher in self._publishers.values():
            publisher.close()
        self._publishers.clear()

    def __enter__(self) -> Responder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
