"""The rebalance rows of ``meteor bench groups``: how long a member joining an exclusive group waits for its lanes.

A 16-lane stream on the bench's grid; for 2, 4 and 8 members, ``members - 1`` grouped ``Subscriber`` objects (the
group's default lease, 5 s: renewals every 1.67 s) hold the lanes balanced over them; then the clock starts, one
more ``Subscriber`` is created, and the clock stops when that member holds its fair share (``balance`` over every
member's id). Each count is run ``rounds`` times on a fresh group; the table shows the median and the worst, and
their ratio to the renewal period (what a join cost when lanes moved only at the holders' next renewal).

The members are objects in this one process (each with its background thread), on one grid client: what is
measured is the group protocol's handover (announce, release, take, fence), not process start-up.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.grid.client import Grid
from meteor_spark.grid.streams import StreamConfig, open_stream
from meteor_spark.groups.admin import delete_stream, group_state
from meteor_spark.groups.balancing import balance
from meteor_spark.tables import render_table

REBALANCE_LANES = 16
#: The group's default lease: renewals (the old handover point) every lease / 3.
REBALANCE_LEASE_MS = 5000
_BALANCE_TIMEOUT_S = 60.0


def _holds_share(joiner: Subscriber, members: list[Subscriber]) -> bool:
    target = balance([m.member.member_id for m in members], REBALANCE_LANES)[joiner.member.member_id]
    return set(joiner.member.assignment()) == target


def _wait(condition: Any, what: str) -> None:
    deadline = time.monotonic() + _BALANCE_TIMEOUT_S
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not happen within {_BALANCE_TIMEOUT_S:.0f} s")
        time.sleep(0.002)


def _one_join(grid: Grid, stream: str, members: int) -> float:
    """Seconds from creating the ``members``-th subscriber until it holds its fair share of the lanes."""
    group = f"bench-rebalance-{members}-{time.time_ns()}"
    info = open_stream(grid, stream)
    subs: list[Subscriber] = []
    try:
        for _ in range(members - 1):
            subs.append(Subscriber(grid, stream, group=group, lease_ms=REBALANCE_LEASE_MS))
        _wait(
            lambda: (
                all(_holds_share(sub, subs) for sub in subs)
                and all(state.holder is not None for state in group_state(grid, info, group))
            ),
            f"{members - 1} members balancing group {group!r}",
        )
        start = time.perf_counter()
        joiner = Subscriber(grid, stream, group=group, lease_ms=REBALANCE_LEASE_MS)
        subs.append(joiner)
        _wait(lambda: _holds_share(joiner, subs), f"the joiner of group {group!r} taking its lanes")
        return time.perf_counter() - start
    finally:
        for sub in subs:
            sub.close()


def measure(grid: Grid, name: str, members: tuple[int, ...], rounds: int) -> dict[str, Any]:
    """Join times (ms) per member count on a fresh 16-lane stream ``name`` (deleted afterwards)."""
    open_stream(grid, StreamConfig(name, lanes=REBALANCE_LANES))
    out: dict[str, Any] = {"lanes": REBALANCE_LANES, "renew_ms": REBALANCE_LEASE_MS / 3, "members": {}}
    try:
        for count in members:
            out["members"][str(count)] = [_one_join(grid, name, count) * 1000 for _ in range(rounds)]
    finally:
        delete_stream(grid, name)
    return out


def render(figures: dict[str, Any]) -> str:
    """The rebalance table of ``meteor bench groups``."""
    renew = figures["renew_ms"]
    rows = []
    for count, times in figures["members"].items():
        median, worst = statistics.median(times), max(times)
        rows.append(
            (
                f"{count} members, {figures['lanes']} lanes",
                f"{median:,.0f} ms",
                f"{worst:,.0f} ms",
                f"{median / renew:.2f} / {worst / renew:.2f}",
                "<= 500 ms",
            )
        )
    table = render_table(("a member joins", "median", "worst", "/ renewal (median / worst)", "target"), rows)
    rounds = max((len(times) for times in figures["members"].values()), default=0)
    return (
        f"{table}\nfrom creating the joining Subscriber until it holds its fair share; {rounds} round(s) each; "
        f"lease {REBALANCE_LEASE_MS} ms, renewal every {renew:,.0f} ms"
    )
