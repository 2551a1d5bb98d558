"""Helpers for tests (ours and users'): wait with a deadline instead of sleeping; a TCP proxy that cuts connections."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from meteor_spark.grid.aio_client import AsyncGrid
    from meteor_spark.grid.client import Grid, GridSettings
T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout_s: float = 10.0, interval_s: float = 0.01, message: str = "") -> T:
    """Poll ``predicate`` until it returns a truthy value or the deadline passes; return that value.

    Raises:
        AssertionError: the deadline passed; the message names what was awaited and the last value seen.
    """
    deadline = time.monotonic() + timeout_s
    last: T = predicate()
    while not last:
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout_s:g} s waiting for {message or predicate}; last value {last!r}"
            )
        time.sleep(interval_s)
        last = predicate()
    return last


class TcpProxy:
    """A TCP forwarder on 127.0.0.1 in front of one ``host:port`` whose connections can be cut on command.

    Point a client at ``address`` instead of the member's and call ``drop()`` to cut every connection open through
    the proxy at once (reset, both ways), as a network failure or a member restart would: a request in flight then
    gets no answer. The proxy keeps listening, so the client can connect again.

    Examples:
        >>> with TcpProxy("127.0.0.1:5701") as proxy:           # doctest: +SKIP
        ...     grid = Grid.connect(proxy.address)
        ...     proxy.drop()
    """

    def __init__(self, target: str, host: str = "127.0.0.1") -> None:
        target_host, _, target_port = target.rpartition(":")
        self.target = (target_host, int(target_port))
        self._listener = socket.create_server((host, 0))
        self.address = f"{host}:{self._listener.getsockname()[1]}"
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._closed = False
        self.accepted = 0
        self.dropped = 0
        self._acceptor = threading.Thread(target=self._accept_loop, name=f"tcp-proxy-{self.address}", daemon=True)
        self._acceptor.start()

    def connect(self, settings: GridSettings, *, retry_pause_s: float = 0.05) -> Grid:
        """A grid client whose every connection to the proxied member goes through this proxy, reconnections
        included (``compat.route_member_through``), retrying an invocation that found no connection after
        ``retry_pause_s`` (the client's 1 s default makes a test slow)."""
        from meteor_spark.compat import route_member_through
        from meteor_spark.grid.client import Grid

        grid = Grid(replace(settings, members=(self.address,)))
        route_member_through(grid.client, self.target[1], self.address, retry_pause_s=retry_pause_s)
        return grid

    async def connect_async(self, settings: GridSettings, *, retry_pause_s: float = 0.05) -> AsyncGrid:
        """``connect`` for the asyncio client: an ``AsyncGrid`` whose every connection to the proxied member goes
        through this proxy, reconnections included."""
        from meteor_spark.compat_asyncio import route_member_through_async
        from meteor_spark.grid.aio_client import AsyncGrid

        grid = await AsyncGrid.start(replace(settings, members=(self.address,)))
        await route_member_through_async(grid.client, self.target[1], self.address, retry_pause_s=retry_pause_s)
        return grid

    def drop(self) -> int:
        """Reset every connection open through the proxy now; returns how many were cut."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            for sock in pair:
                _reset(sock)
        self.dropped += len(pairs)
        return len(pairs)

    def close(self) -> None:
        """Stop listening and cut every connection."""
        self._closed = True
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept()
        except OSError:
            pass
        self._listener.close()
        self.drop()
        self._acceptor.join(5)

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=10)
                upstream.settimeout(None)
            except OSError:
                _reset(client)
                continue
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._pairs.append((client, upstream))
                self.accepted += 1
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(source, sink), name="tcp-proxy-pump", daemon=True).start()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy bytes one way until either side closes; then close both."""
    try:
        while True:
            data = source.recv(1 << 16)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    _reset(source)
    _reset(sink)


def _reset(sock: socket.socket) -> None:
    """Close with a reset (no lingering FIN handshake), waking a thread blocked in ``recv`` on it."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


def committed_values(grid: Grid, stream: str, timeout_s: float = 120.0) -> list[bytes]:
    """Every record value a ``read_committed`` reader delivers from ``stream`` (all lanes, from the oldest record)
    up to the lanes' ends as they are now, waiting for transactions still open there to be decided.

    Raises:
        AssertionError: the reader did not reach the ends within ``timeout_s``.
    """
    from meteor_spark.consumer.subscriber import Subscriber
    from meteor_spark.format.offsets import first_offset_of
    from meteor_spark.grid.streams import lane_bounds, open_stream

    info = open_stream(grid, stream)
    ends = {lane: first_offset_of(end) for lane, (_, end) in lane_bounds(grid, info).items()}
    values: list[bytes] = []
    with Subscriber(grid, stream, initial_offset_scheme="earliest", isolation="read_committed") as sub:

        def caught_up() -> bool:
            values.extend(r.value for r in sub.poll(100))
            return all(sub.position(lane) >= end for lane, end in ends.items())

        wait_until(caught_up, timeout_s=timeout_s, message=f"a read_committed reader to reach the end of {stream!r}")
    return values
