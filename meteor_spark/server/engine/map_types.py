"""The values the map engine shares with the rest of the member: its configs, lock owners, events, entry views and
the ``WouldBlock`` refusal, and the ``MapJournal`` persistence implements.

Apart from ``engine.maps`` so that the handlers, the protocol codecs, persistence and the member's options use these
values without importing the map engine's state and logic.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from enum import IntFlag
from typing import NamedTuple, Protocol

from meteor_spark.server.engine.configs import NamedConfigs, check_pattern
from meteor_spark.server.errors import InvalidConfiguration

LONG_MAX = (1 << 63) - 1
"""What Hazelcast reports for "never" in entry views (``Long.MAX_VALUE``)."""

UNSET = -1
"""What Hazelcast reports in entry views for per-entry statistics it does not keep (``Record.UNSET``)."""


class EntryEventType(IntFlag):
    """Hazelcast ``EntryEventType`` ids; also the bits of a listener's ``listener_flags``."""

    ADDED = 1
    REMOVED = 2
    UPDATED = 4
    EVICTED = 8
    EXPIRED = 16
    EVICT_ALL = 32
    CLEAR_ALL = 64
    MERGED = 128
    INVALIDATION = 256
    LOADED = 512


class WouldBlock(Exception):
    """The operation cannot proceed yet; park on ``wait_key`` and retry (see the module docstring).

    ``retry_at_ms`` is the engine-clock monotonic time at which the obstacle goes away by itself (a lock lease
    ending), or None when only a notification can clear it.
    """

    def __init__(self, wait_key: Hashable, retry_at_ms: float | None = None) -> None:
        super().__init__(f"would block on {wait_key!r}")
        self.wait_key = wait_key
        self.retry_at_ms = retry_at_ms


class LockOwner(NamedTuple):
    """Hazelcast's lock owner: the client's uuid from authentication plus the client-side thread id.

    A named tuple rather than a dataclass: one is built for every map write, and tuples are the cheapest immutable
    value to build and compare.
    """

    client_uuid: uuid.UUID | None
    thread_id: int

    def describe(self) -> str:
        return f"Owner: {self.client_uuid}, thread ID: {self.thread_id}"


@dataclass(frozen=True)
class MapConfig:
    """Per-map settings, matched by name with Hazelcast's wildcard rules (``MapConfigs``).

    ``time_to_live_seconds`` / ``max_idle_seconds``: defaults applied when a write gives a negative TTL / max-idle
    (the client sends -1 when none is given); 0 means entries never expire.

    ``per_entry_stats_enabled``: Hazelcast 5.x's ``per-entry-stats-enabled``, off by default. Off, an entry view
    reports -1 for hits, last access time, creation time and last stored time, and for the last update time unless
    the entry expires (TTL or max-idle: the member keeps that time to expire it), as a Hazelcast member does.
    """

    name: str = "default"
    time_to_live_seconds: int = 0
    max_idle_seconds: int = 0
    per_entry_stats_enabled: bool = False

    def __post_init__(self) -> None:
        check_pattern("map", self.name)
        if self.per_entry_stats_enabled not in (0, 1):  # True / False, or 0 / 1 from a command line
            raise InvalidConfiguration(
                f"map config {self.name!r}: per-entry-stats must be 0 or 1, got {self.per_entry_stats_enabled!r}"
            )
        object.__setattr__(self, "per_entry_stats_enabled", bool(self.per_entry_stats_enabled))
        for setting in ("time_to_live_seconds", "max_idle_seconds"):
            value = getattr(self, setting)
            if value < 0:
                raise InvalidConfiguration(
                    f"map config {self.name!r}: {setting}={value} is negative; "
                    "use 0 for 'never expire' or a positive number of seconds"
                )

    def describe(self) -> str:
        """Java-like rendering, used in conflict messages."""
        return (
            f"MapConfig{{name='{self.name}', timeToLiveSeconds={self.time_to_live_seconds}, "
            f"maxIdleSeconds={self.max_idle_seconds}, "
            f"perEntryStatsEnabled={str(self.per_entry_stats_enabled).lower()}}}"
        )


class MapConfigs(NamedConfigs[MapConfig]):
    """The member's map configs; ``find`` picks the best match, else the ``default`` config."""

    def __init__(self, configs: Iterable[MapConfig] = ()) -> None:
        super().__init__(MapConfig(), configs)


@dataclass(frozen=True)
class EntryEvent:
    """One map event as Hazelcast publishes it (``key`` is None for map-wide CLEAR_ALL / EVICT_ALL)."""

    map_name: str
    event_type: EntryEventType
    key: bytes | None
    value: bytes | None = None
    old_value: bytes | None = None
    affected_entries: int = 1


@dataclass(frozen=True)
class SimpleEntryView:
    """Hazelcast's ``SimpleEntryView`` of one entry (also the protocol's custom struct of that name); times are epoch
    ms, ``LONG_MAX`` means never."""

    key: bytes
    value: bytes
    cost: int
    creation_time: int
    expiration_time: int
    hits: int
    last_access_time: int
    last_stored_time: int
    last_update_time: int
    version: int
    ttl: int
    max_idle: int


@dataclass(frozen=True)
class Listener:
    """An entry-listener registration: which events of which key (None: all keys) go to ``sink``."""

    key: bytes | None
    include_value: bool
    flags: int
    sink: Callable[[EntryEvent], None]


class MapJournal(Protocol):
    """Where committed map changes go when persistence is on (``map_log.MapLog``)."""

    def map_put(
        self, name: str, key: bytes, value: bytes, expires_wall_ms: int | None, ttl_ms: int, max_idle_ms: int
    ) -> None: ...

    def map_remove(self, name: str, key: bytes) -> None: ...

    def map_destroy(self, name: str) -> None: ...
