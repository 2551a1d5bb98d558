"""Helpers for tests (ours and users'): wait with a deadline instead of sleeping."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

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
