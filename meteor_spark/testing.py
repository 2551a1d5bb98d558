"""Helpers for tests (ours and users'): wait with a deadline instead of sleeping."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:  # pragma: no cover
    from meteor_spark.grid import Grid

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T], timeout_s: float = 10.0, interval_s: float = 0.01, message: str = ""
) -> T:
    """Poll ``predicate`` until it returns a truthy value or the deadline passes; return that value.

    Raises:
        AssertionError: the deadline passed; the message names what was awaited and the last value seen.
    """
    deadline = time.monotonic() + timeout_s
    last: T = predicate()
    while not last:
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout_s:g} s waiting for {message or predicate}; last value {last!r}"
            )
        time.sleep(interval_s)
        last = predicate()
    return last


def committed_values(grid: Grid, stream: str, timeout_s: float = 120.0) -> list[bytes]:
    """Every record value a ``read_committed`` reader delivers from ``stream`` (all lanes, from the oldest record)
    up to the lanes' ends as they are now, waiting for transactions still open there to be decided.

    Raises:
        AssertionError: the reader did not reach the ends within ``timeout_s``.
    """
    from meteor_spark.offsets import first_offset_of
    from meteor_spark.streams import lane_bounds, open_stream
    from meteor_spark.subscriber import Subscriber

    info = open_stream(grid, stream)
    ends = {lane: first_offset_of(end) for lane, (_, end) in lane_bounds(grid, info).items()}
    values: list[bytes] = []
    with Subscriber(grid, stream, initial_offset_scheme="earliest", isolation="read_committed") as sub:

        def caught_up() -> bool:
            values.extend(r.value for r in sub.poll(100))
            return all(sub.position(lane) >= end for lane, end in ends.items())

        wait_until(caught_up, timeout_s=timeout_s, message=f"a read_committed reader to reach the end of {stream!r}")
    return values
