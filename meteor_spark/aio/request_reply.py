"""AsyncRequester and AsyncResponder: the asyncio twins of ``meteor_spark.consumer.request_reply``'s ``Requester``
and ``Responder``, on ``AsyncPublisher`` / ``AsyncSubscriber`` and the caller's event loop (no threads).

The protocol is the threaded one, decided by the same functions (``meteor_spark.consumer.request_rules``): the
``meteor.correlation_id`` and ``meteor.reply_to`` headers, a reply stream of the requester's own
(``<request stream>.reply.<random>``, one lane, deleted by ``close``), error replies (``meteor.error``) that fail
the request with ``RequestError``, requests without the two headers counted as ``malformed``, and the errors'
wording. So an asyncio requester and a threaded responder answer each other, and the reverse.

- Requester: one task reads the reply stream while requests wait (one ``read_many`` parked on the grid, so a reply
  reaches its future as soon as the client has it); each request's timeout is a timer on the loop that fails its
  future with ``RequestTimeoutError``; a reply that comes later is dropped and counted in ``late_replies`` when read.
  A ``request`` whose caller is cancelled (``asyncio.wait_for``, a task cancelled) is forgotten at once.
- Responder: one task polls the request stream and answers each request in order; the handler may be a plain
  function or a coroutine function. Replies are queued on an ``AsyncPublisher`` per reply stream (the least
  recently used ones closed past ``max_reply_publishers``). Responders sharing a ``group`` split the request
  stream's lanes (an exclusive group of ``AsyncSubscriber``s) and confirm a batch once its replies are stored, as the
  threaded ``Responder`` does, so asyncio and threaded responders can share one group.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from meteor_spark.aio.publisher import AsyncPublisher
from meteor_spark.aio.streams import delete_ungrouped_stream_async
from meteor_spark.aio.subscriber import AsyncSubscriber
from meteor_spark.consumer.request_rules import (
    check_request_timeout,
    closed_error,
    new_correlation_id,
    outgoing_request,
    reply_outcome,
    reply_stream_name,
    timeout_error,
)
from meteor_spark.consumer.responding import ResponderSteps
from meteor_spark.consumer.subscriber_options import SubscriberOptions
from meteor_spark.errors import MeteorError
from meteor_spark.format.records import Record, RecordBatch
from meteor_spark.grid.aio_client import AsyncGrid, connect_async
from meteor_spark.grid.steps import drive_async
from meteor_spark.grid.streams import StreamConfig
from meteor_spark.validate import check_int

__all__ = ["AsyncHandler", "AsyncRequester", "AsyncResponder"]

logger = logging.getLogger(__name__)

Reply = Record | bytes | str

#: ``handler(request) -> reply`` or ``async def handler(request) -> reply``: the reply as bytes, str or a ``Record``.
AsyncHandler = Callable[[Record], Reply | Awaitable[Reply]]

#: Pause after a failed read before reading again (the grid is likely reconnecting).
ERROR_PAUSE_S = 0.1


class AsyncRequester:
    """Sends requests to a stream and awaits their replies on a reply stream of its own.

    Args:
        members_or_grid: ``"host:port[,host:port]"``, a ``GridSettings`` (a connection of its own, closed with the
            requester) or an ``AsyncGrid`` (shared, left open).
        request_stream: the stream responders read (a ``StreamConfig`` creates it when missing).
        timeout_ms: default time a request waits for its reply.
        reply_capacity: ring items the reply stream keeps.

    Examples:
        >>> async with AsyncRequester(grid, "prices") as requester:        # doctest: +SKIP
        ...     reply = await requester.request(b'{"sku": 42}')
        ...     replies = await asyncio.gather(*(requester.request(q) for q in queries))
    """

    #: Longest single read of the reply stream; ``close`` cancels it.
    POLL_MS = 1000

    def __init__(
        self,
        members_or_grid: object,
        request_stream: StreamConfig | str,
        *,
        timeout_ms: float = 30_000,
        reply_capacity: int = 10_000,
    ) -> None:
        self.timeout_ms = check_request_timeout(timeout_ms)
        self._target = members_or_grid
        self._config = request_stream
        self.request_stream = request_stream if isinstance(request_stream, str) else request_stream.name
        self.reply_stream = reply_stream_name(self.request_stream)
        self._replies = StreamConfig(self.reply_stream, lanes=1, capacity=reply_capacity)  # checked before connecting
        self._pending: dict[bytes, tuple[asyncio.Future[Record], asyncio.TimerHandle]] = {}
        self._grid: AsyncGrid | None = None
        self._owns_grid = False
        self._reader: asyncio.Task[None] | None = None
        self._work = asyncio.Event()
        self._closed = False
        self.late_replies = 0
        self.read_errors = 0

    async def start(self) -> AsyncRequester:
        """Connect (unless given a grid), open the request stream, create the reply stream and start reading it.
        ``async with`` calls it."""
        if self._grid is not None:
            return self
        grid, owned = await connect_async(self._target)
        publisher = None
        try:
            publisher = await AsyncPublisher(grid, self._config).start()
            try:
                subscriber = await AsyncSubscriber(grid, self._replies, initial_offset_scheme="earliest").start()
            except BaseException:
                await delete_ungrouped_stream_async(grid, self.reply_stream)
                raise
        except BaseException:
            if publisher is not None:
                await publisher.close()
            if owned:
                await grid.close()
            raise
        self._grid, self._owns_grid = grid, owned
        self._publisher, self._subscriber = publisher, subscriber
        self._reply_to = self.reply_stream.encode()
        self._reader = asyncio.create_task(self._read(), name=f"meteor-requester-{self.reply_stream}")
        return self

    async def __aenter__(self) -> AsyncRequester:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def request_async(
        self, request: Record | bytes | str, *, timeout_ms: float | None = None
    ) -> asyncio.Future[Record]:
        """Queue a request for publishing; the future completes with the reply ``Record`` (``Requester``'s
        ``request_async``): it fails with ``RequestTimeoutError`` when no reply came within ``timeout_ms`` (default:
        the requester's), ``RequestError`` for an error reply, or the publish's error when the request was not
        stored."""
        return (await self._send(request, timeout_ms))[1]

    async def request(self, request: Record | bytes | str, *, timeout_ms: float | None = None) -> Record:
        """Publish a request and await its reply (see ``request_async``); a cancelled caller's request is
        forgotten (its reply, should it come, counts as late)."""
        correlation_id, future = await self._send(request, timeout_ms)
        try:
            return await future
        finally:
            self._forget(correlation_id)  # cancelled: a task's cancel also cancels the future it awaits

    @property
    def pending(self) -> int:
        """Requests waiting for their reply."""
        return len(self._pending)

    async def _send(
        self, request: Record | bytes | str, timeout_ms: float | None
    ) -> tuple[bytes, asyncio.Future[Record]]:
        wait_ms = self.timeout_ms if timeout_ms is None else check_request_timeout(timeout_ms)
        if self._closed:
            raise closed_error(self.request_stream, waiting=False)
        if self._grid is None:
            raise MeteorError(f"the AsyncRequester of stream {self.request_stream!r} is not started: use `async with`")
        correlation_id = new_correlation_id()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Record] = loop.create_future()
        timer = loop.call_later(wait_ms / 1000.0, self._expire, correlation_id)
        self._pending[correlation_id] = (future, timer)
        self._work.set()
        try:
            stored = await self._publisher.publish_async(outgoing_request(request, correlation_id, self._reply_to))
        except BaseException:
            self._forget(correlation_id)
            raise

        def published(done: asyncio.Future[int]) -> None:
            error = None if done.cancelled() else done.exception()
            if error is not None:
                self._finish(correlation_id, None, error)

        stored.add_done_callback(published)
        return correlation_id, future

    def _forget(self, correlation_id: bytes) -> None:
        entry = self._pending.pop(correlation_id, None)
        if entry is not None:
            entry[1].cancel()

    def _expire(self, correlation_id: bytes) -> None:
        entry = self._pending.pop(correlation_id, None)
        if entry is not None and not entry[0].done():
            entry[0].set_exception(timeout_error(correlation_id, self.request_stream))

    def _finish(self, correlation_id: bytes, reply: Record | None, error: BaseException | None) -> bool:
        """Complete the request's future; False when it is not waiting any more (timed out, or answered)."""
        entry = self._pending.pop(correlation_id, None)
        if entry is None:
            return False
        future, timer = entry
        timer.cancel()
        if future.done():
            return False
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(reply)  # type: ignore[arg-type]
        return True

    async def _read(self) -> None:
        """Read the reply stream while requests wait, and hand each reply to its future."""
        while not self._closed:
            if not self._pending:
                self._work.clear()
                await self._work.wait()
                continue
            try:
                batch = await self._subscriber.poll(self.POLL_MS)
            except MeteorError as exc:
                if self._closed:
                    return
                self.read_errors += 1
                logger.warning("reply stream %r: reading failed (%s); reading again", self.reply_stream, exc)
                await asyncio.sleep(ERROR_PAUSE_S)
                continue
            for reply in batch:
                self._on_reply(reply)

    def _on_reply(self, reply: Record) -> None:
        outcome = reply_outcome(reply, self.reply_stream, self.request_stream)
        if outcome is not None and not self._finish(outcome[0], reply, outcome[1]):
            self.late_replies += 1

    async def close(self) -> None:
        """Fail the requests still waiting (``RequestError``), stop reading replies, delete the reply stream, close
        an owned connection."""
        if self._closed:
            return
        self._closed = True
        pending, self._pending = self._pending, {}
        for future, timer in pending.values():
            timer.cancel()
            if not future.done():
                future.set_exception(closed_error(self.request_stream, waiting=True))
        if self._grid is None:
            return
        self._work.set()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        try:
            await self._publisher.close()
        finally:
            try:
                await self._subscriber.close()
                await delete_ungrouped_stream_async(self._grid, self.reply_stream)
            finally:
                if self._owns_grid:
                    await self._grid.close()


class AsyncResponder(ResponderSteps):
    """Answers the requests of a stream from a task on the event loop: ``handler(request)`` gives the reply.

    Args:
        members_or_grid: ``"host:port[,host:port]"``, a ``GridSettings`` or an ``AsyncGrid`` (as ``AsyncRequester``).
        request_stream: the stream requests arrive on (a ``StreamConfig`` creates it when missing).
        handler: ``handler(request)`` or ``async def handler(request)`` returning bytes, str or a ``Record``; the reply
            goes to the request's ``meteor.reply_to`` stream with its ``meteor.correlation_id``. A handler that
            raises gets an error reply (``Responder``'s rule).
        initial_offset_scheme: where reading starts (default LATEST: requests published before the responder started
            are not answered, as their requesters have likely given up).
        poll_timeout_ms: how long one poll of the request stream waits.
        max_reply_publishers: publishers to reply streams kept open (least recently used ones are closed).
        group: share the request stream's lanes with the other responders of this group, asyncio or threaded (None:
            read every lane).
    """

    def __init__(
        self,
        members_or_grid: object,
        request_stream: StreamConfig | str,
        handler: AsyncHandler,
        *,
        initial_offset_scheme: str = "latest",
        poll_timeout_ms: int = 100,
        max_reply_publishers: int = 32,
        group: str | None = None,
    ) -> None:
        super().__init__(handler, max_reply_publishers)
        self._poll_ms = check_int("poll_timeout_ms", poll_timeout_ms, 1, 3_600_000)
        SubscriberOptions.parse(initial_offset_scheme=initial_offset_scheme)  # its errors before anything connects
        self._target = members_or_grid
        self._config = request_stream
        self._scheme = initial_offset_scheme
        self.group = group
        self.request_stream = request_stream if isinstance(request_stream, str) else request_stream.name
        self._grid: AsyncGrid | None = None
        self._owns_grid = False
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.errors = 0

    async def start(self) -> AsyncResponder:
        """Open the request stream (placing its lanes by ``initial_offset_scheme``) and start answering. ``async
        with`` calls it."""
        if self._task is None:
            grid, owned = await connect_async(self._target)
            try:
                self._subscriber = await AsyncSubscriber(
                    grid, self._config, group=self.group, initial_offset_scheme=self._scheme
                ).start()
            except BaseException:
                if owned:
                    await grid.close()
                raise
            self._grid, self._owns_grid = grid, owned
            self.request_stream = self._subscriber.stream
            self._task = asyncio.create_task(self._run(), name=f"meteor-responder-{self.request_stream}")
        return self

    async def __aenter__(self) -> AsyncResponder:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def lanes(self) -> list[int]:
        """The request stream's lanes this responder answers now (all of them ungrouped; none before ``start``)."""
        return self._subscriber.lanes if self._task is not None else []

    async def _run(self) -> None:
        while not self._closed:
            try:
                batch = await self._subscriber.poll(self._poll_ms)
            except MeteorError as exc:
                if self._closed:
                    return
                self.errors += 1
                logger.warning("stream %r: reading requests failed (%s); reading again", self.request_stream, exc)
                await asyncio.sleep(ERROR_PAUSE_S)
                continue
            await self._answer(batch)

    async def _answer(self, batch: RecordBatch) -> None:
        await drive_async(self._answer_steps(batch))

    def _open_publisher(self, stream: str) -> Awaitable[AsyncPublisher]:
        return AsyncPublisher(self._grid, stream).start()

    async def _send_reply(self, publisher: AsyncPublisher, reply: Record) -> None:
        stored = await publisher.publish_async(reply)
        stored.add_done_callback(self._reply_stored)

    def _reply_stored(self, done: asyncio.Future[int]) -> None:
        error = None if done.cancelled() else done.exception()
        if error is not None:
            logger.warning("stream %r: a reply was not stored (%s)", self.request_stream, error)

    async def close(self) -> None:
        """Stop answering, then flush and close the reply publishers and an owned connection."""
        if self._closed:
            return
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        try:
            for publisher in self._publishers.values():
                await publisher.close()
            self._publishers.clear()
        finally:
            try:
                if self._task is not None:
                    await self._subscriber.close()
            finally:
                if self._owns_grid and self._grid is not None:
                    await self._grid.close()
