"""The map change log (``MapLog``, the ``engine.maps.MapJournal`` of a persistent member): ``maps.log``.

Every committed map change is one record (put / remove / destroy); ``Persistence`` replays the log into the maps at
start and compacts it into a snapshot of the live entries. The record layouts are declared here, once, for the
writer, the replay and the scanner's check of a body (``MAP_RECORD``).
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path

from meteor_spark.server.engine.fsync import Syncer
from meteor_spark.server.engine.log_records import HEADER, Damage, append_record
from meteor_spark.server.engine.log_recovery import BodyShape, Scanner, quarantine, report_damage, truncate_torn

log = logging.getLogger(__name__)

PUT, REMOVE, DESTROY = 1, 2, 3
"""Record kinds (a body's first byte)."""
PUT_FIXED = struct.Struct("<BqqqII")
"""kind, expiry (wall ms, -1 = none), ttl ms, max-idle ms, name length, key length; then name, key, value."""
REMOVE_FIXED = struct.Struct("<BII")
"""kind, name length, key length; then name, key."""
DESTROY_FIXED = struct.Struct("<BI")
"""kind, name length; then name."""


def _fits(body: bytes, length: int) -> bool:
    """Whether the fixed fields of a map record (``body``: up to its fixed part) agree with its length."""
    kind = body[0]
    fixed = {PUT: PUT_FIXED, REMOVE: REMOVE_FIXED, DESTROY: DESTROY_FIXED}.get(kind)
    if fixed is None or len(body) < fixed.size:
        return False
    if kind == PUT:
        _, _, _, _, name_len, key_len = PUT_FIXED.unpack_from(body)
        return PUT_FIXED.size + name_len + key_len <= length
    if kind == REMOVE:
        _, name_len, key_len = REMOVE_FIXED.unpack_from(body)
        return REMOVE_FIXED.size + name_len + key_len == length
    _, name_len = DESTROY_FIXED.unpack_from(body)
    return DESTROY_FIXED.size + name_len == length


MAP_RECORD = BodyShape("map record", DESTROY_FIXED.size, PUT_FIXED.size, _fits)


class MapLog:
    """The map change log (``engine.maps.MapJournal``)."""

    def __init__(self, path: Path, syncer: Syncer) -> None:
        self.path = path
        self._syncer = syncer
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        self.records = 0
        self.quarantined: list[Damage] = []
        """What the last ``replay`` moved out of the log (damaged ranges)."""

    def _write(self, parts: list[bytes | bytearray | memoryview]) -> None:
        append_record(self._fd, parts)
        self.records += 1
        self._syncer.written(self._fd)

    def map_put(
        self, name: str, key: bytes, value: bytes, expires_wall_ms: int | None, ttl_ms: int, max_idle_ms: int
    ) -> None:
        encoded = name.encode("utf-8")
        fixed = PUT_FIXED.pack(
            PUT, -1 if expires_wall_ms is None else expires_wall_ms, ttl_ms, max_idle_ms, len(encoded), len(key)
        )
        self._write([fixed, encoded, key, value])

    def map_remove(self, name: str, key: bytes) -> None:
        encoded = name.encode("utf-8")
        self._write([REMOVE_FIXED.pack(REMOVE, len(encoded), len(key)), encoded, key])

    def map_destroy(self, name: str) -> None:
        encoded = name.encode("utf-8")
        self._write([DESTROY_FIXED.pack(DESTROY, len(encoded)), encoded])

    def replay(self) -> Iterator[tuple[int, str, bytes, bytes, int | None, int, int]]:
        """Every intact record as ``(kind, map, key, value, expires_wall_ms, ttl_ms, max_idle_ms)``.

        A torn tail is truncated; damaged records elsewhere are copied to ``maps.log.quarantine-<n>`` and skipped (the
        compaction that follows every start rewrites the log without them).
        """
        result = Scanner(self._fd, self.path, verify=True, shape=MAP_RECORD).scan()
        for damage in result.damage:
            target = quarantine(self._fd, self.path, damage)
            report_damage(
                self.path,
                damage,
                target,
                "the map updates (put / remove / destroy) these bytes held; a key may "
                "show an older value, or a removed key come back",
            )
        self.quarantined = result.damage
        if result.torn is not None:
            truncate_torn(self._fd, self.path, result.torn)
        records = result.records
        self.records = len(records)
        for record in records:
            body = os.pread(self._fd, record.length, record.offset + HEADER.size)
            kind = body[0]
            if kind == PUT:
                _, expires, ttl, max_idle, name_len, key_len = PUT_FIXED.unpack_from(body)
                start = PUT_FIXED.size
                name = body[start : start + name_len].decode("utf-8")
                key = body[start + name_len : start + name_len + key_len]
                value = body[start + name_len + key_len :]
                yield kind, name, key, value, None if expires < 0 else expires, ttl, max_idle
            elif kind == REMOVE:
                _, name_len, key_len = REMOVE_FIXED.unpack_from(body)
                start = REMOVE_FIXED.size
                yield kind, body[start : start + name_len].decode("utf-8"), body[start + name_len :], b"", None, 0, 0
            elif kind == DESTROY:
                _, name_len = DESTROY_FIXED.unpack_from(body)
                yield kind, body[DESTROY_FIXED.size :].decode("utf-8"), b"", b"", None, 0, 0
            else:
                log.error("%s: unknown record kind %d at byte %d; skipped", self.path, kind, record.offset)

    def close(self) -> None:
        self._syncer.forget(self._fd)
        os.close(self._fd)


def write_snapshot(path: Path, entries: Iterable[tuple[str, bytes, bytes, int | None, int, int]]) -> int:
    """Write ``entries`` (``Maps.snapshot()``) as a fresh map log at ``path``, fsynced whatever the policy; the number
    of records written."""
    snapshot = MapLog(path, Syncer("never", 1))
    try:
        os.ftruncate(snapshot._fd, 0)
        for name, key, value, expires, ttl, max_idle in entries:
            snapshot.map_put(name, key, value, expires, ttl, max_idle)
        os.fsync(snapshot._fd)
        return snapshot.records
    finally:
        snapshot.close()
