"""``meteor bench grid|pubsub|spark|all``: the project's benchmarks in one place.

Each area is a module ``meteor_spark.bench.<area>`` with ``add_arguments(parser)``, ``run(args) -> dict`` (the
figures, each next to a ceiling measured in the same run) and ``render(figures) -> str`` (the table printed here).
Modules are imported only when their area runs (the Spark one starts a JVM), so their flags are parsed here by a
parser built on demand.
"""

from __future__ import annotations

import argparse
import importlib
import time
from types import ModuleType
from typing import Any

from meteor_spark.cli.common import EXIT_FAILURE, EXIT_OK, config_parent, err, out, render_table

AREAS: dict[str, str] = {
    "grid": "the embedded grid (--members: and a real cluster, side by side): 64 KiB ring items through "
    "add_all/read_many, small map get/put (MB/s, ops/s, p50/p99)",
    "pubsub": "the core: one publisher, 4 publishers x 16 subscribers, request/reply latency (records/s, p50/p99)",
    "aio": "the asyncio API vs the threaded one: publish throughput at 100 B and one-in-flight publish -> receive "
    "p50/p99, next to each client's raw add_all and round trip",
    "ephemeral": "ephemeral streams: publish -> consume with 1/4/16 matching entities (records/s, p50/p99), "
    "and dropping with none",
    "idempotence": "idempotent publishing's cost: publish_async, publish_many, short-lived publishers, on vs off",
    "dedup": "message-id deduplication windows' cost: publish_async and publish_many with ids vs without (records/s)",
    "sizes": "how cost grows: record sizes 100 B..64 KiB and lanes 1..8, next to raw add_all (MB/s, records/s)",
    "spark": "the connector: streaming read into noop and batch write, 1 vs 4 lanes (records/s vs a ceiling)",
    "groups": "group consumption, 2 lanes, 1/2/4 members: shared (poll + ack) vs exclusive (poll + confirm), "
    "records/s; rebalance after a join, 16 lanes, 2/4/8 members (ms)",
    "transactions": "the Spark sink transactional vs plain, read_committed vs read_uncommitted (records/s)",
    "soak": "a long transactional meteor -> meteor query: grid map sizes and member memory every --every batches, "
    "then lost/duplicated",
}


#: Top-level keys of an area's figures left out of the ``all`` summary.
SUMMARY_SKIPS = frozenset({"settings", "samples"})


def register(commands: Any, parent: argparse.ArgumentParser) -> None:
    bench = commands.add_parser(
        "bench",
        help="run the benchmarks (grid, pubsub, spark, all) and print their tables",
        description=(
            "Run a benchmark on this machine against an embedded grid it starts itself. Each prints throughput and "
            "latency next to a ceiling measured in the same run. `meteor bench AREA --help` shows the area's flags; "
            "--quick runs small sizes in seconds."
        ),
        epilog="\n".join(f"  {name:{max(map(len, AREAS))}s} {text}" for name, text in AREAS.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    areas = bench.add_subparsers(dest="area", metavar="AREA", title="areas")
    areas.required = True
    for name, text in AREAS.items():
        # add_help=False: --help and every area flag are handed to the area's own parser (built in run_area).
        area = areas.add_parser(name, help=text, add_help=False, parents=[config_parent()])
        area.set_defaults(run=run_area, extra_args=True)
    every = areas.add_parser(
        "all",
        help="run every area but the soak one after the other, then print a summary",
        parents=[config_parent()],
    )
    every.add_argument("--quick", action="store_true", help="small sizes: seconds per area instead of minutes")
    every.set_defaults(run=run_all)


def area_parser(name: str, module: ModuleType) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"meteor bench {name}", description=AREAS[name])
    module.add_arguments(parser)
    return parser


def _module(name: str) -> ModuleType:
    # Imported only when the area runs: the Spark one starts a JVM.
    return importlib.import_module(f"meteor_spark.bench.{name}")


def run_area(args: argparse.Namespace) -> int:
    module = _module(args.area)
    parser = area_parser(args.area, module)
    try:
        bench_args = parser.parse_args(list(getattr(args, "extra", [])))
    except SystemExit as exc:
        return EXIT_OK if exc.code in (0, None) else EXIT_FAILURE  # --help, or a usage error (exit 1, like main)
    out(module.render(module.run(bench_args)))
    return EXIT_OK


#: Areas ``all`` leaves out: the soak is a run of hours by design (10,000 micro-batches), started on its own.
NOT_IN_ALL = frozenset({"soak"})


def run_all(args: argparse.Namespace) -> int:
    summary: list[list[Any]] = []
    failed: list[str] = []
    for name in (area for area in AREAS if area not in NOT_IN_ALL):
        module = _module(name)
        bench_args = area_parser(name, module).parse_args(["--quick"] if args.quick else [])
        out(f"== meteor bench {name}{' --quick' if args.quick else ''}")
        started = time.monotonic()
        try:
            figures = module.run(bench_args)
            out(module.render(figures))
        except Exception as exc:  # one broken area must not hide the others' results
            err(f"meteor bench {name}: failed: {exc}")
            failed.append(name)
            continue
        out(f"   ({time.monotonic() - started:.1f} s)\n")
        # The run's settings and per-repeat samples are in each area's own table above; the summary keeps results.
        summary.extend([name, key, value] for key, value in flatten(figures) if key.split(".")[0] not in SUMMARY_SKIPS)
    if summary:
        out(render_table(["AREA", "FIGURE", "VALUE"], summary, right=[2]))
    if failed:
        err(f"meteor bench all: error: area(s) failed: {', '.join(failed)}")
        return EXIT_FAILURE
    return EXIT_OK


def flatten(figures: Any, prefix: str = "") -> list[tuple[str, str]]:
    """Nested figures as (dotted key, formatted number) rows, numbers only."""
    rows: list[tuple[str, str]] = []
    if isinstance(figures, dict):
        for key, value in figures.items():
            rows.extend(flatten(value, f"{prefix}{key}."))
    elif isinstance(figures, (list, tuple)):
        for index, value in enumerate(figures):
            rows.extend(flatten(value, f"{prefix}{index}."))
    elif isinstance(figures, bool):
        rows.append((prefix.rstrip("."), str(figures).lower()))
    elif isinstance(figures, (int, float)):
        rows.append((prefix.rstrip("."), f"{figures:,.0f}" if abs(figures) >= 100 else f"{figures:.3g}"))
    elif isinstance(figures, str):
        rows.append((prefix.rstrip("."), figures))
    return rows
