"""The publisher's paths for records with message ids on a stream with a deduplication window
(``meteor_spark.producer.dedup``): claim the ids first, queue the records second, settle the claims when the write
settles (written with its offset, or released when it certainly stored nothing).

Records without ids never come here: ``Publisher.publish_async``'s plain path stays as fast as without a window.
The publisher hands in only what a path needs: its ``DedupWindow``, how it picks a record's lane and a function
that queues the records.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa

from meteor_spark.errors import DuplicateMessageError
from meteor_spark.format.arrow_columns import ArrowInput
from meteor_spark.format.partitioning import lane_for_key
from meteor_spark.format.records import Record
from meteor_spark.producer.dedup import Claim, DedupWindow
from meteor_spark.producer.futures import RecordFuture

F = TypeVar("F", bound=Any)


def id_lane(lane: int, message_id: str, lanes: int) -> int:
    """The lane of a record with a message id: its own (explicit or by key), else the lane its id hashes to, so a
    retry lands where the first copy did and a lapsed claim names the lane to search."""
    return lane if lane >= 0 else lane_for_key(message_id.encode("utf-8"), lanes)


def queue_claimed(dedup: DedupWindow, claims: list[Claim], positions: list[int], queue: Callable[[], F]) -> F:
    """Run ``queue()`` (it queues the claimed records and returns their future); release the claims when it
    raises, else settle each claim from the future (``positions``: where its offset is in a list result; -1 for a
    single record's future, or not known)."""
    with released_on_error(dedup, claims):
        future = queue()
    settle_when_done(dedup, claims, positions, future)
    return future


@contextmanager
def released_on_error(dedup: DedupWindow, claims: list[Claim]) -> Iterator[None]:
    """Give the claims back when the block raises (their records were not queued)."""
    try:
        yield
    except BaseException:
        dedup.release_all(claims)
        raise


def settle_when_done(dedup: DedupWindow, claims: list[Claim], positions: list[int], future: Any) -> None:
    """Settle each claim once ``future`` (of the claimed records' write) is done; ``positions`` as in
    ``queue_claimed``."""
    if claims:
        pairs = list(zip(claims, positions, strict=True))
        future.add_done_callback(lambda f: _settle(dedup, pairs, f))


def claim_one(dedup: DedupWindow, rec: Record, lane: int) -> tuple[int, Claim]:
    """Claim one record's id; returns its lane and the claim."""
    assert rec.message_id is not None
    lane = id_lane(lane, rec.message_id, len(dedup.rings))
    return lane, dedup.claim(rec.message_id, lane)


def claim_records(
    dedup: DedupWindow, recs: list[Record], lane_of: Callable[[Record], int]
) -> tuple[list[Claim], list[int]]:
    """Claim the ids of ``publish_many``'s records, all at once; a repeat within the call is refused first. Each
    record with an id gets its claim's lane (``recs`` changed in place). Returns the claims and their positions."""
    wanted, positions = ids_to_claim(dedup.stream, recs, lane_of, len(dedup.rings))
    claims = [claim for claim in dedup.claim_many(wanted) if claim is not None]
    return claims, positions


def ids_to_claim(
    stream: str, recs: list[Any], lane_of: Callable[[Record], int], lanes: int
) -> tuple[list[tuple[str, int]], list[int]]:
    """The ``(message id, lane)`` pairs of ``publish_many``'s records to claim (records without an id, or plain
    values, left out) and their positions; a repeat within the call is refused. Each record with an id gets its
    claim's lane (``recs`` changed in place). The threaded and the asyncio publisher's step before claiming."""
    first: dict[str, int] = {}
    wanted: list[tuple[str, int]] = []
    positions: list[int] = []
    for position, rec in enumerate(recs):
        mid = rec.message_id if isinstance(rec, Record) else None
        if mid is None:
            continue
        if mid in first:
            raise _repeated(stream, mid, "publish_many", "records", first[mid], position)
        first[mid] = position
        lane = id_lane(lane_of(rec), mid, lanes)
        recs[position] = replace(rec, lane=lane)
        wanted.append((mid, lane))
        positions.append(position)
    return wanted, positions


def claim_rows(dedup: DedupWindow, bulk: ArrowInput, skip: bool) -> tuple[ArrowInput, list[Claim], int]:
    """Claim the ids of ``publish_arrow``'s rows, all at once (a repeat within the rows is a duplicate too).
    Returns the rows to publish (each row with an id on its claim's lane, duplicates left out with ``skip``), the
    claims and the number of rows skipped."""
    assert bulk.message_ids is not None
    lanes = len(dedup.rings)
    explicit = bulk.lanes(lanes, dedup.stream, -1)
    lane_of = np.full(bulk.rows, -1, dtype=np.int64) if explicit is None else explicit
    keep = np.ones(bulk.rows, dtype=bool)
    first: dict[str, int] = {}
    wanted: list[tuple[str, int]] = []
    rows: list[int] = []
    for row, mid in enumerate(bulk.message_ids):
        if mid is None:
            continue
        if mid in first:
            if not skip:
                raise _repeated(dedup.stream, mid, "publish_arrow", "rows", first[mid], row)
            keep[row] = False
            continue
        first[mid] = row
        lane_of[row] = id_lane(int(lane_of[row]), mid, lanes)
        wanted.append((mid, int(lane_of[row])))
        rows.append(row)
    claimed = dedup.claim_many(wanted, skip_duplicates=skip)
    for row, claim in zip(rows, claimed, strict=True):
        if claim is None:
            keep[row] = False
    table = bulk.table
    if "lane" in table.column_names:
        table = table.drop_columns(["lane"])
    table = table.append_column("lane", pa.array(lane_of, pa.int64()))
    if not keep.all():
        table = table.filter(pa.array(keep))
    return ArrowInput(table), [claim for claim in claimed if claim is not None], int((~keep).sum())


def _repeated(stream: str, mid: str, call: str, what: str, first: int, again: int) -> DuplicateMessageError:
    return DuplicateMessageError(
        mid,
        stream,
        None,
        text=f"message id {mid!r} appears twice in one {call} call on stream {stream!r} ({what} {first} and "
        f"{again}, 0-based); nothing of this call was queued",
    )


def _settle(dedup: DedupWindow, pairs: list[tuple[Claim, int]], future: Future[Any] | RecordFuture) -> None:
    error = future.exception(0)
    outcome = None if error is not None else future.result(0)
    for claim, position in pairs:
        if outcome is None or isinstance(outcome, int):
            offset = outcome if position == -1 and isinstance(future, RecordFuture) else None
        else:
            offset = None if position < 0 else outcome[position]
        dedup.settled(claim, offset, error)
