"""The TCP shell: accept connections, cut bytes into messages, dispatch, write responses. Nothing else.

One asyncio ``Protocol`` per connection with its own ``FrameReader`` (a buffer, not a StreamReader, for speed).
A malformed message closes only its connection, with one log line; the member never crashes.

Writing. Responses are byte chunks that mostly reference ring items (64 KiB each); a ``read_many`` answer can be
tens of MiB. asyncio's transport would join them into one bytes object and append what the kernel does not take
at once to a growing ``bytearray`` (copied again on every reallocation) - with a client that reads slowly that copy
was most of the member's CPU, and the buffer grew without bound. So a connection keeps its own queue of chunks and
hands them to the kernel with ``os.writev`` on the socket's descriptor (scatter-gather, no copy in Python). When the
kernel is full, only a small piece is given to the transport, whose flow control (limits 0/0) tells us with
``resume_writing`` the moment the socket drains.

Back-pressure. When more than ``OUTPUT_HIGH_WATER`` bytes wait in that queue the connection is *congested*: the
member stops serving that client's requests (received ones wait in a backlog, in order; it keeps reading, so the
client's pings still count, up to ``BACKLOG_HIGH_WATER`` bytes) and parked requests that wake up (long polls) wait
before producing their response (``RequestContext.park``). Below ``OUTPUT_LOW_WATER`` it resumes. So a client that
reads slowly or not at all costs the member at most about one response beyond the high-water mark, and never stalls
other connections. Each response is queued whole, so its frames stay contiguous on the wire.

Unauthenticated peers. Until a connection authenticates, the member accepts one message of at most
``UNAUTHENTICATED_MESSAGE_LIMIT`` bytes (the authentication request); a bigger or fragmented one, or any other request,
closes the connection, and so does not authenticating within ``auth_timeout_s``. The frame reader buffers only bytes
that arrived (never an announced length) and gives its memory back when the connection closes. So a peer without
credentials can pin at most 64 KiB per connection, for a few seconds. Authenticated clients may send frames of up to
``MAX_FRAME_SIZE``.

Silent clients. A connection on which nothing was received and nothing could be written for the client heartbeat
timeout is closed (like a Hazelcast member's client heartbeat monitor), which releases the client's locks and
listeners as any disconnect does. Idle official clients ping every 5 s, so only vanished ones hit it.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import os
import socket
import time
from itertools import islice
from typing import Any, cast

import meteor_spark.server.handlers  # noqa: F401 - registers the handlers
from meteor_spark.server.addresses import advertised_host
from meteor_spark.server.busy_poll import BusyPoll
from meteor_spark.server.connection_info import ConnectionInfo
from meteor_spark.server.engine import Engine
from meteor_spark.server.errors import ProtocolError
from meteor_spark.server.handlers import registry
from meteor_spark.server.handlers.registry import Chunks, Endpoint, MemberSettings
from meteor_spark.server.protocol.frames import MAX_FRAME_SIZE, UNAUTHENTICATED_MESSAGE_LIMIT, FrameReader, Message

logger = logging.getLogger(__name__)

#: Kernel socket buffer size requested for client connections.
SOCKET_BUFFER_BYTES = 4 * 1024 * 1024

#: Bytes queued for a client (beyond what the kernel took) above which the member stops producing more for it.
OUTPUT_HIGH_WATER = 4 * 1024 * 1024
#: ... and below which it resumes.
OUTPUT_LOW_WATER = 1024 * 1024
#: Bytes received from a held-back client beyond which the member stops reading from it.
BACKLOG_HIGH_WATER = 1024 * 1024
#: When the kernel is full, at most this much is copied into the transport to wait for writability.
HANDOFF_BYTES = 64 * 1024

#: Hazelcast's default: a member closes a client connection it heard nothing from for 60 s.
DEFAULT_CLIENT_HEARTBEAT_TIMEOUT_S = 60.0

#: A connection that has not authenticated this long after it was opened is closed.
DEFAULT_AUTH_TIMEOUT_S = 10.0

_IOV_MAX = min(1024, os.sysconf("SC_IOV_MAX")) if hasattr(os, "sysconf") else 1024
_WRITEV = getattr(os, "writev", None)  # None on Windows: chunks then go through the transport
_dispatch_whole = registry.dispatch_whole


class ClientConnection(asyncio.Protocol):
    def __init__(self, server: MemberServer) -> None:
        self.server = server
        self.reader = FrameReader(
            max_frame_size=UNAUTHENTICATED_MESSAGE_LIMIT, message_limit=UNAUTHENTICATED_MESSAGE_LIMIT
        )
        self._auth_deadline: asyncio.TimerHandle | None = None
        self.transport: asyncio.Transport | None = None
        self.endpoint = Endpoint(self, "?")
        self.closed = False
        self.congested = False
        self.last_activity = time.monotonic()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._pending: Chunks | None = None  # responses gathered while a batch of requests is served
        self._pending_bytes = 0
        self._queue: collections.deque[bytes | bytearray | memoryview] = collections.deque()
        self._queued = 0
        self._fd: int | None = None  # the socket's descriptor, for writev; None: write through the transport
        self._writing_paused = False  # the transport holds unsent bytes (it calls resume_writing when drained)
        self._backlog: list[Message] = []
        self._backlog_bytes = 0  # received while held back (what the backlog and the frame reader hold)
        self._reading_paused = False
        self._resume_scheduled = False
        self._writable_waiters: list[asyncio.Future[None]] = []

    # ------------------------------------------------------------------------------------------- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Duck-typed: uvloop's transports have asyncio.Transport's methods without subclassing it.
        transport = cast(asyncio.Transport, transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.endpoint.remote = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.server.connections.add(self)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            # Large kernel buffers let a client hand over a whole multi-MiB add_all in few send() calls (the
            # official client re-slices its unsent remainder after every partial send) and let read_many
            # responses leave in one go.
            for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
                try:
                    sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER_BYTES)
                except OSError:
                    pass
        # Writing to the descriptor ourselves is only right for a plain socket transport (not TLS, which encrypts).
        plain = sock is not None and sock.type == socket.SOCK_STREAM and transport.get_extra_info("sslcontext") is None
        if plain and _WRITEV is not None:
            assert sock is not None
            self._fd = sock.fileno()
            # Paused exactly while the transport holds bytes: our own writes must wait for those.
            transport.set_write_buffer_limits(high=0, low=0)
        else:
            transport.set_write_buffer_limits(high=OUTPUT_LOW_WATER, low=OUTPUT_LOW_WATER // 4)
        if self.server.auth_timeout_s > 0:
            self._auth_deadline = asyncio.get_running_loop().call_later(
                self.server.auth_timeout_s, self._auth_timed_out
            )
        logger.debug("connection from %s", self.endpoint.remote)

    def _auth_timed_out(self) -> None:
        self._auth_deadline = None
        if not self.endpoint.authenticated and not self.closed:
            logger.warning(
                "closing connection from %s: it did not authenticate within %g s",
                self.endpoint.remote,
                self.server.auth_timeout_s,
            )
            self.abort()

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self.last_activity = now = time.monotonic()
        busy_poll = self.server.busy_poll
        if busy_poll is not None:
            busy_poll.request_arrived(now)
        if self.reader.message_limit and self.endpoint.authenticated:
            self.reader.max_frame_size = MAX_FRAME_SIZE
            self.reader.message_limit = 0
        if type(data) is bytes and not self.congested and not self._backlog and self.reader.between_messages():
            try:  # whole requests: served without cutting frames
                served = self._serve_bytes(data)
            except Exception as exc:
                self._failed(exc)
                return
            if served == len(data) or self.closed:
                return
            data = data[served:] if served else data
        try:
            messages = self.reader.feed(data)
        except ProtocolError as exc:
            self.close(f"protocol error: {exc}")
            return
        if self.congested or self._backlog:
            # Held back: keep reading (a ping proves the client alive) but serve nothing until it reads; stop
            # reading only if it keeps sending that much.
            self._backlog.extend(messages)
            self._backlog_bytes += len(data)
            if self._backlog_bytes > BACKLOG_HIGH_WATER and not self._reading_paused and self.transport is not None:
                self._reading_paused = True
                self.transport.pause_reading()
        elif messages:
            self._serve(messages)

    def connection_lost(self, exc: Exception | None) -> None:
        self._shutdown()
        logger.debug("connection from %s closed (%s)", self.endpoint.remote, exc or "EOF")

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        self.last_activity = time.monotonic()
        self._drain()

    # ------------------------------------------------------------------------------------------- registry.Connection

    def send(self, chunks: Chunks) -> None:
        if self._pending is not None:  # a batch of requests is being served: its responses leave together
            if not self.closed:
                self._pending.extend(chunks)
                self._pending_bytes += sum(map(len, chunks))
            return
        self._enqueue(chunks)

    async def writable(self) -> None:
        """Return once the connection is no longer congested (or closed)."""
        loop = asyncio.get_running_loop()
        while self.congested and not self.closed:
            waiter: asyncio.Future[None] = loop.create_future()
            self._writable_waiters.append(waiter)
            await waiter

    def close(self, reason: str) -> None:
        """Close after delivering what was already answered; a protocol error aborts at once."""
        if self.closed:
            return
        if reason.startswith("protocol error") or reason == "internal error":
            logger.warning("closing connection from %s: %s", self.endpoint.remote, reason)
            if reason.startswith("protocol error"):
                self.abort()
                return
        transport = self.transport
        if self._pending:  # responses of the requests served so far in this batch (an error explaining the close)
            self._queue.extend(self._pending)
            self._pending.clear()
        if transport is not None:
            if self._queue:  # the transport flushes these before it closes the socket
                transport.writelines(list(self._queue))
                self._queue.clear()
            transport.close()
        self._shutdown()

    def abort(self) -> None:
        """Close at once, dropping unsent bytes (a client that cannot be written to, or talks garbage)."""
        if self.closed:
            return
        if self.transport is not None:
            self.transport.abort()
        self._shutdown()

    def track(self, task: asyncio.Task[Any]) -> None:
        if self.closed:
            task.cancel()
            return
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------------------------------- inspection

    def info(self, now: float) -> ConnectionInfo:
        endpoint = self.endpoint
        return ConnectionInfo(
            remote=endpoint.remote,
            client_name=endpoint.client_name,
            client_uuid=endpoint.client_uuid,
            queued_bytes=self._queued + self._pending_bytes,
            transport_bytes=self.transport.get_write_buffer_size() if self.transport is not None else 0,
            congested=self.congested,
            backlog=len(self._backlog),
            idle_s=max(0.0, now - self.last_activity),
        )

    # ------------------------------------------------------------------------------------------- serving requests

    def _serve(self, messages: list[Message]) -> None:
        """Dispatch ``messages`` in order, their responses written together; stop early when the client is not
        reading (the rest waits in the backlog)."""
        if len(messages) == 1:
            self._serve_one(messages[0])
            return
        pending: list[Any] = []
        self._pending = pending
        self._pending_bytes = 0
        engine, member, endpoint = self.server.engine, self.server.member, self.endpoint
        requests = self.server.requests
        try:
            for index, message in enumerate(messages):
                name = registry.dispatch(engine, member, endpoint, message)
                requests[name] = requests.get(name, 0) + 1
                if self.closed:
                    break
                if self.congested or self._pending_bytes + self._queued > OUTPUT_HIGH_WATER:
                    self._pending = None
                    self._pending_bytes = 0
                    self._enqueue(pending)
                    pending = []
                    self._pending = pending
                    if self.congested:
                        self._backlog.extend(messages[index + 1 :])
                        break
        except Exception as exc:
            self._failed(exc)
        finally:
            self._pending = None
            self._pending_bytes = 0
            if pending and not self.closed:
                self._enqueue(pending)

    def _serve_bytes(self, data: bytes) -> int:
        """Serve the requests at the start of ``data`` that compiled readers take, from its bytes; where the rest is."""
        engine, member, endpoint, requests = self.server.engine, self.server.member, self.endpoint, self.server.requests
        served = _dispatch_whole(engine, member, endpoint, data, 0)
        if served is None:
            return 0
        name, pos = served
        requests[name] = requests.get(name, 0) + 1
        if pos == len(data) or self.closed or self.congested:  # one request a read: a client waiting for each answer
            return pos
        pending: list[Any] = []  # several requests in one read: their responses leave together, as _serve sends them
        self._pending, self._pending_bytes = pending, 0
        try:
            while pos < len(data) and not self.closed and self._pending_bytes + self._queued <= OUTPUT_HIGH_WATER:
                served = _dispatch_whole(engine, member, endpoint, data, pos)
                if served is None:
                    break
                name, pos = served
                requests[name] = requests.get(name, 0) + 1
        finally:
            self._pending, self._pending_bytes = None, 0
            if pending and not self.closed:
                self._enqueue(pending)
        return pos

    def _serve_one(self, message: Message) -> None:
        """Dispatch one request (what a client waiting for each answer sends): its response goes to the socket as
        the handler sends it, with no gathering list; ``_enqueue`` marks the connection congested if the kernel
        did not take it all."""
        try:
            name = registry.dispatch(self.server.engine, self.server.member, self.endpoint, message)
        except Exception as exc:
            self._failed(exc)
            return
        self.server.requests[name] = self.server.requests.get(name, 0) + 1

    def _failed(self, exc: Exception) -> None:
        """A malformed request closes its connection; a bug costs that one connection, never the member."""
        if isinstance(exc, ProtocolError):
            self.close(f"protocol error: {exc}")
            return
        logger.error("unexpected error serving %s; closing that connection", self.endpoint.remote, exc_info=exc)
        self.close("internal error")

    def _resume_input(self) -> None:
        """Serve the backlog, then read again - unless the client is still (or again) not reading."""
        self._resume_scheduled = False
        if self.closed or self.congested:
            return
        backlog, self._backlog = self._backlog, []
        if backlog:
            self._serve(backlog)
        if not self._backlog:
            self._backlog_bytes = 0
            if self._reading_paused and not self.closed and self.transport is not None:
                self._reading_paused = False
                self.transport.resume_reading()

    # ------------------------------------------------------------------------------------------- writing

    def _enqueue(self, chunks: Chunks) -> None:
        if self.closed:
            return
        size = sum(map(len, chunks))
        fd = self._fd
        if fd is not None and not self._queue and not self._writing_paused and len(chunks) <= _IOV_MAX:
            # Nothing queued before them (the usual case): hand the chunks to the kernel as they are, without the
            # queue's bookkeeping; only what the kernel does not take is queued.
            try:
                written: int = _WRITEV(fd, chunks)  # type: ignore[misc]
            except (BlockingIOError, InterruptedError):
                written = 0
            except OSError as exc:
                self._write_failed(exc)
                return
            if written:
                self.last_activity = time.monotonic()
                if written == size:
                    return
                chunks = _after(chunks, written)
                size -= written
        self._queue.extend(chunks)
        self._queued += size
        self._drain()
        if self._queued > OUTPUT_HIGH_WATER and not self.congested:
            self.congested = True
            logger.debug("client %s reads slower than the member answers; holding its requests", self.endpoint.remote)

    def _writev(self, fd: int, chunks: Chunks) -> int | None:
        """Hand ``chunks`` to the kernel in one ``writev``: the bytes it took (0 when the socket is full), or None
        when the connection failed, which closes it."""
        try:
            written: int = _WRITEV(fd, chunks)  # type: ignore[misc]
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError as exc:
            self._write_failed(exc)
            return None
        if written:
            self.last_activity = time.monotonic()
        return written

    def _write_failed(self, exc: OSError) -> None:
        logger.debug("writing to %s failed (%s); closing the connection", self.endpoint.remote, exc)
        self.abort()

    def _drain(self) -> None:
        """Give the kernel as much of the queue as it takes; when it is full, hand one piece to the transport,
        which calls ``resume_writing`` once the socket drained."""
        queue = self._queue
        transport = self.transport
        fd = self._fd
        while queue and not self._writing_paused and not self.closed and transport is not None:
            if fd is None:
                chunks = list(queue)
                queue.clear()
                self._queued = 0
                transport.writelines(chunks)
                break
            batch = list(queue) if len(queue) <= _IOV_MAX else list(islice(queue, _IOV_MAX))
            written = self._writev(fd, batch)
            if written is None:
                return
            if written:
                if written == self._queued:  # the usual case: the kernel took everything
                    queue.clear()
                    self._queued = 0
                    break
                self._queued -= written
                while written:
                    size = len(queue[0])
                    if written >= size:
                        queue.popleft()
                        written -= size
                    else:
                        queue[0] = memoryview(queue[0])[written:]
                        written = 0
                continue  # a partial write usually means the kernel is full: the next writev says so
            head = memoryview(queue.popleft())
            piece = head[:HANDOFF_BYTES]
            if len(head) > HANDOFF_BYTES:
                queue.appendleft(head[HANDOFF_BYTES:])
            self._queued -= len(piece)
            # Tiny copy; pauses us (limits 0/0) unless the socket took it all after all, then the loop goes on.
            transport.write(piece)
        if self.congested and self._queued <= OUTPUT_LOW_WATER and not self.closed:
            self.congested = False
            waiters, self._writable_waiters = self._writable_waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
            if (self._backlog or self._reading_paused) and not self._resume_scheduled:
                # Not now: _drain may run inside a handler's send(); serving requests there would re-enter.
                self._resume_scheduled = True
                asyncio.get_running_loop().call_soon(self._resume_input)

    # ------------------------------------------------------------------------------------------- internals

    def _shutdown(self) -> None:
        if self.closed and self not in self.server.connections:
            return
        self.closed = True
        self.server.connections.discard(self)
        if self._auth_deadline is not None:
            self._auth_deadline.cancel()
            self._auth_deadline = None
        self.reader.release()
        self._queue.clear()
        self._queued = 0
        self._backlog.clear()
        for waiter in self._writable_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._writable_waiters.clear()
        for task in list(self._tasks):
            task.cancel()
        self._tasks.clear()
        self.endpoint.run_close_hooks()
        client_uuid = self.endpoint.client_uuid
        if client_uuid is not None and not any(
            other.endpoint.client_uuid == client_uuid for other in self.server.connections
        ):
            try:
                self.server.engine.client_disconnected(client_uuid)
            except Exception:
                logger.exception("releasing the resources of client %s failed", client_uuid)


def _after(chunks: Chunks, written: int) -> Chunks:
    """What is left of ``chunks`` once their first ``written`` bytes were written (views: no copy)."""
    for index, chunk in enumerate(chunks):
        size = len(chunk)
        if written < size:
            rest: Chunks = [memoryview(chunk)[written:]] if written else [chunk]
            return rest + chunks[index + 1 :]
        written -= size
    return []


class MemberServer:
    """The listening socket and its connections, on the running event loop.

    Args:
        client_heartbeat_timeout_s: close a connection on which nothing was received (and nothing could be
            written) for this long; 0 disables the check.
        auth_timeout_s: close a connection that has not authenticated this long after it opened; 0 disables it.
        busy_poll_us: after each read, keep the loop polling without sleeping for this long (``busy_poll``); 0: off.
    """

    def __init__(
        self,
        engine: Engine,
        member: MemberSettings,
        client_heartbeat_timeout_s: float = DEFAULT_CLIENT_HEARTBEAT_TIMEOUT_S,
        auth_timeout_s: float = DEFAULT_AUTH_TIMEOUT_S,
        busy_poll_us: int = 0,
    ) -> None:
        if client_heartbeat_timeout_s < 0:
            raise ValueError(f"client heartbeat timeout must be >= 0 s (0 = never), got {client_heartbeat_timeout_s}")
        if not auth_timeout_s >= 0:
            raise ValueError(f"authentication timeout must be >= 0 s (0 = never), got {auth_timeout_s}")
        self.auth_timeout_s = auth_timeout_s
        self.engine = engine
        self.member = member
        self.client_heartbeat_timeout_s = client_heartbeat_timeout_s
        self.connections: set[ClientConnection] = set()
        self.requests: dict[str, int] = {}  # message name -> requests served (the member's metrics)
        self.metrics_address: str | None = None  # host:port of the metrics endpoint, when serving one
        self._server: asyncio.base_events.Server | None = None
        self._monitor: asyncio.Task[None] | None = None
        self.busy_poll = BusyPoll(busy_poll_us) if busy_poll_us else None

    async def bind(self, host: str, port: int) -> tuple[str, int]:
        """Bind the member's socket without accepting yet; the (host, port) actually bound (port 0 picks a free one).

        Binding comes first so a member whose port is in use or whose host is not an address of this machine fails
        before it opened anything (its data directory included).

        Raises:
            OSError: the address cannot be bound (``socket.gaierror`` when ``host`` does not resolve).
        """
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: ClientConnection(self), host, port, reuse_address=True, start_serving=False
        )
        bound = self._server.sockets[0].getsockname()
        # Clients learn the member's address from the member list: advertise the port actually bound.
        self.member = dataclasses.replace(self.member, host=advertised_host(host), port=bound[1])
        return bound[0], bound[1]

    async def start_serving(self) -> None:
        """Accept clients on the socket ``bind`` bound (and watch their heartbeats)."""
        assert self._server is not None, "bind() first"
        await self._server.start_serving()
        if self.client_heartbeat_timeout_s > 0:
            loop = asyncio.get_running_loop()
            self._monitor = loop.create_task(self._monitor_heartbeats(self.client_heartbeat_timeout_s))

    async def start(self, host: str, port: int) -> tuple[str, int]:
        """Bind and accept clients; the (host, port) actually bound (port 0 picks a free one)."""
        bound = await self.bind(host, port)
        await self.start_serving()
        return bound

    async def stop(self) -> None:
        if self._monitor is not None:
            self._monitor.cancel()
            self._monitor = None
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.close("member shutting down")
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    def connection_info(self) -> list[ConnectionInfo]:
        """A snapshot of every open connection (call on the member's loop)."""
        now = time.monotonic()
        return sorted((connection.info(now) for connection in self.connections), key=lambda info: info.remote)

    async def _monitor_heartbeats(self, timeout_s: float) -> None:
        # Hazelcast checks every 10 s; a short timeout (tests) is checked proportionally often.
        interval = min(10.0, timeout_s / 4)
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for connection in list(self.connections):
                silent = now - connection.last_activity
                if silent > timeout_s and not connection.closed:
                    endpoint = connection.endpoint
                    logger.warning(
                        "closing connection from %s (client %r, uuid %s): nothing heard from it for %.1f s, more than "
                        "the client heartbeat timeout of %g s (its locks and listeners are released)",
                        endpoint.remote,
                        endpoint.client_name,
                        endpoint.client_uuid,
                        silent,
                        timeout_s,
                    )
                    connection.abort()
