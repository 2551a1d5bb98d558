"""Persistence: ring buffers and maps survive a restart of the member (SIGKILL included).

Layout of ``data_dir``::

    rings/<quoted ring name>.log    one append-only log per ring: every item ever added, in sequence order
    maps.log                        the map change log (put / remove / destroy), compacted into a snapshot at start

Every record is framed as ``uint32 length | uint32 crc32 | body`` (little-endian); a ring record's body starts with
its int64 sequence. At recovery the logs are scanned (``_Scanner``):

- a **torn tail** (the last record cut short by the end of the file: a write the crash interrupted, never
  acknowledged under ``fsync=always``) is truncated, with a warning;
- any other **damage** (a CRC mismatch, an impossible length, a sequence out of order) is never "repaired" by
  truncation: the scan resynchronises on the next record that checks out, the damaged bytes are copied to
  ``<log>.quarantine-<n>`` beside the log, the log is rewritten with every intact record before and after them, and
  an error names the file, the byte range and the ring sequences lost (they may have been acknowledged);
- a ring's sequence never goes backwards: when damage took a ring's last records, the highest sequence they may have
  held is kept in ``<log>.hwm`` (written only then: appends cost nothing more) and the ring continues above it.
  Lost sequences are holes: reads answer them as a gap in stored history, which clients report as data loss.

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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
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
    sequence: int = -1
    """A ring record's sequence (-1 in the map log)."""

    @property
    def end(self) -> int:
        return self.offset + _HEADER.size + self.length


@dataclass(frozen=True)
class Damage:
    """A damaged byte range ``[start, end)`` of a log, and what it cost."""

    start: int
    end: int
    reason: str
    torn: bool = False
    """A real torn tail: the last record, cut short by the end of the file (a write the crash interrupted)."""
    lost_first: int = -1
    """Ring logs: the first sequence lost with these bytes (-1 when the log is a map log)."""
    lost_last: int = -2
    """Ring logs: the last sequence lost (an upper bound when ``exact`` is False)."""
    exact: bool = True

    @property
    def size(self) -> int:
        return self.end - self.start

    def lost(self) -> str:
        if self.lost_first < 0:
            return "unknown records"
        count = self.lost_last - self.lost_first + 1
        items = "item" if count == 1 else "items"
        if self.exact:
            return f"ring sequences {self.lost_first}..{self.lost_last} ({count} {items})"
        return f"ring sequences from {self.lost_first} up to at most {self.lost_last} (at most {count} {items})"


@dataclass
class _ScanResult:
    records: list[_Scanned]
    damage: list[Damage]
    """Damaged ranges to quarantine, in file order (a torn tail is not among them)."""
    torn: Damage | None = None


_MAX_GAP = 1 << 40
"""No ring log holds a sequence gap this large: a record claiming one is garbage (keeps resynchronisation from
checksumming random lengths)."""


def _map_record_fits(raw: bytes, length: int) -> bool:
    """Whether the fixed fields of a map record (``raw`` = header + up to its fixed part) agree with its length."""
    body = raw[_HEADER.size : _HEADER.size + length]
    kind = body[0]
    fixed = {_PUT: _PUT_FIXED, _REMOVE: _REMOVE_FIXED, _DESTROY: _DESTROY_FIXED}.get(kind)
    if fixed is None or len(body) < fixed.size:
        return False
    if kind == _PUT:
        _, _, _, _, name_len, key_len = _PUT_FIXED.unpack_from(body)
        return _PUT_FIXED.size + name_len + key_len <= length
    if kind == _REMOVE:
        _, name_len, key_len = _REMOVE_FIXED.unpack_from(body)
        return _REMOVE_FIXED.size + name_len + key_len == length
    _, name_len = _DESTROY_FIXED.unpack_from(body)
    return _DESTROY_FIXED.size + name_len == length


class _Scanner:
    """Walks a log's records; around damage it resynchronises on the next record that checks out.

    A record checks out when its length fits in the file, its CRC matches and (ring logs) its sequence is above the
    previous record's; a candidate found by resynchronisation must also be followed by another well-formed record or
    by the end of the file. A random byte string passes that with odds of about 2^-32 per position, so no marker is
    needed and the format stays the one every existing log already has.

    ``verify=False`` checks only the structure (lengths, sequences) of records whose sequence follows the previous
    one; records that open a sequence gap, and candidates after damage, are always CRC-checked.
    """

    def __init__(self, fd: int, path: Path, *, sequenced: bool, verify: bool) -> None:
        self.fd = fd
        self.path = path
        self.sequenced = sequenced
        self.verify = verify
        self.size = os.fstat(fd).st_size
        self.min_body = _SEQUENCE.size if sequenced else _DESTROY_FIXED.size

    def scan(self) -> _ScanResult:
        result = _ScanResult([], [])
        offset = 0
        previous = -1
        while offset < self.size:
            record, reason = self._record_at(offset, previous, self.verify)
            if record is not None:
                result.records.append(record)
                previous = record.sequence
                offset = record.end
                continue
            if not self.verify and result.records and not self.crc_ok(result.records[-1]):
                # The record before took its length on trust: if it fails its CRC, the damage starts there (a
                # damaged length field made it end in the wrong place).
                offset = result.records.pop().offset
                previous = result.records[-1].sequence if result.records else -1
            resume = self._resync(offset, previous)
            if resume is None:
                damage = self._tail(offset, previous, reason)
                if damage.torn:
                    result.torn = damage
                else:
                    result.damage.append(damage)
                break
            lost_first, lost_last = (previous + 1, resume.sequence - 1) if self.sequenced else (-1, -2)
            result.damage.append(Damage(offset, resume.offset, reason, False, lost_first, lost_last))
            offset = resume.offset
        return result

    def crc_ok(self, record: _Scanned) -> bool:
        body = os.pread(self.fd, record.length, record.offset + _HEADER.size)
        return len(body) == record.length and zlib.crc32(body) == record.crc

    def _record_at(self, offset: int, previous: int, verify: bool) -> tuple[_Scanned | None, str]:
        left = self.size - offset
        if left < _HEADER.size:
            return None, f"a record header cut short ({left} of {_HEADER.size} bytes)"
        raw = os.pread(self.fd, _HEADER.size + _PUT_FIXED.size, offset)
        length, crc = _HEADER.unpack_from(raw)
        if length < self.min_body or length >= _MAX_RECORD or len(raw) < _HEADER.size + self.min_body:
            return None, f"an impossible record length {length}"
        if offset + _HEADER.size + length > self.size:
            return None, f"a record of {length} bytes cut short by the end of the file ({left} bytes left)"
        sequence = -1
        if self.sequenced:
            sequence = _SEQUENCE.unpack_from(raw, _HEADER.size)[0]
            if sequence <= previous:
                return None, f"a record numbered {sequence} after sequence {previous}"
            if sequence - previous > _MAX_GAP:
                return None, f"a record numbered {sequence} far after sequence {previous}"
            verify = verify or sequence != previous + 1
        elif not _map_record_fits(raw, length):
            return None, "a map record whose fields do not fit its length"
        record = _Scanned(offset, length, crc, sequence)
        if verify and not self.crc_ok(record):
            return None, "a record whose CRC does not match its contents"
        return record, ""

    def _confirmed(self, offset: int, previous: int) -> _Scanned | None:
        """A record that checks out at ``offset`` and is followed by a well-formed record or the end of the file."""
        record, _ = self._record_at(offset, previous, True)
        if record is None:
            return None
        if record.end == self.size:
            return record
        following, _ = self._record_at(record.end, record.sequence, False)
        return record if following is not None else None

    def _resync(self, start: int, previous: int) -> _Scanned | None:
        """The first record after damage at ``start`` that checks out, or None (the damage runs to the end)."""
        header = os.pread(self.fd, _HEADER.size, start)
        if len(header) == _HEADER.size:
            # Most damage leaves the length intact (a flipped body byte): the next record is where it says.
            length, _ = _HEADER.unpack(header)
            after = start + _HEADER.size + length
            if length >= self.min_body and after < self.size:
                record = self._confirmed(after, previous)
                if record is not None:
                    return record
        chunk_size = 1 << 20
        position = start + 1
        last = self.size - _HEADER.size - self.min_body
        while position <= last:
            chunk = os.pread(self.fd, chunk_size + _HEADER.size + self.min_body, position)
            for index in range(min(chunk_size, last - position + 1)):
                length = int.from_bytes(chunk[index : index + 4], "little")
                if length < self.min_body or position + index + _HEADER.size + length > self.size:
                    continue
                record = self._confirmed(position + index, previous)
                if record is not None:
                    return record
            position += chunk_size
        return None

    def _tail(self, start: int, previous: int, reason: str) -> Damage:
        """Damage that runs to the end of the file: a torn tail, or damaged last records."""
        left = self.size - start
        if left < _HEADER.size:
            return Damage(start, self.size, reason, True, -1, -2)
        raw = os.pread(self.fd, left, start) if left <= 1 << 20 else os.pread(self.fd, _HEADER.size + 8, start)
        length, crc = _HEADER.unpack_from(raw)
        next_sequence = previous + 1
        if start + _HEADER.size + length > self.size and length < _MAX_RECORD:
            sequence_ok = (
                not self.sequenced
                or left < _HEADER.size + _SEQUENCE.size
                or _SEQUENCE.unpack_from(raw, _HEADER.size)[0] == next_sequence
            )
            rest = os.pread(self.fd, left - _HEADER.size, start + _HEADER.size)
            if sequence_ok and zlib.crc32(rest) != crc:
                lost = (next_sequence, next_sequence) if self.sequenced else (-1, -2)
                return Damage(start, self.size, reason, True, *lost)
            if sequence_ok:  # the whole body is there: only the length field is damaged
                lost = (next_sequence, next_sequence) if self.sequenced else (-1, -2)
                return Damage(start, self.size, "a complete record whose length field is damaged", False, *lost)
        if not self.sequenced:
            return Damage(start, self.size, reason)
        # How many records did these bytes hold? Exactly, when their lengths still chain to the end of the file;
        # otherwise at most one per 16 bytes (the smallest ring record).
        count = 0
        offset = start
        while offset < self.size:
            header = os.pread(self.fd, _HEADER.size + _SEQUENCE.size, offset)
            if len(header) < _HEADER.size + _SEQUENCE.size:
                break
            length, _ = _HEADER.unpack_from(header)
            if length < _SEQUENCE.size or offset + _HEADER.size + length > self.size:
                break
            if _SEQUENCE.unpack_from(header, _HEADER.size)[0] != next_sequence + count:
                break
            count += 1
            offset += _HEADER.size + length
        if offset == self.size and count:
            return Damage(start, self.size, reason, False, next_sequence, next_sequence + count - 1)
        bound = max(1, left // (_HEADER.size + _SEQUENCE.size))
        return Damage(start, self.size, reason, False, next_sequence, next_sequence + bound - 1, exact=False)


def _next_free(path: Path, suffix: str) -> Path:
    number = 1
    while True:
        candidate = path.with_name(f"{path.name}.{suffix}-{number}")
        if not candidate.exists():
            return candidate
        number += 1


def _quarantine(fd: int, path: Path, damage: Damage) -> Path:
    """Copy a damaged byte range to ``<log>.quarantine-<n>`` beside the log (fsynced); its path."""
    target = _next_free(path, "quarantine")
    out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        position = damage.start
        while position < damage.end:
            data = os.pread(fd, min(1 << 20, damage.end - position), position)
            if not data:
                break
            os.write(out, data)
            position += len(data)
        os.fsync(out)
    finally:
        os.close(out)
    _fsync_dir(path.parent)
    return target


def _truncate_torn(fd: int, path: Path, torn: Damage) -> None:
    log.warning(
        "%s: torn tail: %s at byte %d, the last record a crash interrupted while it was written; truncating %d "
        "bytes (under fsync=always such a write was never acknowledged)",
        path,
        torn.reason,
        torn.start,
        torn.size,
    )
    os.ftruncate(fd, torn.start)


def _rewrite(fd: int, path: Path, records: list[_Scanned]) -> list[_Scanned]:
    """Replace the log by its intact records only (temporary file, fsync, atomic rename); their new positions."""
    tmp_path = path.with_name(path.name + ".tmp")
    out = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    moved: list[_Scanned] = []
    try:
        position = 0
        for record in records:
            size = record.end - record.offset
            data = os.pread(fd, size, record.offset)
            os.write(out, data)
            moved.append(_Scanned(position, record.length, record.crc, record.sequence))
            position += size
        os.fsync(out)
    finally:
        os.close(out)
    os.replace(tmp_path, path)
    _fsync_dir(path.parent)
    return moved


def _report(path: Path, damage: Damage, target: Path, what: str) -> None:
    log.error(
        "%s: bytes %d..%d are damaged (%s); moved them to %s. Lost: %s, which may have been acknowledged to "
        "clients. %s",
        path,
        damage.start,
        damage.end - 1,
        damage.reason,
        target,
        damage.lost() if damage.lost_first >= 0 else what,
        "Every intact record before and after them is kept.",
    )


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
        self.fsyncs = 0  # successful fsync calls, for the member's metrics
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
                self.fsyncs += 1
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

_HWM = struct.Struct("<qI")


class RingStore:
    """One ring's append-only log (``engine.ringbuffer.RingStore``): every item by sequence, including history
    below the ring's head.

    Sequences lost to damage (quarantined at recovery, or found corrupt when read back) are holes: ``load`` answers
    None for them and ``next_stored`` skips them, so readers see a gap, never wrong bytes.
    """

    def __init__(self, path: Path, syncer: Syncer) -> None:
        self.path = path
        self.hwm_path = path.with_name(path.name + ".hwm")
        self._syncer = syncer
        new = not path.exists()
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        if new and syncer.policy == "always":
            _fsync_dir(path.parent)
        self._offsets = array("q")
        """File offset of each record's header, by ``sequence - self._base``; -1 for a lost sequence."""
        self._base = 0
        self._end = 0
        self._closed = False
        self.quarantined: list[Damage] = []
        """What recovery moved out of the log (damaged ranges)."""

    def recover(self, capacity: int) -> tuple[int, list[bytes]]:
        """(tail, the intact items ending at that tail, at most ``capacity``) from the log.

        The tail never goes below the highest sequence ever assigned: it is the last record's sequence, or the
        high-water mark kept in ``<log>.hwm`` when damage took the last records away. A torn tail is truncated;
        other damage is quarantined (``<log>.quarantine-<n>``) and the log rewritten without it. The structure of
        the whole log is checked, and the CRC of the last ``capacity`` records (the ones read into memory); older
        history has its CRC checked when it is read back, so a start never has to read a long history.
        """
        scanner = _Scanner(self._fd, self.path, sequenced=True, verify=False)
        result = scanner.scan()
        records = result.records
        recent: dict[int, bytes] = {}
        index = len(records) - 1
        while index >= 0 and len(recent) < capacity:
            record = records[index]
            body = os.pread(self._fd, record.length, record.offset + _HEADER.size)
            if len(body) == record.length and zlib.crc32(body) == record.crc:
                recent[record.sequence] = body[_SEQUENCE.size :]
            else:
                result.damage.append(
                    Damage(
                        record.offset,
                        record.end,
                        "a record whose CRC does not match its contents",
                        False,
                        record.sequence,
                        record.sequence,
                    )
                )
                del records[index]
            index -= 1
        result.damage.sort(key=lambda damage: damage.start)
        last = records[-1].sequence if records else -1
        tail = max([last, self._read_hwm()] + [damage.lost_last for damage in result.damage])
        if result.damage:
            for damage in result.damage:
                target = _quarantine(self._fd, self.path, damage)
                _report(self.path, damage, target, "")
            self.quarantined = result.damage
            if tail > last:
                self._write_hwm(tail)
                log.error(
                    "ring log %s: its last records were damaged; the ring continues after sequence %d (kept in %s), so "
                    "no sequence is ever reused",
                    self.path,
                    tail,
                    self.hwm_path.name,
                )
            records = _rewrite(self._fd, self.path, records)
            os.close(self._fd)
            self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND)
            if result.torn is not None:
                log.warning(
                    "%s: torn tail at byte %d (%d bytes, a write a crash interrupted) dropped",
                    self.path,
                    result.torn.start,
                    result.torn.size,
                )
        elif result.torn is not None:
            _truncate_torn(self._fd, self.path, result.torn)
        self._end = records[-1].end if records else 0
        if records:
            self._base = records[0].sequence
            offsets = self._offsets
            for record in records:
                while self._base + len(offsets) < record.sequence:
                    offsets.append(-1)
                offsets.append(record.offset)
        if tail >= 0:
            if not records:
                self._base = tail + 1
            while self._base + len(self._offsets) <= tail:
                self._offsets.append(-1)
        items: list[bytes] = []
        sequence = tail
        while sequence in recent and len(items) < capacity:
            items.append(recent[sequence])
            sequence -= 1
        items.reverse()
        if records:
            log.info(
                "ring log %s: %d items on disk (sequences %d..%d), tail %d",
                self.path.name,
                len(records),
                records[0].sequence,
                last,
                tail,
            )
        return tail, items if capacity > 0 else []

    def _read_hwm(self) -> int:
        try:
            data = self.hwm_path.read_bytes()
        except FileNotFoundError:
            return -1
        if len(data) == _HWM.size:
            sequence, crc = _HWM.unpack(data)
            if zlib.crc32(data[:8]) == crc:
                return sequence
        log.error("%s is damaged; the ring's high-water mark comes from its log alone", self.hwm_path)
        return -1

    def _write_hwm(self, sequence: int) -> None:
        tmp = self.hwm_path.with_name(self.hwm_path.name + ".tmp")
        data = _SEQUENCE.pack(sequence)
        tmp.write_bytes(_HWM.pack(sequence, zlib.crc32(data)))
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.hwm_path)
        _fsync_dir(self.path.parent)

    def append(self, sequence: int, item: bytes) -> None:
        if self._closed:
            raise OSError(errno.EBADF, f"ring log {self.path} is closed")
        if not self._offsets:
            self._base = sequence
        elif sequence != self._base + len(self._offsets):
            last = self._base + len(self._offsets) - 1
            raise AssertionError(f"ring log {self.path}: sequence {sequence} after {last}")
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
        if offset < 0:
            return None
        header = os.pread(self._fd, _HEADER.size, offset)
        length, crc = _HEADER.unpack(header)
        body = os.pread(self._fd, length, offset + _HEADER.size)
        if len(body) != length or zlib.crc32(body) != crc or _SEQUENCE.unpack_from(body)[0] != sequence:
            log.error(
                "ring log %s: the record of sequence %d (bytes from %d) is damaged on disk; it is not served (readers "
                "see it as lost) and stays in the log",
                self.path,
                sequence,
                offset,
            )
            self._offsets[index] = -1
            return None
        return body[_SEQUENCE.size :]

    def next_stored(self, sequence: int, below: int) -> int | None:
        """The first sequence in ``[sequence, below)`` the log holds (skipping lost ones), or None."""
        offsets = self._offsets
        index = max(sequence - self._base, 0)
        stop = min(below - self._base, len(offsets))
        while index < stop:
            if offsets[index] >= 0:
                return self._base + index
            index += 1
        return None

    def destroy(self) -> None:
        self.close()
        for path in (self.path, self.hwm_path):
            try:
                path.unlink()
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
        self.quarantined: list[Damage] = []
        """What the last ``replay`` moved out of the log (damaged ranges)."""

    def _write(self, parts: list[bytes | bytearray | memoryview]) -> None:
        _append_record(self._fd, parts)
        self.records += 1
        self._syncer.written(self._fd)

    def map_put(
        self, name: str, key: bytes, value: bytes, expires_wall_ms: int | None, ttl_ms: int, max_idle_ms: int
    ) -> None:
        encoded = name.encode("utf-8")
        fixed = _PUT_FIXED.pack(
            _PUT, -1 if expires_wall_ms is None else expires_wall_ms, ttl_ms, max_idle_ms, len(encoded), len(key)
        )
        self._write([fixed, encoded, key, value])

    def map_remove(self, name: str, key: bytes) -> None:
        encoded = name.encode("utf-8")
        self._write([_REMOVE_FIXED.pack(_REMOVE, len(encoded), len(key)), encoded, key])

    def map_destroy(self, name: str) -> None:
        encoded = name.encode("utf-8")
        self._write([_DESTROY_FIXED.pack(_DESTROY, len(encoded)), encoded])

    def replay(self) -> Iterator[tuple[int, str, bytes, bytes, int | None, int, int]]:
        """Every intact record as ``(kind, map, key, value, expires_wall_ms, ttl_ms, max_idle_ms)``.

        A torn tail is truncated; damaged records elsewhere are copied to ``maps.log.quarantine-<n>`` and skipped (the
        compaction that follows every start rewrites the log without them).
        """
        result = _Scanner(self._fd, self.path, sequenced=False, verify=True).scan()
        for damage in result.damage:
            target = _quarantine(self._fd, self.path, damage)
            _report(
                self.path,
                damage,
                target,
                "the map updates (put / remove / destroy) these bytes held; a key may "
                "show an older value, or a removed key come back",
            )
        self.quarantined = result.damage
        if result.torn is not None:
            _truncate_torn(self._fd, self.path, result.torn)
        records = result.records
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
        store = RingStore(self.rings_dir / (_file_name(name) + ".log"), self.syncer)
        self._ring_stores[name] = store
        return store

    # -- maps

    def quarantined(self) -> list[Damage]:
        """The damaged ranges moved aside when the logs open now were recovered (rings, then the map log)."""
        damage = [item for store in self._ring_stores.values() for item in store.quarantined]
        return damage + list(self.map_log.quarantined)

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
        log.info(
            "maps recovered from %s: %d live entries from %d log records", self.map_log.path, live, self.map_log.records
        )
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
