"""``meteor publish``: JSON lines or raw lines from a file or stdin into a stream.

A line that cannot be turned into a record is reported on stderr with its line number and is not published; every
other line is. The exit code is 1 when any line failed, so scripts notice.

On a stream with a deduplication window, a record whose message id (``--id``, ``--id-field``) was already published
within the window is refused: one line on stderr names the id and the first copy's offset, and the exit code is 3
(``EXIT_DUPLICATE``) when refused duplicates were the only trouble, so a script retrying a publish can tell "it is
there already" from a failure.

Interrupted (Ctrl-C, SIGTERM), it stops reading, waits for the records already handed to the publisher, and says how
many were stored and the exact command that resumes after the last input line stored (``--skip N``), so a rerun
publishes nothing twice. Records are handed over in chunks whose hand-over a signal never splits (it is deferred
to the end of the chunk), so every chunk is either wholly queued and tracked or not sent at all.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import shlex
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import IO, Any

from meteor_spark.cli.common import (
    EXIT_FAILURE,
    EXIT_OK,
    CommandError,
    Progress,
    Terminated,
    config_of,
    deferred_interrupts,
    err,
    interrupted_code,
    out,
)
from meteor_spark.errors import DuplicateMessageError, SerializationError, StreamNotFoundError
from meteor_spark.format.records import Record
from meteor_spark.grid.client import Grid

logger = logging.getLogger(__name__)

#: Exit code when the only records not published were refused as duplicates of a message id within the stream's
#: deduplication window.
EXIT_DUPLICATE = 3

#: Line errors printed one by one before only counting the rest (a broken file should not flood the terminal).
MAX_REPORTED_ERRORS = 20


def register(commands: Any, parent: argparse.ArgumentParser) -> None:
    publish = commands.add_parser(
        "publish",
        parents=[parent],
        help="publish JSON lines or raw lines from a file or stdin",
        description=(
            "Publish one record per input line. With --format json (the default) each line must be a JSON value; "
            "the record's value is the line exactly as written, and --key-field / --timestamp-field pick the key "
            "and the event time out of it. Blank lines are skipped. With --format raw every line, blank or not, "
            "is a record value. A line that fails is reported with its line number and not published; the rest "
            "are; the exit code is then 1."
        ),
    )
    publish.add_argument("stream", help="stream to publish to")
    publish.add_argument("input", nargs="?", default="-", help="file to read (default: - = stdin)")
    publish.add_argument("--format", choices=("json", "raw"), default="json", help="input format (default json)")
    publish.add_argument(
        "-k", "--key-field", metavar="FIELD", help="JSON field whose value is the record key (a.b for nested fields)"
    )
    publish.add_argument(
        "-t",
        "--timestamp-field",
        metavar="FIELD",
        help="JSON field holding the event time: epoch milliseconds or an ISO-8601 string (default: now)",
    )
    publish.add_argument("--lane", type=int, help="publish every record to this lane (default: by key)")
    publish.add_argument("--topic", help="the records' topic, dot-separated words (e.g. orders.eu.created)")
    publish.add_argument(
        "--id",
        dest="message_id",
        metavar="ID",
        help="the message id of the one record published (the input must hold exactly one record); a stream with a "
        "deduplication window refuses it when the id was used within the window (exit code 3)",
    )
    publish.add_argument(
        "--id-field", metavar="FIELD", help="JSON field whose value is each record's message id (a.b for nested fields)"
    )
    publish.add_argument(
        "--create", action="store_true", help="create the stream (defaults from the TOML [stream] table) if missing"
    )
    publish.add_argument(
        "--skip",
        type=int,
        default=0,
        metavar="N",
        help="skip the first N input lines: an interrupted publish prints the --skip that resumes it exactly",
    )
    publish.set_defaults(run=run_publish)


class LineError(ValueError):
    """One input line could not become a record."""


@dataclass(frozen=True)
class LineFormat:
    """How input lines become records.

    Attributes:
        json: lines are JSON values (else raw bytes).
        key_field: dotted path of the key inside a JSON object.
        timestamp_field: dotted path of the event time inside a JSON object.
        lane: explicit lane for every record (-1 = by key).
        topic: every record's topic.
        message_id: the one record's message id (``--id``).
        id_field: dotted path of the message id inside a JSON object.
    """

    json: bool = True
    key_field: str | None = None
    timestamp_field: str | None = None
    lane: int = -1
    topic: str = ""
    message_id: str | None = None
    id_field: str | None = None

    def __post_init__(self) -> None:
        if not self.json and (self.key_field or self.timestamp_field or self.id_field):
            raise CommandError(
                "--key-field, --timestamp-field and --id-field need --format json (raw lines have no fields)"
            )
        if self.message_id is not None and self.id_field:
            raise CommandError("--id names one record's message id and --id-field each line's: give one of them")
        from meteor_spark.format.routing import check_message_id, check_topic

        check_topic(self.topic, "--topic")
        if self.message_id is not None:
            check_message_id(self.message_id, "--id")

    def record(self, line: bytes) -> Record | None:
        """The record for one line (without its line ending), or None for a line to skip (blank JSON line)."""
        if not self.json:
            return Record(value=line, lane=self.lane, topic=self.topic, message_id=self.message_id)
        if not line.strip():
            return None
        try:
            document = json.loads(line)
        except UnicodeDecodeError as exc:
            raise LineError(f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        except json.JSONDecodeError as exc:
            raise LineError(f"not valid JSON ({exc.msg} at column {exc.colno})") from None
        key = None
        if self.key_field:
            found = _field(document, self.key_field, "--key-field")
            key = None if found is None else _scalar_text(found, self.key_field).encode()
        timestamp_ms = None
        if self.timestamp_field:
            found = _field(document, self.timestamp_field, "--timestamp-field")
            timestamp_ms = None if found is None else _epoch_ms(found, self.timestamp_field)
        message_id = self.message_id
        if self.id_field:
            found = _field(document, self.id_field, "--id-field")
            message_id = None if found is None else _scalar_text(found, self.id_field)
            if message_id == "":
                raise LineError(f"field {self.id_field!r} (--id-field) is empty; a message id has 1 to 255 bytes")
        return Record(
            value=line, key=key, timestamp_ms=timestamp_ms, lane=self.lane, topic=self.topic, message_id=message_id
        )


def _field(document: Any, path: str, flag: str) -> Any:
    current = document
    for part in path.split("."):
        if not isinstance(current, dict):
            raise LineError(f"{flag} {path!r}: the line is not a JSON object with that field")
        if part not in current:
            raise LineError(f"has no field {path!r} ({flag})")
        current = current[part]
    return current


def _scalar_text(value: Any, path: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (bool, int, float)):
        return json.dumps(value)
    raise LineError(f"field {path!r} is a JSON {type(value).__name__}; a key must be a string or a number")


def _epoch_ms(value: Any, path: str) -> int:
    if isinstance(value, bool):
        raise LineError(f"field {path!r} is a boolean; expected epoch milliseconds or an ISO-8601 time")
    if isinstance(value, (int, float)):
        return int(value)
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            raise LineError(f"field {path!r} = {value!r} is not an ISO-8601 time like 2026-01-31T12:00:00Z") from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return int(moment.timestamp() * 1000)
    raise LineError(f"field {path!r} is a JSON {type(value).__name__}; expected epoch milliseconds or ISO-8601")


def _lines(handle: IO[bytes]) -> Iterator[tuple[int, bytes, int]]:
    """(line number, line without its ending, bytes consumed so far)."""
    consumed = 0
    for number, raw in enumerate(handle, start=1):
        consumed += len(raw)
        yield number, raw.rstrip(b"\r\n"), consumed


#: Records handed to the publisher per call (publish_many is far cheaper per record than publish_async).
CHUNK_RECORDS = 1000


#: Seconds an interrupted publish waits for the records already handed over before reporting.
INTERRUPT_FLUSH_S = 30.0


@dataclass
class _Outcome:
    """What happened to the input: lines that failed, and the publisher's futures (one per chunk of records, with
    the input lines of its first and last record)."""

    failed_lines: int = 0
    chunks: list[tuple[Any, int, int, int]] = field(default_factory=list)
    published: int = 0
    publish_failures: int = 0
    duplicates: int = 0
    first_publish_error: BaseException | None = None
    stored_through: int = 0
    """The input line up to which every record is stored (the ``--skip`` that resumes)."""
    stored_beyond: int = 0
    """Records stored after the first chunk that failed or is still unsettled (a resume publishes them again)."""

    def settle(self, skip: int, *, wait: bool = True) -> None:
        """Count the chunks' outcomes (``wait``: each future's; else only those settled by now) and where the
        stored prefix of the input ends."""
        self.stored_through = skip
        gap = False
        for future, count, _first, last in self.chunks:
            if not wait and not future.done():
                gap = True
                continue
            exc = future.exception()
            if exc is None:
                self.published += count
                if gap:
                    self.stored_beyond += count
                else:
                    self.stored_through = last
            else:
                gap = True
                self.publish_failures += count
                self.first_publish_error = self.first_publish_error or exc


def run_publish(args: argparse.Namespace) -> int:
    from meteor_spark.producer.publisher import Publisher

    line_format = LineFormat(
        json=args.format == "json",
        key_field=args.key_field,
        timestamp_field=args.timestamp_field,
        lane=-1 if args.lane is None else args.lane,
        topic=args.topic or "",
        message_id=args.message_id,
        id_field=args.id_field,
    )
    if args.skip < 0:
        raise CommandError(f"--skip must be >= 0 (input lines to pass over), got {args.skip}")
    config = config_of(args)
    handle, total_bytes = _open_input(args.input)
    outcome = _Outcome()
    try:
        with Grid(config.grid) as grid:
            info = _open_target(grid, args, config)
            progress = Progress(f"publishing to {args.stream}", total_bytes)
            typed = _typed_lines(grid, info)
            with Publisher(grid, info.config.name, value_serializer="bytes") as publisher:
                skipped, interrupted = _publish_lines(publisher, handle, args, line_format, outcome, progress, typed)
            outcome.settle(args.skip, wait=interrupted is None)
            progress.finish()
    finally:
        if handle is not sys.stdin.buffer:
            handle.close()
    if interrupted is not None:
        return _report_interrupted(args, outcome, interrupted)
    return _report(args, outcome, skipped)


def _open_target(grid: Grid, args: argparse.Namespace, config: Any) -> Any:
    """The stream to publish to (created with the TOML ``[stream]`` defaults under ``--create``), checked against
    ``--lane`` before any line is read."""
    from meteor_spark.grid.streams import open_stream

    try:
        info = open_stream(grid, args.stream, create=False)
    except StreamNotFoundError:
        if not args.create:
            raise StreamNotFoundError(
                f"stream {args.stream!r} does not exist; create it with `meteor streams create {args.stream}` "
                f"or add --create (settings from the TOML [stream] table)"
            ) from None
        info = open_stream(grid, config.stream_defaults.config(args.stream), create=True)
    if args.lane is not None and not 0 <= args.lane < info.config.lanes:
        raise CommandError(f"--lane {args.lane}: stream {args.stream!r} has lanes 0..{info.config.lanes - 1}")
    return info


def _typed_lines(grid: Grid, info: Any) -> Callable[[Record], Record] | None:
    """On a typed stream (``value_format="avro"``): each line's JSON value encoded with the stream's latest schema,
    the record given its ``meteor.schema`` header; a line that does not fit is reported like a bad line."""
    if info.config.value_format != "avro":
        return None
    from meteor_spark.format.avro import AvroValues
    from meteor_spark.grid.typed_values import AvroSerializer

    encode = AvroSerializer(grid, info.config.name, AvroValues(), what="meteor publish to a typed stream")

    def typed(record: Record) -> Record:
        try:
            value = json.loads(record.value)
        except ValueError as exc:
            raise LineError(f"not a JSON value ({exc}); a typed stream takes one JSON object per line") from None
        return dataclasses.replace(record, value=encode(value), headers=(*record.headers, encode.record_header))

    return typed


def _publish_lines(
    publisher: Any,
    handle: Any,
    args: argparse.Namespace,
    line_format: LineFormat,
    outcome: _Outcome,
    progress: Progress,
    typed: Callable[[Record], Record] | None = None,
) -> tuple[int, KeyboardInterrupt | None]:
    """Publish the input's lines after ``--skip`` in chunks of ``CHUNK_RECORDS``, recording each chunk's future and
    line range in ``outcome``; returns the lines passed over (``LineFormat.record`` gave None) and the Ctrl-C that
    ended the input early, if any. After Ctrl-C, what was handed over gets ``INTERRUPT_FLUSH_S`` to be stored, so
    the report can say where to resume."""
    skipped = 0
    chunk: list[Record] = []
    numbers: list[int] = []
    try:
        for number, line, consumed in _lines(handle):
            if number <= args.skip:
                continue
            try:
                record = line_format.record(line)
                if record is not None and typed is not None:
                    record = typed(record)
            except (LineError, SerializationError) as exc:
                outcome.failed_lines += 1
                if outcome.failed_lines <= MAX_REPORTED_ERRORS:
                    err(f"{_input_name(args.input)}:{number}: {exc}; line not published")
                continue
            if record is None:
                skipped += 1
                continue
            if args.message_id is not None and (numbers or outcome.chunks):
                raise CommandError(
                    f"--id {args.message_id!r} names the message id of one record, but input line {number} is a "
                    f"second record; nothing was published (use --id-field FIELD to take each line's id from it)"
                )
            numbers.append(number)
            chunk.append(record)
            if len(chunk) >= CHUNK_RECORDS:
                with deferred_interrupts():
                    _hand_over(publisher, chunk, numbers, outcome, args)
                    chunk, numbers = [], []
                progress.update(number - args.skip - outcome.failed_lines - skipped, consumed)
        if chunk:
            with deferred_interrupts():
                _hand_over(publisher, chunk, numbers, outcome, args)
                chunk = []
        publisher.flush()
    except KeyboardInterrupt as exc:
        try:
            publisher.flush(INTERRUPT_FLUSH_S)  # what was handed over: stored, or known as not
        except Exception as flush_error:  # reported through the chunks' futures below
            logger.debug("flush after the interruption: %s", flush_error)
        except KeyboardInterrupt:
            pass  # interrupted again: report what is settled by now
        return skipped, exc
    return skipped, None


def _hand_over(
    publisher: Any, chunk: list[Record], numbers: list[int], outcome: _Outcome, args: argparse.Namespace
) -> None:
    """Queue a chunk of records (one ``publish_many``). A chunk with a message id the stream's deduplication window
    refuses is queued again one record at a time, so a duplicate refuses its own line only (reported: id and the
    first copy's offset)."""
    try:
        outcome.chunks.append((publisher.publish_many(chunk), len(chunk), numbers[0], numbers[-1]))
        return
    except DuplicateMessageError:
        pass
    for record, number in zip(chunk, numbers, strict=True):
        try:
            future = publisher.publish_async(record)
        except DuplicateMessageError as exc:
            outcome.duplicates += 1
            if outcome.duplicates <= MAX_REPORTED_ERRORS:
                where = "" if args.message_id is not None else f"{_input_name(args.input)}:{number}: "
                err(f"meteor publish: {where}duplicate: {exc}")
            continue
        outcome.chunks.append((future, 1, number, number))


def _report_interrupted(args: argparse.Namespace, outcome: _Outcome, exc: KeyboardInterrupt) -> int:
    """What an interrupted publish stored, and the command that resumes right after it."""
    what = "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted"
    err(
        f"meteor publish: {what}: {outcome.published:,} record(s) stored in {args.stream!r}; every input line up "
        f"to {outcome.stored_through:,} is stored and nothing after it was sent"
        + (
            f" except {outcome.stored_beyond:,} record(s) stored after a failed chunk (a resume publishes them again)"
            if outcome.stored_beyond
            else ""
        )
    )
    if outcome.publish_failures:
        err(f"meteor publish: first error of the records not stored: {outcome.first_publish_error}")
    err(f"resume with: {resume_command(args, outcome.stored_through)}")
    return interrupted_code(exc)


def resume_command(args: argparse.Namespace, skip: int) -> str:
    """The command line the user ran, with ``--skip`` set to ``skip`` (stdin input stays stdin)."""
    argv = list(getattr(args, "argv", None) or ["publish", args.stream, args.input])
    kept: list[str] = []
    dropping = False
    for word in argv:
        if dropping:
            dropping = False
            continue
        if word == "--skip":
            dropping = True
            continue
        if word.startswith("--skip="):
            continue
        kept.append(word)
    return shlex.join(["meteor", *kept, "--skip", str(skip)])


def _report(args: argparse.Namespace, outcome: _Outcome, skipped: int) -> int:
    if outcome.failed_lines > MAX_REPORTED_ERRORS:
        err(f"... and {outcome.failed_lines - MAX_REPORTED_ERRORS} more line errors")
    summary = f"published {outcome.published:,} record(s) to {args.stream!r}"
    if skipped:
        summary += f"; skipped {skipped:,} blank line(s)"
    if outcome.duplicates:
        summary += f"; refused {outcome.duplicates:,} duplicate message id(s)"
    out(summary)
    if outcome.publish_failures:
        err(
            f"meteor publish: error: {outcome.publish_failures:,} record(s) were not stored by the grid; first error: "
            f"{outcome.first_publish_error}"
        )
    if outcome.failed_lines:
        err(f"meteor publish: error: {outcome.failed_lines:,} line(s) could not be published (see above)")
    if outcome.failed_lines or outcome.publish_failures:
        return EXIT_FAILURE
    return EXIT_DUPLICATE if outcome.duplicates else EXIT_OK


def _open_input(path: str) -> tuple[IO[bytes], int | None]:
    if path == "-":
        return sys.stdin.buffer, None
    try:
        return open(path, "rb"), os.path.getsize(path)
    except OSError as exc:
        raise CommandError(f"cannot read input file {path!r}: {exc.strerror}") from None


def _input_name(path: str) -> str:
    return "<stdin>" if path == "-" else path
