"""The grid reads of one executor lane range, several in flight at once.

A Spark task reads a range the driver planned, ``[start, end)`` of one lane: items already written. One
``read_many`` at a time leaves the task waiting for every answer (a round trip per ``items_per_read`` items, about as
long as converting them), so the next reads are sent before the answer in hand is handed on: up to
``READS_IN_FLIGHT`` windows of consecutive sequences, answered in order.

Only full answers are taken this way: a window whose answer starts elsewhere or holds fewer items (items lost or
overwritten, a ring smaller than the window, a range past the lane's end, a failed read) ends the read-ahead, and the
rest of the range, from the first item not handed on, is read by ``meteor_spark.grid.reading.read_range``, which
decides data loss, skipping and errors exactly as a reader without read-ahead does. The reads still in flight are
left to complete and dropped (at most ``READS_IN_FLIGHT``, so memory stays bounded).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any

from meteor_spark.grid.client import MAX_BATCH_ITEMS, Grid
from meteor_spark.grid.reading import read_range

#: Reads of one range waiting for their answers at once: enough to cover a round trip while a window converts.
READS_IN_FLIGHT = 3


def read_ahead(
    grid: Grid,
    info: Any,
    lane: int,
    start: int,
    end: int,
    *,
    items_per_read: int,
    skip_data_loss: bool,
) -> Iterator[tuple[list[bytes | memoryview], list[int]]]:
    """``(items, sequences)`` of ``[start, end)`` of ``lane``, as ``read_range`` gives them, with up to
    ``READS_IN_FLIGHT`` reads of ``items_per_read`` items under way. Items of full answers are memoryviews of the
    answer's frames (``Ring.read_views_async``), the others ``bytes``."""
    ring = grid.ring(info.ring_names[lane])
    window = max(1, min(items_per_read, MAX_BATCH_ITEMS))
    pending: deque[tuple[int, int, Any]] = deque()  # (first sequence, items, the grid's future)
    asked = cursor = start
    while cursor < end:
        while len(pending) < READS_IN_FLIGHT and asked < end:
            count = min(window, end - asked)
            pending.append((asked, count, ring.read_views_async(asked, 0, count)))
            asked += count
        first, count, future = pending.popleft()
        answer = _full_answer(future, first, count)
        if answer is None:
            break
        cursor = first + count
        yield answer
    else:
        return
    pending.clear()
    yield from read_range(
        grid, info, lane, cursor, end, max_items_per_call=items_per_read, skip_data_loss=skip_data_loss
    )


def _full_answer(future: Any, first: int, count: int) -> tuple[list[bytes | memoryview], list[int]] | None:
    """The window's items (memoryviews of the answer's frames: ``Ring.read_views_async``) and sequences when the
    grid answered with exactly ``first .. first + count - 1``; None otherwise (the caller reads on with
    ``read_range``, which explains any gap or failure)."""
    try:
        batch = future.result()
    except Exception:  # read again by read_range, which raises the translated error if it persists
        return None
    sequences = list(batch.sequences)
    if len(sequences) != count or sequences[0] != first or sequences[-1] != first + count - 1:
        return None
    return list(batch.items), sequences
