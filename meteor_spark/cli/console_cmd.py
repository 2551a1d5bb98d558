"""``meteor console``: the web console for one grid (meteor_spark.console), served by uvicorn until Ctrl-C.

The grid connection comes from the usual flags / environment / TOML file (credentials included, never shown).
The command binds its socket itself before serving, so a port in use is one error line, and ``--port 0`` picks a
free port whose address the start line prints.
"""

from __future__ import annotations

import argparse
import os
import socket
from typing import Any

from meteor_spark.cli.common import EXIT_OK, CommandError, config_of, interrupted_code, out
from meteor_spark.errors import ConfigError
from meteor_spark.grid.client import Grid
from meteor_spark.validate import check_int, check_number

TOKEN_ENV = "METEOR_CONSOLE_TOKEN"
EXTRA_HINT = "meteor console needs the console extra: pip install 'meteor-spark[console]'"


def register(commands: Any, parent: argparse.ArgumentParser) -> None:
    console = commands.add_parser(
        "console",
        parents=[parent],
        help="a web console for the grid: streams, groups and their lag, a live tail, dead letters, transactions",
        description=(
            "Serve a small web console for the grid: streams (lanes, sizes, rates, history depth), groups "
            "(exclusive and shared: members, leases, lag per lane and its trend over the last minutes), a live "
            "tail of a stream with key / topic / lane filters, dead letters, open transactions. Read-only unless "
            "--allow-actions (then dead letters can be redriven from the page). Binds 127.0.0.1 unless --host "
            "says otherwise; a console bound to any other address asks for a token on every request (--token or "
            f"${TOKEN_ENV}; when neither is given one is generated and printed once). Ctrl-C stops it."
        ),
    )
    console.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    console.add_argument("--port", type=int, default=8321, help="port to bind (default 8321; 0: any free port)")
    console.add_argument(
        "--token",
        default=None,
        help=f"the token every request must carry (prefer ${TOKEN_ENV}: flags show in the process list); required "
        "off loopback, generated when not given there",
    )
    console.add_argument(
        "--allow-actions", action="store_true", help="allow the actions (redrive dead letters); read-only otherwise"
    )
    console.add_argument(
        "--sample-interval",
        type=float,
        default=2.0,
        metavar="S",
        help="seconds between samples of the lag history and rates (default 2)",
    )
    console.add_argument(
        "--history-points",
        type=int,
        default=300,
        metavar="N",
        help="samples of lag kept per group lane (default 300: 10 minutes at 2 s)",
    )
    console.set_defaults(run=run_console)


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"--host {host} --port {port}: cannot bind ({exc.strerror}); pick another port") from None
    sock.listen(128)
    return sock


def run_console(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from meteor_spark.console.app import Console, build_app
        from meteor_spark.console.security import Access
    except ModuleNotFoundError as exc:
        if exc.name not in ("starlette", "uvicorn"):
            raise
        raise CommandError(EXTRA_HINT) from None
    check_int("--port", args.port, 0, 65_535)
    interval = check_number("--sample-interval", args.sample_interval, 0.1, 3600)
    points = check_int("--history-points", args.history_points, 2, 100_000)
    token = args.token if args.token is not None else os.environ.get(TOKEN_ENV)
    access = Access.decide(args.host, token, args.allow_actions)
    with Grid(config_of(args).grid) as grid:
        sock = _bind(args.host, args.port)
        try:
            host, port = sock.getsockname()[:2]
            shown = f"[{host}]" if ":" in host else host
            mode = "actions allowed" if access.allow_actions else "read-only"
            out(f"meteor console: serving http://{shown}:{port}/ ({mode}; Ctrl-C stops)")
            if access.generated:
                out(f"meteor console: token (shown once): {access.token}")
                out(f"meteor console: open http://{shown}:{port}/?token=<the token> once to log in")
            elif access.token is not None:
                out("meteor console: every request must carry the token given")
            console = Console(grid, access, sample_s=interval, history_points=points)
            config = uvicorn.Config(
                build_app(console), log_level="warning", access_log=False, lifespan="on", server_header=False
            )
            server = uvicorn.Server(config)
            try:
                server.run(sockets=[sock])
            except KeyboardInterrupt as exc:
                return interrupted_code(exc)
        finally:
            sock.close()
    return EXIT_OK
