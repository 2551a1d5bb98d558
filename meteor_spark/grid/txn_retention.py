"""What the transaction sweep (``meteor_spark.grid.transactions.sweep``) reads to judge what it may remove: the
oldest servable sequence of a lane a committed transaction wrote, whether group offsets it staged are still waiting
to be applied, and which batch ids of a sink and query are old. Read-only: the sweep does the removing."""

from __future__ import annotations

import json
from collections.abc import Iterable

from meteor_spark.grid.client import Grid
from meteor_spark.grid.reading import oldest_in
from meteor_spark.grid.streams import STREAMS_MAP, parse_metadata

#: Where group offsets are staged in transactions (``meteor_spark.groups.store.OFFSETS_MAP``; the grid layer sits
#: below groups, so the name is repeated here and a test checks they agree).
STAGED_OFFSETS_MAP = "meteor.group.offsets"


def still_staged(grid: Grid, key: str, offsets: Iterable[str]) -> bool:
    """Whether an entry ``offsets`` of ``meteor.group.offsets`` still names transaction ``key`` as the one of its
    staged offset (not yet applied: whoever settles it must still find the transaction committed)."""
    return names_staged(grid.map(STAGED_OFFSETS_MAP).get_all(list(offsets)).values(), key)


def names_staged(texts: Iterable[str], key: str) -> bool:
    """Whether one of the offsets entries ``texts`` names transaction ``key`` as the one of its staged offset."""
    for text in texts:
        try:
            staged = json.loads(text).get("txn")
        except (ValueError, AttributeError):
            continue
        if isinstance(staged, dict) and staged.get("key") == key:
            return True
    return False


def lane_oldest(grid: Grid, stream: str, lane: int) -> int | None:
    """The lane's oldest servable sequence; None when the stream or lane no longer exists (nothing to read)."""
    text = grid.map(STREAMS_MAP).get(stream)
    if text is None:
        return None
    names = parse_metadata(stream, text).ring_names
    return oldest_in(grid.ring(names[lane])) if lane < len(names) else None


def old_batches(batches: dict[str, str], keep: int) -> list[str]:
    """Batch keys beyond the last ``keep`` batch ids of their sink and query."""
    by_run: dict[str, list[tuple[int, str]]] = {}
    for batch_key in batches:
        prefix, _, batch_id = batch_key.rpartition("/")
        try:
            by_run.setdefault(prefix, []).append((int(batch_id), batch_key))
        except ValueError:
            continue
    old: list[str] = []
    for keyed in by_run.values():
        keyed.sort()
        old.extend(batch_key for _, batch_key in keyed[:-keep])
    return old
