"""Record offsets and the initial offset schemes.

A lane is a ring buffer whose items are micro-batches of records, so a record is addressed by the ring sequence
of its item and its index inside that item::

    offset = sequence << 16 | index        (index < 65,536 = MAX_RECORDS_PER_ITEM)

Offsets are per lane, 64-bit, strictly increasing and sparse (the indexes of one item are dense, then the next
item starts at the next multiple of 65,536). Users compare, store and seek offsets; they never compute them.

An offset whose index is past the end of its item (for example ``last_offset + 1`` of a full item) means "the
first record of the next item": readers normalise it instead of failing, so ``offset + 1`` is always a valid
"next record to read" for the record at ``offset``.

``InitialOffsetScheme`` and its one resolver, ``resolve_initial``, live here (not in ``subscriber``) because the
subscriber, the group machinery and the Spark reader all resolve it and none should import another for that.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from meteor_spark.errors import ConfigError, GroupError

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
    def parse(cls, value: InitialOffsetScheme | str) -> InitialOffsetScheme:
        """Accept the enum or its name in any case (``"earliest"``, ``"LATEST"``)."""
        if isinstance(value, cls):
            return value
        try:
            return cls(str(value).strip().lower())
        except ValueError:
            known = ", ".join(m.value for m in cls)
            raise ConfigError(f"initial_offset_scheme {value!r} is not a scheme; use one of {known}") from None

    def concrete(self, grouped: bool) -> InitialOffsetScheme:
        """AUTO resolved for a grouped or ungrouped subscriber; the other schemes are already concrete."""
        if self is InitialOffsetScheme.AUTO:
            return InitialOffsetScheme.EARLIEST if grouped else InitialOffsetScheme.LATEST
        return self


def resolve_initial(
    scheme: InitialOffsetScheme | str,
    grouped: bool,
    confirmed: int | None,
    head_seq: int | Callable[[], int],
    next_seq: int,
    *,
    where: str = "",
) -> int:
    """The offset to start reading a lane at (the Meteor README table, with the original's bugs fixed).

    ========  =====================================  ======================================================
    scheme    ungrouped                              grouped
    ========  =====================================  ======================================================
    EARLIEST  oldest record the grid can serve       confirmed offset if any, else oldest record available
    LATEST    end of the lane (only new records)     confirmed offset if any, else end of the lane
    NONE      ConfigError (needs a group)            confirmed offset; GroupError when none is stored
    AUTO      LATEST                                 EARLIEST
    ========  =====================================  ======================================================

    Args:
        scheme: the scheme, as the enum or its name.
        grouped: whether the reader is a group member.
        confirmed: the group's confirmed offset for the lane (ignored when ungrouped).
        head_seq: the lane's oldest ring sequence the grid can serve (``reading.oldest_sequence``: the ring's head,
            or lower on a grid that keeps history below it), or a function giving it, called only when EARLIEST
            needs it (it costs a grid read); a sequence given as a number is checked against ``next_seq``.
        next_seq: the lane's next ring sequence (tail + 1); equal to ``head_seq`` when the lane is empty.
        where: names the lane in error messages, e.g. ``"stream 'orders' lane 2 of group 'billing'"``.

    Raises:
        ConfigError: NONE for an ungrouped reader, or lane bounds that make no sense.
        GroupError: NONE for a group with no confirmed offset on that lane.
    """
    concrete = InitialOffsetScheme.parse(scheme).concrete(grouped)
    if not callable(head_seq) and not 0 <= head_seq <= next_seq:
        raise ConfigError(
            f"lane bounds head_seq={head_seq}, next_seq={next_seq} are invalid{_at(where)}: need 0 <= head <= next"
        )
    if grouped and confirmed is not None:
        return confirmed
    if concrete is InitialOffsetScheme.EARLIEST:
        return first_offset_of(head_seq() if callable(head_seq) else head_seq)
    if concrete is InitialOffsetScheme.LATEST:
        return first_offset_of(next_seq)
    if not grouped:
        raise ConfigError(
            f"initial offset scheme NONE needs a group{_at(where)}: an ungrouped subscriber has no stored offset "
            f"to start from; use EARLIEST or LATEST, or give the subscriber a group"
        )
    raise GroupError(
        f"initial offset scheme NONE{_at(where)}: the group has no confirmed offset for this lane; confirm or "
        f"seek an offset for the group first, or use EARLIEST or LATEST"
    )


def _at(where: str) -> str:
    return f" ({where})" if where else ""
