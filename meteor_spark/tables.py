"""Plain-text tables: the one renderer behind the ``meteor`` commands, the demo's summary and the benchmarks.

Kept out of ``meteor_spark.cli`` so the demo and the benchmarks can render their figures without importing the
command-line layer (dependencies point from the CLI down, never up).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def render_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, right: Sequence[int] = ()) -> str:
    """A plain-text table: columns padded to their widest cell; ``right`` lists right-aligned column indexes
    (numbers). ``None`` cells render empty."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]

    def line(row: list[str]) -> str:
        parts = [cell.rjust(widths[i]) if i in right else cell.ljust(widths[i]) for i, cell in enumerate(row)]
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), rule] + [line(row) for row in cells[1:]])
