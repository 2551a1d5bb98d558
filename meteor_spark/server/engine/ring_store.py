"""A ring's log on disk (``RingStore``, the ``engine.ringbuffer.RingStore`` of a persistent member).

A ring's log keeps every item, so reads below the ring's head are served from disk (Hazelcast's RingbufferStore).
Nothing is deleted until the ring is destroyed. A ring's sequence never goes backwards: when damage took a ring's
last records, the highest sequence they may have held is kept in ``<log>.hwm`` (written only then: appends cost
nothing more) and the ring continues above it. Lost sequences are holes: reads answer them as a gap in stored
history, which clients report as data loss.
"""

from __future__ import annotations

import errno
import logging
import os
import struct
import zlib
from array import array
from collections.abc import Callable
from pathlib import Path

from meteor_spark.server.engine.fsync import Syncer, fsync_dir
from meteor_spark.server.engine.log_records import HEADER, SEQUENCE, Damage, Scanned, append_record
from meteor_spark.server.engine.log_recovery import (
    Scanner,
    ScanResult,
    quarantine,
    report_damage,
    rewrite,
    truncate_torn,
)

log = logging.getLogger(__name__)

_HWM = struct.Struct("<qI")
"""``<log>.hwm``: the highest sequence the ring ever assigned, and the CRC-32 of those 8 bytes."""


class RingStore:
    """One ring's append-only log (``engine.ringbuffer.RingStore``): every item by sequence, including history
    below the ring's head.

    Sequences lost to damage (quarantined at recovery, or found corrupt when read back) are holes: ``load`` answers
    None for them and ``next_stored`` skips them, so readers see a gap, never wrong bytes.
    """

    def __init__(self, path: Path, syncer: Syncer, on_destroy: Callable[[RingStore], None] | None = None) -> None:
        self.path = path
        self._on_destroy = on_destroy
        """Called by ``destroy``: whoever keeps the store by its ring's name lets go of it."""
        self.hwm_path = path.with_name(path.name + ".hwm")
        self._syncer = syncer
        new = not path.exists()
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        if new and syncer.policy == "always":
            fsync_dir(path.parent)
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
        result = Scanner(self._fd, self.path, verify=False).scan()
        recent = self._check_recent(result, capacity)
        last = result.records[-1].sequence if result.records else -1
        tail = max([last, self._read_hwm()] + [damage.lost_last for damage in result.damage])
        records = self._set_damage_aside(result, last, tail)
        self._index(records, tail)
        if records:
            log.info(
                "ring log %s: %d items on disk (sequences %d..%d), tail %d",
                self.path.name,
                len(records),
                records[0].sequence,
                last,
                tail,
            )
        if capacity <= 0:
            return tail, []
        items: list[bytes] = []
        sequence = tail
        while sequence in recent and len(items) < capacity:
            items.append(recent[sequence])
            sequence -= 1
        items.reverse()
        return tail, items

    def _check_recent(self, result: ScanResult, capacity: int) -> dict[int, bytes]:
        """The items of the last ``capacity`` records, by sequence, after checking their CRC; a record that fails
        leaves ``result.records`` for ``result.damage`` (kept in file order)."""
        records = result.records
        recent: dict[int, bytes] = {}
        index = len(records) - 1
        while index >= 0 and len(recent) < capacity:
            record = records[index]
            body = os.pread(self._fd, record.length, record.offset + HEADER.size)
            if len(body) == record.length and zlib.crc32(body) == record.crc:
                recent[record.sequence] = body[SEQUENCE.size :]
            else:
                reason = "a record whose CRC does not match its contents"
                result.damage.append(Damage(record.offset, record.end, reason, False, record.sequence, record.sequence))
                del records[index]
            index -= 1
        result.damage.sort(key=lambda damage: damage.start)
        return recent

    def _set_damage_aside(self, result: ScanResult, last: int, tail: int) -> list[Scanned]:
        """Quarantine the damage, keep the high-water mark when damage took the last records, rewrite the log
        without the damage (or only truncate a torn tail); the intact records where they now are."""
        records = result.records
        if not result.damage:
            if result.torn is not None:
                truncate_torn(self._fd, self.path, result.torn)
            return records
        for damage in result.damage:
            target = quarantine(self._fd, self.path, damage)
            report_damage(self.path, damage, target, "")
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
        records = rewrite(self._fd, self.path, records)
        os.close(self._fd)
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND)
        if result.torn is not None:
            log.warning(
                "%s: torn tail at byte %d (%d bytes, a write a crash interrupted) dropped",
                self.path,
                result.torn.start,
                result.torn.size,
            )
        return records

    def _index(self, records: list[Scanned], tail: int) -> None:
        """The offset of every sequence up to ``tail`` (-1 for a lost one), and where the next record goes."""
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
        data = SEQUENCE.pack(sequence)
        tmp.write_bytes(_HWM.pack(sequence, zlib.crc32(data)))
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.hwm_path)
        fsync_dir(self.path.parent)

    def append(self, sequence: int, item: bytes) -> None:
        if self._closed:
            raise OSError(errno.EBADF, f"ring log {self.path} is closed")
        if not self._offsets:
            self._base = sequence
        elif sequence != self._base + len(self._offsets):
            last = self._base + len(self._offsets) - 1
            raise AssertionError(f"ring log {self.path}: sequence {sequence} after {last}")
        self._offsets.append(self._end)
        self._end += append_record(self._fd, [SEQUENCE.pack(sequence), item])
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
        header = os.pread(self._fd, HEADER.size, offset)
        length, crc = HEADER.unpack(header)
        body = os.pread(self._fd, length, offset + HEADER.size)
        if len(body) != length or zlib.crc32(body) != crc or SEQUENCE.unpack_from(body)[0] != sequence:
            log.error(
                "ring log %s: the record of sequence %d (bytes from %d) is damaged on disk; it is not served (readers "
                "see it as lost) and stays in the log",
                self.path,
                sequence,
                offset,
            )
            self._offsets[index] = -1
            return None
        return body[SEQUENCE.size :]

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
        """Delete the log, and drop its index (8 bytes per sequence ever written) now: a destroyed ring may stay
        referenced for a while (``Ringbuffer.destroy``), and its store with it."""
        self.close()
        self._offsets = array("q")
        if self._on_destroy is not None:
            self._on_destroy(self)
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
