"""The demo's verdict: every window Spark wrote checked against the publisher's tally, every lane's confirmed
offset against the lane's end (``summarise``), and the closing table (``render_summary``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from meteor_spark.cli.demo_orders import GROUP, ORDERS, RESULTS, OrderGenerator, PublishState, WindowResult, iso_ms
from meteor_spark.format.offsets import make_offset
from meteor_spark.grid.client import Grid
from meteor_spark.grid.streams import lane_bounds
from meteor_spark.groups.admin import group_state
from meteor_spark.tables import render_table


@dataclass(frozen=True)
class DemoSummary:
    """What the demo did and whether everything checked out.

    Attributes:
        published: orders published (the clock event not included).
        read: rows the query read from ``orders`` (orders + the clock event when complete).
        batches: micro-batches that read rows.
        windows_expected: (window, category) cells the publisher's tally has.
        windows_out: results the query wrote into ``order-stats``.
        mismatches: cells whose count or revenue differs from the tally, or that are missing.
        confirmed: lane -> the group's confirmed offset at the end.
        lane_ends: lane -> the offset after the last record of the lane.
        elapsed_s: wall time of the whole demo.
        ok: every order read, every window written and right, every lane confirmed to its end.
        last_window: the results of the last window as Spark wrote them, highest revenue first.
    """

    published: int
    read: int
    batches: int
    windows_expected: int
    windows_out: int
    mismatches: tuple[str, ...]
    confirmed: dict[int, int | None]
    lane_ends: dict[int, int]
    elapsed_s: float
    ok: bool
    last_window: tuple[WindowResult, ...] = ()


def summarise(
    state: PublishState,
    rows_by_batch: dict[int, int],
    generator: OrderGenerator,
    results: dict[tuple[int, str], WindowResult],
    grid: Grid,
    orders_info: Any,
    elapsed_s: float,
) -> DemoSummary:
    """Check what the query did (``rows_by_batch``: rows read per micro-batch; ``results``: the windows it wrote)
    against what the publisher did (``state``, ``generator.tally``) and against the group's confirmed offsets."""
    mismatches = window_mismatches(generator.tally.windows, results)
    confirmed = {s.lane: s.confirmed for s in group_state(grid, orders_info, GROUP)}
    lane_ends = {lane: make_offset(nxt, 0) for lane, (_head, nxt) in lane_bounds(grid, orders_info).items()}
    published = state.published
    read = sum(rows_by_batch.values())
    offsets_ok = all(confirmed.get(lane) == end for lane, end in lane_ends.items() if end > 0)
    last_start = max((start for start, _ in results), default=None)
    last_window = sorted((r for r in results.values() if r.window_start_ms == last_start), key=lambda r: -r.revenue)
    ok = (
        state.done
        and published == generator.options.records
        and read == published + 1
        and not mismatches
        and offsets_ok
    )
    return DemoSummary(
        published=published,
        read=read,
        batches=sum(1 for rows in rows_by_batch.values() if rows),
        windows_expected=len(generator.tally.windows),
        windows_out=len(results),
        mismatches=tuple(mismatches),
        confirmed=confirmed,
        lane_ends=lane_ends,
        elapsed_s=elapsed_s,
        ok=ok,
        last_window=tuple(last_window),
    )


def window_mismatches(
    tally: dict[tuple[int, str], list[float]], results: dict[tuple[int, str], WindowResult]
) -> list[str]:
    """Every (window, category) cell where Spark's result and the publisher's tally disagree, in words: missing,
    different count or revenue (a cent of rounding allowed), or written where nothing was published."""
    mismatches: list[str] = []
    for (start_ms, category), (count, revenue) in sorted(tally.items()):
        got = results.get((start_ms, category))
        where = f"window {iso_ms(start_ms)[11:16]} {category}"
        if got is None:
            mismatches.append(f"{where}: missing from {RESULTS!r}")
        elif got.orders != count or abs(got.revenue - revenue) > 0.011:
            mismatches.append(
                f"{where}: Spark says {got.orders} orders / {got.revenue:.2f}, published {count} / {revenue:.2f}"
            )
    for key in sorted(set(results) - set(tally)):
        mismatches.append(f"window {iso_ms(key[0])[11:16]} {key[1]}: in {RESULTS!r} but nothing was published there")
    return mismatches


def render_summary(summary: DemoSummary) -> str:
    """The closing summary of a demo run: what was published, read and written back, every lane's confirmed
    offset, the last window's results and the verdict."""
    lines: list[str] = []
    say = lines.append
    say("")
    say("summary")
    rows = [
        ["orders published", f"{summary.published:,}", f"+ 1 clock event, into {ORDERS!r}"],
        [
            "records read by Spark",
            f"{summary.read:,}",
            f"in {summary.batches} micro-batch{'es' if summary.batches != 1 else ''}, as group {GROUP!r}",
        ],
        [
            "windows written back",
            f"{summary.windows_out:,}",
            f"of {summary.windows_expected:,} expected, into {RESULTS!r}",
        ],
        [
            "windows checked",
            f"{summary.windows_expected - len(summary.mismatches):,}",
            "match; see the mismatches below" if summary.mismatches else "match the publisher's own count and revenue",
        ],
        ["elapsed", f"{summary.elapsed_s:.1f} s", "wall time, Spark start included"],
    ]
    say(render_table(["WHAT", "COUNT", "DETAIL"], rows, right=[1]))
    say("")
    lanes = []
    for lane, end in sorted(summary.lane_ends.items()):
        confirmed = summary.confirmed.get(lane)
        state = "at the end" if confirmed == end else ("nothing to read" if end == 0 else "BEHIND")
        lanes.append([lane, "-" if confirmed is None else f"{confirmed:,}", f"{end:,}", state])
    say(f"group {GROUP!r}: confirmed offsets (the next record the group will read; sequence << 16 | index)")
    say(render_table(["LANE", "CONFIRMED", "LANE END", "STATE"], lanes, right=[0, 1, 2]))
    if summary.last_window:
        say("")
        start_ms = summary.last_window[0].window_start_ms
        say(f"the last window, {iso_ms(start_ms)[11:16]} UTC, as Spark wrote it to {RESULTS!r}:")
        top: list[list[object]] = [[r.category, r.orders, f"{r.revenue:,.2f}"] for r in summary.last_window]
        say(render_table(["CATEGORY", "ORDERS", "REVENUE"], top, right=[1, 2]))
    say("")
    for problem in summary.mismatches[:10]:
        say(f"  mismatch: {problem}")
    if summary.ok:
        say("OK: every order was read, every window was written back and is right, and the group confirmed every lane.")
    else:
        say("NOT OK: see above. Run with --debug for the logs.")
    return "\n".join(lines)
