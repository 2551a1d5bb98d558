"""``python -m meteor_spark.server``: run an embedded grid member in the foreground.

Prints ``listening on HOST:PORT cluster=NAME pid=PID`` (the first line of stdout; scripts parse it) and runs until
Ctrl-C or SIGTERM. ``meteor grid start`` calls ``build_parser()`` and ``run_member(args)``.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import os
import signal
import socket
import sys
from collections.abc import Sequence

from meteor_spark.allocator import tune_allocator
from meteor_spark.server.busy_poll import DEFAULT_WINDOW_US as DEFAULT_BUSY_POLL_US
from meteor_spark.server.busy_poll import MAX_WINDOW_US as MAX_BUSY_POLL_US
from meteor_spark.server.config_syntax import MAP_CONFIG_SYNTAX, RING_CONFIG_SYNTAX, parse_map_config, parse_ring_config
from meteor_spark.server.engine import CP_MODES, FSYNC_POLICIES
from meteor_spark.server.event_loop import EVENT_LOOPS, loop_factory, loop_name
from meteor_spark.server.member import PASSWORD_ENV, MemberOptions, serve
from meteor_spark.server.tcp import DEFAULT_AUTH_TIMEOUT_S, DEFAULT_CLIENT_HEARTBEAT_TIMEOUT_S, MemberServer


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The member's command-line options (added to ``parser`` when given, e.g. a ``meteor grid start`` subparser)."""
    parser = parser or argparse.ArgumentParser(
        prog="python -m meteor_spark.server", description="Run an embedded Hazelcast-compatible grid member."
    )
    _add_address_and_credentials(parser)
    _add_persistence(parser)
    _add_data_structures(parser)
    _add_client_limits(parser)
    _add_process(parser)
    return parser


def _add_address_and_credentials(parser: argparse.ArgumentParser) -> None:
    """Where the member listens and what clients must present."""
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=5701, help="TCP port (default 5701; 0 = any free port, printed)")
    parser.add_argument("--cluster-name", default="dev", help="cluster name clients must present (default dev)")
    parser.add_argument("--username", default=None, help="require this username (with a password)")
    parser.add_argument(
        "--password",
        default=None,
        help=f"require this password (prefer the {PASSWORD_ENV} environment variable: a command line is visible to "
        f"other users)",
    )


def _add_persistence(parser: argparse.ArgumentParser) -> None:
    """The data directory and the fsync policy."""
    parser.add_argument("--data-dir", default=None, help="keep ring buffers and maps in this directory (persistence)")
    parser.add_argument(
        "--fsync",
        choices=FSYNC_POLICIES,
        default="interval",
        help="when persisted writes are fsynced (default interval)",
    )
    parser.add_argument(
        "--fsync-interval-ms",
        type=int,
        default=100,
        metavar="MS",
        help=(
            "with --fsync interval: how often written data is fsynced, i.e. what a machine crash may lose (default 100)"
        ),
    )


def _add_data_structures(parser: argparse.ArgumentParser) -> None:
    """CP mode and the ring buffer / map configs."""
    parser.add_argument(
        "--cp-mode",
        choices=CP_MODES,
        default="disabled",
        help="AtomicLong (CP): 'disabled' refuses it as an Enterprise feature, as Hazelcast 5.7 open source does "
        "(default); 'unsafe' serves it without CP members, as Hazelcast 4.x-5.4 do",
    )
    parser.add_argument(
        "--ring-config",
        action="append",
        default=[],
        metavar=RING_CONFIG_SYNTAX.usage,
        help="ring buffer config for names matching PATTERN (one * wildcard), e.g. "
        "'meteor.stream::orders.*:capacity=50000'; repeatable",
    )
    parser.add_argument(
        "--map-config",
        action="append",
        default=[],
        metavar=MAP_CONFIG_SYNTAX.usage,
        help="default TTL / max-idle in seconds of the maps matching PATTERN (one * wildcard), e.g. "
        "'sessions.*:ttl=600' (applies to writes without a TTL of their own), and per-entry-stats=1 to keep "
        "Hazelcast's per-entry statistics (hits, access and creation times; off by default, as in Hazelcast 5.x); "
        "repeatable",
    )


def _add_client_limits(parser: argparse.ArgumentParser) -> None:
    """When the member closes a silent or unauthenticated connection."""
    parser.add_argument(
        "--client-heartbeat-timeout-s",
        type=float,
        default=DEFAULT_CLIENT_HEARTBEAT_TIMEOUT_S,
        metavar="S",
        help="close a client connection nothing was received on for S seconds (a vanished client), releasing its "
        f"locks and listeners; idle clients ping every 5 s (default {DEFAULT_CLIENT_HEARTBEAT_TIMEOUT_S:g}, as "
        "Hazelcast; 0 = never)",
    )
    parser.add_argument(
        "--auth-timeout-s",
        type=float,
        default=DEFAULT_AUTH_TIMEOUT_S,
        metavar="S",
        help="close a connection that has not authenticated within S seconds of opening it "
        f"(default {DEFAULT_AUTH_TIMEOUT_S:g}; 0 = never)",
    )


def _add_process(parser: argparse.ArgumentParser) -> None:
    """The metrics endpoint, the parent link and the log level."""
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve the member's figures (connections, requests by type, ring items/bytes, map entries, fsyncs, "
        "quarantined ranges) in Prometheus text format on http://HOST:PORT/metrics (0 = any free port, printed; "
        "needs the 'metrics' extra)",
    )
    parser.add_argument(
        "--exit-with-parent",
        action="store_true",
        help=argparse.SUPPRESS,  # EmbeddedGrid(process=True): stop when stdin closes, i.e. when the parent dies
    )
    parser.add_argument(
        "--event-loop",
        default="auto",
        choices=EVENT_LOOPS,
        help="the member's event loop: uvloop (compiled, less CPU per request; the 'member' extra installs it), "
        "asyncio, or auto (default: uvloop when installed)",
    )
    parser.add_argument(
        "--busy-poll-us",
        type=int,
        default=DEFAULT_BUSY_POLL_US,
        metavar="US",
        help="after each request keep polling the sockets without sleeping for US microseconds, while no other "
        "thread wants the core and requests keep coming: a lower round trip on an idle machine (no wake-up); like "
        f"Hazelcast's hazelcast.io.selectorMode=selectnow, but adaptive (default {DEFAULT_BUSY_POLL_US}; 0 = off; "
        f"at most {MAX_BUSY_POLL_US})",
    )
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="log level (default INFO)"
    )


def options_from_args(args: argparse.Namespace) -> MemberOptions:
    """Validated member options from parsed arguments (the password from ``--password`` or the environment).

    Raises:
        ValueError: an invalid option; the message names it.
    """
    password = args.password if args.password is not None else os.environ.get(PASSWORD_ENV)
    if args.username is None:
        password = None if args.password is None else password
    return MemberOptions(
        host=args.host,
        port=args.port,
        cluster_name=args.cluster_name,
        username=args.username,
        password=password,
        data_dir=args.data_dir,
        fsync=args.fsync,
        fsync_interval_ms=args.fsync_interval_ms,
        cp_mode=args.cp_mode,
        ring_configs=tuple(parse_ring_config(text) for text in args.ring_config),
        map_configs=tuple(parse_map_config(text) for text in args.map_config),
        client_heartbeat_timeout_s=getattr(args, "client_heartbeat_timeout_s", DEFAULT_CLIENT_HEARTBEAT_TIMEOUT_S),
        auth_timeout_s=getattr(args, "auth_timeout_s", DEFAULT_AUTH_TIMEOUT_S),
        metrics_port=getattr(args, "metrics_port", None),
        busy_poll_us=getattr(args, "busy_poll_us", DEFAULT_BUSY_POLL_US),
    )


def run_member(args: argparse.Namespace) -> int:
    """Run a member in the foreground until SIGINT/SIGTERM; the process exit code.

    A member that cannot start prints one error line (the option, its value, the fix) and exits 1; no start or stop
    line is logged for a member that never ran.
    """
    logging.basicConfig(
        level=getattr(args, "log_level", "INFO"),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    data_dir = getattr(args, "data_dir", None)
    if data_dir is not None and os.path.exists(data_dir) and not os.path.isdir(data_dir):
        return _fail(f"--data-dir {data_dir} is a file, not a directory; give a directory (created if missing)")
    try:
        options = options_from_args(args)
    except ValueError as exc:
        return _fail(str(exc))
    try:
        new_loop = loop_factory(getattr(args, "event_loop", "auto"))
    except ValueError as exc:
        return _fail(str(exc))
    tune_allocator()  # this process is only a member: let it reuse freed item memory
    try:
        with asyncio.Runner(loop_factory=new_loop) as runner:
            runner.run(_serve_until_stopped(options, exit_with_parent=getattr(args, "exit_with_parent", False)))
    except ValueError as exc:  # the metrics endpoint could not start, the data directory is in use
        return _fail(str(exc))
    except OSError as exc:
        return _fail(listen_failure(options.host, options.port, exc))
    return 0


def listen_failure(host: str, port: int, exc: OSError) -> str:
    """The error line for a member that cannot listen on ``host:port`` (``exc``: what binding raised), naming the
    option to change and how (shared with ``meteor grid start``)."""
    if isinstance(exc, socket.gaierror):
        return (
            f"--host {host!r}: not a host name or address this machine can resolve ({exc}); give an interface of "
            f"this machine, e.g. 127.0.0.1 or 0.0.0.0"
        )
    if exc.errno == errno.EADDRINUSE:
        return (
            f"--port {port} on {host} is in use (another member?); stop what uses it, choose another --port, or use "
            f"--port 0 for a free port"
        )
    if exc.errno == errno.EADDRNOTAVAIL:
        return (
            f"--host {host}: not an address of this machine; give one of its interfaces, e.g. 127.0.0.1 or 0.0.0.0 "
            f"(every interface)"
        )
    if exc.errno == errno.EACCES:
        return (
            f"--port {port} on {host}: permission denied (ports below 1024 need privileges); choose a --port above "
            f"1023, or --port 0 for a free port"
        )
    return f"cannot listen on --host {host} --port {port}: {exc.strerror or exc}; check both options"


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 1


async def _serve_until_stopped(options: MemberOptions, *, exit_with_parent: bool) -> None:
    """Serve until SIGINT / SIGTERM (or, with ``exit_with_parent``, until stdin closes), printing the ready line."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    if exit_with_parent:
        # The parent holds our stdin open; EOF means it died (even by SIGKILL): do not outlive it.
        def on_stdin() -> None:
            try:
                data = os.read(0, 4096)
            except OSError:
                data = b""
            if not data:
                loop.remove_reader(0)
                stop.set()

        loop.add_reader(0, on_stdin)

    listening: list[MemberServer] = []

    def on_ready(address: str) -> None:
        metrics = listening[0].metrics_address if listening else None
        shown = f" metrics={metrics}" if metrics else ""
        print(f"listening on {address} cluster={options.cluster_name} pid={os.getpid()}{shown}", flush=True)
        logging.getLogger("meteor_spark.server.member").info("event loop: %s", loop_name(loop))

    await serve(options, stop, on_ready, on_listening=listening.append)


def main(argv: Sequence[str] | None = None) -> int:
    """Exit codes as for ``meteor``: 0 success (and ``--help``), 1 any user error, usage errors included."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # argparse printed the usage and the error (exit 2), or the help (exit 0)
        return 0 if exc.code in (0, None) else 1
    return run_member(args)


if __name__ == "__main__":
    sys.exit(main())
