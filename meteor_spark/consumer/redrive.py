"""Redrive: dead letters published again to the stream they came from, once each however often it is run.

Each dead letter that matches the filter and is not redriven yet becomes a record of its source stream with the
original value, key, topic, timestamp and user headers, the dead-letter headers stripped, the header
``meteor.redriven.from`` naming the dead letter, and the message id ``dlq:<dead-letter stream>:<lane>:<offset>``
(a source stream with a deduplication window refuses a second copy on its own). It goes to its source lane when
that lane still exists, else by its key.

Exactly once across reruns, crashes included, comes from the progress entry (``meteor_spark.consumer.redrive_state``):
a step of at most ``step`` letters is written there, with the ends of its source lanes, before anything is sent,
and moved to ``done`` once the grid acknowledged it. A redrive that finds a step left by a dead process reads those
source lanes from the recorded ends and counts every letter whose message id it finds there as done, so only the
letters that never arrived are sent again. Two redrives of one dead-letter stream at once are kept apart by the
same entry: a step is taken by compare-and-set, and a redrive that meets another's step waits until the entry has
not changed for ``lease_s`` (or at once when the owner was a process of this host that is gone).
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from meteor_spark.consumer.dead_letters import HEADER_REDRIVEN_FROM, DeadLetter, ScanReport, scan_dead_letters
from meteor_spark.consumer.redrive_state import REDRIVE_MAP, RedriveProgress, RedriveRun, message_id_of
from meteor_spark.errors import DuplicateMessageError, FormatError, RedriveError, StreamNotFoundError
from meteor_spark.format.records import Record, decode_batch
from meteor_spark.grid.client import Grid, GridMap
from meteor_spark.grid.reading import read_range
from meteor_spark.grid.streams import StreamInfo, lane_bounds, open_stream, streams_bounds
from meteor_spark.producer.futures import RecordFuture
from meteor_spark.producer.publisher import Publisher
from meteor_spark.validate import check_int, check_number

logger = logging.getLogger(__name__)

#: Dead letters published per step (one progress write before, one after).
DEFAULT_STEP = 200
MAX_STEP = 10_000
#: How long another redrive's step must stay unchanged before it is taken for dead.
LEASE_S = 30.0
#: Ring items of one source lane a redrive reads to settle a step left behind; past this it stops and says so.
MAX_VERIFY_ITEMS = 200_000
#: A step's publisher gives up on a record after this long (well inside ``LEASE_S``).
DELIVERY_TIMEOUT_MS = 10_000


@dataclass(frozen=True)
class RedriveFilter:
    """Which dead letters a redrive takes: all, or those of a source stream / lane, whose error contains a text
    (case-insensitive), in an offset range ``[from_offset, to_offset)`` of the dead-letter stream."""

    source: str | None = None
    source_lane: int | None = None
    error: str | None = None
    from_offset: int | None = None
    to_offset: int | None = None

    def matches(self, letter: DeadLetter) -> bool:
        if self.source is not None and letter.source_stream != self.source:
            return False
        if self.source_lane is not None and letter.source_lane != self.source_lane:
            return False
        if self.error is not None and self.error.lower() not in letter.error.lower():
            return False
        if self.from_offset is not None and letter.offset < self.from_offset:
            return False
        return self.to_offset is None or letter.offset < self.to_offset


@dataclass
class RedriveReport:
    """What a redrive did (or, with ``dry_run``, would do).

    Attributes:
        matched: dead letters the filter took. already: of those, redriven before. redriven: published now (with
            ``dry_run``: that would be). refused_duplicates: refused by the source stream's deduplication window as
            already there (counted as done). recovered: letters of a step a dead redrive left that were found in
            their source stream; resent: letters of that step not found (sent again if the filter takes them).
        not_redrivable: undecodable ring items (no record to send). no_source: letters without source headers or
            whose source stream is gone (``missing_sources`` names those streams).
        per_source: records published per source stream.
    """

    dry_run: bool
    matched: int = 0
    already: int = 0
    redriven: int = 0
    refused_duplicates: int = 0
    recovered: int = 0
    resent: int = 0
    not_redrivable: int = 0
    no_source: int = 0
    missing_sources: set[str] = field(default_factory=set)
    per_source: dict[str, int] = field(default_factory=dict)
    scan: ScanReport = field(default_factory=ScanReport)


def redriven_record(letter: DeadLetter, lanes: int) -> Record:
    """The record ``letter`` becomes in its source stream (see the module docs)."""
    record = letter.record
    lane = letter.source_lane if letter.source_lane is not None and 0 <= letter.source_lane < lanes else -1
    return Record(
        value=record.value,
        key=record.key,
        headers=(*letter.user_headers, (HEADER_REDRIVEN_FROM, letter.position.encode())),
        timestamp_ms=record.timestamp_ms,
        lane=lane,
        topic=letter.topic,
        message_id=message_id_of(letter.position),
    )


def read_progress(grid: Grid, dlq: str) -> RedriveProgress:
    """The stored redrive progress of dead-letter stream ``dlq`` (empty when it was never redriven)."""
    return RedriveProgress.decode(grid.map(REDRIVE_MAP).get(dlq), f"{dlq!r} in map {REDRIVE_MAP!r}")


class _Entry:
    """The progress entry of one dead-letter stream and the bytes last read, for compare-and-set."""

    def __init__(self, grid: Grid, dlq: str) -> None:
        self.map: GridMap = grid.map(REDRIVE_MAP)
        self.key = dlq
        self.text = self.map.get(dlq)

    @property
    def progress(self) -> RedriveProgress:
        return RedriveProgress.decode(self.text, f"{self.key!r} in map {REDRIVE_MAP!r}")

    def write(self, new: RedriveProgress, *, sent: bool = False) -> None:
        """Compare-and-set the entry; ``sent``: the step's records were published already (said in the error)."""
        text = new.encode()
        if self.text is None:
            ok = self.map.put_if_absent(self.key, text) is None
        else:
            ok = self.map.replace_if_same(self.key, self.text, text)
        if not ok:
            raise RedriveError(
                f"another redrive of dead-letter stream {self.key!r} changed its progress meanwhile ("
                + (
                    "it took over this redrive's step after it stalled for longer than the lease; the step's records "
                    "were sent, so the other redrive settles them"
                    if sent
                    else "nothing of this step was sent"
                )
                + "): run the redrive again once the other one ended"
            )
        self.text = text


def redrive(
    grid: Grid,
    info: StreamInfo,
    selection: RedriveFilter,
    *,
    dry_run: bool = False,
    step: int = DEFAULT_STEP,
    lease_s: float = LEASE_S,
    on_wait: Callable[[str], None] | None = None,
) -> RedriveReport:
    """Redrive the dead letters of ``info``'s stream that ``selection`` takes (see the module docs).

    Raises:
        RedriveError: another redrive changed the progress meanwhile, or a step left behind cannot be settled.
    """
    check_int("step", step, 1, MAX_STEP)
    check_number("lease_s", lease_s, 0, 3600)
    report = RedriveReport(dry_run)
    # The entry is read before the dead-letter stream is scanned, and only written back by CAS on that read: every
    # letter it marks done was written before it, so the scan sees it, and rebuilding the ranges over the scanned
    # letters (``RedriveProgress.marked``) never drops a letter done by another redrive.
    entry = _Entry(grid, info.name)
    if entry.progress.run is not None and not dry_run:
        run = _abandoned(entry, info.name, lease_s, on_wait)
        if run is not None:
            _settle(grid, entry, info, run, report)
    letters = list(scan_dead_letters(grid, info, report.scan))
    held = _held(info, letters)
    progress = entry.progress
    todo: dict[str, list[DeadLetter]] = {}
    for letter in letters:
        if not selection.matches(letter):
            continue
        report.matched += 1
        if progress.is_done(letter.lane, letter.offset):
            report.already += 1
        elif letter.is_item:
            report.not_redrivable += 1
        elif letter.source_stream is None:
            report.no_source += 1
        else:
            todo.setdefault(letter.source_stream, []).append(letter)
    sources: dict[str, StreamInfo] = {}
    for name in list(todo):
        try:
            sources[name] = open_stream(grid, name, create=False)
        except (StreamNotFoundError, FormatError):
            report.no_source += len(todo.pop(name))
            report.missing_sources.add(name)
    if dry_run:
        for name, group in todo.items():
            report.per_source[name] = len(group)
            report.redriven += len(group)
        return report
    ordered = sorted((letter for group in todo.values() for letter in group), key=lambda d: (d.lane, d.offset))
    publishers: dict[str, Publisher] = {}
    try:
        for at in range(0, len(ordered), step):
            _step(grid, entry, ordered[at : at + step], sources, publishers, held, report)
    finally:
        for publisher in publishers.values():
            publisher.close()
    return report


def _owner() -> tuple[str, str, int]:
    host = socket.gethostname()
    return f"{host}-{os.getpid()}-{uuid.uuid4().hex[:8]}", host, os.getpid()


def _step(
    grid: Grid,
    entry: _Entry,
    chunk: list[DeadLetter],
    sources: dict[str, StreamInfo],
    publishers: dict[str, Publisher],
    held: dict[int, list[int]],
    report: RedriveReport,
) -> None:
    """One step: note it with its source lanes' ends, publish it, wait for the grid, mark it done."""
    names = sorted({letter.source_stream for letter in chunk if letter.source_stream is not None})
    bounds = streams_bounds(grid, [sources[name] for name in names])
    tails: dict[str, dict[int, int]] = {}
    for (stream, lane), (_, end) in bounds.items():
        tails.setdefault(stream, {})[lane] = end
    owner, host, pid = _owner()
    letters = tuple((letter.lane, letter.offset) for letter in chunk)
    entry.write(entry.progress.with_run(RedriveRun(owner, host, pid, letters, tails)))
    futures: list[tuple[str, RecordFuture]] = []
    for letter in chunk:
        name = letter.source_stream
        assert name is not None
        publisher = publishers.get(name)
        if publisher is None:
            publisher = publishers[name] = Publisher(
                grid, name, delivery_timeout_ms=DELIVERY_TIMEOUT_MS, value_serializer="bytes"
            )
        try:
            futures.append((name, publisher.publish_async(redriven_record(letter, sources[name].lanes))))
        except DuplicateMessageError:
            report.refused_duplicates += 1
    for publisher in publishers.values():
        publisher.flush()
    for name, future in futures:
        try:
            future.result()
        except DuplicateMessageError:
            report.refused_duplicates += 1
            continue
        report.redriven += 1
        report.per_source[name] = report.per_source.get(name, 0) + 1
    entry.write(entry.progress.marked(letters, held).with_run(None), sent=True)


def _held(info: StreamInfo, letters: list[DeadLetter]) -> dict[int, list[int]]:
    """Per lane of the dead-letter stream, the offsets of the letters scanned, in order."""
    held: dict[int, list[int]] = {lane: [] for lane in range(info.lanes)}
    for letter in letters:
        held[letter.lane].append(letter.offset)
    return held


def _settle(grid: Grid, entry: _Entry, dlq_info: StreamInfo, run: RedriveRun, report: RedriveReport) -> None:
    """Settle an abandoned step: mark done what reached its source lanes, clear the step; the rest is sent again."""
    dlq = dlq_info.name
    held = _held(dlq_info, list(scan_dead_letters(grid, dlq_info, ScanReport())))
    expected = {message_id_of(f"{dlq}:{lane}:{offset}"): (lane, offset) for lane, offset in run.letters}
    found: set[tuple[int, int]] = set()
    for name, tails in run.tails.items():
        try:
            info = open_stream(grid, name, create=False)
        except StreamNotFoundError:
            continue  # the source stream is gone: nothing of the step can be there
        ends = lane_bounds(grid, info)
        for lane, start in tails.items():
            if lane >= info.lanes:
                continue
            end = ends[lane][1]
            if end - start > MAX_VERIFY_ITEMS:
                raise RedriveError(
                    f"a redrive of {dlq!r} died mid-step; to tell which of its {len(run.letters)} dead letters reached "
                    f"stream {name!r} lane {lane}, {end - start:,} ring items would have to be read (limit "
                    f"{MAX_VERIFY_ITEMS:,}); its progress entry {dlq!r} in map {REDRIVE_MAP!r} is left as it is"
                )
            found |= _found_in(grid, info, lane, max(start, 0), end, expected)
    report.recovered += len(found)
    report.resent += len(run.letters) - len(found)
    logger.warning(
        "dead-letter stream %r: a redrive step left by %s was settled: %d of its %d record(s) had reached their "
        "stream, the rest will be sent again",
        dlq,
        run.owner,
        len(found),
        len(run.letters),
    )
    entry.write(entry.progress.marked(found, held).with_run(None))


def _found_in(
    grid: Grid, info: StreamInfo, lane: int, start: int, end: int, expected: dict[str, tuple[int, int]]
) -> set[tuple[int, int]]:
    """The dead letters among ``expected`` (message id -> letter) whose redriven record is in items
    ``[start, end)`` of ``lane``."""
    found: set[tuple[int, int]] = set()
    if end <= start:
        return found
    for items, sequences in read_range(grid, info, lane, start, end, skip_data_loss=True):
        for raw, seq in zip(items, sequences, strict=True):
            try:
                batch = decode_batch(raw, stream=info.name, lane=lane, sequence=seq)
            except FormatError:
                continue
            for record in batch:
                letter = None if record.message_id is None else expected.get(record.message_id)
                if letter is not None:
                    found.add(letter)
    return found


def _abandoned(entry: _Entry, dlq: str, lease_s: float, on_wait: Callable[[str], None] | None) -> RedriveRun | None:
    """The step in the entry once it is abandoned: its owner was a process of this host that is gone, or the entry
    stayed the same for ``lease_s`` (None: the step ended meanwhile)."""
    seen_since = time.monotonic()
    told = False
    while True:
        run = entry.progress.run
        if run is None:
            return None
        if run.host == socket.gethostname() and not _alive(run.pid):
            return run
        if time.monotonic() - seen_since >= lease_s:
            return run
        if not told and on_wait is not None:
            on_wait(
                f"dead-letter stream {dlq!r}: another redrive ({run.owner}) has a step in progress; waiting until it "
                f"ends or its progress stays unchanged for {lease_s:g} s"
            )
            told = True
        time.sleep(0.2)
        text = entry.map.get(entry.key)
        if text != entry.text:
            entry.text = text
            seen_since = time.monotonic()


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


__all__ = ["RedriveFilter", "RedriveReport", "read_progress", "redrive", "redriven_record"]
