"""A minimal synchronous protocol client over a plain socket, for tests and scenarios the official client cannot play:
a client that stops reading, reads slowly, or goes silent without closing its connection.

It speaks through our own codecs (``encode_request`` / ``decode_response``); the official client is what the
integration tests use for everything else.
"""

from __future__ import annotations

import socket
import time
import uuid
from typing import Any

from meteor_spark.server.protocol import message_codec
from meteor_spark.server.protocol import messages as m
from meteor_spark.server.protocol.frames import PREAMBLE, RESPONSE_FIXED_OFFSET, FrameReader, Message

ERROR_RESPONSE_TYPE = 0


class RawClient:
    """One connection; requests are numbered from 1; ``receive`` hands out whole messages in arrival order."""

    def __init__(self, address: str, *, receive_buffer: int | None = None, timeout_s: float = 10.0) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if receive_buffer is not None:
            # Before connect(): the window the kernel advertises is fixed at the handshake.
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        self.sock.settimeout(timeout_s)
        self.sock.connect((host, int(port)))
        self.sock.sendall(PREAMBLE)
        self.reader = FrameReader(expect_preamble=False)
        self.received: list[Message] = []
        self.received_bytes = 0
        self._next_id = 1

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, spec: message_codec.MessageSpec, **values: Any) -> int:
        """Send one request; its correlation id."""
        correlation_id = self._next_id
        self._next_id += 1
        self.sock.sendall(
            b"".join(bytes(chunk) for chunk in message_codec.encode_request(spec, correlation_id, values))
        )
        return correlation_id

    def send_all(self, requests: list[tuple[message_codec.MessageSpec, dict[str, Any]]]) -> list[int]:
        """Send several requests in one write (so the member receives them together); their correlation ids."""
        ids, data = self.encode_all(requests)
        self.sock.sendall(data)
        return ids

    def encode_all(self, requests: list[tuple[message_codec.MessageSpec, dict[str, Any]]]) -> tuple[list[int], bytes]:
        """The correlation ids and the bytes of several requests, to be sent as the caller chooses."""
        first = self._next_id
        self._next_id += len(requests)
        data = b"".join(
            bytes(chunk)
            for offset, (spec, values) in enumerate(requests)
            for chunk in message_codec.encode_request(spec, first + offset, values)
        )
        return list(range(first, first + len(requests))), data

    def read_some(self, max_bytes: int = 65536) -> list[Message]:
        """One ``recv`` of at most ``max_bytes``: the messages it completed (raises on timeout / EOF)."""
        data = self.sock.recv(max_bytes)
        if not data:
            raise ConnectionError("the member closed the connection")
        self.received_bytes += len(data)
        return self.reader.feed(data)

    def receive(self, deadline_s: float = 10.0) -> Message:
        """The next whole message (response or event)."""
        deadline = time.monotonic() + deadline_s
        while not self.received:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no message within {deadline_s:g} s")
            self.received.extend(self.read_some())
        return self.received.pop(0)

    def call(self, spec: message_codec.MessageSpec, **values: Any) -> dict[str, Any]:
        """Send a request and wait for its response (events in between are dropped).

        Raises:
            RuntimeError: the member answered with an error response.
        """
        correlation_id = self.send(spec, **values)
        while True:
            message = self.receive()
            if correlation_id_of(message) != correlation_id:
                continue
            if message_type_of(message) == ERROR_RESPONSE_TYPE:
                raise RuntimeError(f"{spec.name} failed in the member (error response)")
            return message_codec.decode_response(spec, message)

    def authenticate(self, cluster_name: str = "dev", client_name: str = "raw-client") -> uuid.UUID:
        client_uuid = uuid.uuid4()
        response = self.call(
            m.CLIENT_AUTHENTICATION,
            cluster_name=cluster_name,
            username=None,
            password=None,
            uuid=client_uuid,
            client_type="PYH",
            serialization_version=1,
            client_hazelcast_version="5.7.0",
            client_name=client_name,
            labels=[],
        )
        if response["status"] != 0:
            raise RuntimeError(f"authentication refused with status {response['status']}")
        return client_uuid


def correlation_id_of(message: Message) -> int:
    return int.from_bytes(message.frames[0].content[4:12], "little", signed=True)


def message_type_of(message: Message) -> int:
    return int.from_bytes(message.frames[0].content[0:4], "little", signed=True)


def payload_bytes(message: Message) -> int:
    """Bytes of the frames of ``message`` after its initial frame's header (a response's size, roughly)."""
    return sum(len(frame.content) for frame in message.frames) - RESPONSE_FIXED_OFFSET
