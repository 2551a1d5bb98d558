"""``EmbeddedGrid``: a Hazelcast-compatible member in a thread of this process or in its own process.

>>> with EmbeddedGrid() as member:          # doctest: +SKIP
...     client = hazelcast.HazelcastClient(cluster_members=[member.address], cluster_name=member.cluster_name)

``process=False`` runs the member's event loop in a daemon thread (fast to start, shares the GIL with the caller);
``process=True`` runs ``python -m meteor_spark.server`` (its own GIL: the way to benchmark it, and the only way to
``kill()`` it for crash tests).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from meteor_spark.server.busy_poll import DEFAULT_WINDOW_US as DEFAULT_BUSY_POLL_US
from meteor_spark.server.busy_poll import check_window as check_busy_poll_window
from meteor_spark.server.config_syntax import MAP_CONFIG_SYNTAX, RING_CONFIG_SYNTAX
from meteor_spark.server.engine import Clock, Engine, EngineConfig
from meteor_spark.server.engine.map_types import MapConfig
from meteor_spark.server.engine.ringbuffer import RingConfig
from meteor_spark.server.handlers.registry import MemberSettings
from meteor_spark.server.tcp import (
    DEFAULT_AUTH_TIMEOUT_S,
    DEFAULT_CLIENT_HEARTBEAT_TIMEOUT_S,
    ConnectionInfo,
    MemberServer,
)

logger = logging.getLogger(__name__)

#: Environment variable the member process reads its password from (never put on a command line: ``ps`` shows it).
PASSWORD_ENV = "METEOR_GRID_PASSWORD"

#: The first line ``python -m meteor_spark.server`` prints: ``listening on HOST:PORT cluster=NAME pid=PID``.
READY_LINE = re.compile(
    r"^listening on (?P<address>\S+:\d+) cluster=(?P<cluster>\S+) pid=(?P<pid>\d+)(?: metrics=(?P<metrics>\S+:\d+))?$"
)


@dataclass(frozen=True)
class MemberOptions:
    """Everything a member is started with, validated once (see ``EmbeddedGrid`` for the meaning of each).

    Raises:
        ValueError: on a bad port, a username without a password (or the reverse), an empty cluster name, a negative
            client heartbeat timeout, or an invalid engine setting (``InvalidConfiguration``: fsync policy, fsync
            interval, CP mode).
    """

    host: str = "127.0.0.1"
    port: int = 0
    cluster_name: str = "dev"
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    data_dir: str | None = None
    fsync: str = "interval"
    fsync_interval_ms: int = 100
    cp_mode: str = "disabled"
    ring_configs: tuple[RingConfig, ...] = ()
    map_configs: tuple[MapConfig, ...] = ()
    partition_count: int = 271
    client_heartbeat_timeout_s: float = DEFAULT_CLIENT_HEARTBEAT_TIMEOUT_S
    auth_timeout_s: float = DEFAULT_AUTH_TIMEOUT_S
    metrics_port: int | None = None
    busy_poll_us: int = DEFAULT_BUSY_POLL_US

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ValueError(f"port must be 0..65535 (0 = any free port), got {self.port}")
        if self.metrics_port is not None and not 0 <= self.metrics_port < 65536:
            raise ValueError(f"metrics port must be 0..65535 (0 = any free port), got {self.metrics_port}")
        if not self.auth_timeout_s >= 0:  # also refuses NaN
            raise ValueError(
                f"authentication timeout must be >= 0 seconds (0 = never close unauthenticated connections), got "
                f"{self.auth_timeout_s}; the default is {DEFAULT_AUTH_TIMEOUT_S:g}"
            )
        check_busy_poll_window(self.busy_poll_us)
        if self.data_dir is not None and os.path.exists(self.data_dir) and not os.path.isdir(self.data_dir):
            raise ValueError(f"data directory {self.data_dir} is a file, not a directory")
        if not self.client_heartbeat_timeout_s >= 0:  # also refuses NaN
            raise ValueError(
                f"client heartbeat timeout must be >= 0 seconds (0 = never close silent clients), got "
                f"{self.client_heartbeat_timeout_s}; Hazelcast's default is {DEFAULT_CLIENT_HEARTBEAT_TIMEOUT_S:g}"
            )
        if (self.username is None) != (self.password is None):
            raise ValueError("username and password go together: give both or neither")
        if not self.cluster_name:
            raise ValueError("cluster name is empty; Hazelcast's default is 'dev'")
        self.engine_config()  # validates the engine's settings now, not when the member starts

    def engine_config(self) -> EngineConfig:
        return EngineConfig(
            partition_count=self.partition_count,
            cluster_name=self.cluster_name,
            data_dir=self.data_dir,
            fsync=self.fsync,
            fsync_interval_ms=self.fsync_interval_ms,
            cp_mode=self.cp_mode,
        )

    def member_settings(self) -> MemberSettings:
        return MemberSettings(
            host=self.host,
            port=self.port,
            cluster_name=self.cluster_name,
            username=self.username,
            password=self.password,
            partition_count=self.partition_count,
        )


async def serve(
    options: MemberOptions,
    stop: asyncio.Event,
    on_ready: Callable[[str], None],
    clock: Clock | None = None,
    on_listening: Callable[[MemberServer], None] | None = None,
) -> None:
    """Run a member on the current event loop until ``stop`` is set; ``on_ready(address)`` once it listens
    (``on_listening(server)`` just before, for in-process inspection).

    A member that cannot start raises before it logs anything (only a member that served logs that it stopped).

    Raises:
        OSError: the host or port cannot be bound (``socket.gaierror``: the host does not resolve).
        ValueError: the metrics endpoint cannot start, or the data directory is unusable (``InvalidConfiguration``).
    """
    engine = Engine(
        options.engine_config(), clock=clock, ring_configs=options.ring_configs, map_configs=options.map_configs
    )
    server = MemberServer(
        engine,
        options.member_settings(),
        options.client_heartbeat_timeout_s,
        auth_timeout_s=options.auth_timeout_s,
        busy_poll_us=options.busy_poll_us,
    )
    http = await _start(options, engine, server)
    try:
        if on_listening is not None:
            on_listening(server)
        address = f"{server.member.host}:{server.member.port}"
        logger.info("member %s of cluster %r listening on %s", server.member.member_uuid, options.cluster_name, address)
        if server.metrics_address is not None:
            logger.info("member metrics on http://%s/metrics", server.metrics_address)
        on_ready(address)
        await stop.wait()
    finally:
        await _shut_down(engine, server, http)
        logger.info("member of cluster %r stopped", options.cluster_name)


async def _start(options: MemberOptions, engine: Engine, server: MemberServer) -> Any:
    """Bind the member's address, start its metrics endpoint, open its engine (persistence recovery), then accept
    clients, in that order so the cheapest mistakes (a port in use, a host not of this machine) fail before anything
    was opened; the metrics HTTP server, or None. A step that fails undoes the ones before it."""
    await server.bind(options.host, options.port)
    http = None
    try:
        if options.metrics_port is not None:
            from meteor_spark.server.metrics import start_metrics_server

            http, metrics_port = start_metrics_server(server, options.host, options.metrics_port)
            server.metrics_address = f"{server.member.host}:{metrics_port}"
        await engine.open()
        await server.start_serving()
    except BaseException:
        await _shut_down(engine, server, http)
        raise
    return http


async def _shut_down(engine: Engine, server: MemberServer, http: Any) -> None:
    if http is not None:
        http.shutdown()
        http.server_close()
    await server.stop()
    await engine.close()


class EmbeddedGrid:
    """A Hazelcast-wire-compatible member for tests, notebooks and laptops.

    Args:
        host: interface to bind; 127.0.0.1 by default (reachable from this machine only).
        port: TCP port; 0 picks a free one (``address`` tells which).
        cluster_name: clients must present it.
        username, password: when given, clients must present them. The password is never logged nor shown.
        data_dir: keep ring buffers and maps on disk there (survive restarts); None = memory only.
        fsync: "always", "interval" or "never" (see docs/persistence.md for what each risks).
        fsync_interval_ms: with ``fsync="interval"``, how often written data is fsynced (what a machine crash may
            lose).
        cp_mode: "disabled" (AtomicLong refused as an Enterprise feature, as Hazelcast 5.7 open source refuses it;
            the default) or "unsafe" (AtomicLong works without CP members, as on Hazelcast 4.x-5.4).
        process: run the member in its own process (``python -m meteor_spark.server``) instead of a thread.
        ring_configs: ring buffer configs (exact names or ``*`` patterns) the member starts with.
        map_configs: map configs (exact names or ``*`` patterns): the default TTL / max-idle of matching maps.
        log_level: log level of the member process (process mode; a thread logs through this process's logging).
        start_timeout_s: how long ``start()`` waits for the member to listen.
        client_heartbeat_timeout_s: close a client connection the member heard nothing from for this long (the
            client vanished: partition, frozen process), which releases its locks and listeners; idle official
            clients ping every 5 s. Hazelcast's default, 60 s; 0 = never.
        auth_timeout_s: close a connection that has not authenticated this long after it opened (a peer without
            credentials cannot hold a connection, nor more than 64 KiB of the member's memory); 0 = never.
        metrics_port: serve the member's figures in Prometheus text format on this port (0 = a free one;
            ``metrics_address`` tells which); None = no endpoint. Needs the ``metrics`` extra.
        busy_poll_us: after each request, keep polling the sockets without sleeping for this many microseconds,
            while no other thread wants the core and requests keep coming (``server/busy_poll.py``): lower round
            trips on an idle machine. 0 = off; None (default) = 100 for a member process, off for a member thread
            (which would spin against the application's threads).
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        cluster_name: str = "dev",
        username: str | None = None,
        password: str | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        fsync: str = "interval",
        fsync_interval_ms: int = 100,
        cp_mode: str = "disabled",
        process: bool = False,
        ring_configs: Iterable[RingConfig] = (),
        map_configs: Iterable[MapConfig] = (),
        log_level: str | int | None = None,
        start_timeout_s: float = 30.0,
        client_heartbeat_timeout_s: float = DEFAULT_CLIENT_HEARTBEAT_TIMEOUT_S,
        auth_timeout_s: float = DEFAULT_AUTH_TIMEOUT_S,
        metrics_port: int | None = None,
        busy_poll_us: int | None = None,
    ) -> None:
        if busy_poll_us is None:
            busy_poll_us = DEFAULT_BUSY_POLL_US if process else 0
        self.options = MemberOptions(
            host=host,
            port=port,
            cluster_name=cluster_name,
            username=username,
            password=password,
            data_dir=os.fspath(data_dir) if data_dir is not None else None,
            fsync=fsync,
            fsync_interval_ms=fsync_interval_ms,
            cp_mode=cp_mode,
            ring_configs=tuple(ring_configs),
            map_configs=tuple(map_configs),
            client_heartbeat_timeout_s=client_heartbeat_timeout_s,
            auth_timeout_s=auth_timeout_s,
            metrics_port=metrics_port,
            busy_poll_us=busy_poll_us,
        )
        if busy_poll_us and not process:
            # Measured: a polling member thread took the GIL from the application's threads (map get p50 58-60 ->
            # 68-72 us in the same process).
            raise ValueError("busy_poll_us needs process=True: a member thread would spin against the application")
        self.process_mode = process
        self.log_level = log_level
        self.start_timeout_s = start_timeout_s
        self._address: str | None = None
        self._metrics_address: str | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._server: MemberServer | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._log_file: str | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------------------------------------ properties

    @property
    def cluster_name(self) -> str:
        return self.options.cluster_name

    @property
    def address(self) -> str:
        """``host:port`` clients connect to (the real port after binding).

        Raises:
            RuntimeError: the member is not started.
        """
        if self._address is None:
            raise RuntimeError("the embedded grid is not started; call start() (or use it as a context manager)")
        return self._address

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    @property
    def metrics_address(self) -> str | None:
        """``host:port`` of the Prometheus endpoint (``http://<it>/metrics``), None without ``metrics_port``."""
        if self._address is None:
            raise RuntimeError("the embedded grid is not started; call start() (or use it as a context manager)")
        return self._metrics_address

    @property
    def pid(self) -> int | None:
        """Process id of the member process (process mode), else None."""
        return self._process.pid if self._process is not None else None

    @property
    def log_path(self) -> str | None:
        """Where the member process writes its log (process mode)."""
        return self._log_file

    @property
    def running(self) -> bool:
        if self._process is not None:
            return self._process.poll() is None
        return self._thread is not None and self._thread.is_alive()

    def connections(self, timeout_s: float = 10.0) -> list[ConnectionInfo]:
        """A snapshot of the member's client connections: who, how many response bytes wait for each to read, whether
        the member holds a client back for reading too slowly, how long each was silent. Thread mode only.

        Raises:
            RuntimeError: in process mode (the member's state is in another process) or when not running.
        """
        loop, server = self._loop, self._server
        if self.process_mode:
            raise RuntimeError("connections() inspects a member thread; this EmbeddedGrid runs in its own process")
        if loop is None or server is None or not self.running:
            raise RuntimeError(f"{self!r} is not running; call start() first")

        async def snapshot() -> list[ConnectionInfo]:
            return server.connection_info()

        return asyncio.run_coroutine_threadsafe(snapshot(), loop).result(timeout_s)

    def __repr__(self) -> str:
        mode = "process" if self.process_mode else "thread"
        where = self._address or f"{self.options.host}:{self.options.port} (not started)"
        return f"EmbeddedGrid({where}, cluster={self.cluster_name!r}, mode={mode})"

    # ------------------------------------------------------------------------------------------------ lifecycle

    def start(self) -> EmbeddedGrid:
        """Start the member and wait until it listens.

        Raises:
            RuntimeError: already running, or it did not come up within ``start_timeout_s`` (the message includes
                the member's own error).
        """
        with self._lock:
            if self.running:
                raise RuntimeError(f"{self!r} is already running")
            if self.process_mode:
                self._start_process()
            else:
                self._start_thread()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the member (SIGTERM then SIGKILL after ``timeout_s`` in process mode). Idempotent."""
        with self._lock:
            if self._process is not None:
                self._stop_process(timeout_s)
            elif self._thread is not None:
                self._stop_thread(timeout_s)

    def kill(self) -> None:
        """SIGKILL the member process (crash tests). Only in process mode.

        Raises:
            RuntimeError: in thread mode (a thread cannot be killed).
        """
        with self._lock:
            if self._process is None:
                raise RuntimeError("kill() needs EmbeddedGrid(process=True); a member thread cannot be killed")
            if self._process.poll() is None:
                self._process.kill()
                self._process.wait()

    def restart(self) -> EmbeddedGrid:
        """Stop (if running) and start again on the same port and data directory."""
        port = self.port if self._address is not None else self.options.port
        self.stop()
        self.options = replace(self.options, port=port)
        return self.start()

    def __enter__(self) -> EmbeddedGrid:
        if not self.running:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------------------------------------ thread mode

    def _start_thread(self) -> None:
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            stop = asyncio.Event()
            self._stop_event = stop

            def on_ready(address: str) -> None:
                self._address = address
                ready.set()

            def on_listening(server: MemberServer) -> None:
                self._server = server
                self._metrics_address = server.metrics_address

            try:
                loop.run_until_complete(serve(self.options, stop, on_ready, on_listening=on_listening))
            except BaseException as exc:  # reported to start(), never lost
                failure.append(exc)
                ready.set()
            finally:
                try:
                    _cancel_remaining(loop)
                finally:
                    loop.close()

        self._address = None
        self._thread = threading.Thread(target=run, name=f"meteor-grid-{self.options.port}", daemon=True)
        self._thread.start()
        if not ready.wait(self.start_timeout_s):
            raise RuntimeError(f"the embedded grid did not start listening within {self.start_timeout_s:g} s")
        if failure:
            self._thread.join()
            self._thread = None
            raise RuntimeError(
                f"the embedded grid could not start on {self.options.host}:{self.options.port}: {failure[0]}"
            ) from failure[0]

    def _stop_thread(self, timeout_s: float) -> None:
        thread, loop, stop = self._thread, self._loop, self._stop_event
        if thread is None:
            return
        if loop is not None and stop is not None and thread.is_alive():
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:
                pass  # the loop already closed
        thread.join(timeout_s)
        if thread.is_alive():
            logger.warning("the embedded grid thread did not stop within %g s", timeout_s)
        self._thread = None
        self._loop = None
        self._stop_event = None
        self._server = None

    # ------------------------------------------------------------------------------------------------ process mode

    def _start_process(self) -> None:
        options = self.options
        argv = [sys.executable, "-m", "meteor_spark.server", *member_arguments(options), "--exit-with-parent"]
        if self.log_level is not None:
            level = logging.getLevelName(self.log_level) if isinstance(self.log_level, int) else self.log_level
            argv += ["--log-level", str(level)]
        env = dict(os.environ)
        env.pop(PASSWORD_ENV, None)
        if options.password is not None:
            env[PASSWORD_ENV] = options.password
        if self._log_file is None:
            handle, self._log_file = tempfile.mkstemp(prefix="meteor-grid-", suffix=".log")
            os.close(handle)
        with open(self._log_file, "ab") as log:
            self._process = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=env, start_new_session=True
            )
        assert self._process.stdout is not None
        line = _read_line(self._process.stdout, self.start_timeout_s)
        match = READY_LINE.match(line.decode("utf-8", "replace").strip())
        if match is None:
            self._process.kill()
            self._process.wait()
            self._process = None
            raise RuntimeError(
                f"the embedded grid process did not start (first output {line[:200]!r}); its log {self._log_file} "
                f"ends with:\n{_tail(self._log_file)}"
            )
        self._address = match["address"]
        self._metrics_address = match["metrics"]
        logger.info("embedded grid process %s listening on %s", self._process.pid, self._address)

    def _stop_process(self, timeout_s: float) -> None:
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                logger.warning("embedded grid process %s ignored SIGTERM for %g s; killing it", process.pid, timeout_s)
                process.kill()
                process.wait()
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                stream.close()
        self._process = None


def member_arguments(options: MemberOptions) -> list[str]:
    """Command-line arguments of ``python -m meteor_spark.server`` for ``options`` (the password goes through the
    environment)."""
    argv = ["--host", options.host, "--port", str(options.port), "--cluster-name", options.cluster_name]
    if options.username is not None:
        argv += ["--username", options.username]
    if options.data_dir is not None:
        argv += ["--data-dir", options.data_dir]
    argv += ["--fsync", options.fsync, "--fsync-interval-ms", str(options.fsync_interval_ms)]
    argv += ["--cp-mode", options.cp_mode]
    argv += ["--client-heartbeat-timeout-s", repr(float(options.client_heartbeat_timeout_s))]
    argv += ["--auth-timeout-s", repr(float(options.auth_timeout_s))]
    if options.metrics_port is not None:
        argv += ["--metrics-port", str(options.metrics_port)]
    argv += ["--busy-poll-us", str(options.busy_poll_us)]
    for ring_config in options.ring_configs:
        argv += ["--ring-config", RING_CONFIG_SYNTAX.format(ring_config)]
    for map_config in options.map_configs:
        argv += ["--map-config", MAP_CONFIG_SYNTAX.format(map_config)]
    return argv


def _read_line(stream: object, timeout_s: float) -> bytes:
    """One line from a pipe, or what arrived before the deadline / EOF."""
    fd = stream.fileno()  # type: ignore[attr-defined]
    deadline = time.monotonic() + timeout_s
    data = bytearray()
    while not data.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        readable, _, _ = select.select([fd], [], [], remaining)
        if not readable:
            break
        chunk = os.read(fd, 1)
        if not chunk:
            break
        data += chunk
    return bytes(data)


def _tail(path: str | None, lines: int = 20) -> str:
    if path is None:
        return "(no log)"
    try:
        with open(path, "rb") as handle:
            return b"".join(handle.readlines()[-lines:]).decode("utf-8", "replace")
    except OSError as exc:
        return f"(log unreadable: {exc})"


def _cancel_remaining(loop: asyncio.AbstractEventLoop) -> None:
    tasks = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())


__all__ = [
    "EmbeddedGrid",
    "MemberOptions",
    "serve",
]
