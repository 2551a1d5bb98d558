"""Delayed redelivery and dead letters by distance: the rules both kinds of group share.

**Delayed redelivery.** ``nack(records, delay_ms=...)`` on a group member asks for the records again no earlier
than ``delay_ms`` from now, and holds back only the group that asked: a shared group keeps the records unavailable
until then (``meteor_spark.groups.shared_state``: a ``not_before`` on the released span), an exclusive group rewinds
the lane to the first record nacked and pauses the lane for that group (``meteor_spark.groups.store``: a
``not_before_ms`` on the lane's confirmed offset). The time is stored in the group's state in the grid, not in the
member, so it holds when the member that nacked dies: whichever member takes the records or the lane up waits for
the same instant. It is wall-clock time (ms since the epoch) because members on other hosts read it; a host whose
clock runs ahead of the nacking host's sees the instant that much earlier (and redelivers that much sooner), one
whose clock lags sees it later. Keep member clocks synchronised (NTP keeps them within milliseconds); the delay is
a lower bound only up to that skew. ``delay_ms`` is at most ``MAX_NACK_DELAY_MS``: a longer pause is a schedule,
better kept outside a stream (republish the record later), and an unbounded one would hold a lane for good.

**Dead letters by distance.** A group with ``dead_letter_after=N`` (a group setting, stored with the group) moves a
record to its dead-letter stream once it has fallen more than ``N`` records behind the most recently consumed one
of its lane: a poison record retried again and again, or held back by delayed nacks, no longer holds the rest of the
lane for ever. The distance of a record at offset ``o`` is the number of records after it up to and including the
most recently consumed one (``records_between(o, high) - 1``, ``high`` one past that record). Shared groups measure it
against the first offset never acquired and dead-letter available records (released or delayed, never ones a member
holds now) when a member acquires; exclusive groups measure it against the furthest record the group delivered on the
lane and dead-letter a record when it is nacked that far behind (the lane then goes on after it).

Everything here is pure (no grid, no threads) apart from ``now_ms``.
"""

from __future__ import annotations

from collections.abc import Callable

from meteor_spark.errors import ConfigError
from meteor_spark.format.offsets import index_of, make_offset, sequence_of
from meteor_spark.groups.leases import wall_ms

__all__ = [
    "MAX_DEAD_LETTER_AFTER",
    "MAX_NACK_DELAY_MS",
    "check_dead_letter_after",
    "check_delay",
    "distance_floor",
    "not_before",
    "now_ms",
]

#: The longest delay ``nack`` accepts (1 hour): longer is a schedule, not a retry.
MAX_NACK_DELAY_MS = 3_600_000

#: The largest ``dead_letter_after`` accepted (records).
MAX_DEAD_LETTER_AFTER = 1 << 30


def now_ms() -> int:
    """Wall-clock ms since the epoch: the clock ``not_before`` instants are stored in (see the module docs)."""
    return wall_ms()


def check_delay(delay_ms: object) -> int:
    """``delay_ms`` of a ``nack``, checked: an integer in ``[0, MAX_NACK_DELAY_MS]``."""
    if isinstance(delay_ms, bool) or not isinstance(delay_ms, int):
        raise ConfigError(f"nack delay_ms must be an integer number of milliseconds, got {delay_ms!r}")
    if delay_ms < 0:
        raise ConfigError(f"nack delay_ms must be >= 0 (0: redeliver at once), got {delay_ms}")
    if delay_ms > MAX_NACK_DELAY_MS:
        raise ConfigError(
            f"nack delay_ms={delay_ms} is longer than the maximum MAX_NACK_DELAY_MS={MAX_NACK_DELAY_MS} (1 hour): a "
            f"longer pause holds the lane or the record too long; acknowledge the record and publish it again later "
            f"instead"
        )
    return delay_ms


def not_before(delay_ms: int) -> int:
    """The wall-clock instant a record nacked now with ``delay_ms`` may come back (0: at once)."""
    return now_ms() + delay_ms if delay_ms > 0 else 0


def check_dead_letter_after(value: object, dead_letter_stream: str | None) -> int | None:
    """``dead_letter_after`` checked: None, or an integer in ``[1, MAX_DEAD_LETTER_AFTER]`` given together with a
    dead-letter stream (where the records go)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_DEAD_LETTER_AFTER:
        raise ConfigError(
            f"dead_letter_after must be an integer in [1, {MAX_DEAD_LETTER_AFTER}] (records a record may fall behind "
            f"the most recently consumed one before it is dead-lettered), got {value!r}"
        )
    if not dead_letter_stream:
        raise ConfigError(
            f"dead_letter_after={value} needs a dead_letter_stream: the stream records that fall that far behind are "
            f"moved to; give dead_letter_stream=..., or leave dead_letter_after unset"
        )
    return value


def records_between(first: int, end: int, count_of: Callable[[int], int]) -> int:
    """Records in ``[first, end)`` of one lane; ``count_of(sequence)`` is the record count of a ring item."""
    if end <= first:
        return 0
    lo, hi = sequence_of(first), sequence_of(end)
    if lo == hi:
        return index_of(end) - index_of(first)
    total = count_of(lo) - index_of(first) + index_of(end)
    for sequence in range(lo + 1, hi):
        total += count_of(sequence)
    return total


def distance_floor(start: int, high: int, limit: int, count_of: Callable[[int], int]) -> int:
    """The lowest offset in ``[start, high)`` whose record is at most ``limit`` records behind the record before
    ``high`` (the most recently consumed one): every record below the offset returned is more than ``limit``
    behind; ``start`` when none is. Walks back from ``high`` over at most ``limit + 1`` records."""
    remaining = limit + 1  # the record itself and the ``limit`` records after it
    sequence, below = sequence_of(high), index_of(high)
    floor_seq = sequence_of(start)
    while True:
        if remaining <= below:
            return max(start, make_offset(sequence, below - remaining))
        remaining -= below
        sequence -= 1
        if sequence < floor_seq:
            return start
        below = count_of(sequence)
