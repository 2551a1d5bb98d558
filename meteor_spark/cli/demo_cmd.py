"""``meteor demo``: the main job on this machine (embedded grid + Spark), in about half a minute."""

from __future__ import annotations

import argparse
from typing import Any

from meteor_spark.cli.common import EXIT_FAILURE, EXIT_OK, config_parent, out


def register(commands: Any, parent: argparse.ArgumentParser) -> None:
    from meteor_spark.cli.demo_orders import DEFAULTS

    demo = commands.add_parser(
        "demo",
        parents=[config_parent()],
        help="run the whole thing here: grid, publisher, a Spark streaming query reading as a group",
        description=(
            "Start an embedded grid in its own process, publish a stream of shop orders (JSON, keyed by customer, "
            "with event times) in the background, and run a Spark Structured Streaming query that reads them as a "
            "subscriber group, parses the JSON, sums orders and revenue per category over one-minute event-time "
            "windows (with a watermark) and writes the results back into a second stream. Live progress shows "
            "records/s and the group's lag per lane; a summary checks every window against what was published. "
            "Everything is stopped at the end, also on Ctrl-C."
        ),
    )
    demo.add_argument(
        "--records", type=int, default=DEFAULTS.records, help=f"orders to publish (default {DEFAULTS.records:,})"
    )
    demo.add_argument(
        "--lanes", type=int, default=DEFAULTS.lanes, help=f"lanes of the stream (default {DEFAULTS.lanes})"
    )
    demo.add_argument(
        "--seconds",
        type=float,
        default=DEFAULTS.seconds,
        help=f"spread publishing over this many seconds (default {DEFAULTS.seconds:g})",
    )
    demo.add_argument(
        "--minutes",
        type=int,
        default=DEFAULTS.shop_minutes,
        help=f"minutes of shop time the orders cover, one window each (default {DEFAULTS.shop_minutes})",
    )
    demo.add_argument(
        "--timeout",
        type=float,
        default=DEFAULTS.timeout_s,
        help=f"give up when the results are not complete after this many seconds (default {DEFAULTS.timeout_s:g})",
    )
    demo.add_argument("--quiet", action="store_true", help="no live progress lines, only the summary")
    demo.set_defaults(run=run_demo)


def run_demo(args: argparse.Namespace) -> int:
    from meteor_spark.cli.demo import DemoOptions, run
    from meteor_spark.cli.demo_summary import render_summary

    options = DemoOptions(
        records=args.records,
        lanes=args.lanes,
        seconds=args.seconds,
        shop_minutes=args.minutes,
        timeout_s=args.timeout,
        live=not args.quiet,
    )
    summary = run(options)
    out(render_summary(summary))
    return EXIT_OK if summary.ok else EXIT_FAILURE
