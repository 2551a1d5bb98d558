"""A shared member's grid calls as steps: one source of truth for the threaded and the asyncio member.

Every decision of a shared group (what to acquire, timeouts, delivery counts, dead letters, take-up checks) is
written once, in generators that *yield* each grid call as a zero-argument callable and receive its answer back.
A driver runs them (``meteor_spark.grid.steps``): ``drive`` calls each callable and sends the result in (the
threaded ``SharedSubscriber``); ``drive_async`` awaits what a callable returns when it is awaitable (the asyncio
member, whose map and rings are ``AsyncGridMap`` / ``AsyncRing``: the same method names, awaited). An error a call
raises is thrown into the generator at the yield, so the steps' own ``try`` blocks see it with either driver.

The composite reads the steps need are steps too: the oldest servable sequence of a ring is
``meteor_spark.grid.reading.oldest_steps`` (which ``oldest_in`` drives), and the item under a stored item mark is
written here over the pure parts of ``meteor_spark.grid.item_marks``.
"""

from __future__ import annotations

from typing import Any

from meteor_spark.grid.item_marks import ItemMark, verdict_of
from meteor_spark.grid.steps import Steps

__all__ = ["check_mark_steps"]


def check_mark_steps(ring: Any, mark: ItemMark) -> Steps[str]:
    """``meteor_spark.grid.item_marks.check_mark``'s verdict as steps (one read of one item)."""
    batch = yield lambda: ring.read_many(mark.sequence, 0, 1)
    return verdict_of(mark, batch.items, batch.sequences)
