"""The private couplings to hazelcast-python-client and pyspark (``meteor_spark.compat``) still hold.

These fail loudly when a dependency is upgraded past the versions a coupling was written for, or changes the private
detail it relies on; the message names the coupling and what changed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from meteor_spark import compat


def test_every_coupling_holds_for_the_installed_dependencies() -> None:
    assert compat.problems() == []


def test_every_private_use_is_declared() -> None:
    names = " ".join(coupling.name for coupling in compat.COUPLINGS)
    assert (
        "reactor waker" in names and "_invocation_service" in names and "SIGTERM" in names and "proxy routing" in names
    )
    assert "partial-send" in names
    for coupling in compat.COUPLINGS:
        assert compat.installed_version(coupling.distribution) is not None, coupling.distribution


def test_a_version_outside_the_range_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compat, "installed_version", lambda distribution: (9, 0))
    found = compat.problems()
    assert len(found) == len(compat.COUPLINGS)
    assert all("installed 9.0" in problem and "widen written_for" in problem for problem in found)


def test_a_changed_private_detail_is_reported() -> None:
    def gone() -> None:
        raise AssertionError("hazelcast.reactor._PipedWaker is gone")

    coupling = compat.Coupling("reactor waker patch", "hazelcast-python-client", ((5, 7), (5, 8)), gone)
    installed = compat.installed_version(coupling.distribution)
    assert installed is not None
    assert coupling.problems() == [
        f"reactor waker patch: hazelcast-python-client {installed[0]}.{installed[1]} changed: "
        "hazelcast.reactor._PipedWaker is gone"
    ]


def test_the_reactor_patch_is_applied_and_drains_before_clearing_the_flag() -> None:
    from hazelcast import reactor

    import meteor_spark.grid.client  # noqa: F401  (applies the patch at import)

    waker = reactor._PipedWaker.__new__(reactor._PipedWaker)
    waker._read_fd, write_fd = os.pipe()
    try:
        os.set_blocking(waker._read_fd, False)
        os.write(write_fd, b"x" * 5000)  # more than one 4096-byte read
        waker.awake = True
        waker.handle_read()
        assert waker.awake is False
        with pytest.raises(BlockingIOError):
            os.read(waker._read_fd, 1)  # drained completely
    finally:
        os.close(waker._read_fd)
        os.close(write_fd)
    assert getattr(reactor._PipedWaker, "_meteor_fixed", None) is True  # a marker compat sets on the class


def test_the_send_patch_requeues_the_unsent_rest_without_copying_it() -> None:
    import collections
    import io
    import types

    from hazelcast import reactor

    import meteor_spark.grid.client  # noqa: F401  (applies the patch at import)

    assert getattr(reactor.AsyncoreConnection, "_meteor_send_fixed", None) is True  # compat's marker
    message = bytearray(os.urandom(1_000_000))
    sent: list[int] = []
    # a bare connection whose members the test replaces (send, socket): not the typed AsyncoreConnection any more
    connection: Any = reactor.AsyncoreConnection.__new__(reactor.AsyncoreConnection)
    connection._write_queue = collections.deque([message])
    connection._write_buf = io.BytesIO()
    connection._reactor = types.SimpleNamespace(bytes_sent=0)
    connection.send_buffer_size = 128_000

    def send(data: bytes | bytearray | memoryview) -> int:  # the kernel takes 100 kB at a time
        sent.append(len(data))
        return min(100_000, len(data))

    connection.send = send
    received = 0
    while connection._write_queue:
        rest = connection._write_queue[0]
        connection.handle_write()
        received += 100_000 if len(rest) > 100_000 else len(rest)
        if connection._write_queue:
            assert isinstance(connection._write_queue[0], memoryview)
            assert connection._write_queue[0].obj is message  # a view of the message: nothing copied
    assert received == len(message) and len(sent) == 10
    assert connection._reactor.bytes_sent == len(message)


def test_the_sigterm_hook_exits_once_and_not_once_stopping() -> None:
    """The first SIGTERM raises SystemExit (the runner's ``finally`` then stops the reader); later ones, and any
    once ``stopping`` is set (a reader's stop is under way), are ignored so they cannot abort the release."""
    script = textwrap.dedent(
        """
        import signal, threading
        from meteor_spark import compat
        stopping = threading.Event()
        assert compat.stop_source_runner_on_sigterm(stopping)
        try:
            signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
        except SystemExit as exc:
            print(exc.code, stopping.is_set())
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
        print("ignored")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.split() == [str(128 + signal.SIGTERM), "True", "ignored"]


def test_importing_compat_loads_neither_dependency() -> None:
    probe = "import sys, meteor_spark.compat\nprint(sorted(m for m in ('pyspark', 'hazelcast') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"


def test_a_request_is_sent_from_the_calling_thread_when_nothing_is_queued() -> None:
    """The calling thread hands a request to the kernel itself (no reactor wake-up); the part the kernel does not
    take is queued for the reactor, which is then woken, and a request behind queued bytes waits its turn."""
    import collections
    import socket
    import types

    from hazelcast import reactor

    import meteor_spark.grid.client  # noqa: F401  (applies the patch at import)

    wakes: list[int] = []
    taken: list[bytes] = []
    # a bare connection whose members the test replaces (send, socket): not the typed AsyncoreConnection any more
    connection: Any = reactor.AsyncoreConnection.__new__(reactor.AsyncoreConnection)
    connection._write_queue = collections.deque()
    connection._reactor = types.SimpleNamespace(bytes_sent=0, wake_loop=lambda: wakes.append(1))
    connection.sent_protocol_bytes = True
    connection.live = True
    kernel_room = [1000]

    def send(data: bytes | memoryview) -> int:
        n = min(kernel_room[0], len(data))
        taken.append(bytes(data[:n]))
        return n

    connection.socket = types.SimpleNamespace(send=send)
    connection._write(b"a" * 100)
    assert taken == [b"a" * 100] and not connection._write_queue and wakes == []
    kernel_room[0] = 30
    connection._write(b"b" * 100)  # the kernel takes 30 bytes: the rest waits for the reactor
    assert taken[-1] == b"b" * 30 and bytes(connection._write_queue[0]) == b"b" * 70 and wakes == [1]
    connection._write(b"c" * 10)  # behind queued bytes: queued too, never sent ahead of them
    assert [bytes(part) for part in connection._write_queue] == [b"b" * 70, b"c" * 10] and len(taken) == 2
    assert connection._reactor.bytes_sent == 130
    connection._write_queue.clear()
    connection.socket = socket.socket()  # a socket that is not connected: the reactor deals with the error
    try:
        connection._write(b"d" * 10)
    finally:
        connection.socket.close()
    assert [bytes(part) for part in connection._write_queue] == [b"d" * 10]
