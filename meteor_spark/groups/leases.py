"""Fenced, renewable leases kept in a grid map: the primitive that subscriber groups are built on.

A lease is one map entry whose value is canonical JSON (compact, sorted keys: the grid's compare-and-set compares
bytes, so the same lease must always encode to the same text)::

    {"beat": 7, "epoch": 3, "holder": "host-4711-1a2b3c4d", "lease_ms": 5000, "renewed_ms": 1700000000000, "v": 1}

- ``epoch`` (the fencing token) grows by one on every change of holder. It is never reused: releasing a lease does
  not delete the entry, it writes a *vacant* value (``holder`` null) that keeps the epoch, so the next holder takes
  ``epoch + 1``. When the entry is missing altogether (never created, or removed by an operator), the acquirer
  passes a floor (``groups`` uses the epoch stored with the lane's confirmed offset) and starts above it.
- ``beat`` grows on every renewal, so a live holder's value changes every renewal period and a takeover CAS on an
  old value can never succeed against a renewed lease (no ABA).
- ``lease_ms`` is the holder's own lease duration; observers judge its expiry with it.
- ``renewed_ms`` is the writer's wall clock at its last write. It is shown by tools ("expires around ...") and is
  never used to decide anything.

Clock assumptions:

- **Safety never depends on clocks.** Every write that matters is a compare-and-set on exact bytes; the consumers
  of a lease (``groups``) additionally fence their writes with the epoch, so a holder that was deposed while it
  believed its lease live (GC pause, partition, slow clock) cannot move an offset.
- **Expiry is judged by observed non-renewal on the observer's monotonic clock** (``ExpiryObserver``): a lease is
  expired for an observer once the observer has seen the very same value for ``lease_ms`` of its own monotonic
  time. No wall clocks are compared across machines, so clock skew between hosts does not matter; only the *rates*
  of the monotonic clocks must roughly agree. The price: an observer that starts watching a dead holder's lease
  waits one full ``lease_ms`` from its first look, even if the holder died long before.
- **A holder judges its own lease** from the monotonic time at which it *sent* its last successful renewal: it
  stops treating the lease as live ``lease_ms`` after that, which is always before any observer can have seen the
  renewed value for ``lease_ms`` (an observer first sees a value after it was written, and it is written after it
  was sent). So with equal clock rates a holder gives up before anyone takes over.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from meteor_spark.errors import FormatError
from meteor_spark.grid.client import GridMap

logger = logging.getLogger(__name__)

#: Version of the lease value layout; a reader meeting a newer one refuses to interpret it.
LEASE_FORMAT = 1

T = TypeVar("T")


def canonical(obj: Any) -> str:
    """Compact JSON with sorted keys: equal values always give equal bytes, as compare-and-set needs."""
    return json.dumps(obj, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def decode_entry(
    text: str, entry: str, what: str, format_name: str, max_version: int, build: Callable[[dict[str, Any]], T]
) -> T:
    """Parse a canonical-JSON map value meteor wrote: check its layout version, then ``build`` it.

    ``entry`` names the map entry (e.g. ``lease <key> in map 'meteor.group.leases'``), ``what`` the kind of value
    for the error message. A newer layout, or anything malformed, is a ``FormatError`` naming the entry.
    """
    try:
        raw = json.loads(text)
        version = int(raw.get("v", 0))
        if version > max_version:
            raise FormatError(
                f"{entry} was written in {format_name} format {version}, newer than this version of meteor-spark "
                f"understands ({max_version}); upgrade meteor-spark on this host"
            )
        return build(raw)
    except FormatError:
        raise
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise FormatError(
            f"{entry} holds {text!r}, which is not a meteor {what} ({exc}); remove the entry if something else wrote it"
        ) from exc


def wall_ms() -> int:
    """Wall-clock milliseconds, only ever stored for display."""
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class Lease:
    """One lease value.

    Attributes:
        epoch: fencing token; grows by one on every change of holder, never reused.
        holder: id of the holder, or None when the lease is vacant (released).
        beat: renewal counter of the current holder (0 right after acquisition).
        lease_ms: the holder's lease duration in milliseconds.
        renewed_ms: the writer's wall clock at the last write (display only).
    """

    epoch: int
    holder: str | None
    beat: int = 0
    lease_ms: int = 0
    renewed_ms: int = 0

    @property
    def vacant(self) -> bool:
        return self.holder is None

    def encode(self) -> str:
        return canonical(
            {
                "v": LEASE_FORMAT,
                "epoch": self.epoch,
                "holder": self.holder,
                "beat": self.beat,
                "lease_ms": self.lease_ms,
                "renewed_ms": self.renewed_ms,
            }
        )

    @classmethod
    def decode(cls, text: str, where: str) -> Lease:
        """Parse a stored lease; ``where`` names the map entry in the error message."""
        return decode_entry(text, f"lease {where}", "lease", "lease", LEASE_FORMAT, cls._build)

    @classmethod
    def _build(cls, raw: dict[str, Any]) -> Lease:
        holder = raw["holder"]
        return cls(
            epoch=int(raw["epoch"]),
            holder=None if holder is None else str(holder),
            beat=int(raw.get("beat", 0)),
            lease_ms=int(raw.get("lease_ms", 0)),
            renewed_ms=int(raw.get("renewed_ms", 0)),
        )


@dataclass(frozen=True)
class Held:
    """A lease this process holds: the exact stored text (for the next CAS) and when it was last renewed.

    Attributes:
        lease: the decoded value.
        text: the exact stored text the next renewal or release compares against.
        sent_mono: monotonic time (s) at which the write that stored ``text`` was sent.
    """

    lease: Lease
    text: str
    sent_mono: float

    def live_locally(self, now_mono: float) -> bool:
        """The holder's own judgement: live until ``lease_ms`` after the last successful write was sent."""
        return now_mono - self.sent_mono < self.lease.lease_ms / 1000.0


def acquired(holder: str, lease_ms: int, seen: Lease | None, floor_epoch: int = 0) -> Lease:
    """The lease a takeover writes over ``seen`` (None: no entry): epoch above both the seen one and the floor
    (the epoch stored with the lane's offset, for a lease entry that went missing), so epochs never repeat."""
    base = floor_epoch if seen is None else max(seen.epoch, floor_epoch)
    return Lease(epoch=base + 1, holder=holder, lease_ms=lease_ms, renewed_ms=wall_ms())


def renewed(held: Held) -> Lease:
    """A held lease renewed: ``beat + 1``, so a takeover CAS on the old value can never succeed (no ABA)."""
    return replace(held.lease, beat=held.lease.beat + 1, renewed_ms=wall_ms())


def vacated(held: Held) -> Lease:
    """A held lease released: vacant, keeping its epoch so the next holder takes ``epoch + 1``."""
    return Lease(epoch=held.lease.epoch, holder=None, lease_ms=held.lease.lease_ms, renewed_ms=wall_ms())


class ExpiryObserver:
    """Judges expiry of other holders' leases by observed non-renewal, on this process's monotonic clock.

    Feed it every value read (``see``); ``expired`` is True once the same text has been seen for ``lease_ms``.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._first_seen: dict[str, tuple[str, float]] = {}

    def see(self, key: str, text: str | None) -> None:
        if text is None:
            self._first_seen.pop(key, None)
            return
        seen = self._first_seen.get(key)
        if seen is None or seen[0] != text:
            self._first_seen[key] = (text, self._clock())

    def unchanged_for_s(self, key: str, text: str) -> float:
        """How long (s) this observer has seen ``text`` unchanged at ``key`` (0 when it was just seen)."""
        seen = self._first_seen.get(key)
        if seen is None or seen[0] != text:
            self.see(key, text)
            return 0.0
        return self._clock() - seen[1]

    def expired(self, key: str, text: str, lease_ms: int) -> bool:
        return self.unchanged_for_s(key, text) >= lease_ms / 1000.0

    def forget_except(self, keys: set[str]) -> None:
        """Drop what was seen for other keys (keeps the table bounded when members come and go)."""
        for key in [k for k in self._first_seen if k not in keys]:
            del self._first_seen[key]


class LeaseMap:
    """Acquire, renew and release leases in one grid map, by compare-and-set only (the values written are
    ``acquired`` / ``renewed`` / ``vacated``'s, which the asyncio member writes too)."""

    def __init__(self, grid_map: GridMap) -> None:
        self.map = grid_map

    def read(self, key: str) -> tuple[str | None, Lease | None]:
        text = self.map.get(key)
        return text, None if text is None else Lease.decode(text, self.where(key))

    def where(self, key: str) -> str:
        return f"{key} in map {self.map.name!r}"

    def acquire(
        self, key: str, holder: str, lease_ms: int, seen_text: str | None, seen: Lease | None, floor_epoch: int = 0
    ) -> Held | None:
        """Take the lease from the state last seen: absent, vacant, or expired (the caller decided that).

        The CAS is on ``seen_text`` exactly, so a lease renewed or taken by someone else since it was read is left
        alone. Returns what is now held, or None when another party won.
        """
        sent = time.monotonic()
        lease = acquired(holder, lease_ms, seen if seen_text is not None else None, floor_epoch)
        text = lease.encode()
        if seen_text is None or seen is None:
            won = self.map.put_if_absent(key, text) is None
        else:
            won = self.map.replace_if_same(key, seen_text, text)
        if not won:
            return None
        logger.debug("acquired lease %s with epoch %d", self.where(key), lease.epoch)
        return Held(lease, text, sent)

    def renew(self, key: str, held: Held) -> Held | None:
        """Extend a held lease; None when it is no longer ours (taken over after it expired for someone)."""
        sent = time.monotonic()
        lease = renewed(held)
        text = lease.encode()
        if self.map.replace_if_same(key, held.text, text):
            return Held(lease, text, sent)
        return None

    def release(self, key: str, held: Held) -> bool:
        """Make a held lease vacant, keeping its epoch; False when it was no longer ours."""
        vacant = vacated(held)
        released = self.map.replace_if_same(key, held.text, vacant.encode())
        if released:
            logger.debug("released lease %s (epoch %d)", self.where(key), held.lease.epoch)
        return released
