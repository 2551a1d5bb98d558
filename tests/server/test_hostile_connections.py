"""Hostile connections (fault tier): a member process keeps serving a good client while peers announce huge frames
before authenticating, send garbage, oversized or truncated frames and unknown messages, before and after
authentication. The member must stay up, keep its memory, and refuse what no client sends.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from raw_client import ERROR_RESPONSE_TYPE, RawClient, correlation_id_of, message_type_of

from meteor_spark.grid.client import Grid
from meteor_spark.server.member import EmbeddedGrid
from meteor_spark.server.protocol import messages as m
from meteor_spark.server.protocol import messages_data as md
from meteor_spark.server.protocol.frames import IS_FINAL, PREAMBLE, UNFRAGMENTED
from meteor_spark.testing import wait_until

pytestmark = [pytest.mark.fault, pytest.mark.embedded_only]

MIB = 1024 * 1024


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS in /proc/{pid}/status")


class GoodClient:
    """A real client doing map and ring operations in a thread; counts what succeeded and what failed."""

    def __init__(self, member: EmbeddedGrid) -> None:
        self.grid = Grid.connect(member.address, cluster_name=member.cluster_name, connect_timeout_s=10)
        self.ok = 0
        self.failed: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        entries = self.grid.map("good-client")
        ring = self.grid.ring("good-client-ring")
        i = 0
        while not self._stop.is_set():
            try:
                entries.set(f"k{i % 100}", str(i))
                assert entries.get(f"k{i % 100}") == str(i)
                ring.add(b"x" * 100)
                self.ok += 1
            except BaseException as exc:
                self.failed.append(exc)
            i += 1

    def __enter__(self) -> GoodClient:
        self._thread.start()
        wait_until(lambda: self.ok > 0, timeout_s=30, message="the good client's first operations")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        self.grid.close()

    def progress(self, since: int) -> bool:
        return self.ok > since


@pytest.fixture
def member() -> Iterator[EmbeddedGrid]:
    grid = EmbeddedGrid(process=True, auth_timeout_s=2)
    grid.start()
    yield grid
    grid.stop()


def _closed_by_member(sock: socket.socket, timeout_s: float = 10.0) -> bool:
    """True once the member closed the connection (EOF or reset) within ``timeout_s``."""
    sock.settimeout(timeout_s)
    try:
        while sock.recv(65536):
            pass
        return True
    except ConnectionError:
        return True
    except TimeoutError:
        return False


def _frame_header(length: int, flags: int = UNFRAGMENTED | IS_FINAL) -> bytes:
    return struct.pack("<iH", length, flags)


def _announce_and_send(address: str, announced: int) -> int:
    """Connect, announce one frame of ``announced`` bytes before authenticating and try to send all of it; the bytes
    the member took before it closed the connection."""
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    sent = 0
    try:
        sock.sendall(PREAMBLE + _frame_header(announced))
        chunk = b"\0" * MIB
        while sent < announced:
            sent += sock.send(chunk[: announced - sent])
    except OSError:
        pass
    finally:
        sock.close()
    return sent


def test_unauthenticated_connections_cannot_pin_memory(member: EmbeddedGrid) -> None:
    assert member.pid is not None
    with GoodClient(member) as good:
        baseline = _rss_mb(member.pid)
        sent_total = 0
        for _ in range(3):
            threads: list[threading.Thread] = []
            sent: list[int] = []
            for _ in range(4):
                thread = threading.Thread(target=lambda: sent.append(_announce_and_send(member.address, 64 * MIB)))
                thread.start()
                threads.append(thread)
            for thread in threads:
                thread.join(60)
            sent_total += sum(sent)
            ok = good.ok
            wait_until(lambda: good.progress(ok), timeout_s=10, message="the good client to keep working")
        after = _rss_mb(member.pid)
    print(
        f"unauthenticated 3 x 4 x 64 MiB announced: member RSS {baseline:.1f} MB before, {after:.1f} MB after "
        f"(+{after - baseline:.1f} MB); {sent_total / MIB:.1f} MiB accepted by the socket before the member closed; "
        f"good client ops ok {good.ok}, failed {len(good.failed)}"
    )
    assert not good.failed
    assert member.running
    assert after - baseline < 50


def test_a_connection_that_never_authenticates_is_closed(member: EmbeddedGrid) -> None:
    host, port = member.address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(PREAMBLE)
        started = time.monotonic()
        assert _closed_by_member(sock, timeout_s=30)
        waited = time.monotonic() - started
    print(f"silent unauthenticated connection closed after {waited:.1f} s (auth timeout 2 s)")


def _error_then_close(raw: RawClient, correlation_id: int) -> bool:
    message = raw.receive()
    assert message_type_of(message) == ERROR_RESPONSE_TYPE and correlation_id_of(message) == correlation_id
    return _closed_by_member(raw.sock)


def test_garbage_and_oversized_frames_before_and_after_authentication(member: EmbeddedGrid) -> None:
    host, port = member.address.rsplit(":", 1)
    refused = 0
    with GoodClient(member) as good:
        # Before authentication.
        with socket.create_connection((host, int(port)), timeout=10) as sock:  # not even the preamble
            sock.sendall(b"GET / HTTP/1.1\r\n\r\n")
            refused += _closed_by_member(sock)
        with socket.create_connection((host, int(port)), timeout=10) as sock:  # a frame above the 64 KiB limit
            sock.sendall(PREAMBLE + _frame_header(1 * MIB))
            refused += _closed_by_member(sock)
        with socket.create_connection((host, int(port)), timeout=10) as sock:  # a length no frame has
            sock.sendall(PREAMBLE + _frame_header(3))
            refused += _closed_by_member(sock)
        with socket.create_connection((host, int(port)), timeout=10) as sock:  # a truncated frame, then silence
            sock.sendall(PREAMBLE + _frame_header(100) + b"\1" * 50)
            refused += _closed_by_member(sock)  # the authentication deadline
        with RawClient(member.address) as raw:  # a real request before authenticating
            refused += _error_then_close(raw, raw.send(md.MAP_GET, name="m", key=b"\0" * 8, thread_id=1))
        with RawClient(member.address) as raw:  # an unknown message type before authenticating
            frame = struct.pack("<iqi", 0x7F0F01, 1, -1)
            raw.sock.sendall(_frame_header(6 + len(frame)) + frame)
            refused += _error_then_close(raw, 1)

        # After authentication.
        with RawClient(member.address) as raw:  # an unknown message type: an error, and the connection stays
            raw.authenticate()
            frame = struct.pack("<iqi", 0x7F0F01, 99, -1)
            raw.sock.sendall(_frame_header(6 + len(frame)) + frame)
            message = raw.receive()
            assert message_type_of(message) == ERROR_RESPONSE_TYPE and correlation_id_of(message) == 99
            raw.call(m.CLIENT_PING)
        with RawClient(member.address) as raw:  # an announced length above 256 MiB
            raw.authenticate()
            raw.sock.sendall(_frame_header(512 * MIB))
            refused += _closed_by_member(raw.sock)
        with RawClient(member.address) as raw:  # garbage
            raw.authenticate()
            raw.sock.sendall(b"\xff" * 64)
            refused += _closed_by_member(raw.sock)
        with RawClient(member.address) as raw:  # a truncated frame, then the client goes away
            raw.authenticate()
            raw.sock.sendall(_frame_header(1000) + b"\1" * 10)
        ok = good.ok
        wait_until(lambda: good.progress(ok), timeout_s=10, message="the good client to keep working")
    print(
        f"hostile frames: {refused} of 8 connections refused by the member; good client ops ok {good.ok}, "
        f"failed {len(good.failed)}"
    )
    assert refused == 8
    assert not good.failed
    assert member.running
