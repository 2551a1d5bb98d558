"""Record offsets and the initial offset schemes.

A lane is a ring buffer whose items are micro-batches of records, so a record is addressed by the ring sequence
of its item and its index inside that item::

    offset = sequence << 16 | index        (index < 65,536 = MAX_RECORDS_PER_ITEM)

Offsets are per lane, 64-bit, strictly increasing and sparse (the indexes of one item are dense, then the next
item starts at the next multiple of 65,536). Users compare, store and seek offsets; they never compute them.

An offset whose index is past the end of its item (for example ``last_offset + 1`` of a full item) means "the
first record of the next item": readers normalise it instead of failing, so ``offset + 1`` is always a valid
"next record to read" for the record at ``offset``.

``InitialOffsetScheme`` lives here (not in ``subscriber``) because both the subscriber and the group machinery
resolve it and neither should import the other for that.
"""

from __future__ import annotations

import enum

from meteor_spark.errors import ConfigError

INDEX_BITS = 16
MAX_RECORDS_PER_ITEM = 1 << INDEX_BITS
_INDEX_MASK = MAX_RECORDS_PER_ITEM - 1
#: Largest ring sequence an offset can carry (offsets are signed 64-bit for Java/Spark interop).
MAX_SEQUENCE = (1 << (63 - INDEX_BITS)) - 1


def make_offset(sequence: int, index: int) -> int:
    """The offset of record ``index`` of the ring item at ``sequence``."""
    if not 0 <= sequence <= MAX_SEQUENCE:
        raise ConfigError(f"ring sequence {sequence} is out of range; it must be in [0, {MAX_SEQUENCE}]")
    if not 0 <= index < MAX_RECORDS_PER_ITEM:
        raise ConfigError(f"record index {index} is out of range; it must be in [0, {MAX_RECORDS_PER_ITEM - 1}]")
    return sequence << INDEX_BITS | index


def sequence_of(offset: int) -> int:
    """The ring sequence of the item holding the record at ``offset``."""
    if offset < 0:
        raise ConfigError(f"offset {offset} is negative; offsets are >= 0")
    return offset >> INDEX_BITS


def index_of(offset: int) -> int:
    """The index of the record at ``offset`` inside its ring item."""
    if offset < 0:
        raise ConfigError(f"offset {offset} is negative; offsets are >= 0")
    return offset & _INDEX_MASK


def first_offset_of(sequence: int) -> int:
    """The offset of the first record of the item at ``sequence`` (also "everything before this item")."""
    return make_offset(sequence, 0)


class InitialOffsetScheme(enum.Enum):
    """Where a subscriber starts when it has no position of its own (the Meteor README table, with its bugs fixed).

    ========  ===================================  ==================================================
    scheme    ungrouped subscriber                 grouped subscriber (per lane, when first assigned)
    ========  ===================================  ==================================================
    EARLIEST  the oldest record the grid can serve the confirmed offset if any, else the oldest record
    LATEST    the end of the lane (new records)    the confirmed offset if any, else the end of the lane
    NONE      illegal: ConfigError at creation     the confirmed offset; none stored -> GroupError
    AUTO      LATEST                               EARLIEST
    ========  ===================================  ==================================================

    Fixes against the original: EARLIEST is the oldest item the grid can serve, not literal offset 0, so a wrapped
    ring is not a data loss: the ring's head on a plain grid, lower on a grid keeping history below the head (a
    persistent embedded member, a Hazelcast RingbufferStore; ``reading.oldest_sequence``). NONE works for a group
    with a stored offset. Ungrouped subscribers
    resolve the scheme when they are created; grouped ones when a lane is assigned to them.
    """

    EARLIEST = "earliest"
    LATEST = "latest"
    NONE = "none"
    AUTO = "auto"

    @classmethod
    def parse(cls, value: "InitialOffsetScheme | str") -> "InitialOffsetScheme":
        """Accept the enum or its name in any case (``"earliest"``, ``"LATEST"``)."""
        if isinstance(value, cls):
            return value
        try:
            return cls(str(value).strip().lower())
        except ValueError:
            known = ", ".join(m.value for m in cls)
            raise ConfigError(
                f"initial_offset_scheme {value!r} is not a scheme; use one of {known}"
            ) from None

    def concrete(self, grouped: bool) -> "InitialOffsetScheme":
        """AUTO resolved for a grouped or ungrouped subscriber; the other schemes are already concrete."""
        if self is InitialOffsetScheme.AUTO:
            return InitialOffsetScheme.EARLIEST if grouped else InitialOffsetScheme.LATEST
        return self
