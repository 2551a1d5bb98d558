"""``meteor bench sizes``: how the core's cost grows with the work, next to the grid's own ingest in the same run.

Two sweeps, each against an embedded grid in its own process, with the publisher's default settings (unless flags
override them):

- record size (100 B, 1 KiB, 10 KiB, 64 KiB): one publisher on a 1-lane stream, ``publish_many`` (lists of up to
  10,000 records) and ``publish_async`` (one record a call, futures dropped; the same records, at most 250,000:
  ``sizes_measure.async_records``), then one subscriber reading every ``publish_many`` record as ``Record``
  objects. Ceiling: raw ``add_all`` of the same ring items (encoded beforehand: same records per item, same items
  per call as the publisher's settings cut them), one call in flight, as the publisher does per lane;
- lanes (1, 2, 4, 8) at one record size (100 B by default): one publisher's ``publish_many`` over the lanes and one
  subscriber reading them all; keyless values, and with ``--keyed`` also keyed records (4,096 distinct keys, so
  every lane gets some of each call). Ceiling: raw ``add_all`` of the same items to that many rings, one call in
  flight per ring. Each lane count is also compared with 1 lane (``vs 1 lane``), the lane counts measured in
  alternation, round after round (``best_of_rounds``). ``--lanes-only`` skips the size sweep.

The size sweep runs every side of every size in a fresh client process per run (``sizes_fresh``: what a new
process sees, minor page faults counted; ``--allocator both`` also without the allocator settings of
``meteor_spark.allocator``); ``--warm`` measures it in this one process instead, as the lane sweep always is.
Every figure is the best of ``--repeats`` runs (the machine may be shared). Ratios are ours / ceiling. Values are
random bytes (LZ4 cannot shrink them). ``--plot FILE`` writes a PNG of both sweeps (needs matplotlib: the
``notebook`` extra).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from meteor_spark.bench import check_at_least_one
from meteor_spark.bench.harness import best_of_rounds
from meteor_spark.bench.sizes_fresh import ALLOCATOR_MODES
from meteor_spark.bench.sizes_fresh import size_points as fresh_size_points
from meteor_spark.bench.sizes_measure import (
    MB,
    Shape,
    async_records,
    best_seconds,
    ceiling_rate,
    consume,
    publish_async,
    publish_many,
    records_for,
    stream_for,
    unique_name,
    value_pool,
)
from meteor_spark.errors import ConfigError
from meteor_spark.format.records import Record
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.streams import StreamConfig
from meteor_spark.groups.admin import delete_stream
from meteor_spark.producer.batching import PublisherSettings
from meteor_spark.server import EmbeddedGrid
from meteor_spark.tables import render_table

SIZES = (100, 1024, 10 * 1024, 64 * 1024)
LANES = (1, 2, 4, 8)
#: Distinct keys of the keyed lane sweep.
KEYS = 4096


@dataclass(frozen=True)
class SizesBenchOptions:
    """One run's sizes (``--quick`` shrinks everything to seconds) and the publisher overrides."""

    sizes: tuple[int, ...]
    lanes: tuple[int, ...]
    megabytes: int
    max_records: int
    lane_record_bytes: int
    repeats: int
    plot: str | None
    max_batch_records: int | None
    max_batch_bytes: int | None
    max_call_bytes: int | None
    keyed: bool = False
    lanes_only: bool = False
    linger_ms: float | None = None
    warm: bool = False
    allocator: str = "tuned"

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> SizesBenchOptions:
        quick = bool(getattr(args, "quick", False))
        options = cls(
            sizes=tuple(args.sizes) if args.sizes else SIZES,
            lanes=tuple(args.lanes) if args.lanes else LANES,
            megabytes=_given(args.megabytes, 4 if quick else 100),
            max_records=_given(args.max_records, 20_000 if quick else 1_000_000),
            lane_record_bytes=args.lane_record_bytes,
            repeats=_given(args.repeats, 1 if quick else 3),
            plot=args.plot,
            max_batch_records=args.max_batch_records,
            max_batch_bytes=args.max_batch_bytes,
            max_call_bytes=args.max_call_bytes,
            keyed=bool(getattr(args, "keyed", False)),
            lanes_only=bool(getattr(args, "lanes_only", False)),
            linger_ms=getattr(args, "linger_ms", None),
            warm=bool(getattr(args, "warm", False)),
            allocator=getattr(args, "allocator", None) or "tuned",
        )
        check_at_least_one(options, ("megabytes", "max_records", "lane_record_bytes", "repeats"))
        if any(size < 1 for size in options.sizes):
            raise ConfigError(f"--sizes must be >= 1 byte each, got {list(options.sizes)}")
        if any(not 1 <= lanes <= 64 for lanes in options.lanes):
            raise ConfigError(f"--lanes must be 1..64 each, got {list(options.lanes)}")
        if options.allocator not in ALLOCATOR_MODES or (options.warm and options.allocator != "tuned"):
            raise ConfigError(
                f"--allocator must be one of {', '.join(ALLOCATOR_MODES)} (and only tuned with --warm: a warm process "
                f"has set its allocator already), got {options.allocator!r}"
            )
        options.publisher_settings()  # the overrides are validated once, here
        return options

    def publisher_overrides(self) -> dict[str, Any]:
        """The publisher settings given on the command line (the rest are the defaults)."""
        given = {
            "max_batch_records": self.max_batch_records,
            "max_batch_bytes": self.max_batch_bytes,
            "max_call_bytes": self.max_call_bytes,
            "linger_ms": self.linger_ms,
        }
        return {name: value for name, value in given.items() if value is not None}

    def publisher_settings(self) -> PublisherSettings:
        return replace(PublisherSettings(), **self.publisher_overrides())


def _given(value: int | None, default: int) -> int:
    return default if value is None else value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="small sizes (seconds): 4 MB per size, one repeat")
    parser.add_argument("--sizes", type=int, nargs="+", help="record sizes in bytes (default 100 1024 10240 65536)")
    parser.add_argument("--lanes", type=int, nargs="+", help="lane counts of the lane sweep (default 1 2 4 8)")
    parser.add_argument(
        "--keyed", action="store_true", help="the lane sweep also publishes keyed records (4,096 distinct keys)"
    )
    parser.add_argument("--lanes-only", action="store_true", help="run the lane sweep only (no record-size sweep)")
    parser.add_argument(
        "--megabytes", type=int, default=None, help="MB published per size and lane count (default 100)"
    )
    parser.add_argument("--max-records", type=int, default=None, help="records per run at most (default 1M)")
    parser.add_argument(
        "--lane-record-bytes", type=int, default=100, help="record size of the lane sweep (default 100)"
    )
    parser.add_argument("--repeats", type=int, default=None, help="runs per figure, the best kept (default 3)")
    parser.add_argument("--plot", metavar="FILE", default=None, help="write a PNG of both sweeps (needs matplotlib)")
    parser.add_argument(
        "--max-batch-records", type=int, default=None, help="publisher override (default: the stream's, 1000)"
    )
    parser.add_argument(
        "--max-batch-bytes", type=int, default=None, help="publisher override (default: the stream's, 1 MiB)"
    )
    parser.add_argument("--max-call-bytes", type=int, default=None, help="publisher override (default 1 MiB)")
    parser.add_argument(
        "--linger-ms", type=float, default=None, help="publisher override (default: the stream's, 0 = send at once)"
    )
    parser.add_argument(
        "--warm",
        action="store_true",
        help="measure the size sweep in this one (warm) process instead of a fresh process per side and run",
    )
    parser.add_argument(
        "--allocator",
        default="tuned",
        help="size sweep: tuned (the allocator settings, the default), off (METEOR_MALLOC_TUNING=off) or both",
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    options = SizesBenchOptions.from_args(args)
    if options.plot:
        _pyplot()  # fail before minutes of measuring, not after
    settings = options.publisher_settings()
    figures: dict[str, Any] = {
        "settings": {
            "max_batch_records": settings.max_batch_records,
            "max_batch_bytes": settings.max_batch_bytes,
            "max_call_bytes": settings.max_call_bytes,
            "max_items_per_call": settings.max_items_per_call,
            "linger_ms": settings.linger_ms,
            "repeats": options.repeats,
        },
    }
    figures["settings"]["process"] = "warm" if options.warm else "fresh"
    with EmbeddedGrid(port=0, process=True) as member:
        grid_settings = GridSettings(members=(member.address,), cluster_name=member.cluster_name)
        sizes = () if options.lanes_only else options.sizes
        if not options.warm:
            modes = (True, False) if options.allocator == "both" else (options.allocator == "tuned",)
            figures["sizes"] = [point for size in sizes for point in fresh_size_points(options, size, modes)]
        with Grid(grid_settings) as grid:
            if options.warm:
                figures["sizes"] = [_size_point(grid, options, settings, size) for size in sizes]
            figures["lanes"] = _lane_sweep(grid, options, settings)
    if options.plot:
        plot(figures, options.plot)
        figures["plot"] = options.plot
    return figures


def _size_point(grid: Grid, options: SizesBenchOptions, settings: PublisherSettings, size: int) -> dict[str, Any]:
    n = records_for(options, size)
    n_async = async_records(n)
    values = value_pool(size, n)
    shape = Shape.of(settings, size)
    overrides = options.publisher_overrides()
    ceiling = ceiling_rate(grid, values, shape, 1, options.repeats)
    consumed: list[float] = []

    def many() -> float:
        stream = stream_for("many", 1, n, shape)
        try:
            elapsed = publish_many(grid, stream, overrides, values)
            consumed.append(consume(grid, stream.name, n))
            return elapsed
        finally:
            delete_stream(grid, stream.name)

    def one_by_one() -> float:
        stream = StreamConfig(unique_name("async"), capacity=1000)  # overwritten: nobody reads it
        try:
            return publish_async(grid, stream, overrides, values[:n_async])
        finally:
            delete_stream(grid, stream.name)

    many_s = best_seconds(options.repeats, many)
    async_s = best_seconds(options.repeats, one_by_one)
    return {
        "record_bytes": size,
        "records": n,
        "records_per_item": shape.records_per_item,
        "items_per_call": shape.items_per_call,
        "ceiling_records_s": ceiling,
        "publish_many_records_s": n / many_s,
        "publish_async_records": n_async,
        "publish_async_records_s": n_async / async_s,
        "consume_records_s": n / min(consumed),
    }


def _lane_sweep(grid: Grid, options: SizesBenchOptions, settings: PublisherSettings) -> list[dict[str, Any]]:
    """Every lane count (keyless, and keyed with ``--keyed``) measured once per round, in turn, best of
    ``--repeats`` rounds: alternating the sides spreads the machine's noise over all of them."""
    size = options.lane_record_bytes
    n = records_for(options, size)
    values = value_pool(size, n)
    shape = Shape.of(settings, size)
    overrides = options.publisher_overrides()
    kinds: dict[str, list[Any]] = {"keyless": values}
    if options.keyed:
        kinds["keyed"] = [Record(value, key=b"key-%d" % (i % KEYS)) for i, value in enumerate(values)]

    def side(lanes: int, records: list[Any]) -> Callable[[], dict[str, float]]:
        def measure() -> dict[str, float]:
            stream = stream_for("lanes", lanes, n, shape)
            try:
                elapsed = publish_many(grid, stream, overrides, records)
                return {"publish_many_records_s": n / elapsed, "consume_records_s": n / consume(grid, stream.name, n)}
            finally:
                delete_stream(grid, stream.name)

        return measure

    sides = {(kind, lanes): side(lanes, records) for kind, records in kinds.items() for lanes in options.lanes}
    best = best_of_rounds(options.repeats, {f"{kind} {lanes}": measure for (kind, lanes), measure in sides.items()})
    points = []
    for kind, lanes in sides:
        ceiling = ceiling_rate(grid, values, shape, lanes, options.repeats)
        points.append(
            {"lanes": lanes, "keyed": kind == "keyed", "record_bytes": size, "records": n, "ceiling_records_s": ceiling}
            | best[f"{kind} {lanes}"]
        )
    return points


# ------------------------------------------------------------------------------------------------ output


def size_label(size: int) -> str:
    """``100 B``, ``1 KiB``, ``64 KiB``, ``1.5 MiB``."""
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.3g} {unit}"
    return f"{size} B"


def _mbs(point: dict[str, Any], key: str) -> float:
    return float(point[key] * point["record_bytes"] / MB)


def render(figures: dict[str, Any]) -> str:
    """The figures of ``run`` as the tables ``meteor bench sizes`` prints."""
    settings = figures["settings"]
    notes = [
        f"publisher settings: max_batch_records={settings['max_batch_records']:,}, max_batch_bytes="
        f"{settings['max_batch_bytes']:,}, max_call_bytes={settings['max_call_bytes']:,}, max_items_per_call="
        f"{settings['max_items_per_call']}, linger_ms={settings.get('linger_ms', 0.0):g}; best of "
        f"{settings['repeats']} run(s) per figure",
        "record-size sweep: "
        + (
            "measured in this one warm process (--warm)"
            if settings.get("process") == "warm"
            else "every side in a fresh client process per run, against a member process of its own warmed by as "
            "many bytes written and dropped (the allocator column: meteor_spark.allocator's settings applied, or "
            "METEOR_MALLOC_TUNING=off); minor faults and client CPU (all its threads, per MB moved): the fastest "
            "run's, while timed; the member's: over that run's whole client process"
        )
        + "; lane sweep: one warm process",
        "ratios: ours / raw add_all of the same ring items in the same calls (encoded beforehand), one call in "
        "flight per ring, measured in the same run",
        *_async_note(figures["sizes"]),
    ]
    if "plot" in figures:
        notes.append(f"plot written to {figures['plot']}")
    tables = [_sizes_table(figures["sizes"]), ""] if figures["sizes"] else []
    return "\n".join([*tables, _lanes_table(figures["lanes"]), *notes])


def _async_note(points: list[dict[str, Any]]) -> list[str]:
    """Where ``publish_async`` published fewer records than the other sides (every run pays a start-up)."""
    fewer = [p for p in points if p.get("publish_async_records", p["records"]) < p["records"]]
    if not fewer:
        return []
    published = ", ".join(
        f"{p['publish_async_records']:,} of {p['records']:,} records at {size_label(p['record_bytes'])}" for p in fewer
    )
    return [f"publish_async published {published} (one record a call); that run pays its start-up over fewer bytes"]


_SIDE_ORDER = ("ceiling", "publish_many", "publish_async", "consume")


def _per_side(figures: dict[str, Any] | None, form: str) -> str:
    """A figure per side, raw / many / async / subscriber (``-`` when not measured)."""
    return "-" if not figures else " / ".join(format(figures[side], form) for side in _SIDE_ORDER)


def _sizes_table(points: list[dict[str, Any]]) -> str:
    """The record-size sweep: MB/s and records/s per path, ratios against raw add_all."""
    rows: list[tuple[str, ...]] = []
    for p in points:
        ceiling = p["ceiling_records_s"]
        rows.append(
            (
                size_label(p["record_bytes"]),
                p.get("allocator", "warm"),
                f"{p['records_per_item']:,} x {p['items_per_call']}",
                f"{_mbs(p, 'ceiling_records_s'):,.0f} MB/s ({ceiling:,.0f}/s)",
                f"{_mbs(p, 'publish_many_records_s'):,.0f} MB/s ({p['publish_many_records_s']:,.0f}/s)",
                f"{p['publish_many_records_s'] / ceiling:.2f}",
                f"{_mbs(p, 'publish_async_records_s'):,.0f} MB/s ({p['publish_async_records_s']:,.0f}/s)",
                f"{p['publish_async_records_s'] / ceiling:.2f}",
                f"{_mbs(p, 'consume_records_s'):,.0f} MB/s ({p['consume_records_s']:,.0f}/s)",
                _per_side(p.get("minor_faults"), ","),
                _per_side(p.get("cpu_ms_per_mb"), ".2f"),
                _per_side(p.get("member_minor_faults"), ","),
                _per_side(p.get("member_cpu_ms_per_mb"), ".2f"),
            )
        )
    return render_table(
        (
            "record",
            "allocator",
            "rec/item x items/call",
            "ceiling: raw add_all",
            "publish_many",
            "ratio",
            "publish_async",
            "ratio",
            "one subscriber, Records",
            "minor faults: raw / many / async / subscriber",
            "client CPU ms/MB: raw / many / async / subscriber",
            "member minor faults",
            "member CPU ms/MB",
        ),
        rows,
    )


def _lanes_table(points: list[dict[str, Any]]) -> str:
    """The lane sweep: records/s and MB/s per path, publish_many against raw add_all, and each lane count against
    1 lane of the same kind (keyless or keyed) when the sweep has it."""
    one = {p["keyed"]: p for p in points if p["lanes"] == 1}
    rows: list[tuple[str, ...]] = []
    for p in points:
        ceiling = p["ceiling_records_s"]
        base = one.get(p["keyed"])

        def versus(key: str, point: dict[str, Any] = p, base: dict[str, Any] | None = base) -> str:
            return "-" if base is None else f"{point[key] / base[key]:.2f}"

        rows.append(
            (
                str(p["lanes"]),
                "keyed" if p["keyed"] else "keyless",
                f"{ceiling:,.0f}/s ({_mbs(p, 'ceiling_records_s'):,.0f} MB/s)",
                f"{p['publish_many_records_s']:,.0f}/s ({_mbs(p, 'publish_many_records_s'):,.0f} MB/s)",
                f"{p['publish_many_records_s'] / ceiling:.2f}",
                versus("publish_many_records_s"),
                f"{p['consume_records_s']:,.0f}/s ({_mbs(p, 'consume_records_s'):,.0f} MB/s)",
                versus("consume_records_s"),
            )
        )
    lane_bytes = points[0]["record_bytes"] if points else 0
    return render_table(
        (
            f"lanes ({size_label(lane_bytes)} records)",
            "records",
            "ceiling: raw add_all",
            "publish_many",
            "ratio",
            "vs 1 lane",
            "one subscriber, Records",
            "vs 1 lane",
        ),
        rows,
    )


def _pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend, or ``ConfigError`` saying how to install it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as pyplot
    except ImportError:
        raise ConfigError(
            "--plot needs matplotlib: pip install 'meteor-spark[notebook]' (or pip install matplotlib)"
        ) from None
    return pyplot


def plot(figures: dict[str, Any], path: str) -> None:
    """Write a PNG of both sweeps: MB/s by record size, records/s by lane count, each with its ceiling."""
    pyplot = _pyplot()
    fig, (by_size, by_lanes) = pyplot.subplots(1, 2, figsize=(12, 4.5))
    sizes = [p["record_bytes"] for p in figures["sizes"]]
    for key, label, style in (
        ("ceiling_records_s", "ceiling: raw add_all", "k--"),
        ("publish_many_records_s", "publish_many", "o-"),
        ("publish_async_records_s", "publish_async", "s-"),
        ("consume_records_s", "one subscriber (Records)", "^-"),
    ):
        by_size.plot(sizes, [_mbs(p, key) for p in figures["sizes"]], style, label=label)
    by_size.set_xscale("log")
    by_size.set_xticks(sizes, [size_label(s) for s in sizes])
    by_size.set_xlabel("record size")
    by_size.set_ylabel("MB/s")
    by_size.set_title("one publisher, one lane")
    by_size.legend()
    keyless = [p for p in figures["lanes"] if not p["keyed"]]
    lanes = [p["lanes"] for p in keyless]
    for key, label, style in (
        ("ceiling_records_s", "ceiling: raw add_all", "k--"),
        ("publish_many_records_s", "publish_many", "o-"),
        ("consume_records_s", "one subscriber (Records)", "^-"),
    ):
        by_lanes.plot(lanes, [p[key] for p in keyless], style, label=label)
    by_lanes.set_xticks(lanes)
    by_lanes.set_xlabel("lanes")
    by_lanes.set_ylabel("records/s")
    record_bytes = keyless[0]["record_bytes"] if keyless else 0
    by_lanes.set_title(f"one publisher, {size_label(record_bytes)} keyless records")
    by_lanes.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    pyplot.close(fig)
