"""What the grid benchmarks share: an embedded member process of their own, and the best of several rounds.

Each bench measures against a member it starts itself (its own process, so the member's CPU is not the bench's),
and repeats its sides in alternation, keeping the best of each figure: a single round on a shared machine measures
the neighbours as much as the code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.server import EmbeddedGrid


@contextmanager
def bench_grid() -> Iterator[tuple[Grid, GridSettings]]:
    """A fresh embedded member process and a client of it (with its settings, for child processes); both end
    with the block."""
    server = EmbeddedGrid(port=0, process=True)
    server.start()
    settings = GridSettings(members=(server.address,), cluster_name=server.cluster_name)
    try:
        with Grid(settings) as grid:
            yield grid, settings
    finally:
        server.stop()


def best_of_rounds(
    rounds: int, sides: dict[str, Callable[[], dict[str, float]]], lowest: Callable[[str], bool] = lambda _: False
) -> dict[str, dict[str, float]]:
    """Run every side once per round, in turn, and keep each figure's best: the highest, or the lowest for the
    names ``lowest`` picks (durations)."""
    measured: dict[str, dict[str, list[float]]] = {side: {} for side in sides}
    for _ in range(rounds):
        for side, measure in sides.items():
            for name, value in measure().items():
                measured[side].setdefault(name, []).append(value)
    return {
        side: {name: (min(values) if lowest(name) else max(values)) for name, values in figures.items()}
        for side, figures in measured.items()
    }
