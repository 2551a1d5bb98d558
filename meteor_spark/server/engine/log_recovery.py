"""Recovering a log at start: the scan that finds every intact record, and what is done with damage.

The logs are scanned (``Scanner``) when a member opens them:

- a **torn tail** (the last record cut short by the end of the file: a write the crash interrupted, never
  acknowledged under ``fsync=always``) is truncated, with a warning (``truncate_torn``);
- any other **damage** (a CRC mismatch, an impossible length, a sequence out of order) is never "repaired" by
  truncation: the scan resynchronises on the next record that checks out, the damaged bytes are copied to
  ``<log>.quarantine-<n>`` beside the log (``quarantine``), the log is rewritten with every intact record before and
  after them (``rewrite``), and an error names the file, the byte range and the ring sequences lost (they may have
  been acknowledged; ``report_damage``).

Ring logs and the map log share this code: they differ only in what makes a body well-formed (a rising sequence, or
a ``BodyShape``), so one scanner, with one set of damage tests, serves both.
"""

from __future__ import annotations

import logging
import os
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from meteor_spark.server.engine.fsync import fsync_dir
from meteor_spark.server.engine.log_records import HEADER, MAX_RECORD, SEQUENCE, Damage, Scanned

log = logging.getLogger(__name__)

MAX_GAP = 1 << 40
"""No ring log holds a sequence gap this large: a record claiming one is garbage (keeps resynchronisation from
checksumming random lengths)."""


@dataclass
class ScanResult:
    """What a scan found: the intact records in file order, and the damage."""

    records: list[Scanned]
    damage: list[Damage]
    """Damaged ranges to quarantine, in file order (a torn tail is not among them)."""
    torn: Damage | None = None


@dataclass(frozen=True)
class BodyShape:
    """How a scan tells a well-formed body in a log without sequences (the map log, ``engine.map_log``)."""

    kind: str
    """What a record is, for error messages ("a map record")."""
    min_size: int
    """The smallest body."""
    fixed_size: int
    """How many leading bytes of a body ``fits`` needs (at most)."""
    fits: Callable[[bytes, int], bool]
    """Whether a body's leading bytes agree with its length."""


class Scanner:
    """Walks a log's records; around damage it resynchronises on the next record that checks out.

    A record checks out when its length fits in the file, its CRC matches and (ring logs) its sequence is above the
    previous record's; a candidate found by resynchronisation must also be followed by another well-formed record or
    by the end of the file. A random byte string passes that with odds of about 2^-32 per position, so no marker is
    needed and the format stays the one every existing log already has.

    ``verify=False`` checks only the structure (lengths, sequences) of records whose sequence follows the previous
    one; records that open a sequence gap, and candidates after damage, are always CRC-checked.
    """

    def __init__(self, fd: int, path: Path, *, verify: bool, shape: BodyShape | None = None) -> None:
        self.fd = fd
        self.path = path
        self.sequenced = shape is None
        """A ring log (every body starts with its sequence); else a log of bodies of ``shape``."""
        self.shape = shape
        self.verify = verify
        self.size = os.fstat(fd).st_size
        self.min_body = SEQUENCE.size if shape is None else shape.min_size
        self._peek = HEADER.size + (SEQUENCE.size if shape is None else shape.fixed_size)

    def scan(self) -> ScanResult:
        result = ScanResult([], [])
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

    def crc_ok(self, record: Scanned) -> bool:
        body = os.pread(self.fd, record.length, record.offset + HEADER.size)
        return len(body) == record.length and zlib.crc32(body) == record.crc

    def _record_at(self, offset: int, previous: int, verify: bool) -> tuple[Scanned | None, str]:
        left = self.size - offset
        if left < HEADER.size:
            return None, f"a record header cut short ({left} of {HEADER.size} bytes)"
        raw = os.pread(self.fd, self._peek, offset)
        length, crc = HEADER.unpack_from(raw)
        if length < self.min_body or length >= MAX_RECORD or len(raw) < HEADER.size + self.min_body:
            return None, f"an impossible record length {length}"
        if offset + HEADER.size + length > self.size:
            return None, f"a record of {length} bytes cut short by the end of the file ({left} bytes left)"
        sequence = -1
        if self.sequenced:
            sequence = SEQUENCE.unpack_from(raw, HEADER.size)[0]
            if sequence <= previous:
                return None, f"a record numbered {sequence} after sequence {previous}"
            if sequence - previous > MAX_GAP:
                return None, f"a record numbered {sequence} far after sequence {previous}"
            verify = verify or sequence != previous + 1
        elif self.shape is not None and not self.shape.fits(raw[HEADER.size : HEADER.size + length], length):
            return None, f"a {self.shape.kind} whose fields do not fit its length"
        record = Scanned(offset, length, crc, sequence)
        if verify and not self.crc_ok(record):
            return None, "a record whose CRC does not match its contents"
        return record, ""

    def _confirmed(self, offset: int, previous: int) -> Scanned | None:
        """A record that checks out at ``offset`` and is followed by a well-formed record or the end of the file."""
        record, _ = self._record_at(offset, previous, True)
        if record is None:
            return None
        if record.end == self.size:
            return record
        following, _ = self._record_at(record.end, record.sequence, False)
        return record if following is not None else None

    def _resync(self, start: int, previous: int) -> Scanned | None:
        """The first record after damage at ``start`` that checks out, or None (the damage runs to the end)."""
        header = os.pread(self.fd, HEADER.size, start)
        if len(header) == HEADER.size:
            # Most damage leaves the length intact (a flipped body byte): the next record is where it says.
            length, _ = HEADER.unpack(header)
            after = start + HEADER.size + length
            if length >= self.min_body and after < self.size:
                record = self._confirmed(after, previous)
                if record is not None:
                    return record
        chunk_size = 1 << 20
        position = start + 1
        last = self.size - HEADER.size - self.min_body
        while position <= last:
            chunk = os.pread(self.fd, chunk_size + HEADER.size + self.min_body, position)
            for index in range(min(chunk_size, last - position + 1)):
                length = int.from_bytes(chunk[index : index + 4], "little")
                if length < self.min_body or position + index + HEADER.size + length > self.size:
                    continue
                record = self._confirmed(position + index, previous)
                if record is not None:
                    return record
            position += chunk_size
        return None

    def _tail(self, start: int, previous: int, reason: str) -> Damage:
        """Damage that runs to the end of the file: a torn tail, or damaged last records."""
        left = self.size - start
        if left < HEADER.size:
            return Damage(start, self.size, reason, True, -1, -2)
        raw = os.pread(self.fd, left, start) if left <= 1 << 20 else os.pread(self.fd, HEADER.size + 8, start)
        length, crc = HEADER.unpack_from(raw)
        next_sequence = previous + 1
        if start + HEADER.size + length > self.size and length < MAX_RECORD:
            sequence_ok = (
                not self.sequenced
                or left < HEADER.size + SEQUENCE.size
                or SEQUENCE.unpack_from(raw, HEADER.size)[0] == next_sequence
            )
            rest = os.pread(self.fd, left - HEADER.size, start + HEADER.size)
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
            header = os.pread(self.fd, HEADER.size + SEQUENCE.size, offset)
            if len(header) < HEADER.size + SEQUENCE.size:
                break
            length, _ = HEADER.unpack_from(header)
            if length < SEQUENCE.size or offset + HEADER.size + length > self.size:
                break
            if SEQUENCE.unpack_from(header, HEADER.size)[0] != next_sequence + count:
                break
            count += 1
            offset += HEADER.size + length
        if offset == self.size and count:
            return Damage(start, self.size, reason, False, next_sequence, next_sequence + count - 1)
        bound = max(1, left // (HEADER.size + SEQUENCE.size))
        return Damage(start, self.size, reason, False, next_sequence, next_sequence + bound - 1, exact=False)


def _next_free(path: Path, suffix: str) -> Path:
    number = 1
    while True:
        candidate = path.with_name(f"{path.name}.{suffix}-{number}")
        if not candidate.exists():
            return candidate
        number += 1


def quarantine(fd: int, path: Path, damage: Damage) -> Path:
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
    fsync_dir(path.parent)
    return target


def truncate_torn(fd: int, path: Path, torn: Damage) -> None:
    log.warning(
        "%s: torn tail: %s at byte %d, the last record a crash interrupted while it was written; truncating %d "
        "bytes (under fsync=always such a write was never acknowledged)",
        path,
        torn.reason,
        torn.start,
        torn.size,
    )
    os.ftruncate(fd, torn.start)


def rewrite(fd: int, path: Path, records: list[Scanned]) -> list[Scanned]:
    """Replace the log by its intact records only (temporary file, fsync, atomic rename); their new positions."""
    tmp_path = path.with_name(path.name + ".tmp")
    out = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    moved: list[Scanned] = []
    try:
        position = 0
        for record in records:
            size = record.end - record.offset
            data = os.pread(fd, size, record.offset)
            os.write(out, data)
            moved.append(Scanned(position, record.length, record.crc, record.sequence))
            position += size
        os.fsync(out)
    finally:
        os.close(out)
    os.replace(tmp_path, path)
    fsync_dir(path.parent)
    return moved


def report_damage(path: Path, damage: Damage, target: Path, what: str) -> None:
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
