"""A map's state in the member: its entry records, its key locks, and the keys whose record can expire.

The map engine (``maps.Maps``) owns and changes these; they are apart from it as plain data, the one concern of
this module, so the engine's module holds its logic only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from meteor_spark.server.engine.map_types import LockOwner, MapConfig


@dataclass(slots=True)
class EntryRecord:
    value: bytes
    created_wall: int
    updated_wall: int
    accessed_wall: int
    ttl_ms: int
    """0 = never; measured from ``ttl_base_mono`` (the last write or set_ttl)."""
    max_idle_ms: int
    """0 = never; measured from the last access (reads and writes)."""
    ttl_base_mono: float
    accessed_mono: float
    hits: int = 0
    version: int = 0

    def expires_at_mono(self) -> float | None:
        """When the record expires (monotonic ms): the earlier of its TTL and max-idle ends; None: never."""
        if self.max_idle_ms <= 0:
            return self.ttl_base_mono + self.ttl_ms if self.ttl_ms > 0 else None
        idle_end = self.accessed_mono + self.max_idle_ms
        return min(idle_end, self.ttl_base_mono + self.ttl_ms) if self.ttl_ms > 0 else idle_end


@dataclass(slots=True)
class KeyLock:
    owner: LockOwner
    count: int
    reference_id: int
    expires_mono: float | None
    acquired_wall: int


@dataclass
class MapState:
    config: MapConfig
    records: dict[bytes, EntryRecord] = field(default_factory=dict)
    locks: dict[bytes, KeyLock] = field(default_factory=dict)
    expiring: set[bytes] = field(default_factory=set)
    """Keys whose record can expire, so ``sweep`` never scans the whole map."""
