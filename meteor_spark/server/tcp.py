"""The TCP shell: accept connections, cut bytes into messages, dispatch, write responses. Nothing else.

One asyncio ``Protocol`` per connection with its own ``FrameReader`` (a buffer, not a StreamReader, for speed).
Responses produced while a chunk of input is processed are collected and written with one ``writelines`` call.
A malformed message closes only its connection, with one log line; the member never crashes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
from typing import Any

from meteor_spark.server.engine import Engine
from meteor_spark.server.errors import ProtocolError
from meteor_spark.server.handlers import registry
from meteor_spark.server.handlers.registry import Chunks, Endpoint, MemberSettings
from meteor_spark.server.protocol.frames import FrameReader

import meteor_spark.server.handlers  # noqa: F401 - registers the handlers

logger = logging.getLogger(__name__)

#: Kernel socket buffer size requested for client connections.
SOCKET_BUFFER_BYTES = 4 * 1024 * 1024


class ClientConnection(asyncio.Protocol):
    def __init__(self, server: "MemberServer") -> None:
        self.server = server
        self.reader = FrameReader()
        self.transport: asyncio.Transport | None = None
        self.endpoint = Endpoint(self, "?")
        self.closed = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._pending: Chunks | None = None  # responses gathered while a data_received call runs

    # ------------------------------------------------------------------------------------------- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
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
        logger.debug("connection from %s", self.endpoint.remote)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self._pending = pending = []
        try:
            messages = self.reader.feed(data)
            engine, member, endpoint = self.server.engine, self.server.member, self.endpoint
            for message in messages:
                registry.dispatch(engine, member, endpoint, message)
                if self.closed:
                    break
        except ProtocolError as exc:
            self.close(f"protocol error: {exc}")
        except Exception:  # a bug must cost one connection, never the member
            logger.exception("unexpected error serving %s; closing that connection", self.endpoint.remote)
            self.close("internal error")
        finally:
            self._pending = None
            if pending and self.transport is not None and not self.closed:
                self.transport.writelines(pending)

    def connection_lost(self, exc: Exception | None) -> None:
        self._shutdown()
        logger.debug("connection from %s closed (%s)", self.endpoint.remote, exc or "EOF")

    # ------------------------------------------------------------------------------------------- registry.Connection

    def send(self, chunks: Chunks) -> None:
        if self.closed:
            return
        if self._pending is not None:
            self._pending.extend(chunks)
        elif self.transport is not None:
            self.transport.writelines(chunks)

    def close(self, reason: str) -> None:
        if self.closed:
            return
        if reason.startswith("protocol error") or reason == "internal error":
            logger.warning("closing connection from %s: %s", self.endpoint.remote, reason)
        if self.transport is not None:
            self.transport.abort() if reason.startswith("protocol error") else self.transport.close()
        self._shutdown()

    def track(self, task: asyncio.Task[Any]) -> None:
        if self.closed:
            task.cancel()
            return
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------------------------------- internals

    def _shutdown(self) -> None:
        if self.closed and self not in self.server.connections:
            return
        self.closed = True
        self.server.connections.discard(self)
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


class MemberServer:
    """The listening socket and its connections, on the running event loop."""

    def __init__(self, engine: Engine, member: MemberSettings) -> None:
        self.engine = engine
        self.member = member
        self.connections: set[ClientConnection] = set()
        self._server: asyncio.base_events.Server | None = None

    async def start(self, host: str, port: int) -> tuple[str, int]:
        """Bind and listen; the (host, port) actually bound (port 0 picks a free one)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: ClientConnection(self), host, port, reuse_address=True)
        bound = self._server.sockets[0].getsockname()
        # Clients learn the member's address from the member list: advertise the port actually bound.
        self.member = dataclasses.replace(self.member, host=advertised_host(host), port=bound[1])
        return bound[0], bound[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.close("member shutting down")
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None


def advertised_host(bind_host: str) -> str:
    """The address clients should use to reach a member bound to ``bind_host``.

    A wildcard bind (0.0.0.0, ::) is advertised as this machine's primary address, found by asking the kernel which
    source address it would use for an outside destination (no packet is sent).
    """
    if bind_host not in ("", "0.0.0.0", "::"):
        return bind_host
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("10.255.255.255", 1))
        return str(probe.getsockname()[0])
    except OSError:
        return "127.0.0.1"
    finally:
        probe.close()
