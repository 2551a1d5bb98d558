"""Persistence: ring buffers and maps survive a restart of the member (SIGKILL included).

Layout of ``data_dir``::

    rings/<quoted ring name>.log    one append-only log per ring: every item ever added, in sequence order
    maps.log                        the map change log (put / remove / destroy), compacted into a snapshot at start

Every record is framed as ``uint32 length | uint32 crc32 | body`` (little-endian); a ring record's body starts with
its int64 sequence. At recovery the logs are scanned; the first record that is cut short or fails its CRC marks a
torn tail (a write the crash interrupted, never acknowledged under ``fsync=always``): the file is truncated there,
with a warning, and nothing after it is ever served.

Durability (``EngineConfig.fsync``, documented for users in ``docs/persistence.md``):

- ``always``: an operation is acknowledged only after an fsync that started after its write. Writers that arrive
  while an fsync runs share the next one (group commit), so the cost is one fsync per batch of concurrent writes,
  not per write.
- ``interval``: writes reach the OS before the acknowledgement (a killed process loses nothing); a background
  thread fsyncs every ``fsync_interval_ms``, so a machine crash may lose that last interval.
- ``never``: writes reach the OS before the acknowledgement; the OS decides when they reach the disk.

Ring history: a ring's log keeps every item, so reads below the ring's head are served from disk (Hazelcast's
RingbufferStore). Nothing is deleted until the ring is destroyed. Locks, listeners, AtomicLongs and FlakeId state are
not persisted (a restarted Hazelcast member loses them too).
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import hashlib
import logging
import os
import struct
import threading
import zlib
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator
from urllib.parse import quote

from meteor_spark.server.errors import InvalidConfiguration

if TYPE_CHECKING:
    from meteor_spark.server.engine import Engine
    from meteor_spark.server.engine.ringbuffer import RingConfig

log = logging.getLogger(__name__)

_HEADER = struct.Struct("<II")
_SEQUENCE = struct.Struct("<q")
_MAX_RECORD = 1 << 31  # a length beyond this is garbage, not a record

_PUT, _REMOVE, _DESTROY = 1, 2, 3
_PUT_FIXED = struct.Struct("<BqqqII")
_REMOVE_FIXED = struct.Struct("<BII")
_DESTROY_FIXED = struct.Struct("<BI")

_COMPACT_MIN_RECORDS = 100_000
"""The map log is compacted when it holds this many records and four times more than live entries."""


# ------------------------------------------------------------------------------------------------ record framing


def frame(body_parts: list[bytes | bytearray | memoryview]) -> list[bytes | bytearray | memoryview]:
    """``length | crc32 | body`` as a list of buffers for ``os.writev`` (the body is never copied)."""
    crc = 0
    length = 0
    for part in body_parts:
        crc = zlib.crc32(part, crc)
        length += len(part)
    return [_HEADER.pack(length, crc), *body_parts]


def _append_record(fd: int, body_parts: list[bytes | bytearray | memoryview]) -> int:
    """Append one framed record to a log opened with ``O_APPEND``; the bytes written.

    Raises:
        OSError: the write failed (disk full...): the operation is refused, never acknowledged.
    """
    parts = frame(body_parts)
    expected = sum(len(part) for part in parts)
    written = os.writev(fd, parts)
    while written < expected:  # a short write: finish the record, never leave a silent hole in the log
        written += os.write(fd, b"".join(bytes(part) for part in parts)[written:])
    return expected


@dataclass(frozen=True)
class _Scanned:
    offset: int
    """File offset of the record's header."""
    length: int
    """Body length."""
    crc: int


def _truncate(fd: int, path: Path, offset: int, reason: str) -> None:
    size = os.fstat(fd).st_size
    log.warning(
        "%s: torn tail after a crash: %s at byte %d; truncating %d bytes (never acknowledged under fsync=always)",
        path, reason, offset, size - offset,
    )
    os.ftruncate(fd, offset)


def scan(fd: int, path: Path, verify: bool = True) -> tuple[list[_Scanned], int]:
    """Walk the records of a log; return them and the offset where valid data ends.

    The file is truncated at the first record that is cut short or (with ``verify``) fails its CRC. Without
    ``verify`` only lengths are checked; the caller then checks the CRCs of what it reads.
    """
    size = os.fstat(fd).st_size
    records: list[_Scanned] = []
    offset = 0
    reason = ""
    while offset < size:
        if size - offset < _HEADER.size:
            reason = f"a record header cut short ({size - offset} of {_HEADER.size} bytes)"
            break
        length, crc = _HEADER.unpack(os.pread(fd, _HEADER.size, offset))
        end = offset + _HEADER.size + length
        if length >= _MAX_RECORD or end > size:
            reason = f"a record of {length} bytes cut short by the end of the file ({size - offset} bytes left)"
            break
        if verify and zlib.crc32(os.pread(fd, length, offset + _HEADER.size)) != crc:
            reason = "a record whose CRC does not match its contents"
            break
        records.append(_Scanned(offset, length, crc))
        offset = end
    if offset < size:
        _truncate(fd, path, offset, reason)
    return records, offset


# ------------------------------------------------------------------------------------------------ fsync policy


class Syncer:
    """Makes written data durable according to the fsync policy; ``commit()`` is what handlers await.

    ``always``: a background thread runs fsync rounds; each round fsyncs every file written since the previous round
    and then completes every commit requested before the round started (group commit).
    """

    def __init__(self, policy: str, interval_ms: int) -> None:
        # ``policy`` and ``interval_ms`` come validated from ``EngineConfig``.
        self.policy = policy
        self.interval_ms = interval_ms
        self._cond = threading.Condition()
        self._dirty: set[int] = set()
        self._requested = 0
        self._waiters: list[tuple[int, asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._closing = False
        self._fsync_lock = threading.Lock()
        self._failure: OSError | None = None
        self._thread: threading.Thread | None = None
        if policy != "never":
            self._thread = threading.Thread(target=self._run, name=f"meteor-fsync-{policy}", daemon=True)
            self._thread.start()

    def written(self, fd: int) -> None:
        """Note that ``fd`` has data the next fsync round must cover (called right after the write)."""
        if self.policy == "never":
            return
        with self._cond:
            self._dirty.add(fd)

    async def commit(self) -> None:
        """Return once everything written so far is as durable as the policy promises.

        Raises:
            OSError: an fsync failed; the write is not acknowledged (the member keeps refusing until restarted,
                because after a failed fsync the kernel may have dropped the data: retrying would lie).
        """
        if self._failure is not None:
            raise self._failure
        if self.policy != "always":
            return
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._cond:
            self._requested += 1
            self._waiters.append((self._requested, loop, future))
            self._cond.notify()
        await future

    def forget(self, fd: int) -> None:
        """Stop syncing ``fd`` (about to be closed); waits for a running fsync round so none touches a closed (or
        reused) descriptor. Its data is fsynced now unless the policy is ``never``."""
        with self._fsync_lock:
            with self._cond:
                self._dirty.discard(fd)
            if self.policy != "never" and self._failure is None:
                self._sync({fd})

    def _run(self) -> None:
        while True:
            with self._cond:
                if self.policy == "always":
                    while not self._waiters and not self._closing:
                        self._cond.wait()
                else:
                    self._cond.wait(self.interval_ms / 1000.0)
                if self._closing and not self._waiters and not self._dirty:
                    return
                dirty, self._dirty = self._dirty, set()
                waiters, self._waiters = self._waiters, []
            # Outside the condition, so writers on the loop never wait for a disk. A descriptor closed (after
            # ``forget``, which fsyncs it) between the snapshot and here fails with EBADF, or belongs to a newer file
            # by then; either is harmless.
            with self._fsync_lock:
                failure = self._sync(dirty)
            for _, loop, future in waiters:
                loop.call_soon_threadsafe(_settle, future, failure)

    def _sync(self, fds: set[int]) -> OSError | None:
        for fd in fds:
            try:
                os.fsync(fd)
            except OSError as exc:
                if exc.errno == errno.EBADF:
                    continue
                log.error("fsync failed (%s); refusing further writes until the member restarts", exc)
                self._failure = exc
                return exc
        return None

    def close(self) -> None:
        """Stop the thread after a last fsync of what it still has to cover (``always`` / ``interval``)."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join()


def _settle(future: asyncio.Future[None], failure: OSError | None) -> None:
    if future.done():
        return
    if failure is None:
        future.set_result(None)
    else:
        future.set_exception(failure)


def _fsync_dir(path: Path) -> None:
    """Make a file's creation or rename durable (its directory entry)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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


# ------------------------------------------------------------------------------------------------ rings


class RingStore:
    """One ring's append-only log (``engine.ringbuffer.RingStore``): every item by sequence, including history
    below the ring's head."""

    def __init__(self, path: Path, syncer: Syncer) -> None:
        self.path = path
        self._syncer = syncer
        new = not path.exists()
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        if new and syncer.policy == "always":
            _fsync_dir(path.parent)
        self._offsets = array("q")
        """File offset of each record's header, by ``sequence - self._base``."""
        self._base = 0
        self._end = 0
        self._closed = False

    def recover(self, capacity: int) -> tuple[int, list[bytes]]:
        """(tail, the last ``capacity`` items) from the log; a torn tail is truncated first.

        Only the tail can be torn, and the last ``capacity`` records are read into memory anyway, so those are the
        records whose CRC is checked here (older history is checked when ``load`` reads it): a start never has to
        read a long history.
        """
        records, self._end = scan(self._fd, self.path, verify=False)
        keep = max(len(records) - capacity, 0)
        items: list[bytes] = []
        for index in range(keep, len(records)):
            record = records[index]
            body = os.pread(self._fd, record.length, record.offset + _HEADER.size)
            if zlib.crc32(body) != record.crc:
                _truncate(self._fd, self.path, record.offset, "a record whose CRC does not match its contents")
                del records[index:]
                self._end = record.offset
                break
            items.append(body[_SEQUENCE.size :])
        if not records:
            return -1, []
        first_sequence = _SEQUENCE.unpack(os.pread(self._fd, _SEQUENCE.size, records[0].offset + _HEADER.size))[0]
        self._base = first_sequence
        self._offsets.extend(record.offset for record in records)
        tail = first_sequence + len(records) - 1
        log.info("ring log %s: %d items on disk (sequences %d..%d)", self.path.name, len(records), first_sequence, tail)
        return tail, items[-capacity:] if capacity > 0 else []

    def append(self, sequence: int, item: bytes) -> None:
        if self._closed:
            raise OSError(errno.EBADF, f"ring log {self.path} is closed")
        if not self._offsets:
            self._base = sequence
        elif sequence != self._base + len(self._offsets):
            raise AssertionError(f"ring log {self.path}: sequence {sequence} after {self._base + len(self._offsets) - 1}")
        self._offsets.append(self._end)
        self._end += _append_record(self._fd, [_SEQUENCE.pack(sequence), item])
        self._syncer.written(self._fd)

    async def commit(self) -> None:
        await self._syncer.commit()

    def load(self, sequence: int) -> bytes | None:
        index = sequence - self._base
        if index < 0 or index >= len(self._offsets) or self._closed:
            return None
        offset = self._offsets[index]
        header = os.pread(self._fd, _HEADER.size, offset)
        length, crc = _HEADER.unpack(header)
        body = os.pread(self._fd, length, offset + _HEADER.size)
        if len(body) != length or zlib.crc32(body) != crc:
            log.error("ring log %s: record of sequence %d is corrupt on disk; not serving it", self.path, sequence)
            return None
        return body[_SEQUENCE.size :]

    def destroy(self) -> None:
        self.close()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._syncer.forget(self._fd)
        os.close(self._fd)


# ------------------------------------------------------------------------------------------------ maps


class MapLog:
    """The map change log (``engine.maps.MapJournal``)."""

    def __init__(self, path: Path, syncer: Syncer) -> None:
        self.path = path
        self._syncer = syncer
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        self.records = 0

    def _write(self, parts: list[bytes | bytearray | memoryview]) -> None:
        _append_record(self._fd, parts)
        self.records += 1
        self._syncer.written(self._fd)

    def map_put(self, name: str, key: bytes, value: bytes, expires_wall_ms: int | None, ttl_ms: int,
                max_idle_ms: int) -> None:
        encoded = name.encode("utf-8")
        fixed = _PUT_FIXED.pack(_PUT, -1 if expires_wall_ms is None else expires_wall_ms, ttl_ms, max_idle_ms,
                                len(encoded), len(key))
        self._write([fixed, encoded, key, value])

    def map_remove(self, name: str, key: bytes) -> None:
        encoded = name.encode("utf-8")
        self._write([_REMOVE_FIXED.pack(_REMOVE, len(encoded), len(key)), encoded, key])

    def map_destroy(self, name: str) -> None:
        encoded = name.encode("utf-8")
        self._write([_DESTROY_FIXED.pack(_DESTROY, len(encoded)), encoded])

    def replay(self) -> Iterator[tuple[int, str, bytes, bytes, int | None, int, int]]:
        """Every valid record as ``(kind, map, key, value, expires_wall_ms, ttl_ms, max_idle_ms)`` (torn tail cut)."""
        records, _ = scan(self._fd, self.path, verify=True)
        self.records = len(records)
        for record in records:
            body = os.pread(self._fd, record.length, record.offset + _HEADER.size)
            kind = body[0]
            if kind == _PUT:
                _, expires, ttl, max_idle, name_len, key_len = _PUT_FIXED.unpack_from(body)
                start = _PUT_FIXED.size
                name = body[start : start + name_len].decode("utf-8")
                key = body[start + name_len : start + name_len + key_len]
                value = body[start + name_len + key_len :]
                yield kind, name, key, value, None if expires < 0 else expires, ttl, max_idle
            elif kind == _REMOVE:
                _, name_len, key_len = _REMOVE_FIXED.unpack_from(body)
                start = _REMOVE_FIXED.size
                yield kind, body[start : start + name_len].decode("utf-8"), body[start + name_len :], b"", None, 0, 0
            elif kind == _DESTROY:
                _, name_len = _DESTROY_FIXED.unpack_from(body)
                yield kind, body[_DESTROY_FIXED.size :].decode("utf-8"), b"", b"", None, 0, 0
            else:
                log.error("%s: unknown record kind %d at byte %d; skipped", self.path, kind, record.offset)

    def close(self) -> None:
        self._syncer.forget(self._fd)
        os.close(self._fd)


# ------------------------------------------------------------------------------------------------ the whole


class Persistence:
    """All of a member's persistent state under one ``data_dir``."""

    def __init__(self, engine: "Engine") -> None:
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

    def ring_store(self, name: str, config: "RingConfig") -> RingStore:
        """The ``RingService.store_factory``: the log of ring ``name`` (recovered by the ring at creation)."""
        previous = self._ring_stores.pop(name, None)
        if previous is not None:
            previous.close()
        store = RingStore(self.rings_dir / (_file_name(name) + ".log"), self.syncer)
        self._ring_stores[name] = store
        return store

    # -- maps

    def recover_maps(self) -> int:
        """Replay the map log into ``engine.maps``; return the number of live entries."""
        maps = self._engine.maps
        for kind, name, key, value, expires, ttl, max_idle in self.map_log.replay():
            if kind == _PUT:
                maps.restore(name, key, value, expires, ttl, max_idle)
            elif kind == _REMOVE:
                maps.restore_remove(name, key)
            else:
                maps.restore_destroy(name)
        live = sum(1 for _ in maps.snapshot())
        log.info("maps recovered from %s: %d live entries from %d log records", self.map_log.path, live,
                 self.map_log.records)
        return live

    def compact_maps(self) -> None:
        """Rewrite the map log as a snapshot of the live entries (atomic rename; fsynced whatever the policy)."""
        tmp_path = self.map_log.path.with_suffix(".log.tmp")
        snapshot = MapLog(tmp_path, Syncer("never", 1))
        try:
            os.ftruncate(snapshot._fd, 0)
            for name, key, value, expires, ttl, max_idle in self._engine.maps.snapshot():
                snapshot.map_put(name, key, value, expires, ttl, max_idle)
            os.fsync(snapshot._fd)
            records = snapshot.records
        finally:
            snapshot.close()
        self.map_log.close()
        os.replace(tmp_path, self.map_log.path)
        _fsync_dir(self.root)
        self.map_log = MapLog(self.map_log.path, self.syncer)
        self.map_log.records = records
        self._engine.maps.journal = self.map_log
        log.info("map log compacted to %d records", records)

    def maybe_compact_maps(self) -> None:
        records = self.map_log.records
        if records >= _COMPACT_MIN_RECORDS and records > 4 * max(self._engine.maps.entry_count(), 1):
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


def attach(engine: "Engine") -> Persistence:
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
