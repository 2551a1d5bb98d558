"""``meteor streams ensure``: create a stream, or check its stored configuration and refuse, warn or apply.

The declared configuration is whole: every ``StreamConfig`` setting can be given as a flag (``CONFIG_FLAGS``), the
rest come from the ``[stream]`` table of the TOML file, then from the library's defaults, and every one is compared
with the stored configuration (``meteor_spark.grid.ensure``). Exit codes: 0 when the stream was created, found
unchanged, changed (``apply``) or its differences reported (``warn``); 1 when a difference was refused (``error``,
or ``apply`` meeting a setting that cannot change: nothing is then written).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from meteor_spark.cli.common import EXIT_OK, config_of, out, render_table

if TYPE_CHECKING:
    from meteor_spark.grid.streams import StreamConfig

#: The ``StreamConfig`` fields ``ensure`` takes as flags: (flag, field, type, metavar, help).
CONFIG_FLAGS: tuple[tuple[str, str, type, str, str], ...] = (
    ("--lanes", "lanes", int, "N", "number of lanes (ring buffers); records with one key share a lane"),
    ("--capacity", "capacity", int, "ITEMS", "ring items kept per lane before the oldest are overwritten"),
    ("--backup-count", "backup_count", int, "N", "synchronous backup copies of each lane on other members"),
    ("--async-backup-count", "async_backup_count", int, "N", "asynchronous backup copies of each lane"),
    ("--ttl", "ttl_s", int, "SECONDS", "seconds a ring item lives (0 = until overwritten)"),
    ("--compression", "compression", str, "CODEC", "publishers' compression of record batches (lz4 or none)"),
    ("--compression-threshold", "compression_threshold", int, "BYTES", "compress an item only from this size on"),
    ("--max-batch-records", "max_batch_records", int, "N", "publishers' records per ring item at most"),
    ("--max-batch-bytes", "max_batch_bytes", int, "BYTES", "publishers' record bytes per ring item at most"),
    ("--linger-ms", "linger_ms", float, "MS", "publishers' wait for more records before sending a partial item"),
    ("--dedup-window-ms", "dedup_window_ms", int, "MS", "how long a message id stays taken (0 = no deduplication)"),
    ("--region", "region", str, "NAME", "the region the stream is recorded in (informational; docs/deploying.md)"),
    ("--value-format", "value_format", str, "FORMAT", "avro: a typed stream (values encoded with its schemas)"),
)


def register_ensure(actions: Any, parent: argparse.ArgumentParser) -> None:
    """Add ``ensure`` to ``meteor streams``' actions."""
    ensure = actions.add_parser(
        "ensure",
        parents=[parent],
        help="create a stream, or compare its stored configuration and refuse, warn about or apply differences",
        description=(
            "Create the stream if it is absent; if it exists, compare every setting of the declared configuration "
            "(these flags, then the [stream] table of the TOML file, then the library's defaults) with the stored "
            "one and print each difference with its fate. --on-difference error (default) refuses any difference; "
            "warn reports them and keeps the stored configuration; apply changes the publishers' batching defaults, "
            "the deduplication window and the region, and refuses (writing nothing) when lanes, capacity, backup "
            "counts, TTL or ephemeral differ. Exit code 0: created, unchanged, applied or warned; 1: refused."
        ),
    )
    ensure.add_argument("stream", help="stream name")
    add_config_flags(ensure)
    ensure.add_argument(
        "--on-difference",
        choices=("error", "warn", "apply"),
        default="error",
        help="what to do when the stored configuration differs (default error)",
    )
    ensure.set_defaults(run=run_ensure)


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """The ``StreamConfig`` flags of ``streams create`` and ``streams ensure``."""
    for flag, field, kind, metavar, text in CONFIG_FLAGS:
        parser.add_argument(flag, dest=field, type=kind, metavar=metavar, help=text)
    parser.add_argument(
        "--ephemeral",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="an at-most-once stream (topics, no acknowledgements) or, with --no-ephemeral, a persistent one",
    )


def declared_config(args: argparse.Namespace) -> StreamConfig:
    """The stream configuration the flags declare: the flags given, then the ``[stream]`` table, then defaults."""
    declared = {field: getattr(args, field) for _, field, *_ in CONFIG_FLAGS}
    return config_of(args).stream_defaults.config(args.stream, ephemeral=args.ephemeral, **declared)


def describe_config(config: StreamConfig) -> str:
    """One line of a stream's layout and its optional settings, as ``create`` and ``ensure`` print it."""
    return (
        f"{config.lanes} lane(s), capacity {config.capacity:,} items per lane, {config.backup_count} backup(s) + "
        f"{config.async_backup_count} async, compression {config.compression}"
        + (", ephemeral" if config.ephemeral else "")
        + (f", dedup window {config.dedup_window_ms:,} ms" if config.dedup_window_ms else "")
        + (f", region {config.region}" if config.region else "")
    )


def run_ensure(args: argparse.Namespace) -> int:
    from meteor_spark.errors import StreamConfigConflictError
    from meteor_spark.grid.client import Grid
    from meteor_spark.grid.ensure import ensure_stream

    config = config_of(args)
    stream_config = declared_config(args)
    with Grid(config.grid) as grid:
        try:
            result = ensure_stream(grid, stream_config, on_difference=args.on_difference)
        except StreamConfigConflictError as exc:
            if exc.differences:
                _show_differences(exc.differences)
            raise
    name = repr(stream_config.name)
    if result.outcome == "created":
        out(f"stream {name} created: {describe_config(stream_config)}")
    elif result.outcome == "unchanged":
        out(f"stream {name} unchanged: its stored configuration is the one declared")
    else:
        _show_differences(result.differences)
        count = len(result.differences)
        if result.outcome == "applied":
            out(f"stream {name}: {count} setting(s) applied; parties opening it from now on use them")
        else:
            out(f"stream {name}: {count} difference(s) reported; the stored configuration is kept")
    return EXIT_OK


def _show_differences(differences: tuple[Any, ...]) -> None:
    """A table of the differences (setting, stored, declared, fate), then each distinct reason once."""
    rows = [[d.field, repr(d.stored), repr(d.asked), d.fate] for d in differences]
    out(render_table(["SETTING", "STORED", "DECLARED", "FATE"], rows))
    for difference in differences:
        if difference.reason:
            out(f"  {difference.field}: {difference.fate}: {difference.reason}")
