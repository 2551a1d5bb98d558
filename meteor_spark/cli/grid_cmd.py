"""``meteor grid start|status``: run an embedded grid member; look at a running grid."""

from __future__ import annotations

import argparse
import logging
import os
import socket
from collections import Counter
from typing import Any

from meteor_spark.cli.common import EXIT_OK, CommandError, config_parent, open_grid, out, render_table
from meteor_spark.config import load_config
from meteor_spark.errors import unknown_option


def register(commands: Any, parent: argparse.ArgumentParser) -> None:
    grid = commands.add_parser(
        "grid",
        help="run an embedded grid member, or show the state of a grid",
        description="Run an embedded Hazelcast-compatible grid member, or show the state of a running grid.",
    )
    actions = grid.add_subparsers(dest="action", metavar="ACTION", title="actions")
    actions.required = True

    start = actions.add_parser(
        "start",
        parents=[config_parent()],
        help="run an embedded grid member in the foreground (Ctrl-C or SIGTERM stops it)",
        description=(
            "Run an embedded, Hazelcast-wire-compatible grid member in the foreground. It prints the address it "
            "listens on and stops cleanly on Ctrl-C or SIGTERM. Defaults can come from the [server] table of the "
            "TOML file (--config); flags win."
        ),
    )
    _add_member_arguments(start)
    start.set_defaults(run=run_start)

    status = actions.add_parser(
        "status",
        parents=[parent],
        help="connect and show the cluster's members, streams and distributed objects",
        description="Connect to the grid and show its members, its meteor streams and its distributed objects.",
    )
    status.set_defaults(run=run_status)


def _add_member_arguments(parser: argparse.ArgumentParser) -> None:
    """The embedded member's own flags (``python -m meteor_spark.server``), so both commands stay identical."""
    from meteor_spark.server.__main__ import build_parser

    build_parser(parser)


def run_start(args: argparse.Namespace) -> int:
    from meteor_spark.server.__main__ import run_member

    # Only the file's [server] table matters here: --username / --cluster-name of `grid start` are the member's own,
    # not the settings of a client connection (and its password comes from $METEOR_GRID_PASSWORD or --password).
    server_defaults = load_config(getattr(args, "config", None)).server
    if server_defaults:
        from meteor_spark.server.__main__ import build_parser

        member_args = vars(build_parser().parse_args([]))
        for key, value in server_defaults.items():
            if key not in member_args:
                raise unknown_option("[server] setting", key, member_args)
            # A flag given on the command line wins over the file: only fill what still has its default.
            if getattr(args, key, None) == member_args[key]:
                setattr(args, key, value)
    check_can_start(args)
    # `meteor` set up logging before the member could (its basicConfig would then do nothing): apply its level.
    logging.getLogger().setLevel(getattr(args, "log_level", "INFO"))
    return int(run_member(args) or EXIT_OK)


def check_can_start(args: argparse.Namespace) -> None:
    """Refuse, before a member starts (and logs its start and stop), what would stop it at once, each said as what
    it is: a data directory that cannot be created, a --host that names no interface here, a --port in use."""
    data_dir = getattr(args, "data_dir", None)
    if data_dir is not None and not os.path.isdir(data_dir):
        if os.path.exists(data_dir):
            raise CommandError(
                f"--data-dir {data_dir} is a file, not a directory; give a directory (created if missing)"
            )
        try:
            os.makedirs(data_dir)
        except OSError as exc:
            raise CommandError(
                f"--data-dir {data_dir}: cannot create the data directory: {exc.strerror}; give a directory this user "
                f"can write"
            ) from None
    from meteor_spark.server.__main__ import listen_failure

    host, port = args.host, args.port
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        family, kind, proto, _, address = addresses[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the member binds: TIME_WAIT is no conflict
            probe.bind(address)
    except UnicodeError as exc:
        raise CommandError(listen_failure(host, port, socket.gaierror(str(exc)))) from None
    except OverflowError:
        raise CommandError(f"--port {port}: ports are 0..65535 (0 = any free port)") from None
    except OSError as exc:
        raise CommandError(listen_failure(host, port, exc)) from None


def run_status(args: argparse.Namespace) -> int:
    from meteor_spark.groups.admin import list_streams

    with open_grid(args) as grid:
        settings = grid.settings
        members = grid.members()
        out(f"cluster {settings.cluster_name!r}, connected through {', '.join(settings.members)}")
        out()
        out(render_table(["MEMBER", "UUID", "VERSION"], [list(m) for m in members]))
        out()
        streams = list_streams(grid)
        out(f"streams: {len(streams)}" + (f" ({', '.join(s.config.name for s in streams)})" if streams else ""))
        objects = grid.distributed_objects()
        by_service = Counter(service for service, _ in objects)
        out()
        if objects:
            rows = [[service, count] for service, count in sorted(by_service.items())]
            out(render_table(["SERVICE", "OBJECTS"], rows, right=[1]))
        else:
            out("no distributed objects")
    return EXIT_OK
