"""Every place meteor-spark leans on a private detail of hazelcast-python-client or pyspark, in one module.

Each coupling is declared in ``COUPLINGS`` with the versions it was written for and a check that the private
detail still looks as it did; ``tests/test_compat.py`` runs every check and fails loudly (naming the coupling and
what changed) when a dependency moves outside the range or changes the detail. Upgrading a dependency therefore
means: read the failing coupling, re-verify it against the new version, widen its range.

Importing this module imports neither ``hazelcast`` nor ``pyspark``: each function imports what it touches.
"""

from __future__ import annotations

import inspect
import logging
import os
import signal
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

from meteor_spark.compat_frames import CLIENT, installed_version, written_for
from meteor_spark.compat_reactor import TIMERS_WRITTEN_FOR, WAKER_WRITTEN_FOR, check_timer_wait, check_waker
from meteor_spark.compat_ring import EVENT_WRITTEN_FOR, READ_WRITTEN_FOR, check_future_event, check_read_path

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Coupling:
    """One private detail of a dependency that meteor-spark relies on.

    Attributes:
        name: what meteor-spark does with it.
        distribution: the pip distribution it belongs to.
        written_for: ``(lowest, first_untested)`` ``(major, minor)`` versions: checked for ``lowest <= v <
            first_untested``.
        check: raises ``AssertionError`` saying what changed when the detail no longer looks as expected (the
            dependency is imported by the check, never by this module).
    """

    name: str
    distribution: str
    written_for: tuple[tuple[int, int], tuple[int, int]]
    check: Callable[[], None]

    def problems(self) -> list[str]:
        """What no longer holds (empty when the coupling is safe); a missing distribution is no problem."""
        found = installed_version(self.distribution)
        if found is None:
            return []
        low, high = self.written_for
        out = []
        if not low <= found < high:
            out.append(
                f"{self.name}: written for {self.distribution} {_dotted(low)} up to (not including) {_dotted(high)}, "
                f"installed {_dotted(found)}; re-verify it against the new version, then widen written_for"
            )
        try:
            self.check()
        except AssertionError as exc:
            out.append(f"{self.name}: {self.distribution} {_dotted(found)} changed: {exc}")
        return out


def _dotted(pair: tuple[int, int]) -> str:
    return f"{pair[0]}.{pair[1]}"


# ------------------------------------------------------- hazelcast-python-client: partial sends of big messages

_SEND_WRITTEN_FOR = ((5, 7), (5, 8))
_UPSTREAM_REQUEUE = "write_queue.appendleft(bytes_[bytes_sent:])"


# long: on purpose (about 80 lines): _handle_write below is hazelcast-python-client's AsyncoreConnection.handle_write
# copied whole, with one line changed, so it can be read side by side with the version it replaces (and
# check_partial_send_fix compares that version's source); its closures bind the client's private names once.
# Cutting the copy into helpers would make that comparison, and the next upgrade's, harder.
def fix_partial_send_copies() -> bool:
    """Stop hazelcast-python-client 5.7 from copying the unsent rest of a message after every partial send;
    returns whether the fix is applied.

    ``AsyncoreConnection.handle_write`` puts ``bytes_[bytes_sent:]`` back at the head of the write queue when the
    kernel takes only part of a message: a slice of a ``bytearray``/``bytes`` is a copy. The kernel takes a few
    hundred KiB per send (the client sets 128 kB socket buffers), so a message of N bytes is copied about
    N / 256 KiB times: quadratic. A 64 MiB ``add_all`` was sent at ~20 MiB/s, with 70 % of the client's time in
    that line. The replacement re-queues a ``memoryview`` of the rest (no copy); everything else is the client's
    own code, unchanged.

    It also sends a request from the calling thread when nothing is queued (``_write``): upstream always queues
    it and wakes the reactor thread through a pipe, a hand-off that was a large part of a small request's latency.
    A per-connection lock orders these sends with the reactor's; what the kernel does not take, and any socket
    error, go to the reactor as before. Never on TLS (an ``SSLSocket`` must not be used by two threads at once).
    Applied only to the versions it was written for.
    """
    from hazelcast import reactor

    connection_class = getattr(reactor, "AsyncoreConnection", None)
    if connection_class is None or getattr(connection_class, "_meteor_send_fixed", False):
        return connection_class is not None
    if not written_for(_SEND_WRITTEN_FOR):
        logger.warning(
            "hazelcast-python-client %s is outside the versions meteor-spark's partial-send work-around was written "
            "for; running the client unpatched",
            version(CLIENT),
        )
        return False
    socket_error = reactor.socket.error
    retryable = reactor._RETRYABLE_ERROR_CODES

    def handle_write(self: Any) -> None:
        with _write_lock(self):
            _handle_write(self)

    def _handle_write(self: Any) -> None:
        write_queue = self._write_queue
        send_buffer_size = self.send_buffer_size
        write_batch = []
        total_length = 0
        while write_queue:
            message_bytes = write_queue.popleft()
            write_batch.append(message_bytes)
            total_length += len(message_bytes)
            if total_length >= send_buffer_size:
                break
        if len(write_batch) == 1:
            bytes_ = write_batch[0]
        else:
            buf = self._write_buf
            buf.seek(0)
            for message_bytes in write_batch:
                buf.write(message_bytes)
            bytes_ = buf.getvalue()
            buf.truncate(0)
        try:
            bytes_sent = self.send(bytes_)
        except socket_error as err:
            if err.args[0] in retryable:
                self._write_queue.appendleft(bytes_)
            else:
                self.close_connection(None, err)
        else:
            self.last_write_time = time.time()
            self.sent_protocol_bytes = True
            self._reactor.bytes_sent += bytes_sent
            if bytes_sent < len(bytes_):
                write_queue.appendleft(memoryview(bytes_)[bytes_sent:])  # the only change: a view, not a copy

    def write(self: Any, buf: Any) -> None:
        # Sending from the calling thread when nothing is queued saves the hand-off to the reactor thread (a pipe
        # write, a wake-up and a GIL switch: most of a small request's latency). Whatever the kernel does not take
        # at once, or a socket error, is queued for the reactor as before (it handles errors and closes).
        with _write_lock(self):
            if not self._write_queue and self._meteor_direct:
                try:
                    sent = self.socket.send(buf)
                except (OSError, ValueError):
                    sent = 0
                if sent:
                    self.last_write_time = time.time()
                    self._reactor.bytes_sent += sent
                    if sent == len(buf):
                        return
                    buf = memoryview(buf)[sent:]
            self._write_queue.append(buf)
        self._reactor.wake_loop()

    connection_class._meteor_original_handle_write = connection_class.handle_write
    connection_class._meteor_original_write = connection_class._write
    connection_class.handle_write = handle_write
    connection_class._write = write
    connection_class._meteor_direct = property(_may_send_directly)
    connection_class._meteor_send_fixed = True
    return True


def _write_lock(connection: Any) -> Any:
    """The lock that orders one connection's writes between the reactor thread and the calling threads (made on
    first use: the client creates connections itself)."""
    lock = connection.__dict__.get("_meteor_write_lock")
    if lock is None:
        lock = connection.__dict__.setdefault("_meteor_write_lock", threading.RLock())
    return lock


def _may_send_directly(connection: Any) -> bool:
    """A calling thread may send on a plain socket that sent its protocol bytes (so is connected); never on TLS,
    whose socket object must not be used by two threads at once."""
    return bool(connection.sent_protocol_bytes) and connection.live and not isinstance(connection.socket, ssl.SSLSocket)


def _check_send() -> None:
    from hazelcast import reactor

    connection_class = getattr(reactor, "AsyncoreConnection", None)
    assert connection_class is not None, "hazelcast.reactor.AsyncoreConnection is gone"
    original = getattr(connection_class, "_meteor_original_handle_write", connection_class.handle_write)
    source = inspect.getsource(original)
    assert _UPSTREAM_REQUEUE in source, (
        f"AsyncoreConnection.handle_write no longer does `{_UPSTREAM_REQUEUE}`: the copy may be fixed upstream, or "
        f"the method reshaped (the replacement would then drop upstream changes)"
    )
    expected = (
        "self._write_queue",
        "self.send_buffer_size",
        "self._write_buf",
        "self.send(bytes_)",
        "self.close_connection(None, err)",
        "self.last_write_time = time.time()",
        "self.sent_protocol_bytes = True",
        "self._reactor.bytes_sent += bytes_sent",
    )
    missing = [piece for piece in expected if piece not in source]
    assert not missing, f"AsyncoreConnection.handle_write changed: {missing} no longer in it"
    assert hasattr(reactor, "_RETRYABLE_ERROR_CODES"), "hazelcast.reactor._RETRYABLE_ERROR_CODES is gone"
    write = inspect.getsource(getattr(connection_class, "_meteor_original_write", connection_class._write))
    assert "self._write_queue.append(buf)" in write and "self._reactor.wake_loop()" in write, (
        "AsyncoreConnection._write no longer queues the message and wakes the reactor: the direct send replaces it"
    )
    assert "def readable" in inspect.getsource(connection_class) and "sent_protocol_bytes" in source, (
        "AsyncoreConnection no longer marks `sent_protocol_bytes`: the direct send cannot tell a connected socket"
    )


# ------------------------------------------------- hazelcast-python-client: a request the client has no codec for

_INVOKE_WRITTEN_FOR = ((5, 7), (5, 8))


def add_ringbuffer_config_request(pattern: str, capacity: int, backups: int, async_backups: int, ttl_s: int) -> Any:
    """The DynamicConfig.addRingbufferConfig request (0x1B0200), built with the client's own protocol helpers.

    Fixed params first: capacity, backupCount, asyncBackupCount, timeToLiveSeconds, mergeBatchSize; then name,
    inMemoryFormat, ringbufferStoreConfig (null), splitBrainProtectionName (null), mergePolicy. Members older than
    protocol 2.7 ignore the trailing userCodeNamespace (null).
    """
    from hazelcast.protocol.builtin import CodecUtil, FixSizedTypesCodec, StringCodec
    from hazelcast.protocol.client_message import REQUEST_HEADER_SIZE, OutboundMessage, create_initial_buffer

    offset = REQUEST_HEADER_SIZE
    buf = create_initial_buffer(offset + 5 * 4, 0x1B0200)
    for value in (capacity, backups, async_backups, ttl_s, 100):
        FixSizedTypesCodec.encode_int(buf, offset, value)
        offset += 4
    StringCodec.encode(buf, pattern)
    StringCodec.encode(buf, "BINARY")
    CodecUtil.encode_nullable(buf, None, StringCodec.encode)
    CodecUtil.encode_nullable(buf, None, StringCodec.encode)
    StringCodec.encode(buf, "com.hazelcast.spi.merge.PutIfAbsentMergePolicy")
    CodecUtil.encode_nullable(buf, None, StringCodec.encode, True)
    return OutboundMessage(buf, False)


def invoke(client: Any, request: Any) -> None:
    """Send ``request`` through the client's invocation service (retries, routing) and wait for its empty answer.

    The public client API has no way to send a message it has no codec for; ``_invocation_service`` is private.
    Errors are the client's own (the caller translates them).
    """
    from hazelcast.invocation import Invocation

    invocation = Invocation(request, response_handler=lambda message: None)
    client._invocation_service.invoke(invocation)
    invocation.future.result()


def _check_invoke() -> None:
    from hazelcast.client import HazelcastClient
    from hazelcast.invocation import Invocation
    from hazelcast.protocol import builtin, client_message

    assert "self._invocation_service" in inspect.getsource(HazelcastClient.__init__), (
        "HazelcastClient no longer has `_invocation_service`"
    )
    assert "response_handler" in inspect.signature(Invocation.__init__).parameters, (
        "Invocation() no longer takes response_handler"
    )
    for module, names in (
        (builtin, ("CodecUtil", "FixSizedTypesCodec", "StringCodec")),
        (client_message, ("REQUEST_HEADER_SIZE", "OutboundMessage", "create_initial_buffer")),
    ):
        missing = [name for name in names if not hasattr(module, name)]
        assert not missing, f"{module.__name__} no longer has {missing}"


# ------------------------------------------------------------ pyspark: the streaming source runner's SIGTERM

_PYSPARK = "pyspark"
_RUNNER_WRITTEN_FOR = ((4, 2), (4, 4))


def stop_source_runner_on_sigterm(stopping: threading.Event) -> bool:
    """Make Spark's SIGTERM end its Python streaming source runner through the runner's own ``finally:
    reader.stop()`` (and ``atexit`` hooks); returns whether the handler is installed.

    pyspark 4.2/4.3's runner (``pyspark/sql/streaming/python_streaming_source_runner.py``) never gets to call
    ``reader.stop()``: the JVM ends the process with SIGTERM, whose default action kills it before that ``finally``
    runs. The handler raises ``SystemExit`` and does nothing else: the signal lands anywhere in the runner's main
    thread, sometimes in the middle of a batch (inside a group member's lock, or inside the grid client sending a
    request), where a release run by the handler would wait for that lock forever or re-enter the client's half-done
    call; unwinding first releases the locks, and ``stop()`` then runs from the ``finally``.

    Only a SIGTERM that finds ``stopping`` clear raises (and sets it); the readers' ``stop()`` sets it too. Any later
    one is ignored, so it cannot abort the release: Spark sends two, and closes the runner's socket, so the runner
    may be in its ``finally`` before the first arrives. Signal handlers can only be installed from the main thread
    (where the runner calls the reader); elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        return False

    def on_sigterm(signum: int, frame: Any) -> None:
        if not stopping.is_set():
            stopping.set()
            raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_sigterm)
    return True


def _check_runner() -> None:
    from pyspark.sql.streaming import python_streaming_source_runner as runner

    source = inspect.getsource(runner)
    assert "reader.stop()" in source and "finally:" in source, (
        "the streaming source runner no longer calls reader.stop() in a finally block"
    )
    assert "signal.signal(" not in source, (
        "the streaming source runner installs signal handlers itself now: ours may replace them"
    )


# ------------------------------------------------- pyspark: which planner worker asks a batch reader for pushdown

_PUSHDOWN_WRITTEN_FOR = ((4, 1), (4, 4))
_PUSHDOWN_WORKER = os.path.join("sql", "worker", "data_source_pushdown_filters.py")


def planning_filter_pushdown() -> bool:
    """Whether the calling ``DataSource.reader()`` runs in Spark's filter-pushdown planner worker, the only place
    pyspark 4.1-4.3 call ``pushFilters`` (with ``spark.sql.python.filterPushdown.enabled`` on). Elsewhere a reader
    class overriding ``pushFilters`` fails the query (``DATA_SOURCE_PUSHDOWN_DISABLED``) when the conf is off, and
    a reader cannot read the conf: offering it only under that worker's frame keeps reads working either way."""
    frame = inspect.currentframe()
    while frame is not None and not frame.f_code.co_filename.endswith(_PUSHDOWN_WORKER):
        frame = frame.f_back
    return frame is not None


def _check_pushdown() -> None:
    from pyspark.sql.worker import data_source_pushdown_filters as pushdown
    from pyspark.sql.worker import plan_data_source_read as plan

    assert str(pushdown.__file__).endswith(_PUSHDOWN_WORKER), f"the pushdown worker moved: {pushdown.__file__}"
    source, planned = inspect.getsource(pushdown._main), inspect.getsource(plan._main)
    assert "data_source.reader(" in source and "reader.pushFilters(" in source, "pushdown worker: no pushFilters"
    assert "DATA_SOURCE_PUSHDOWN_DISABLED" in planned and "reader.pushFilters(" not in planned, (
        "the read planner worker calls pushFilters itself now: a reader may offer it there too"
    )


# ------------------------------------------- hazelcast-python-client: a client whose connections go through a proxy

_ROUTING_WRITTEN_FOR = ((5, 7), (5, 8))


def route_member_through(client: Any, member_port: int, proxy_address: str, *, retry_pause_s: float) -> None:
    """Make every connection ``client`` opens to the member listening on ``member_port`` go to ``proxy_address``
    instead, reconnections included, and retry invocations that found no connection after ``retry_pause_s``.

    For tests that cut connections (``meteor_spark.testing.TcpProxy``): the client reconnects to the addresses of
    the member list, which name the member itself, so the proxy must be put in the address provider's
    translation (private, ``_connection_manager._address_provider``); the retry pause (1 s by default) is
    ``_invocation_service._invocation_retry_pause``.
    """
    provider = client._connection_manager._address_provider
    proxied = provider.load_addresses()[0][0]
    if proxied.port != int(proxy_address.rsplit(":", 1)[1]):
        raise ValueError(f"the client was not connected through {proxy_address}: its first address is {proxied}")
    original = provider.translate
    provider.translate = lambda address: proxied if address.port == member_port else original(address)
    client._invocation_service._invocation_retry_pause = retry_pause_s


def _check_routing() -> None:
    from hazelcast import client, connection, invocation

    assert "self._connection_manager" in inspect.getsource(client.HazelcastClient.__init__), (
        "HazelcastClient no longer has `_connection_manager`"
    )
    assert "self._address_provider.translate(" in inspect.getsource(connection.ConnectionManager), (
        "ConnectionManager no longer translates addresses through `_address_provider.translate`"
    )
    assert "self._invocation_retry_pause" in inspect.getsource(invocation.InvocationService.__init__), (
        "InvocationService no longer has `_invocation_retry_pause`"
    )


_CONNECT_LOG_WRITTEN_FOR = ((5, 7), (5, 8))
#: The loggers the client reports each failed connection attempt on (``logger.warning(..., exc_info=True)``).
_CONNECT_LOGGERS = ("hazelcast.connection", "hazelcast.internal.asyncio_connection")


@contextmanager
def connect_failures() -> Iterator[list[BaseException]]:
    """While the block runs, collect the errors of the client's failed connection attempts (a refused
    authentication, a TLS handshake failure), which it logs and retries until its connect timeout and never
    raises: the caller can then say why it could not connect instead of a generic timeout.

    The client logs each failure on ``hazelcast.connection`` as a WARNING with ``exc_info`` (private). Where
    WARNING is not enabled for that logger (the CLI quiets ``hazelcast``), it is enabled for the block and the
    records go only to the collector, so nothing new is shown.
    """
    seen: list[BaseException] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.exc_info and record.exc_info[1] is not None:
                seen.append(record.exc_info[1])

    saved = []
    for name in _CONNECT_LOGGERS:
        client_logger = logging.getLogger(name)
        handler = Collect(logging.WARNING)
        saved.append((client_logger, handler, client_logger.level, client_logger.propagate))
        if not client_logger.isEnabledFor(logging.WARNING):
            client_logger.setLevel(logging.WARNING)
            client_logger.propagate = False
        client_logger.addHandler(handler)
    try:
        yield seen
    finally:
        for client_logger, handler, level, propagate in saved:
            client_logger.removeHandler(handler)
            client_logger.setLevel(level)
            client_logger.propagate = propagate


def _check_connect_log() -> None:
    from hazelcast import connection

    source = inspect.getsource(connection.ConnectionManager._connect)
    assert '_logger.warning("Error during initial connection to %s", target, exc_info=True)' in source, (
        "ConnectionManager._connect no longer logs a failed attempt as a WARNING with exc_info"
    )
    assert connection._logger.name == "hazelcast.connection", "the connection manager's logger was renamed"
    assert "AuthenticationError(" in inspect.getsource(connection.ConnectionManager._on_auth), (
        "a refused authentication is no longer an AuthenticationError"
    )


_CONNECTION_CLOSED_WRITTEN_FOR = ((5, 7), (5, 8))


def on_connection_closed(client: Any, callback: Callable[[], None]) -> None:
    """Call ``callback`` whenever one of the client's member connections closes (a member died, restarted or was
    cut off), before the client can retry an operation on a new connection to that member.

    The public API tells only of losing the whole cluster (lifecycle ``DISCONNECTED``) and, later, of membership
    changes; a member of a bigger cluster restarting shows first as its connection closing, which only the
    connection manager's listeners (private ``_connection_manager.add_listener``) report. The callback runs on the
    client's reactor thread: it must not block.
    """
    client._connection_manager.add_listener(on_connection_closed=lambda _connection: callback())


def _check_connection_closed() -> None:
    from hazelcast import connection

    params = inspect.signature(connection.ConnectionManager.add_listener).parameters
    assert "on_connection_closed" in params, "ConnectionManager.add_listener no longer takes on_connection_closed"
    source = inspect.getsource(connection.ConnectionManager.on_connection_close)
    assert "on_connection_closed(closed_connection)" in source, (
        "ConnectionManager.on_connection_close no longer calls the connection listeners' on_connection_closed"
    )
    assert source.index("DISCONNECTED") < source.index("_trigger_cluster_reconnection"), (
        "the DISCONNECTED lifecycle event no longer fires before the client reconnects"
    )
    assert "self._connection_manager = " in inspect.getsource(
        __import__("hazelcast.client", fromlist=["HazelcastClient"]).HazelcastClient.__init__
    ), "HazelcastClient no longer has `_connection_manager`"


COUPLINGS: tuple[Coupling, ...] = (
    Coupling("reactor waker patch (compat_reactor, grid.py)", CLIENT, WAKER_WRITTEN_FOR, check_waker),
    Coupling(
        "reactor polls until its next timer (compat_reactor, grid.py)", CLIENT, TIMERS_WRITTEN_FOR, check_timer_wait
    ),
    Coupling("partial-send copy and calling-thread send patch (grid.py)", CLIENT, _SEND_WRITTEN_FOR, _check_send),
    Coupling("ring reads, appends, frames (compat_ring, _frames)", CLIENT, READ_WRITTEN_FOR, check_read_path),
    Coupling("futures' event on bare locks (compat_ring, grid.py)", CLIENT, EVENT_WRITTEN_FOR, check_future_event),
    Coupling(
        "dynamic ring-buffer config via _invocation_service (Grid.add_ring_config)",
        CLIENT,
        _INVOKE_WRITTEN_FOR,
        _check_invoke,
    ),
    Coupling("proxy routing of a test client (testing.grid_through)", CLIENT, _ROUTING_WRITTEN_FOR, _check_routing),
    Coupling(
        "SIGTERM hook in Spark's streaming source runner (spark/reader.py)",
        _PYSPARK,
        _RUNNER_WRITTEN_FOR,
        _check_runner,
    ),
    Coupling("pushFilters only in Spark's pushdown worker", _PYSPARK, _PUSHDOWN_WRITTEN_FOR, _check_pushdown),
    Coupling(
        "why a connection failed, from the client's connection log (Grid)",
        CLIENT,
        _CONNECT_LOG_WRITTEN_FOR,
        _check_connect_log,
    ),
    Coupling(
        "connection-closed listener: reads cross a member restart only after a recheck (Grid.connection_losses)",
        CLIENT,
        _CONNECTION_CLOSED_WRITTEN_FOR,
        _check_connection_closed,
    ),
)


def problems() -> list[str]:
    """Every coupling that no longer holds for the installed dependencies (empty when all are safe)."""
    return [problem for coupling in COUPLINGS for problem in coupling.problems()]
