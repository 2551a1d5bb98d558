"""The ``meteor`` command: entry point, parser, and the one place user errors become a line on stderr."""

from __future__ import annotations

import argparse
import logging
import sys
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from meteor_spark import __version__
from meteor_spark.cli import (
    bench_cmd,
    console_cmd,
    demo_cmd,
    dlq_cmd,
    grid_cmd,
    groups_cmd,
    publish_cmd,
    schemas_cmd,
    streams_cmd,
    tail_cmd,
    trace_cmd,
)
from meteor_spark.cli.common import (
    EXIT_FAILURE,
    EXIT_OK,
    CommandError,
    Terminated,
    connection_parent,
    err,
    interrupted_code,
    sigterm_interrupts,
)
from meteor_spark.errors import MeteorError

logger = logging.getLogger(__name__)

DESCRIPTION = """\
meteor-spark: Kafka-like streams inside a Hazelcast grid, for Python and Spark.

Commands talk to the grid at 127.0.0.1:5701 (cluster 'dev') unless told otherwise by flags, environment
variables or a TOML file (--config, $METEOR_CONFIG; its keys: docs/configuration.md).
"""

EPILOG = """\
examples:
  meteor demo                                   the whole thing on this machine: grid + Spark, ~30 s
  meteor grid start                             run an embedded grid on 127.0.0.1:5701 (Ctrl-C stops it)
  meteor streams create orders --lanes 4
  meteor publish orders events.jsonl --key-field user_id
  meteor tail orders --from earliest --max 10
  meteor groups orders
  meteor dlq list orders-dlq                    dead letters by source and error; `dlq redrive` sends them back
  meteor trace orders --key user-7              where a key's records are and what became of them
  meteor console                                a web console on http://127.0.0.1:8321/ (read-only)
  meteor bench all --quick

`meteor COMMAND --help` shows each command's flags.
"""


def build_parser() -> argparse.ArgumentParser:
    """The full ``meteor`` parser (also used to generate the CLI reference, docs/cli.md)."""
    parent = connection_parent()
    parser = argparse.ArgumentParser(
        prog="meteor",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[parent],
    )
    parser.add_argument("--version", action="version", version=f"meteor-spark {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    commands.required = True
    for module in (
        grid_cmd,
        streams_cmd,
        publish_cmd,
        tail_cmd,
        groups_cmd,
        dlq_cmd,
        trace_cmd,
        console_cmd,
        bench_cmd,
        demo_cmd,
    ):
        module.register(commands, parent)
    schemas_cmd.register(commands, parent)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``meteor`` with ``argv`` (default: ``sys.argv[1:]``) and return its exit code.

    User mistakes (unreachable grid, unknown stream, bad values, a bad command line) print on stderr and return 1
    (argparse's own 2 is folded into it: one exit code for every user error); ``--help``/``--version`` return 0;
    Ctrl-C returns 130, SIGTERM 143 (after the same clean-up). ``--debug`` adds debug logging and tracebacks.
    """
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(list(sys.argv[1:] if argv is None else argv))
        if extra and not getattr(args, "extra_args", False):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as exc:  # argparse exits on --help/--version (0) and on usage errors (2)
        return EXIT_OK if exc.code in (0, None) else EXIT_FAILURE
    args.extra = extra  # handed to commands that parse their own flags (meteor bench AREA)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what a command shows to resume (meteor publish)
    debug = bool(getattr(args, "debug", False))
    with _cli_logging(debug), sigterm_interrupts():
        try:
            return int(args.run(args))
        except (MeteorError, CommandError) as exc:
            if debug:
                traceback.print_exc()
            err(f"meteor {args.command}: error: {exc}")
            return EXIT_FAILURE
        except ModuleNotFoundError as exc:
            if exc.name != "pyspark":  # a missing optional extra is a user's fix; anything else is a bug
                raise
            if debug:
                traceback.print_exc()
            err(f"meteor {args.command}: error: {exc.msg}")
            return EXIT_FAILURE
        except KeyboardInterrupt as exc:
            err(f"meteor {args.command}: {'terminated' if isinstance(exc, Terminated) else 'interrupted'}")
            return interrupted_code(exc)


@contextmanager
def _cli_logging(debug: bool) -> Iterator[None]:
    """Logging for one command, undone afterwards (``main`` also runs inside other programs and tests).

    The application, not the library, decides levels: warnings stay visible; the hazelcast client's routine
    connection chatter (and its retry warnings while a grid is unreachable) would bury the one-line error.
    """
    root = logging.getLogger()
    quiet = logging.getLogger("hazelcast")
    saved = (root.level, quiet.level)
    handler: logging.Handler | None = None
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
    root.setLevel(logging.DEBUG if debug else logging.WARNING)
    quiet.setLevel(logging.DEBUG if debug else logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(saved[0])
        quiet.setLevel(saved[1])
        if handler is not None:
            root.removeHandler(handler)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
