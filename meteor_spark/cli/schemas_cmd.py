"""``meteor schemas``: the schemas of typed streams in the grid (``meteor_spark.grid.schemas``): register a version,
list the streams' subjects, show a version (with the Spark type it reads as), check a schema before registering."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from meteor_spark.cli.common import EXIT_FAILURE, EXIT_OK, config_of, err, fmt_time_ms, out, render_table
from meteor_spark.errors import ConfigError
from meteor_spark.format.avro import COMPATIBILITY_MODES
from meteor_spark.grid.client import Grid


def register(commands: Any, parent: argparse.ArgumentParser) -> None:
    schemas = commands.add_parser(
        "schemas",
        parents=[parent],
        help="typed streams' Avro schemas: register, list, show, check",
        description=(
            "A typed stream's values are Avro records; its schemas live in the grid (map meteor.schemas) with "
            "versions and a compatibility mode (backward, forward, full or none, as Schema Registry checks them). "
            "Publishers encode with a version, every record carries it (header meteor.schema), and subscribers and "
            "Spark (valueFormat=avro) decode each record with its own version into theirs."
        ),
    )
    actions = schemas.add_subparsers(dest="action", metavar="ACTION", title="actions")
    actions.required = True
    reg = actions.add_parser(
        "register",
        parents=[parent],
        help="register a schema as the stream's next version (the same schema again: its version)",
        description="Register FILE (Avro schema JSON, '-' for stdin) as STREAM's next version. An incompatible "
        "schema is refused naming the fields that break it; nothing is registered then.",
    )
    reg.add_argument("stream")
    reg.add_argument("file", help="the schema (.avsc JSON), '-' for stdin")
    reg.add_argument(
        "--compatibility",
        choices=COMPATIBILITY_MODES,
        default=None,
        help="the mode of a stream registering its first schema (default backward); an existing stream's mode is "
        "changed with --set-compatibility",
    )
    reg.add_argument("--set-compatibility", action="store_true", help="change an existing stream's mode first")
    reg.set_defaults(run=run_register)
    listing = actions.add_parser("list", parents=[parent], help="every typed stream: mode, versions, latest")
    listing.add_argument("--json", action="store_true", help="one JSON document")
    listing.set_defaults(run=run_list)
    show = actions.add_parser(
        "show", parents=[parent], help="a schema version: its JSON, fingerprint and the Spark type it reads as"
    )
    show.add_argument("stream")
    show.add_argument("--version", type=int, default=None, metavar="N", help="default: the latest")
    show.add_argument("--json", action="store_true", help="one JSON document")
    show.set_defaults(run=run_show)
    check = actions.add_parser(
        "check",
        parents=[parent],
        help="would this schema be accepted as the stream's next version? (exit 1 and the fields when not)",
    )
    check.add_argument("stream")
    check.add_argument("file", help="the schema (.avsc JSON), '-' for stdin")
    check.add_argument("--compatibility", choices=COMPATIBILITY_MODES, default=None, help="default: the stream's")
    check.set_defaults(run=run_check)


def _schema_text(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError as exc:
        raise ConfigError(f"cannot read schema file {path!r}: {exc.strerror}") from None


def run_register(args: argparse.Namespace) -> int:
    from meteor_spark.grid.schemas import get_subject, register_schema, set_compatibility

    text = _schema_text(args.file)
    with Grid(config_of(args).grid) as grid:
        if args.set_compatibility:
            if args.compatibility is None:
                raise ConfigError("--set-compatibility needs --compatibility MODE")
            set_compatibility(grid, args.stream, args.compatibility)
            mode = None
        else:
            mode = args.compatibility
            subject = get_subject(grid, args.stream)
            if subject is not None and mode == subject.compatibility:
                mode = None
        version = register_schema(grid, args.stream, text, compatibility=mode)
    out(f"stream {args.stream}: schema version {version.version} (fingerprint {version.fingerprint})")
    return EXIT_OK


def run_list(args: argparse.Namespace) -> int:
    from meteor_spark.grid.schemas import list_subjects

    with Grid(config_of(args).grid) as grid:
        subjects = list_subjects(grid)
    if args.json:
        out(json.dumps([json.loads(s.to_json()) for s in subjects], indent=2))
        return EXIT_OK
    rows = [
        [
            s.stream,
            s.compatibility,
            str(len(s.versions)),
            str(s.latest.version),
            s.latest.fingerprint,
            fmt_time_ms(s.latest.registered_at_ms),
        ]
        for s in subjects
    ]
    out(render_table(["stream", "compatibility", "versions", "latest", "fingerprint", "registered"], rows))
    return EXIT_OK


def run_show(args: argparse.Namespace) -> int:
    from meteor_spark.format.avro import spark_ddl
    from meteor_spark.grid.schemas import require_subject

    with Grid(config_of(args).grid) as grid:
        subject = require_subject(grid, args.stream, "meteor schemas show")
    chosen = subject.latest if args.version is None else subject.version(args.version)
    if args.json:
        document = {**chosen.to_dict(), "schema": chosen.schema.json, "compatibility": subject.compatibility}
        out(json.dumps(document, indent=2))
        return EXIT_OK
    out(f"stream {subject.stream}: version {chosen.version} of {subject.latest.version} ({subject.compatibility})")
    out(f"fingerprint {chosen.fingerprint}, registered {fmt_time_ms(chosen.registered_at_ms)}")
    out(json.dumps(chosen.schema.json, indent=2))
    try:
        out(f"Spark value type: {spark_ddl(chosen.schema)}")
    except ConfigError as exc:
        out(f"Spark value type: none ({exc})")
    return EXIT_OK


def run_check(args: argparse.Namespace) -> int:
    from meteor_spark.grid.schemas import check_schema

    text = _schema_text(args.file)
    with Grid(config_of(args).grid) as grid:
        problems = check_schema(grid, args.stream, text, args.compatibility)
    if not problems:
        out(f"stream {args.stream}: compatible")
        return EXIT_OK
    for problem in problems:
        err(f"incompatible: {problem}")
    return EXIT_FAILURE
