"""``meteor streams list|describe|create|delete`` (``ensure``: ``streams_ensure``)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields
from typing import Any

from meteor_spark.cli.common import EXIT_FAILURE, EXIT_OK, config_of, err, fmt_int, fmt_time_ms, out, render_table
from meteor_spark.cli.streams_ensure import add_config_flags, declared_config, describe_config, register_ensure
from meteor_spark.errors import StreamNotFoundError
from meteor_spark.grid.client import Grid


def register(commands: Any, parent: argparse.ArgumentParser) -> None:
    streams = commands.add_parser(
        "streams",
        help="list, describe, create, ensure and delete streams",
        description=(
            "List, describe, create, ensure and delete meteor streams (each lane is one ring buffer in the grid)."
        ),
    )
    actions = streams.add_subparsers(dest="action", metavar="ACTION", title="actions")
    actions.required = True

    listing = actions.add_parser("list", parents=[parent], help="one line per stream: lanes, capacity, items held")
    listing.set_defaults(run=run_list)

    describe = actions.add_parser(
        "describe", parents=[parent], help="a stream's configuration and, per lane, its ring positions"
    )
    describe.add_argument("stream", help="stream name")
    describe.set_defaults(run=run_describe)

    create = actions.add_parser(
        "create",
        parents=[parent],
        help="create a stream (idempotent when the configuration is the same)",
        description=(
            "Create a stream. Settings not given here come from the [stream] table of the TOML file, then from "
            "the library's defaults. Creating an existing stream with the same settings does nothing; with "
            "different settings it fails and shows the difference."
        ),
    )
    create.add_argument("stream", help="stream name")
    add_config_flags(create)
    create.set_defaults(run=run_create)

    register_ensure(actions, parent)

    delete = actions.add_parser(
        "delete", parents=[parent], help="delete a stream: its lanes' ring buffers, metadata and group offsets"
    )
    delete.add_argument("stream", help="stream name")
    delete.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation (needed without a TTY)")
    delete.set_defaults(run=run_delete)


def run_list(args: argparse.Namespace) -> int:
    from meteor_spark.grid.streams import lane_bounds
    from meteor_spark.groups.admin import list_streams

    with Grid(config_of(args).grid) as grid:
        streams = list_streams(grid)
        if not streams:
            out("no streams (create one with `meteor streams create NAME`)")
            return EXIT_OK
        rows = []
        for info in sorted(streams, key=lambda s: s.config.name):
            bounds = lane_bounds(grid, info)
            held = sum(nxt - head for head, nxt in bounds.values())
            rows.append(
                [
                    info.config.name,
                    info.config.lanes,
                    fmt_int(info.config.capacity),
                    fmt_int(held),
                    info.config.compression,
                    fmt_time_ms(info.created_at_ms),
                ]
            )
        headers = ["STREAM", "LANES", "CAPACITY", "ITEMS HELD", "COMPRESSION", "CREATED"]
        out(render_table(headers, rows, right=[1, 2, 3]))
    return EXIT_OK


def run_describe(args: argparse.Namespace) -> int:
    from meteor_spark.grid.streams import lane_bounds, open_stream

    with Grid(config_of(args).grid) as grid:
        info = open_stream(grid, args.stream, create=False)
        created = fmt_time_ms(info.created_at_ms)
        out(f"stream {info.config.name!r} (format version {info.format_version}, created {created})")
        out()
        settings = [[f.name, getattr(info.config, f.name)] for f in fields(info.config) if f.name != "name"]
        out(render_table(["SETTING", "VALUE"], settings))
        out()
        bounds = lane_bounds(grid, info)
        rows = []
        for lane, ring in enumerate(info.ring_names):
            head, nxt = bounds[lane]
            rows.append([lane, ring, fmt_int(head), fmt_int(nxt), fmt_int(nxt - head)])
        out(render_table(["LANE", "RING", "HEAD SEQ", "NEXT SEQ", "ITEMS HELD"], rows, right=[0, 2, 3, 4]))
        out()
        out("ring items hold micro-batches of records; offsets are (sequence << 16 | index in batch)")
    return EXIT_OK


def run_create(args: argparse.Namespace) -> int:
    from meteor_spark.grid.streams import open_stream

    config = config_of(args)
    stream_config = declared_config(args)
    with Grid(config.grid) as grid:
        try:
            open_stream(grid, args.stream, create=False)
            existed = True
        except StreamNotFoundError:
            existed = False
        info = open_stream(grid, stream_config, create=True)
    verb = "exists already with these settings" if existed else "created"
    out(f"stream {info.config.name!r} {verb}: {describe_config(info.config)}")
    return EXIT_OK


def run_delete(args: argparse.Namespace) -> int:
    from meteor_spark.grid.streams import open_stream
    from meteor_spark.groups.admin import delete_stream, forget_groups

    with Grid(config_of(args).grid) as grid:
        info = open_stream(grid, args.stream, create=False)
        if not args.yes:
            if not sys.stdin.isatty():
                err(f"meteor streams: not deleting {args.stream!r}: add --yes to confirm (no terminal to ask on)")
                return EXIT_FAILURE
            answer = input(f"delete stream {args.stream!r} and all {info.config.lanes} lane(s) of records? [y/N] ")
            if answer.strip().lower() not in ("y", "yes"):
                out("nothing deleted")
                return EXIT_FAILURE
        # A stream re-created under this name must not inherit the old groups' leases and offsets: forgotten here
        # first to count them (delete_stream forgets them too, for callers outside the CLI).
        forgotten = forget_groups(grid, args.stream)
        delete_stream(grid, args.stream)
    out(f"stream {args.stream!r} deleted" + (f" with its group state ({forgotten} entries)" if forgotten else ""))
    return EXIT_OK
