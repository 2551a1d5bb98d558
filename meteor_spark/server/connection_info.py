"""What the member tells about one client connection (``EmbeddedGrid.connections``): a plain snapshot, kept apart
from the TCP shell that fills it so that inspecting connections needs nothing of the shell's machinery."""

from __future__ import annotations

import dataclasses
import uuid


@dataclasses.dataclass(frozen=True)
class ConnectionInfo:
    """A snapshot of one client connection, for inspection and tests.

    Attributes:
        remote: the client's ``host:port``.
        client_name, client_uuid: who authenticated on it (``""`` / None before authentication).
        queued_bytes: response bytes waiting in the member for the client to read (beyond the kernel's buffer).
        transport_bytes: bytes in the asyncio transport's own buffer (at most one hand-off piece).
        congested: the member stopped serving this client until it reads (back-pressure).
        backlog: received requests waiting to be served because of the back-pressure.
        idle_s: seconds since the member last received from, or could write to, the client.
    """

    remote: str
    client_name: str
    client_uuid: uuid.UUID | None
    queued_bytes: int
    transport_bytes: int
    congested: bool
    backlog: int
    idle_s: float
