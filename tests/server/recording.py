"""Driving the member's dispatcher without sockets: a connection that records what the member sends, an
authenticated endpoint on it, and a request decoded as the TCP shell would hand it over."""

from __future__ import annotations

import asyncio
from typing import Any

from meteor_spark.server.handlers.registry import Endpoint
from meteor_spark.server.protocol import message_codec
from meteor_spark.server.protocol.frames import FrameReader


class RecordingConnection:
    """What the TCP shell's connection offers the dispatcher; responses are decoded and kept in order, and the
    tasks a congested connection is handed are kept (``writable`` ends the congestion)."""

    def __init__(self, congested: bool = False) -> None:
        self.closed = False
        self.congested = congested
        self.responses: list[Any] = []
        self.tasks: list[asyncio.Task[Any]] = []

    def send(self, chunks: list[Any]) -> None:
        self.responses.extend(FrameReader(expect_preamble=False).feed(b"".join(bytes(x) for x in chunks)))

    def close(self, reason: str) -> None:
        self.closed = True

    def track(self, task: asyncio.Task[Any]) -> None:
        self.tasks.append(task)

    async def writable(self) -> None:
        self.congested = False


def endpoint(connection: RecordingConnection) -> Endpoint:
    made = Endpoint(connection, "test")
    made.authenticated = True
    return made


def request(spec: Any, correlation_id: int, **values: Any) -> Any:
    data = b"".join(bytes(x) for x in message_codec.encode_request(spec, correlation_id, values, partition_id=0))
    return FrameReader(expect_preamble=False).feed(data)[0]
