"""Persistence: ring buffers and maps survive a restart of the member (SIGKILL included).

Layout of ``data_dir``::

    LOCK                            held (flock) by the member using the directory
    rings/<quoted ring name>.log    one append-only log per ring: every item ever added, in sequence order
    maps.log                        the map change log (put / remove / destroy), compacted into a snapshot at start

This module ties the parts together for one member (``attach``); each part is its own module:

- ``log_records``: the record framing every log shares (``length | crc32 | body``) and the ``Damage`` it reports;
- ``log_recovery``: the scan at start (torn tails truncated, other damage quarantined, never silently dropped);
- ``fsync``: the fsync policy (``always`` group commit, ``interval``, ``never``), one ``Syncer`` for all logs;
- ``ring_store``: a ring's log, its history below the head and its high-water mark;
- ``map_log``: the map change log and its record layouts.

Locks, listeners, AtomicLongs and FlakeId state are not persisted (a restarted Hazelcast member loses them too).
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

from meteor_spark.server.engine.fsync import Syncer, fsync_dir
from meteor_spark.server.engine.log_records import Damage
from meteor_spark.server.engine.map_log import PUT, REMOVE, MapLog, write_snapshot
from meteor_spark.server.engine.ring_store import RingStore
from meteor_spark.server.errors import InvalidConfiguration

if TYPE_CHECKING:
    from meteor_spark.server.engine import Engine
    from meteor_spark.server.engine.ringbuffer import RingConfig
log = logging.getLogger(__name__)

COMPACT_MIN_RECORDS = 100_000
"""The map log is compacted when it holds this many records and four times more than live entries."""


class Persistence:
    """All of a member's persistent state under one ``data_dir``."""

    def __init__(self, engine: Engine) -> None:
        config = engine.config
        assert config.data_dir is not None
        self.root = Path(config.data_dir)
        self.rings_dir = self.root / "rings"
        self.rings_dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = _lock_directory(self.root)
        self.syncer = Syncer(config.fsync, config.fsync_interval_ms)
        self._engine = engine
        self._ring_stores: dict[str, RingStore] = {}
        self.map_log = MapLog(self.root / "maps.log", self.syncer)

    # -- rings

    def ring_store(self, name: str, config: RingConfig) -> RingStore:
        """The ``RingService.store_factory``: the log of ring ``name`` (recovered by the ring at creation)."""
        previous = self._ring_stores.pop(name, None)
        if previous is not None:
            previous.close()
        forget = functools.partial(self._forget_ring, name)
        store = RingStore(self.rings_dir / (_file_name(name) + ".log"), self.syncer, forget)
        self._ring_stores[name] = store
        return store

    def _forget_ring(self, name: str, store: RingStore) -> None:
        """A ring's log was destroyed with its ring: it is no longer one of the logs open now (kept, it would be one
        entry more per stream ever created and deleted)."""
        if self._ring_stores.get(name) is store:
            del self._ring_stores[name]

    def open_ring_logs(self) -> list[str]:
        """Names of the rings whose logs are open now (every ring alive on this member)."""
        return list(self._ring_stores)

    # -- maps

    def quarantined(self) -> list[Damage]:
        """The damaged ranges moved aside when the logs open now were recovered (rings, then the map log)."""
        damage = [item for store in self._ring_stores.values() for item in store.quarantined]
        return damage + list(self.map_log.quarantined)

    def recover_maps(self) -> int:
        """Replay the map log into ``engine.maps``; return the number of live entries."""
        maps = self._engine.maps
        for kind, name, key, value, expires, ttl, max_idle in self.map_log.replay():
            if kind == PUT:
                maps.restore(name, key, value, expires, ttl, max_idle)
            elif kind == REMOVE:
                maps.restore_remove(name, key)
            else:
                maps.restore_destroy(name)
        live = sum(1 for _ in maps.snapshot())
        log.info(
            "maps recovered from %s: %d live entries from %d log records", self.map_log.path, live, self.map_log.records
        )
        return live

    def compact_maps(self) -> None:
        """Rewrite the map log as a snapshot of the live entries (atomic rename; fsynced whatever the policy)."""
        tmp_path = self.map_log.path.with_suffix(".log.tmp")
        records = write_snapshot(tmp_path, self._engine.maps.snapshot())
        self.map_log.close()
        os.replace(tmp_path, self.map_log.path)
        fsync_dir(self.root)
        self.map_log = MapLog(self.map_log.path, self.syncer)
        self.map_log.records = records
        self._engine.maps.journal = self.map_log
        log.info("map log compacted to %d records", records)

    def maybe_compact_maps(self) -> None:
        records = self.map_log.records
        if records >= COMPACT_MIN_RECORDS and records > 4 * max(self._engine.maps.entry_count(), 1):
            self.compact_maps()

    # -- lifecycle

    async def commit(self) -> None:
        """Await durability of every write made so far (per the fsync policy); compacts the map log when due."""
        self.maybe_compact_maps()
        await self.syncer.commit()

    def close(self) -> None:
        for store in self._ring_stores.values():
            store.close()
        self._ring_stores.clear()
        self.syncer.close()
        self.map_log.close()
        os.close(self._lock_fd)  # releases the flock


def attach(engine: Engine) -> Persistence:
    """Open ``engine.config.data_dir``: recover maps, give rings their logs, and close everything at shutdown."""
    persistence = Persistence(engine)
    persistence.recover_maps()
    persistence.compact_maps()
    engine.maps.journal = persistence.map_log
    engine.rings.store_factory = persistence.ring_store
    engine.persistence = persistence
    engine.close_hooks.append(persistence.close)
    log.info("persistence on %s with fsync=%s", persistence.root, engine.config.fsync)
    return persistence


def _lock_directory(root: Path) -> int:
    """Hold an exclusive lock on ``root`` for this member's lifetime (the kernel drops it if the process dies).

    Raises:
        InvalidConfiguration: another member uses the directory; two writers would corrupt each other's logs.
    """
    fd = os.open(root / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise InvalidConfiguration(
            f"data directory {root} is in use by another member; stop it or give this member its own --data-dir"
        ) from None
    return fd


def _file_name(name: str) -> str:
    """A file name for any object name: quoted, and shortened with a hash when very long."""
    quoted = quote(name, safe="")
    if len(quoted) > 150:
        quoted = quoted[:100] + "~" + hashlib.sha256(name.encode("utf-8")).hexdigest()[:32]
    return quoted
