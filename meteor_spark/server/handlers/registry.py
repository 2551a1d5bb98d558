"""The handler registry and the request dispatcher.

A handler serves one message type::

    @handles(RINGBUFFER_SIZE)
    async def size(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any]:
        return {"response": ctx.engine.rings.get(req["name"]).size()}

It gets the decoded request parameters by spec name and returns the response parameters by spec name (or None for an
empty response). It raises ``meteor_spark.server.errors.ServerError`` subclasses for Hazelcast error responses.

A handler that usually does not wait may be a plain function (``def``): the dispatcher calls it and answers, with no
coroutine to create and drive (measured on ``Map.get`` and ``Map.put``, the member's most frequent small requests).
When it must wait (a lock in the way, a durable write), it returns a coroutine instead of the response, which the
dispatcher drives as it drives an ``async`` handler's; a long poll returns ``ctx.answer_when(key, answer)`` instead
(``PARKED``): a callback answers it from the write that satisfies it, with no coroutine at all.

Ordering: a handler runs synchronously until its first real suspension, so it must mutate engine state before its
first ``await`` - a client's successive calls then apply in the order they were sent. Handlers that do not suspend
never become tasks (the dispatcher drives the coroutine inline), which keeps the per-message overhead low; one that
suspends (a long poll) continues as its own task, so it never stalls its connection or other clients.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import struct
import types
import uuid as uuid_module
from collections.abc import Awaitable, Callable, Coroutine, Hashable
from dataclasses import dataclass, field
from typing import Any, Protocol

from meteor_spark.server.engine import Engine
from meteor_spark.server.errors import Authentication, ProtocolError, ServerError, UnsupportedOperation
from meteor_spark.server.fidelity import MIMICKED_VERSION
from meteor_spark.server.protocol.errors import encode_error
from meteor_spark.server.protocol.frames import HEADER_SIZE, REQUEST_FIXED_OFFSET, Message
from meteor_spark.server.protocol.message_codec import (
    BytesReader,
    ChunksWriter,
    EventSpec,
    MessageSpec,
    decode_request,
    encode_event,
    encode_response,
)

logger = logging.getLogger(__name__)


class Parked:
    """The type of ``PARKED``."""

    def __repr__(self) -> str:
        return "PARKED"


#: What a plain handler returns when ``RequestContext.answer_when`` will answer its request later.
PARKED = Parked()


Response = dict[str, Any] | None
Handler = Callable[["RequestContext", dict[str, Any]], Coroutine[Any, Any, Response] | Response | Parked]
Chunks = list[bytes | bytearray | memoryview]
_NO_VALUES: dict[str, Any] = {}


@dataclass(frozen=True)
class HandlerEntry:
    spec: MessageSpec
    handler: Handler
    needs_auth: bool = True
    plain: bool = False
    """The handler is a plain function: its return value is the response."""
    read_bytes: BytesReader | None = None
    """The request's decoder straight from the bytes it arrived in (``message_codec._bytes_reader``), if compiled."""
    write_response: ChunksWriter | None = None
    """The response's compiled encoder (``message_codec._frames_writer``), called without ``encode_response``."""


#: message type -> (spec, handler); filled by ``@handles`` when the handler modules are imported.
HANDLERS: dict[int, HandlerEntry] = {}


def handles(spec: MessageSpec, *, needs_auth: bool = True) -> Callable[[Handler], Handler]:
    """Register the decorated coroutine function as the handler of ``spec``'s request type."""

    def register(handler: Handler) -> Handler:
        existing = HANDLERS.get(spec.request_type)
        if existing is not None and existing.handler.__qualname__ != handler.__qualname__:
            raise RuntimeError(
                f"message 0x{spec.request_type:06X} ({spec.name}) already has handler {existing.handler.__qualname__}"
            )
        plain = not inspect.iscoroutinefunction(handler)
        read_bytes, write_response = spec._read_bytes, spec._write_response  # type: ignore[attr-defined]
        HANDLERS[spec.request_type] = HandlerEntry(spec, handler, needs_auth, plain, read_bytes, write_response)
        return handler

    return register


@dataclass(frozen=True)
class MemberSettings:
    """Who this member is and whom it lets in.

    Attributes:
        host, port: the address clients reach (the bound port, never 0).
        cluster_name: clients must present it.
        username, password: when set, clients must present them (never logged; not in ``repr``).
        member_uuid: stable for the member's lifetime (clients route by it).
        cluster_id: changes on every start, which tells clients the cluster restarted.
        version: the Hazelcast version announced to clients: the release whose answers the member reproduces
            (``meteor_spark.server.fidelity``), so clients enable exactly the features it has.
    """

    host: str
    port: int
    cluster_name: str = "dev"
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    member_uuid: uuid_module.UUID = field(default_factory=uuid_module.uuid4)
    cluster_id: uuid_module.UUID = field(default_factory=uuid_module.uuid4)
    partition_count: int = 271
    version: str = MIMICKED_VERSION


class Connection(Protocol):
    """What the dispatcher needs from a client connection (the TCP shell implements it).

    ``congested`` is true while the client reads slower than the member answers; ``writable()`` returns once it is
    not (or the connection closed).
    """

    closed: bool
    congested: bool

    def send(self, chunks: Chunks) -> None: ...

    async def writable(self) -> None: ...

    def close(self, reason: str) -> None: ...

    def track(self, task: asyncio.Task[Any]) -> None: ...


class Endpoint:
    """One client connection as the member sees it: identity after authentication, listeners, close hooks."""

    def __init__(self, connection: Connection, remote: str = "?") -> None:
        self.connection = connection
        self.remote = remote
        self.authenticated = False
        self.client_uuid: uuid_module.UUID | None = None
        self.client_name = ""
        self.client_type = ""
        self.client_version = ""
        self.labels: list[str] = []
        self._close_hooks: dict[object, Callable[[], object]] = {}

    @property
    def closed(self) -> bool:
        return self.connection.closed

    def on_close(self, key: object, hook: Callable[[], object]) -> None:
        """Run ``hook`` when the connection closes (e.g. drop a listener registration); ``key`` allows removal."""
        self._close_hooks[key] = hook

    def remove_on_close(self, key: object) -> None:
        self._close_hooks.pop(key, None)

    def run_close_hooks(self) -> None:
        hooks, self._close_hooks = self._close_hooks, {}
        for hook in hooks.values():
            try:
                hook()
            except Exception:
                logger.exception("close hook of connection %s failed", self.remote)

    def __repr__(self) -> str:
        return f"Endpoint(remote={self.remote}, client={self.client_name!r}, uuid={self.client_uuid})"


class RequestContext:
    """What a handler gets besides its request parameters."""

    __slots__ = ("correlation_id", "endpoint", "engine", "member", "partition_id", "spec")

    def __init__(
        self,
        engine: Engine,
        member: MemberSettings,
        endpoint: Endpoint,
        correlation_id: int,
        partition_id: int,
        spec: MessageSpec,
    ) -> None:
        self.engine = engine
        self.member = member
        self.endpoint = endpoint
        self.correlation_id = correlation_id
        self.partition_id = partition_id
        self.spec = spec

    def send_event(self, spec: EventSpec, **values: Any) -> bool:
        """Push an event for the listener this request registered (its correlation id); False if the connection
        is gone."""
        if self.endpoint.closed:
            return False
        self.endpoint.connection.send(encode_event(spec, self.correlation_id, values))
        return True

    async def park(self, key: Hashable, timeout_s: float | None = None) -> bool:
        """Wait until ``engine.waiters`` is notified for ``key``; False when ``timeout_s`` passed first.

        The wait is cancelled (CancelledError) when the connection closes. Callers re-check their condition
        afterwards: wake-ups may be spurious. While the client is not reading its responses, the return is held
        back until it does: the caller's response (a long poll's items) would only pile up in the member.
        """
        if timeout_s is not None and timeout_s <= 0:
            return False  # no suspension: answered inline like any other request
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()

        def wake() -> None:
            if not waiter.done():
                waiter.set_result(None)

        waiters = self.engine.waiters
        handle = waiters.register(key, wake)
        try:
            if timeout_s is None:
                await waiter
                woken = True
            else:
                try:
                    await asyncio.wait_for(waiter, timeout_s)
                    woken = True
                except TimeoutError:
                    woken = False
        finally:
            waiters.cancel(key, handle)
        connection = self.endpoint.connection
        if connection.congested:
            await connection.writable()
        return woken

    def answer_when(self, key: Hashable, answer: Callable[[], Response]) -> Parked:
        """Answer this request at the first notification of ``key`` at which ``answer`` returns a response (None:
        not yet, wait for the next one); what a plain handler returns instead of its response (a long poll
        without a timeout).

        The answer is sent from inside the write that notified, right after the writer's own response
        (``_handle``), and no coroutine or task waits meanwhile: a parked poll is one registered callback, so the
        write -> parked read hop costs the member no event-loop turn, future or task. ``answer`` raising (a
        ``ServerError``) answers with that error. While the client is not reading its responses, a wake-up hands
        over to a task that answers once it reads again (``writable``), as ``park`` holds back every long poll. The
        registration goes when the connection closes.
        """
        parked = _ParkedAnswer(self, key, answer)
        parked.handle = self.engine.waiters.register(key, parked)
        self.endpoint.on_close(self, parked.cancel)
        return PARKED

    async def _answer_when_writable(self, key: Hashable, answer: Callable[[], Response]) -> None:
        """``answer_when``'s wake-up on a congested connection: the same attempt once the client reads again."""
        await self.endpoint.connection.writable()
        if self.endpoint.closed:
            return
        try:
            response = answer()
        except BaseException as exc:
            _fail(self, exc)
            return
        if response is None:
            self.answer_when(key, answer)
        else:
            _respond(self, response)


class _ParkedAnswer:
    """A parked request's wake-up (``RequestContext.answer_when``): an object that re-registers itself, not a closure
    naming itself, which would be a reference cycle keeping what ``answer`` holds until a full garbage collection."""

    __slots__ = ("answer", "ctx", "handle", "key")

    def __init__(self, ctx: RequestContext, key: Hashable, answer: Callable[[], Response]) -> None:
        self.ctx = ctx
        self.key = key
        self.answer = answer
        self.handle = 0

    def __call__(self) -> None:
        ctx = self.ctx
        endpoint = ctx.endpoint
        connection = endpoint.connection
        if connection.closed:
            return
        if connection.congested:
            endpoint.remove_on_close(ctx)
            connection.track(asyncio.ensure_future(ctx._answer_when_writable(self.key, self.answer)))
            return
        try:
            response = self.answer()
        except BaseException as exc:
            endpoint.remove_on_close(ctx)
            _fail(ctx, exc)
            return
        if response is None:
            self.handle = ctx.engine.waiters.register(self.key, self)
            return
        endpoint.remove_on_close(ctx)
        _respond(ctx, response)

    def cancel(self) -> None:
        self.ctx.engine.waiters.cancel(self.key, self.handle)


# --------------------------------------------------------------------------------------------------------------------
# Dispatch


def dispatch(engine: Engine, member: MemberSettings, endpoint: Endpoint, msg: Message) -> str:
    """Serve one request: decode, run its handler, send the response or error. Returns the message's name
    (``"unknown"`` for a type the member does not serve), for the member's request counts.

    Raises:
        ProtocolError: the message is malformed (the caller closes the connection).
    """
    message_type, correlation_id, partition_id = msg.request_header()
    entry = HANDLERS.get(message_type)
    connection = endpoint.connection
    if not endpoint.authenticated and (entry is None or entry.needs_auth):
        # Hazelcast: "must authenticate before any operation", an error response, and the connection is closed.
        what = entry.spec.name if entry is not None else f"message type 0x{message_type & 0xFFFFFFFF:x}"
        connection.send(
            encode_error(
                correlation_id,
                Authentication(f"client {endpoint.remote} must authenticate before any operation; it sent {what}"),
            )
        )
        logger.warning("closing connection from %s: it sent %s before authenticating", endpoint.remote, what)
        connection.close(f"{what} before authentication")
        return "unknown" if entry is None else entry.spec.name
    if entry is None:
        connection.send(
            encode_error(
                correlation_id,
                UnsupportedOperation(
                    f"Unrecognized client message received with type: 0x{message_type & 0xFFFFFFFF:x}"
                ),
            )
        )
        return "unknown"
    return _handle(engine, member, endpoint, entry, decode_request(entry.spec, msg), correlation_id, partition_id)


def dispatch_whole(
    engine: Engine, member: MemberSettings, endpoint: Endpoint, data: bytes, start: int = 0
) -> tuple[str, int] | None:
    """Serve the request that starts at ``start`` of ``data`` when it is a whole one of an authenticated client that
    its compiled bytes reader decodes (a client waiting for each answer sends one a read; one sending several at
    once, several), with no frames cut: its name and the offset after it. None when it is not, and nothing was
    done: the caller then cuts the bytes from ``start`` on into messages and serves them with ``dispatch``.

    Raises:
        ProtocolError: a parameter is malformed (the caller closes the connection).
    """
    if len(data) - start < HEADER_SIZE + REQUEST_FIXED_OFFSET or not endpoint.authenticated:
        return None
    message_type, correlation_id, partition_id = _WHOLE_HEADER.unpack_from(data, start + HEADER_SIZE)
    entry = HANDLERS.get(message_type)
    if entry is None or entry.read_bytes is None:
        return None
    read = entry.read_bytes(data, start)
    if read is None:
        return None
    request, end = read
    return _handle(engine, member, endpoint, entry, request, correlation_id, partition_id), end


#: The request header (type, correlation id, partition id) after the initial frame's header.
_WHOLE_HEADER = struct.Struct("<iqi")


def _handle(
    engine: Engine,
    member: MemberSettings,
    endpoint: Endpoint,
    entry: HandlerEntry,
    request: dict[str, Any],
    correlation_id: int,
    partition_id: int,
) -> str:
    """Run a decoded request's handler and answer it (at once, or from the task a waiting handler becomes).

    A plain handler's wake-ups (an add answering reads parked on its ring) go out after its own response, as
    Hazelcast answers a write before the operations it unparks run: the writer learns its write is done first, and
    its next one finds nothing outstanding. Both go out in the same event-loop turn."""
    spec = entry.spec
    ctx = RequestContext(engine, member, endpoint, correlation_id, partition_id, spec)
    if entry.plain:
        waiters = engine.waiters
        held = waiters.hold()
        try:
            coro = _answer_plain(ctx, entry, request)
        finally:
            if held:
                waiters.release()
        if coro is None:
            return spec.name
    else:
        coro = entry.handler(ctx, request)
    try:
        suspended = coro.send(None)
    except StopIteration as stop:
        _respond(ctx, stop.value)
        return spec.name
    except BaseException as exc:
        _fail(ctx, exc)
        return spec.name
    task = asyncio.ensure_future(_finish(ctx, _continue(coro, suspended)))
    endpoint.connection.track(task)
    return spec.name


def _answer_plain(ctx: RequestContext, entry: HandlerEntry, request: dict[str, Any]) -> Any:
    """Run a plain handler and send its response; None when done, else the coroutine it returned (run on)."""
    spec = entry.spec
    connection = ctx.endpoint.connection
    try:
        result = entry.handler(ctx, request)
    except BaseException as exc:
        _fail(ctx, exc)
        return None
    if type(result) is _COROUTINE:
        return result
    if result is PARKED or connection.closed:
        return None
    write = entry.write_response
    values = result or _NO_VALUES
    try:
        if write is not None:
            chunks = write((spec.request_type + 1, ctx.correlation_id, 0), values)  # type: ignore[arg-type]
        else:
            chunks = encode_response(spec, ctx.correlation_id, values)  # type: ignore[arg-type]
    except Exception:
        _respond(ctx, result)  # type: ignore[arg-type]  # reports the handler's bad response
        return None
    connection.send(chunks)
    return None


_COROUTINE = types.CoroutineType


@types.coroutine
def _continue(coro: Coroutine[Any, Any, Response], suspended: Any) -> Any:
    """Resume a coroutine that already ran to its first suspension, under a task (a hand-made eager task)."""
    to_yield = suspended
    while True:
        try:
            sent = yield to_yield
        except BaseException as exc:
            try:
                to_yield = coro.throw(exc)
            except StopIteration as stop:
                return stop.value
        else:
            try:
                to_yield = coro.send(sent)
            except StopIteration as stop:
                return stop.value


async def _finish(ctx: RequestContext, pending: Awaitable[Response]) -> None:
    try:
        result = await pending
    except asyncio.CancelledError:
        return  # the connection closed under a long poll: nobody to answer
    except BaseException as exc:
        _fail(ctx, exc)
        return
    _respond(ctx, result)


def _respond(ctx: RequestContext, result: Response) -> None:
    connection = ctx.endpoint.connection
    if connection.closed:
        return
    try:
        chunks = encode_response(ctx.spec, ctx.correlation_id, result or _NO_VALUES)
    except Exception as exc:  # a handler bug (wrong response params): report it, keep the member up
        logger.exception("handler of %s returned a response that cannot be encoded", ctx.spec.name)
        connection.send(encode_error(ctx.correlation_id, ServerError(f"{ctx.spec.name}: {exc}")))
        return
    connection.send(chunks)


def _fail(ctx: RequestContext, exc: BaseException) -> None:
    if isinstance(exc, ProtocolError):
        ctx.endpoint.connection.close(f"protocol error in {ctx.spec.name}: {exc}")
        return
    if not isinstance(exc, ServerError):
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise exc
        logger.exception("handler of %s failed", ctx.spec.name, exc_info=exc)
        exc = ServerError(f"{ctx.spec.name} failed in the member: {type(exc).__name__}: {exc}")
    if ctx.endpoint.closed:
        return
    ctx.endpoint.connection.send(encode_error(ctx.correlation_id, exc))
