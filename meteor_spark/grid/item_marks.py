"""Item marks: which history a stored position was taken in, so a lane truncated and refilled under it is caught.

A lane's sequences are not unique for ever: a member restart that cuts a torn ring-log tail (fsync ``interval`` or
``never`` after a machine crash), or a Hazelcast cluster restarted without a store, hands the lost sequences out
again to new records. A group offset or checkpoint taken before that still points past the lost sequences, so a
reader resuming there would silently pass over as many new records. Kafka catches the same thing with the leader
epoch kept beside committed offsets (KIP-101, KIP-320); a ring has no epoch to ask for, so the position carries a
fingerprint of the item it was taken after instead:

- ``ItemMark(sequence, crc)``: the ring sequence of an item at or before the position (the item of the last record
  delivered, normally the one just before it) and a CRC-32 of that item's first ``MARKED_BYTES`` bytes and its
  length. Those bytes are the whole header of the current format (``wire.HEADER_SIZE``): producer id, producer
  sequence, timestamps, record count, lengths and the CRC-32 the writer computed over header and body, so the mark
  stands for the whole item while the reader hashes bytes it already holds (no extra read on confirm).
- ``check_mark``: one ``read_many`` of one item at the mark's sequence, when a reader resumes from a stored
  position. The same bytes there: same history. Another item: the lane was truncated and refilled
  (``LaneTruncatedError``). The item below the oldest the grid serves (overwritten): nothing to compare, the usual
  data-loss handling applies. Past the lane's end: the position is past the end (``OffsetOutOfRangeError``).

A mark is a check, not a position: stored offsets without one (written by earlier versions, by ``seek``, by tools)
are simply not checked.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from meteor_spark.format.item_header import HEADER_SIZE

if TYPE_CHECKING:  # pragma: no cover
    from meteor_spark.grid.client import Ring
#: Bytes of an item the mark hashes (the current format's whole header, which ends with its body's CRC-32).
MARKED_BYTES = HEADER_SIZE

SAME = "same"
CHANGED = "changed"
GONE = "gone"
PAST_END = "past_end"


@dataclass(frozen=True)
class ItemMark:
    """The fingerprint of the ring item at ``sequence``.

    Examples:
        >>> mark_of(b"MTRB" + bytes(60), 7) == mark_of(b"MTRB" + bytes(60), 7), mark_of(b"x", 7).sequence
        (True, 7)
        >>> mark_of(b"MTRB" + bytes(60), 7) == mark_of(b"MTRB" + bytes(61), 7)
        False
    """

    sequence: int
    crc: int

    def encode(self) -> list[int]:
        """The stored form, ``[sequence, crc]`` (compact in a JSON map value or checkpoint)."""
        return [self.sequence, self.crc]

    @classmethod
    def decode(cls, raw: Any) -> ItemMark | None:
        """From the stored form; None for anything else (an entry without a mark is not checked)."""
        if (
            isinstance(raw, list)
            and len(raw) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in raw)
            and raw[0] >= 0
        ):
            return cls(int(raw[0]), int(raw[1]))
        return None


def mark_of(item: bytes | bytearray | memoryview, sequence: int) -> ItemMark:
    """The mark of ``item`` stored at ``sequence``: CRC-32 of its length and its first ``MARKED_BYTES`` bytes."""
    view = memoryview(item)
    return ItemMark(sequence, zlib.crc32(view[:MARKED_BYTES], zlib.crc32(len(view).to_bytes(8, "little"))))


def check_mark(ring: Ring, mark: ItemMark) -> tuple[str, int]:
    """Compare ``mark`` with the item the ring holds at its sequence (one ``read_many`` of one item).

    Returns ``(verdict, sequence)``: ``SAME`` (the same item), ``CHANGED`` (another item: truncated and refilled),
    ``GONE`` (below the oldest item the grid serves; ``sequence`` is that oldest one) or ``PAST_END`` (the lane ends
    before the mark; ``sequence`` is the lane's next sequence).
    """
    batch = ring.read_many(mark.sequence, 0, 1)
    verdict = verdict_of(mark, batch.items, batch.sequences)
    return verdict, (ring.tail() + 1 if verdict == PAST_END else batch.sequences[0])


def verdict_of(mark: ItemMark, items: Sequence[Any], sequences: Sequence[int]) -> str:
    """``check_mark``'s verdict on the answer of a one-item read at the mark's sequence (issued by the caller, so
    a Spark task can send it alongside its range's first read)."""
    if not sequences or sequences[0] < mark.sequence:
        return PAST_END
    if sequences[0] > mark.sequence:
        return GONE
    return SAME if mark_of(items[0], sequences[0]) == mark else CHANGED
