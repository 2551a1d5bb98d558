"""Reading an exact range of ring items of one lane (shared by the Subscriber's catch-up and the Spark reader).

The grid never says "that sequence is gone": ``read_many`` below the oldest item it can serve silently starts at
that item. A range read therefore compares the sequences it gets with the ones it asked for, and turns any gap into
a ``DataLossError`` (or, when the caller opted in, into a count of skipped items it can report). A range reaching
past the lane's end is an ``OffsetOutOfRangeError``: those sequences were never written (a typo, or a lane that was
truncated or re-created), and waiting for them would silently skip everything written before them.

"The oldest item it can serve" is the ring's head on a plain grid, and lower on a grid that keeps history below
the head (a persistent embedded member, a Hazelcast ring buffer with a RingbufferStore): ``oldest_sequence``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from meteor_spark.errors import ConfigError, DataLossError, FormatError, OffsetOutOfRangeError
from meteor_spark.format.item_header import item_count
from meteor_spark.format.wire import decode_item
from meteor_spark.grid.client import MAX_BATCH_ITEMS, Grid, Ring
from meteor_spark.grid.steps import Steps, drive
from meteor_spark.grid.streams import StreamInfo

logger = logging.getLogger(__name__)

DEFAULT_ITEMS_PER_CALL = 100


class RangeReader(Iterator[tuple[list[bytes], list[int]]]):
    """Iterates ``(items, sequences)`` chunks of exactly the ring items of ``lane`` in ``[start_seq, end_seq)``, in
    order.

    Deterministic for a given range while its items are in the ring (the Spark reader replays partitions with it).

    Attributes:
        skipped_items: ring items of the range that were gone and skipped (``skip_data_loss``), each counted once.

    Raises (while iterating):
        DataLossError: some of the items are gone: overwritten, or quarantined by a persistent member (unless
            ``skip_data_loss``: then they are skipped and counted in ``skipped_items``).
        OffsetOutOfRangeError: the range reaches past the lane's end (names the valid range).
    """

    def __init__(
        self,
        grid: Grid,
        info: StreamInfo,
        lane: int,
        start_seq: int,
        end_seq: int,
        *,
        max_items_per_call: int = DEFAULT_ITEMS_PER_CALL,
        skip_data_loss: bool = False,
    ) -> None:
        check_lane(info, lane)
        if start_seq < 0 or end_seq < start_seq:
            raise ConfigError(f"invalid sequence range [{start_seq}, {end_seq}): need 0 <= start <= end")
        if max_items_per_call < 1:
            raise ConfigError(f"max_items_per_call must be >= 1, got {max_items_per_call}")
        self.stream = info.name
        self.lane = lane
        self.end = end_seq
        self.next_seq = start_seq
        self.skipped_items = 0
        self._ring = grid.ring(info.ring_names[lane])
        self._max_items = max_items_per_call
        self._skip = skip_data_loss
        self._capacity: int | None = None

    def __iter__(self) -> RangeReader:
        return self

    def __next__(self) -> tuple[list[bytes], list[int]]:
        while self.next_seq < self.end:
            if self._capacity is None:
                self._capacity = self._ring.capacity()
            want = min(self.end - self.next_seq, self._max_items, self._capacity, MAX_BATCH_ITEMS)
            # min_count=0: never park on the server; a range is only ever asked for what was already written.
            # The grid clamps a start past tail + 1 to tail + 1, so a range past the end reads as empty there.
            batch = self._ring.read_many(self.next_seq, 0, want)
            items, sequences = list(batch.items), list(batch.sequences)
            if not items:
                self._nothing_at(self.next_seq)
                continue
            first = sequences[0]
            if first > self.next_seq:
                self._lost(self.next_seq, first)
                if self.next_seq >= self.end:
                    break
            keep = len(items)
            while keep and sequences[keep - 1] >= self.end:
                keep -= 1
            if keep < len(items):
                items, sequences = items[:keep], sequences[:keep]
            if not items:
                continue
            self.next_seq = sequences[-1] + 1
            return items, sequences
        raise StopIteration

    def _nothing_at(self, seq: int) -> None:
        """An empty read: either the range's items are gone (expired, overwritten), or they were never written."""
        head = self._ring.head()
        if head > seq:
            self._lost(seq, head)
            return
        raise OffsetOutOfRangeError(
            self.stream, self.lane, self.end, oldest_in(self._ring), self._ring.tail() + 1, unit="sequence"
        )

    def _lost(self, requested: int, available: int) -> None:
        if not self._skip:
            raise DataLossError(
                self.stream, self.lane, requested=requested, oldest_available=available, unit="sequence"
            )
        lost_until = min(available, self.end)
        self.skipped_items += lost_until - requested
        logger.warning(
            "stream %r lane %d: ring items [%d, %d) were gone (overwritten or quarantined) before they were read; "
            "skipped them (skip_data_loss is on)",
            self.stream,
            self.lane,
            requested,
            lost_until,
        )
        self.next_seq = lost_until


def check_lane(info: StreamInfo, lane: object) -> int:
    """``lane`` when it is a lane of the stream; else a ``ConfigError`` naming the valid lanes."""
    if isinstance(lane, bool) or not isinstance(lane, int) or not 0 <= lane < info.config.lanes:
        raise ConfigError(
            f"lane {lane!r} does not exist in stream {info.name!r}; its lanes are 0..{info.config.lanes - 1}"
        )
    return lane


def oldest_sequence(grid: Grid, info: StreamInfo, lane: int) -> int:
    """The oldest ring sequence the grid can serve for ``lane`` (``tail + 1`` when it holds nothing).

    That is the ring's head, or lower where the grid keeps history below the head: a persistent embedded member, or
    a Hazelcast member whose ring buffer has a RingbufferStore. Neither says so in ``headSequence``; both answer a
    read below the head from the store, and a grid without one clamps the read to the head. So one read of one item
    from sequence 0 finds the oldest servable sequence on every grid.
    """
    return oldest_in(grid.ring(info.ring_names[check_lane(info, lane)]))


def oldest_in(ring: Ring) -> int:
    """``oldest_sequence`` of one ring (``oldest_steps``, run on the caller's thread)."""
    return drive(oldest_steps(ring))


def oldest_steps(ring: Any) -> Steps[int]:
    """The oldest sequence ``ring`` serves, as steps (``meteor_spark.grid.steps``: driven by ``oldest_in``, by the
    shared members' steps, and awaited over an ``AsyncRing``): one read of one item from sequence 0, which the grid
    clamps to the oldest sequence it serves.

    An empty answer is not answered with ``tail + 1`` as read afterwards: records appended between the read and the
    tail's would lie below that, and a reader starting there (a group member taking an empty lane up as the first
    records arrive) would skip them for good. The read is made again after the tail: an item found then is the
    oldest; none means the ring was still empty, so ``tail + 1`` is where its first item will go."""
    batch = yield lambda: ring.read_many(0, 0, 1)
    if batch.sequences:
        return int(batch.sequences[0])
    tail = yield lambda: ring.tail()
    batch = yield lambda: ring.read_many(0, 0, 1)
    return int(batch.sequences[0]) if batch.sequences else int(tail) + 1


#: ``read_range(grid, info, lane, start_seq, end_seq, *, max_items_per_call=100, skip_data_loss=False)`` (the
#: contract's name): the reader is its own iterator, so the function is the class.
read_range = RangeReader


def count_records(grid: Grid, info: StreamInfo, lane: int, start_seq: int, end_seq: int) -> int:
    """Records in the ring items ``[start_seq, end_seq)`` of a lane, from the items' headers alone (no body is
    decompressed or checksummed: ``tally_records`` does that).

    An item whose header fails its own checks (not a meteor item, bad length, count or flags) counts as 0 records
    (it holds none this reader can deliver) and is logged.

    Raises:
        DataLossError: some of those items are gone, so there is no exact count any more.
        OffsetOutOfRangeError: the range reaches past the lane's end.
    """
    return _tally(grid, info, lane, start_seq, end_seq, item_count).records


@dataclass(frozen=True)
class RecordTally:
    """What ``tally_records`` found: records in the decodable items, and the sequences of undecodable ones."""

    records: int
    corrupt_sequences: tuple[int, ...] = ()


def tally_records(grid: Grid, info: StreamInfo, lane: int, start_seq: int, end_seq: int) -> RecordTally:
    """Records in the ring items ``[start_seq, end_seq)`` of a lane, every item decoded (so checksummed), also naming
    the items that could not be decoded (counted as 0 records)."""
    return _tally(grid, info, lane, start_seq, end_seq, _decoded_count)


def _decoded_count(item: bytes, *, stream: str, lane: int, sequence: int) -> int:
    return decode_item(item, stream=stream, lane=lane, sequence=sequence).count


def _tally(
    grid: Grid, info: StreamInfo, lane: int, start_seq: int, end_seq: int, count: Callable[..., int]
) -> RecordTally:
    total = 0
    corrupt: list[int] = []
    for items, sequences in read_range(grid, info, lane, start_seq, end_seq):
        for item, sequence in zip(items, sequences, strict=True):
            try:
                total += count(item, stream=info.name, lane=lane, sequence=sequence)
            except FormatError as exc:
                corrupt.append(sequence)
                logger.warning("counting records: %s; counted as 0 records", exc)
    return RecordTally(total, tuple(corrupt))
