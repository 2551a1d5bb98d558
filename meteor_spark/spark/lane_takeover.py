"""The item-mark check of a group lane a grouped Spark source starts holding (``DriverState.view``).

A lane's holder stores the item mark of the item before its confirmed offset with the offset
(``meteor_spark.grid.item_marks``). Whoever starts holding the lane resumes from that offset, so whoever starts
holding it compares that stored mark with the item the lane has now: a new query at its start, a restarted source
runner, and a standby that takes the lane over mid-run. The standby's own offsets cannot tell: it follows the
group's confirmed offset while it stands by, and the marks in its offsets are read from the lane as it is when it
plans, after a truncation and refill that happened before (a member restart that cut the ring log's tail, or a grid
restarted without a store). The stored mark was taken by the holder that read the records, before any of that.

Cost: one single-item read per lane, only when this source runner starts holding it under a lease epoch it has not
checked yet; the reads of the lanes taken in one go are issued at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from meteor_spark.format.offsets import sequence_of
from meteor_spark.grid.client import Ring, result
from meteor_spark.grid.item_marks import CHANGED, PAST_END, ItemMark, verdict_of
from meteor_spark.grid.streams import StreamInfo
from meteor_spark.groups.exclusive import GroupMember

if TYPE_CHECKING:  # pragma: no cover
    from meteor_spark.grid.client import Grid

__all__ = ["changed_group_marks", "moved_back"]

Lane = tuple[str, int]


def changed_group_marks(
    grid: Grid,
    infos: Mapping[str, StreamInfo],
    members: Mapping[str, GroupMember],
    epochs: Mapping[Lane, int],
    checked: dict[Lane, int],
) -> dict[Lane, tuple[int, ItemMark]]:
    """Compare the group's stored mark of every lane held under an epoch not in ``checked`` with the lane's item.

    ``epochs``: (stream, lane) -> lease epoch of the lanes this source runner holds now. ``checked`` is updated
    with the epochs checked (a lane whose stored mark lies past its end is left unchecked: the lane lost its tail
    and is not refilled yet, and the confirmed offset past the end is refused as stale meanwhile, so the check
    runs again with the next view). Returns ``(position, stale mark)`` of each lane whose item at the mark's
    sequence is another one: truncated and refilled under the group's offset.
    """
    reads: dict[Lane, tuple[int, ItemMark, Any]] = {}
    for key, epoch in epochs.items():
        stream, lane = key
        member = members.get(stream)
        if checked.get(key) == epoch or member is None or stream not in infos:
            continue
        mark = member.confirmed_mark(lane)
        offset = member.known_offsets([lane]).get(lane) if mark is not None else None
        if mark is None or offset is None:
            checked[key] = epoch  # nothing stored to compare: resumed where the lane's start option says
            continue
        ring = grid.ring(infos[stream].ring_names[lane])
        reads[key] = (sequence_of(offset), mark, ring.read_many_async(mark.sequence, 0, 1))
    changed: dict[Lane, tuple[int, ItemMark]] = {}
    for key, (position, mark, future) in reads.items():
        stream, lane = key
        batch = Ring.to_batch(
            result(future, f"read the item marked by the group's offset of stream {stream!r} lane {lane}")
        )
        verdict = verdict_of(mark, batch.items, batch.sequences)
        if verdict == PAST_END:
            continue
        checked[key] = epochs[key]
        if verdict == CHANGED:
            changed[key] = (position, mark)
    return changed


def moved_back(positions: Mapping[Lane, int], restarts: Mapping[Lane, tuple[int, int]]) -> dict[Lane, int]:
    """``positions`` with each lane of ``restarts`` (stale sequence, oldest sequence) that is at or below its stale
    group offset moved back to its oldest sequence (kept where lower: the data-loss check applies there)."""
    out = dict(positions)
    out.update({k: min(out[k], old) for k, (stale, old) in restarts.items() if out.get(k, stale + 1) <= stale})
    return out
