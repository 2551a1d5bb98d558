"""Hazelcast IMap semantics: record stores keyed by serialized key bytes, TTL / max-idle, locks, entry events.

Keys and values are the serialized ``Data`` bytes the client sends; they are never deserialized. Values are compared
by bytes (Hazelcast's BINARY in-memory format), so ``replace_if_same`` / ``remove_if_same`` / ``contains_value``
behave exactly like a default-configured Java member.

Blocking: Hazelcast parks a key-based mutating operation of a non-owner while another owner holds the key's lock
(``LockAwareOperation``), and parks ``lock`` until the lock is free. The engine never blocks: such an operation raises
``WouldBlock`` naming the waiters key to park on (``("map", name, key)``, notified whenever that lock is released)
and, when the holder's lease ends on its own, the monotonic time at which to retry. The caller re-runs the operation
after the wake-up; nothing was changed by the refused attempt.

Expiry is lazy (every operation ignores and purges expired records, firing EXPIRED) plus ``sweep()``, which the
member calls periodically so listeners hear about entries nobody touches.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace

from meteor_spark.server.engine.clock import Clock, Waiters
from meteor_spark.server.engine.listeners import Listeners
from meteor_spark.server.engine.map_records import EntryRecord, KeyLock, MapState
from meteor_spark.server.engine.map_types import (
    LONG_MAX,
    UNSET,
    EntryEvent,
    EntryEventType,
    Listener,
    LockOwner,
    MapConfigs,
    MapJournal,
    SimpleEntryView,
    WouldBlock,
)
from meteor_spark.server.errors import IllegalMonitorState

log = logging.getLogger(__name__)


def _as_recorded(duration_ms: int) -> int:
    """A TTL or max-idle as a Hazelcast entry view reports it: its records keep whole seconds (at least 1 when set),
    while the entry still expires on the exact milliseconds; LONG_MAX when unset."""
    if duration_ms <= 0:
        return LONG_MAX
    return max(1, duration_ms // 1000) * 1000


class Maps:
    """Every map of the member. Not thread-safe (see ``meteor_spark.server.engine``)."""

    def __init__(self, clock: Clock, waiters: Waiters, configs: MapConfigs | None = None) -> None:
        self._clock = clock
        self._waiters = waiters
        self._configs = configs if configs is not None else MapConfigs()
        self._stores: dict[str, MapState] = {}
        self._listeners: Listeners[Listener] = Listeners()
        self.journal: MapJournal | None = None

    # ------------------------------------------------------------------ plumbing

    def _store(self, name: str) -> MapState:
        store = self._stores.get(name)
        if store is None:
            store = self._stores[name] = MapState(self._configs.find(name))
        return store

    def names(self) -> list[str]:
        return sorted(self._stores)

    def entry_count(self) -> int:
        """Records held across all maps, expired ones not yet purged included (cheap; for log compaction)."""
        return sum(len(store.records) for store in self._stores.values())

    @staticmethod
    def wait_key(name: str, key: bytes) -> tuple[str, str, bytes]:
        """The waiters key notified whenever the lock on ``key`` is released."""
        return ("map", name, key)

    def _live(self, name: str, store: MapState, key: bytes) -> EntryRecord | None:
        """The record under ``key`` unless absent or expired (an expired one is purged, firing EXPIRED)."""
        record = store.records.get(key)
        if record is None:
            return None
        expires = record.expires_at_mono()
        if expires is not None and self._clock.monotonic_ms() >= expires:
            self._drop(name, store, key)
            self._fire(name, EntryEventType.EXPIRED, key, None, record.value)
            return None
        return record

    def _live_items(self, name: str, store: MapState) -> Iterator[tuple[bytes, EntryRecord]]:
        for key in list(store.records):
            record = self._live(name, store, key)
            if record is not None:
                yield key, record

    def _drop(self, name: str, store: MapState, key: bytes) -> EntryRecord | None:
        record = store.records.pop(key, None)
        store.expiring.discard(key)
        if record is not None and self.journal is not None:
            self.journal.map_remove(name, key)
        return record

    def _touch(self, record: EntryRecord) -> None:
        record.hits += 1
        record.accessed_wall = self._clock.now_ms()
        record.accessed_mono = self._clock.monotonic_ms()

    def _write(
        self,
        name: str,
        store: MapState,
        key: bytes,
        value: bytes,
        ttl_ms: int,
        max_idle_ms: int,
        existing: EntryRecord | None,
    ) -> None:
        """Store ``value`` under ``key`` with Hazelcast's per-write TTL rules and fire ADDED or UPDATED."""
        clock = self._clock
        now_wall, now_mono = clock.now_ms(), clock.monotonic_ms()
        config = store.config
        ttl = config.time_to_live_seconds * 1000 if ttl_ms < 0 else ttl_ms
        max_idle = config.max_idle_seconds * 1000 if max_idle_ms < 0 else max_idle_ms
        if existing is None:
            record = EntryRecord(value, now_wall, now_wall, now_wall, ttl, max_idle, now_mono, now_mono)
            store.records[key] = record
        else:
            record = existing
            old_value = record.value
            record.value = value
            record.updated_wall = record.accessed_wall = now_wall
            record.ttl_base_mono = record.accessed_mono = now_mono
            record.ttl_ms, record.max_idle_ms = ttl, max_idle
            record.version += 1
        if ttl > 0 or max_idle > 0:
            store.expiring.add(key)
        elif store.expiring:
            store.expiring.discard(key)
        if self.journal is not None:
            self._journal_put(name, key, record)
        if name not in self._listeners.names:
            return  # no event object for a map nobody listens to (every write of the common case)
        if existing is None:
            self._fire(name, EntryEventType.ADDED, key, value, None)
        else:
            self._fire(name, EntryEventType.UPDATED, key, value, old_value)

    def _track_expiry(self, store: MapState, key: bytes, record: EntryRecord) -> None:
        if record.ttl_ms > 0 or record.max_idle_ms > 0:
            store.expiring.add(key)
        else:
            store.expiring.discard(key)

    def _journal_put(self, name: str, key: bytes, record: EntryRecord) -> None:
        if self.journal is None:
            return
        expires = record.expires_at_mono()
        expires_wall = None if expires is None else self._clock.now_ms() + int(expires - self._clock.monotonic_ms())
        self.journal.map_put(name, key, record.value, expires_wall, record.ttl_ms, record.max_idle_ms)

    def _put_value(
        self, name: str, store: MapState, key: bytes, value: bytes, ttl_ms: int, max_idle_ms: int
    ) -> bytes | None:
        existing = self._live(name, store, key)
        old = existing.value if existing is not None else None
        self._write(name, store, key, value, ttl_ms, max_idle_ms, existing)
        return old

    def _lock_of(self, name: str, store: MapState, key: bytes) -> KeyLock | None:
        """The live lock on ``key``; a lock whose lease ended is released here (waking its waiters)."""
        lock = store.locks.get(key)
        if lock is None:
            return None
        if lock.expires_mono is not None and self._clock.monotonic_ms() >= lock.expires_mono:
            del store.locks[key]
            self._waiters.notify(self.wait_key(name, key))
            return None
        return lock

    def _check_lock(self, name: str, store: MapState, key: bytes, caller: LockOwner) -> None:
        """Hazelcast's ``LockAwareOperation.shouldWait``: a non-owner's mutation waits while the key is locked."""
        lock = self._lock_of(name, store, key)
        if lock is not None and lock.owner != caller:
            raise WouldBlock(self.wait_key(name, key), lock.expires_mono)

    # ------------------------------------------------------------------ reads

    def get(self, name: str, key: bytes) -> bytes | None:
        store = self._stores.get(name) or self._store(name)
        record = store.records.get(key)
        if record is None:
            return None
        if record.ttl_ms > 0 or record.max_idle_ms > 0:  # only a record that can expire needs the expiry check
            record = self._live(name, store, key)
            if record is None:
                return None
        clock = self._clock
        record.hits += 1
        record.accessed_wall = clock.now_ms()
        record.accessed_mono = clock.monotonic_ms()
        return record.value

    def contains_key(self, name: str, key: bytes) -> bool:
        store = self._store(name)
        record = self._live(name, store, key)
        if record is None:
            return False
        self._touch(record)
        return True

    def contains_value(self, name: str, value: bytes) -> bool:
        store = self._store(name)
        return any(record.value == value for _, record in self._live_items(name, store))

    def get_all(self, name: str, keys: Iterable[bytes]) -> list[tuple[bytes, bytes]]:
        store = self._store(name)
        found: list[tuple[bytes, bytes]] = []
        seen: set[bytes] = set()
        for key in keys:
            if key in seen:
                continue
            seen.add(key)
            record = self._live(name, store, key)
            if record is not None:
                self._touch(record)
                found.append((key, record.value))
        return found

    def key_set(self, name: str) -> list[bytes]:
        return [key for key, _ in self._live_items(name, self._store(name))]

    def values(self, name: str) -> list[bytes]:
        return [record.value for _, record in self._live_items(name, self._store(name))]

    def entry_set(self, name: str) -> list[tuple[bytes, bytes]]:
        return [(key, record.value) for key, record in self._live_items(name, self._store(name))]

    def size(self, name: str) -> int:
        return sum(1 for _ in self._live_items(name, self._store(name)))

    def is_empty(self, name: str) -> bool:
        return next(self._live_items(name, self._store(name)), None) is None

    def get_entry_view(self, name: str, key: bytes) -> SimpleEntryView | None:
        store = self._store(name)
        record = self._live(name, store, key)
        if record is None:
            return None
        expires = record.expires_at_mono()
        expiration = LONG_MAX if expires is None else self._clock.now_ms() + int(expires - self._clock.monotonic_ms())
        stats = store.config.per_entry_stats_enabled
        return SimpleEntryView(
            key=key,
            value=record.value,
            cost=len(key) + len(record.value),
            creation_time=record.created_wall if stats else UNSET,
            expiration_time=expiration,
            hits=record.hits if stats else UNSET,
            last_access_time=record.accessed_wall if stats else UNSET,
            last_stored_time=0 if stats else UNSET,
            last_update_time=record.updated_wall if stats or expires is not None else UNSET,
            version=record.version,
            ttl=_as_recorded(record.ttl_ms),
            max_idle=_as_recorded(record.max_idle_ms),
        )

    # ------------------------------------------------------------------ writes (lock-aware)

    def put(
        self, name: str, key: bytes, value: bytes, caller: LockOwner, ttl_ms: int = -1, max_idle_ms: int = -1
    ) -> bytes | None:
        """Store and return the previous value (None if absent). Raises ``WouldBlock`` if another owner locked it."""
        store = self._stores.get(name) or self._store(name)
        if store.locks:  # no call at all for a map without locks (the common case)
            self._check_lock(name, store, key, caller)
        existing = self._live(name, store, key)
        old = existing.value if existing is not None else None
        self._write(name, store, key, value, ttl_ms, max_idle_ms, existing)
        return old

    def set(
        self, name: str, key: bytes, value: bytes, caller: LockOwner, ttl_ms: int = -1, max_idle_ms: int = -1
    ) -> None:
        self.put(name, key, value, caller, ttl_ms, max_idle_ms)

    put_transient = set

    def put_if_absent(
        self, name: str, key: bytes, value: bytes, caller: LockOwner, ttl_ms: int = -1, max_idle_ms: int = -1
    ) -> bytes | None:
        """Store only if absent; return the existing value (None when this call stored it)."""
        store = self._store(name)
        self._check_lock(name, store, key, caller)
        existing = self._live(name, store, key)
        if existing is not None:
            self._touch(existing)
            return existing.value
        self._write(name, store, key, value, ttl_ms, max_idle_ms, None)
        return None

    def replace(self, name: str, key: bytes, value: bytes, caller: LockOwner) -> bytes | None:
        """Replace only if present; return the previous value (None: absent, nothing stored)."""
        store = self._store(name)
        self._check_lock(name, store, key, caller)
        existing = self._live(name, store, key)
        if existing is None:
            return None
        return self._put_value(name, store, key, value, -1, -1)

    def replace_if_same(self, name: str, key: bytes, expected: bytes, value: bytes, caller: LockOwner) -> bool:
        """Compare-and-set by serialized bytes."""
        store = self._store(name)
        self._check_lock(name, store, key, caller)
        existing = self._live(name, store, key)
        if existing is None or existing.value != expected:
            return False
        self._put_value(name, store, key, value, -1, -1)
        return True

    def _remove_record(self, name: str, store: MapState, key: bytes, event_old_value: bool = True) -> bytes | None:
        """Drop the entry and fire REMOVED, with the removed value as the event's old value unless
        ``event_old_value`` is False (``delete``: Hazelcast's delete never reads the value, so its event has none)."""
        existing = self._live(name, store, key)
        if existing is None:
            return None
        self._drop(name, store, key)
        self._fire(name, EntryEventType.REMOVED, key, None, existing.value if event_old_value else None)
        return existing.value

    def remove(self, name: str, key: bytes, caller: LockOwner) -> bytes | None:
        store = self._store(name)
        self._check_lock(name, store, key, caller)
        return self._remove_record(name, store, key)

    def delete(self, name: str, key: bytes, caller: LockOwner) -> None:
        store = self._store(name)
        self._check_lock(name, store, key, caller)
        self._remove_record(name, store, key, event_old_value=False)

    def remove_if_same(self, name: str, key: bytes, expected: bytes, caller: LockOwner) -> bool:
        store = self._store(name)
        self._check_lock(name, store, key, caller)
        existing = self._live(name, store, key)
        if existing is None or existing.value != expected:
            return False
        self._remove_record(name, store, key)
        return True

    def set_ttl(self, name: str, key: bytes, ttl_ms: int, caller: LockOwner) -> bool:
        """Restart the entry's TTL from now (0 = never, negative = map default); False if absent or expired."""
        store = self._store(name)
        self._check_lock(name, store, key, caller)
        record = self._live(name, store, key)
        if record is None:
            return False
        record.ttl_ms = store.config.time_to_live_seconds * 1000 if ttl_ms < 0 else ttl_ms
        record.ttl_base_mono = self._clock.monotonic_ms()
        record.version += 1  # Hazelcast counts a TTL change as an update of the entry
        self._track_expiry(store, key, record)
        self._journal_put(name, key, record)
        return True

    def evict(self, name: str, key: bytes, caller: LockOwner) -> bool:
        store = self._store(name)
        self._check_lock(name, store, key, caller)
        record = self._live(name, store, key)
        if record is None:
            return False
        self._drop(name, store, key)
        self._fire(name, EntryEventType.EVICTED, key, None, record.value)
        return True

    def put_all(self, name: str, entries: Iterable[tuple[bytes, bytes]]) -> None:
        """Store every entry. Like Hazelcast, ``putAll`` ignores locks held by others."""
        store = self._store(name)
        for key, value in entries:
            self._put_value(name, store, key, value, -1, -1)

    def _remove_unlocked(self, name: str, event_type: EntryEventType) -> int:
        store = self._store(name)
        removed = 0
        for key, _ in list(self._live_items(name, store)):
            if self._lock_of(name, store, key) is None:
                self._drop(name, store, key)
                removed += 1
        if removed:
            self._fire(name, event_type, None, None, None, removed)
        return removed

    def clear(self, name: str) -> int:
        """Remove every entry whose key is not locked (Hazelcast skips locked keys); fire CLEAR_ALL."""
        return self._remove_unlocked(name, EntryEventType.CLEAR_ALL)

    def evict_all(self, name: str) -> int:
        """Evict every entry whose key is not locked; fire EVICT_ALL."""
        return self._remove_unlocked(name, EntryEventType.EVICT_ALL)

    def flush(self, name: str) -> None:
        """No map store behind the member's maps, so there is nothing to write behind."""
        self._store(name)

    def destroy(self, name: str) -> None:
        """Drop the map's data, locks and listeners (``destroy_proxy``); waiters re-check and find it free."""
        store = self._stores.pop(name, None)
        self._listeners.drop(name)
        if self.journal is not None:
            self.journal.map_destroy(name)
        if store is not None:
            for key in list(store.locks):
                self._waiters.notify(self.wait_key(name, key))

    # ------------------------------------------------------------------ locks

    def lock(self, name: str, key: bytes, caller: LockOwner, lease_ms: int, reference_id: int) -> None:
        """Acquire (or re-enter) the lock; raise ``WouldBlock`` while another owner holds it.

        A repeated ``reference_id`` from the current owner is a client retry and does not count again
        (``LockResourceImpl``). ``lease_ms < 0``: held until unlocked; otherwise released ``lease_ms`` after the
        latest acquire.
        """
        store = self._store(name)
        lock = self._lock_of(name, store, key)
        now = self._clock.monotonic_ms()
        expires = None if lease_ms < 0 else now + lease_ms
        if lock is None:
            store.locks[key] = KeyLock(caller, 1, reference_id, expires, self._clock.now_ms())
            return
        if lock.owner != caller:
            raise WouldBlock(self.wait_key(name, key), lock.expires_mono)
        if lock.reference_id == reference_id:
            return
        lock.reference_id = reference_id
        lock.count += 1
        lock.expires_mono = expires

    def unlock(self, name: str, key: bytes, caller: LockOwner, reference_id: int) -> None:
        store = self._store(name)
        lock = self._lock_of(name, store, key)
        if lock is None or lock.owner != caller:
            owner_info = "<not-locked>" if lock is None else lock.owner.describe()
            raise IllegalMonitorState(f"Current thread is not owner of the lock! -> {owner_info}")
        if lock.reference_id == reference_id:
            return
        lock.reference_id = reference_id
        lock.count -= 1
        if lock.count == 0:
            del store.locks[key]
            self._waiters.notify(self.wait_key(name, key))

    def force_unlock(self, name: str, key: bytes) -> None:
        store = self._store(name)
        if store.locks.pop(key, None) is not None:
            self._waiters.notify(self.wait_key(name, key))

    def is_locked(self, name: str, key: bytes) -> bool:
        store = self._store(name)
        return self._lock_of(name, store, key) is not None

    def lock_owner(self, name: str, key: bytes) -> LockOwner | None:
        store = self._store(name)
        lock = self._lock_of(name, store, key)
        return None if lock is None else lock.owner

    def client_disconnected(self, client_uuid: uuid.UUID) -> int:
        """Release every lock the client holds (its connection is gone); return how many were released."""
        released = 0
        for name, store in self._stores.items():
            for key, lock in list(store.locks.items()):
                if lock.owner.client_uuid == client_uuid:
                    del store.locks[key]
                    released += 1
                    self._waiters.notify(self.wait_key(name, key))
        if released:
            log.info("released %d map lock(s) held by disconnected client %s", released, client_uuid)
        return released

    # ------------------------------------------------------------------ listeners and expiry

    def add_listener(
        self,
        name: str,
        sink: Callable[[EntryEvent], None],
        *,
        key: bytes | None = None,
        include_value: bool = True,
        flags: int = 0,
    ) -> uuid.UUID:
        """Send ``name``'s events whose type is in ``flags`` (and, with ``key``, only that key's) to ``sink``."""
        return self._listeners.add(name, Listener(key, include_value, flags, sink))

    def remove_listener(self, name: str, registration_id: uuid.UUID) -> bool:
        return self._listeners.remove(name, registration_id)

    def _fire(
        self,
        name: str,
        event_type: EntryEventType,
        key: bytes | None,
        value: bytes | None,
        old_value: bytes | None,
        affected_entries: int = 1,
    ) -> None:
        if name not in self._listeners:
            return  # the common case: no event object is built for a map nobody listens to
        event = EntryEvent(name, event_type, key, value, old_value, affected_entries)
        for registration_id, registration in self._listeners.of(name):
            if not registration.flags & event.event_type:
                continue
            if registration.key is not None and event.key is not None and registration.key != event.key:
                continue
            delivered = event if registration.include_value else replace(event, value=None, old_value=None)
            try:
                registration.sink(delivered)
            except Exception:  # a broken listener connection must not fail the operation that fired the event
                log.exception("entry listener %s on map %r failed", registration_id, event.map_name)

    def sweep(self) -> int:
        """Purge every expired entry (firing EXPIRED) and every lapsed lock lease; return entries expired."""
        expired = 0
        for name, store in list(self._stores.items()):
            for key in list(store.expiring):
                if key in store.records and self._live(name, store, key) is None:
                    expired += 1
            for key in list(store.locks):
                self._lock_of(name, store, key)
        return expired

    # ------------------------------------------------------------------ persistence

    def restore(
        self, name: str, key: bytes, value: bytes, expires_wall_ms: int | None, ttl_ms: int, max_idle_ms: int
    ) -> None:
        """Reinstall a recovered entry without events or journal writes; already-expired entries are skipped."""
        now_wall, now_mono = self._clock.now_ms(), self._clock.monotonic_ms()
        store = self._store(name)
        if expires_wall_ms is not None and expires_wall_ms <= now_wall:
            store.records.pop(key, None)
            store.expiring.discard(key)
            return
        remaining = None if expires_wall_ms is None else expires_wall_ms - now_wall
        record = EntryRecord(value, now_wall, now_wall, now_wall, ttl_ms, max_idle_ms, now_mono, now_mono)
        if remaining is not None and ttl_ms > 0:
            # Re-anchor the TTL so the entry still expires at the recorded wall-clock time.
            record.ttl_base_mono = now_mono + remaining - ttl_ms
        store.records[key] = record
        self._track_expiry(store, key, record)

    def restore_remove(self, name: str, key: bytes) -> None:
        store = self._store(name)
        store.records.pop(key, None)
        store.expiring.discard(key)

    def restore_destroy(self, name: str) -> None:
        self._stores.pop(name, None)

    def snapshot(self) -> Iterator[tuple[str, bytes, bytes, int | None, int, int]]:
        """Every live entry as ``(map, key, value, expires_wall_ms, ttl_ms, max_idle_ms)`` (for log compaction)."""
        for name, store in self._stores.items():
            for key, record in self._live_items(name, store):
                expires = record.expires_at_mono()
                expires_wall = (
                    None if expires is None else self._clock.now_ms() + int(expires - self._clock.monotonic_ms())
                )
                yield name, key, record.value, expires_wall, record.ttl_ms, record.max_idle_ms
