"""What every ``meteor`` subcommand shares: connection flags, opening the grid, tables, a progress line."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Any

from meteor_spark.config import MeteorSettings, load_config
from meteor_spark.grid.client import Grid
from meteor_spark.tables import render_table as render_table  # the commands' tables

#: Exit codes: 0 success, 1 a failure the user can fix (message on stderr), 130 Ctrl-C, 143 SIGTERM (128 + the
#: signal's number, as a shell reports a process the signal ended; here the command cleaned up first).
EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143

_ENV_HELP = (
    "METEOR_HAZELCAST_MEMBERS, METEOR_CLUSTER_NAME, METEOR_USERNAME, METEOR_PASSWORD, ...: see docs/configuration.md"
)


class CommandError(Exception):
    """A user-facing failure of a command that is not a ``MeteorError`` (e.g. a file that cannot be opened)."""


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived. A ``KeyboardInterrupt``, so every clean-up a command does on Ctrl-C (a ``tail --group``
    releasing its lanes, a ``publish`` reporting what was stored) runs on SIGTERM too; only the exit code differs."""


def interrupted_code(exc: KeyboardInterrupt) -> int:
    """The exit code for an interruption: 143 for SIGTERM, 130 for Ctrl-C."""
    return EXIT_TERMINATED if isinstance(exc, Terminated) else EXIT_INTERRUPTED


class deferred_interrupts:
    """Holds Ctrl-C and SIGTERM back while a step that must not be cut in half runs (handing a chunk to a
    publisher, joining a group), then raises them: the step is either done and tracked, or not started. Only in
    the main thread (where Python delivers signals)."""

    def __init__(self) -> None:
        self._pending: int | None = None
        self._saved: list[tuple[int, Any]] = []

    def __enter__(self) -> deferred_interrupts:
        self._saved = []
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._saved.append((signum, signal.signal(signum, self._hold)))
        return self

    def _hold(self, signum: int, frame: object) -> None:
        self._pending = signum

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._saved:
            signal.signal(signum, handler)
        pending, self._pending = self._pending, None
        if pending == signal.SIGTERM:
            raise Terminated()
        if pending == signal.SIGINT:
            raise KeyboardInterrupt()


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """While the block runs, SIGTERM raises ``Terminated`` in the main thread (Python's default would end the
    process at once, skipping every ``finally``). Elsewhere than in the main thread it changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_sigterm(signum: int, frame: object) -> None:
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def config_parent() -> argparse.ArgumentParser:
    """``--config`` and ``--debug`` only (for commands that do not connect, e.g. ``grid start``)."""
    parent = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    parent.add_argument(
        "-c", "--config", metavar="PATH", help="TOML configuration file (default: $METEOR_CONFIG; none otherwise)"
    )
    parent.add_argument("--debug", action="store_true", help="log debug output and show tracebacks")
    return parent


def connection_parent() -> argparse.ArgumentParser:
    """Flags accepted both before and after the subcommand (``meteor -m h:p streams list`` and
    ``meteor streams list -m h:p``). Defaults are suppressed so a flag given in one place is not reset by the
    other."""
    parent = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    group = parent.add_argument_group(
        "connection",
        f"Flags win over environment variables ({_ENV_HELP}), which win over the TOML file.",
    )
    group.add_argument(
        "-c", "--config", metavar="PATH", help="TOML configuration file (default: $METEOR_CONFIG; none otherwise)"
    )
    group.add_argument(
        "-m",
        "--members",
        metavar="HOST:PORT[,...]",
        help="grid members to connect to (default 127.0.0.1:5701, the grid `meteor grid start` runs)",
    )
    group.add_argument("--cluster-name", metavar="NAME", help="cluster name of the grid (default dev)")
    group.add_argument("--username", metavar="USER", help="username, when the grid requires credentials")
    group.add_argument(
        "--password",
        metavar="PASSWORD",
        help="password (prefer $METEOR_PASSWORD: flags are visible to other users in the process list)",
    )
    group.add_argument(
        "--connect-timeout", metavar="SECONDS", help="give up reaching the grid after this long (default 10)"
    )
    parent.add_argument("--debug", action="store_true", help="log debug output and show tracebacks")
    return parent


def config_of(args: argparse.Namespace) -> MeteorSettings:
    """The configuration for this invocation (flags > environment > file > defaults)."""
    overrides = {
        "hazelcast.members": getattr(args, "members", None),
        "hazelcast.clusterName": getattr(args, "cluster_name", None),
        "hazelcast.username": getattr(args, "username", None),
        "hazelcast.password": getattr(args, "password", None),
        "hazelcast.connectTimeout": getattr(args, "connect_timeout", None),
    }
    return load_config(getattr(args, "config", None), overrides={k: v for k, v in overrides.items() if v})


def open_grid(args: argparse.Namespace) -> Grid:
    """Connect to the grid the flags/environment/file describe. Raises ``GridConnectionError`` with a clear
    message when nobody answers."""
    return Grid(config_of(args).grid)


def out(text: str = "") -> None:
    """Command output (stdout); everything else goes to stderr or the log."""
    sys.stdout.write(text + "\n")


def err(text: str) -> None:
    sys.stderr.write(text + "\n")


def fmt_int(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def fmt_time_ms(epoch_ms: int | None) -> str:
    """UTC wall-clock time of an epoch-milliseconds value, ISO-8601 with milliseconds."""
    if epoch_ms is None:
        return "-"
    seconds, millis = divmod(int(epoch_ms), 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


def fmt_rate(count: float, seconds: float) -> str:
    return f"{count / seconds:,.0f}/s" if seconds > 0 else "-"


@dataclass
class Progress:
    """A one-line progress indicator on stderr, drawn only when stderr is a terminal (never in pipes or logs)."""

    label: str
    total_bytes: int | None = None
    stream: IO[str] | None = None
    min_interval_s: float = 0.2

    def __post_init__(self) -> None:
        self._stream = self.stream or sys.stderr
        self.enabled = bool(getattr(self._stream, "isatty", lambda: False)())
        self._started = time.monotonic()
        self._last_draw = 0.0

    def update(self, count: int, done_bytes: int | None = None, *, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last_draw < self.min_interval_s:
            return
        self._last_draw = now
        elapsed = now - self._started
        text = f"{self.label}: {count:,} ({fmt_rate(count, elapsed)})"
        if self.total_bytes and done_bytes is not None:
            fraction = min(1.0, done_bytes / self.total_bytes)
            filled = int(fraction * 30)
            text += f" [{'#' * filled}{'.' * (30 - filled)}] {fraction:4.0%}"
        self._stream.write("\r" + text + "\033[K")
        self._stream.flush()

    def finish(self) -> None:
        if self.enabled:
            self._stream.write("\r\033[K")
            self._stream.flush()
