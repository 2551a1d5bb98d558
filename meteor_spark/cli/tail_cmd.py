"""``meteor tail``: print a stream's records as they arrive, from the earliest, the latest or a given offset, or as
a member of a subscriber group (then confirming what was printed); ``--topics`` prints only the records whose topic
matches (on an ephemeral stream, tail is then a consuming entity with those patterns)."""

from __future__ import annotations

import argparse
import base64
import json
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from meteor_spark.cli.common import (
    EXIT_OK,
    CommandError,
    config_of,
    deferred_interrupts,
    err,
    fmt_time_ms,
    interrupted_code,
    out,
)
from meteor_spark.format.records import Record
from meteor_spark.grid.client import Grid

#: Longest wait of one poll; bounds how late --timeout and Ctrl-C are noticed.
POLL_MS = 200
#: Characters of a value shown in the pretty format before it is cut (--json never cuts).
PRETTY_VALUE_CHARS = 200


def register(commands: Any, parent: argparse.ArgumentParser) -> None:
    tail = commands.add_parser(
        "tail",
        parents=[parent],
        help="print records as they arrive (from earliest, latest, an offset, or as a group)",
        description=(
            "Print a stream's records as they arrive, until Ctrl-C, --max records or --timeout seconds without a "
            "new record. Without --group the reader is independent (it moves no offsets). With --group it joins "
            "the subscriber group: it reads only the lanes the group gives it, starts at the group's confirmed "
            "offsets, and confirms each batch after printing it. A pretty line is LANE:OFFSET, the record's "
            "timestamp (UTC), key=KEY when there is one, then the value (hex when it is not UTF-8 text)."
        ),
    )
    tail.add_argument("stream", help="stream name")
    _add_start_arguments(tail)
    _add_stop_and_output_arguments(tail)
    tail.set_defaults(run=run_tail)


def _add_start_arguments(tail: argparse.ArgumentParser) -> None:
    """Where reading starts and which lanes are read: --from, --since, --lane, --group."""
    tail.add_argument(
        "--from",
        dest="start",
        default=None,
        metavar="WHERE",
        help=(
            "earliest (the oldest record the grid can serve), latest (only new records; the default without --group) "
            "or a record offset as tail prints it after LANE: (with --lane, or on a one-lane stream; not Spark's ring "
            "sequences: the record offset of sequence S is S * 65536). With --group: where lanes without a confirmed "
            "offset start (default earliest)"
        ),
    )
    tail.add_argument(
        "--since",
        metavar="TIME",
        default=None,
        help=(
            "start at the first record whose timestamp is at or after TIME: ISO-8601 (2026-11-23T17:00:00Z; UTC when "
            "no zone is given), ms since the epoch, or a duration back from now (90s, 10m, 2h, 1d). Lanes with no "
            "such record start at their end. Not with --from or --group"
        ),
    )
    tail.add_argument("--lane", type=int, help="read only this lane (not with --group)")
    tail.add_argument(
        "-g",
        "--group",
        help="read as a member of this subscriber group (confirms what it prints; Ctrl-C or SIGTERM release its lanes)",
    )
    tail.add_argument(
        "--topics",
        action="append",
        metavar="PATTERN",
        default=None,
        help=(
            "print only records whose topic matches this AMQP pattern ('*' one word, '#' zero or more: "
            "orders.*.created, orders.#); repeat for several. On an ephemeral stream tail is a consuming entity "
            "(with --group, its group is): it starts at the end, and publishers keep only records some entity's "
            "patterns match (default '#', every topic)"
        ),
    )


def _add_stop_and_output_arguments(tail: argparse.ArgumentParser) -> None:
    """When tail stops (--max, --timeout), how records are printed (--json) and what an undecodable ring item does
    (--on-corrupt, --dead-letter-stream)."""
    tail.add_argument("-n", "--max", type=int, metavar="N", help="stop after N records")
    tail.add_argument(
        "--timeout", type=float, metavar="SECONDS", help="stop after this many seconds without a new record"
    )
    tail.add_argument(
        "--json", action="store_true", help="one JSON object per record (key/value as text, or base64 if binary)"
    )
    tail.add_argument(
        "--on-corrupt",
        choices=("error", "skip", "dead_letter"),
        default=None,
        help=(
            "a ring item that cannot be decoded: error (the default: stop with an error naming lane and sequence), "
            "skip (pass over it, with a warning) or dead_letter (see --dead-letter-stream)"
        ),
    )
    tail.add_argument(
        "--dead-letter-stream",
        metavar="STREAM",
        default=None,
        help="publish undecodable ring items to this stream (created when missing), then go on",
    )


@dataclass(frozen=True)
class TailPlan:
    """Where ``tail`` starts, checked against the stream.

    Attributes:
        scheme: initial offset scheme name (earliest/latest/auto) when no explicit offset is given.
        offset: an explicit offset to seek to, or None.
        lane: the only lane to read, or None for all (or the group's share).
        since_ms: start every lane read at the first record at or after this time (ms since the epoch), or None.
    """

    scheme: str
    offset: int | None
    lane: int | None
    since_ms: int | None = None


def plan(args: argparse.Namespace, lanes: int, *, ephemeral: bool = False) -> TailPlan:
    """Validate the flags against the stream's lane count (and, ephemeral, that tail starts at the end)."""
    if args.group is not None and not args.group.strip():
        raise CommandError("--group is empty: give a group name, or leave --group out to read without a group")
    if args.max is not None and args.max < 1:
        raise CommandError(f"--max must be at least 1, got {args.max}")
    if args.timeout is not None and args.timeout <= 0:
        raise CommandError(f"--timeout must be > 0 seconds, got {args.timeout:g}")
    if args.lane is not None:
        if args.group:
            raise CommandError("--lane and --group exclude each other: a group decides which lanes a member reads")
        if not 0 <= args.lane < lanes:
            raise CommandError(f"--lane {args.lane}: stream {args.stream!r} has lanes 0..{lanes - 1}")
    if ephemeral:
        where = "--since" if getattr(args, "since", None) is not None else "--from"
        if where == "--since" or (args.start is not None and args.start.strip().lower() != "latest"):
            raise CommandError(
                f"{where}: stream {args.stream!r} is ephemeral; a reader starts at its end (nothing published before "
                f"it subscribed is kept for it), so leave {where} out"
            )
        return TailPlan(scheme="latest", offset=None, lane=args.lane)
    since = getattr(args, "since", None)
    if since is not None:
        if args.start is not None or args.group:
            raise CommandError("--since excludes --from and --group: it says where an independent reader starts")
        return TailPlan(scheme="latest", offset=None, lane=args.lane, since_ms=parse_since(since))
    start = (args.start or ("earliest" if args.group else "latest")).strip().lower()
    if start in ("earliest", "latest"):
        return TailPlan(scheme=start, offset=None, lane=args.lane)
    try:
        offset = int(start)
    except ValueError:
        raise CommandError(f"--from {args.start!r}: expected earliest, latest or an offset (a number)") from None
    if offset < 0:
        raise CommandError(f"--from {offset}: offsets are >= 0")
    if args.group:
        raise CommandError("--from OFFSET and --group exclude each other: a group starts at its confirmed offsets")
    lane = args.lane if args.lane is not None else (0 if lanes == 1 else None)
    if lane is None:
        raise CommandError(
            f"--from {offset}: offsets are per lane and stream {args.stream!r} has {lanes} lanes; add --lane N"
        )
    return TailPlan(scheme="earliest", offset=offset, lane=lane)


_RELATIVE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h|d)\s*$", re.IGNORECASE)
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_since(text: str, *, now_ms: int | None = None, option: str = "--since") -> int:
    """``--since TIME`` (or ``option``) as ms since the epoch: a whole number is epoch ms, a number with a unit
    (90s, 10m, 2h, 1d) is that long before ``now_ms`` (default: now), anything else ISO-8601 (UTC when it names no
    zone)."""
    value = text.strip()
    if value.isdigit():
        return int(value)
    relative = _RELATIVE.match(value)
    if relative is not None:
        now = int(time.time() * 1000) if now_ms is None else now_ms
        return max(0, now - int(float(relative.group(1)) * _UNIT_MS[relative.group(2).lower()]))
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00") if value.endswith("Z") else value)
    except ValueError:
        raise CommandError(
            f"{option} {text!r}: expected ISO-8601 (2026-11-23T17:00:00Z), ms since the epoch, or a duration back "
            f"from now like 10m or 2h"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    ms = int(moment.timestamp() * 1000)
    if ms < 0:
        raise CommandError(f"{option} {text!r} is before 1970; record timestamps are ms since the epoch, >= 0")
    return ms


def run_tail(args: argparse.Namespace) -> int:
    from meteor_spark.consumer.subscriber import InitialOffsetScheme, Subscriber
    from meteor_spark.format.corrupt import CorruptItemPolicy
    from meteor_spark.grid.streams import open_stream

    with Grid(config_of(args).grid) as grid:
        info = open_stream(grid, args.stream, create=False)
        tail_plan = plan(args, info.config.lanes, ephemeral=bool(info.config.ephemeral))
        # Checked here to name the flags in errors; the subscriber parses the same two settings again.
        CorruptItemPolicy.parse(
            args.on_corrupt, args.dead_letter_stream, mode_name="--on-corrupt", stream_name="--dead-letter-stream"
        )
        printed = 0
        last_record_at = time.monotonic()
        interrupted: KeyboardInterrupt | None = None
        subscriber: Subscriber | None = None
        try:
            with deferred_interrupts():  # a signal while joining the group: joined, then released below
                subscriber = Subscriber(
                    grid,
                    info.config.name,
                    group=args.group,
                    initial_offset_scheme=InitialOffsetScheme.parse(tail_plan.scheme),
                    on_corrupt=args.on_corrupt,
                    dead_letter_stream=args.dead_letter_stream,
                    topics=getattr(args, "topics", None),
                )
            if tail_plan.offset is not None:
                check_record_offset(grid, info, tail_plan.lane, tail_plan.offset)  # type: ignore[arg-type]
                subscriber.seek(tail_plan.offset, lane=tail_plan.lane)
            if tail_plan.since_ms is not None:
                subscriber.seek_to_timestamp(tail_plan.since_ms, lane=tail_plan.lane)
            while args.max is None or printed < args.max:
                batch = subscriber.poll(POLL_MS)
                records = list(batch) if tail_plan.lane is None else [r for r in batch if r.lane == tail_plan.lane]
                if not records:
                    if args.timeout is not None and time.monotonic() - last_record_at >= args.timeout:
                        break
                    continue
                last_record_at = time.monotonic()
                last_printed: dict[int, Record] = {}
                for record in records:
                    out(json_line(record) if args.json else pretty_line(record))
                    last_printed[record.lane] = record
                    printed += 1
                    if args.max is not None and printed >= args.max:
                        break
                if args.group and not info.config.ephemeral:  # ephemeral: the position was saved on delivery
                    # Confirm exactly what was printed: with --max, the rest of this batch stays for the group.
                    for record in last_printed.values():
                        subscriber.confirm(record)
        except KeyboardInterrupt as exc:
            interrupted = exc  # Ctrl-C (or SIGTERM) is how a tail is meant to end
        finally:
            if subscriber is not None:
                subscriber.close()  # a group member releases its lanes: the group moves on without waiting for expiry
    if interrupted is not None:
        return interrupted_code(interrupted)
    if printed == 0 and args.timeout is not None:
        err(f"meteor tail: no record arrived on {args.stream!r} within {args.timeout:g} s")
    return EXIT_OK


def check_record_offset(grid: Grid, info: Any, lane: int, offset: int) -> None:
    """``--from OFFSET`` names a record: refuse an index past the records of its ring item, which the reader would
    otherwise silently turn into the next item's first record (``--from 5`` read as offset 65536)."""
    from meteor_spark.format.item_header import item_count
    from meteor_spark.format.offsets import first_offset_of, index_of, sequence_of

    sequence, index = sequence_of(offset), index_of(offset)
    if index == 0:
        return  # an item's first record, or the lane's end: the subscriber checks the range
    ring = grid.ring(info.ring_names[lane])
    batch = ring.read_many(sequence, 0, 1)
    if not batch.items or batch.sequences[0] != sequence:
        return  # not in the ring (overwritten or past the end): the subscriber names the valid range
    count = item_count(batch.items[0], stream=info.name, lane=lane, sequence=sequence)
    if index >= count:
        raise CommandError(
            f"--from {offset}: lane {lane} has no record at offset {offset}; its ring item {sequence} holds records "
            f"{first_offset_of(sequence)}..{first_offset_of(sequence) + count - 1} and the next starts at "
            f"{first_offset_of(sequence + 1)}. Record offsets are those tail prints after LANE: (ring sequence * "
            f"65536 + the record's index in its item); to start at ring sequence {offset} as Spark counts, use "
            f"--from {first_offset_of(offset)}"
        )


def pretty_line(record: Record) -> str:
    key = "" if record.key is None else f" key={_text_or_hex(record.key)}"
    value = _text_or_hex(record.value)
    if len(value) > PRETTY_VALUE_CHARS:
        raw = record.value
        size = f"{len(raw):,} bytes" if isinstance(raw, (bytes, bytearray)) else f"{len(value):,} characters"
        value = value[:PRETTY_VALUE_CHARS] + f"... ({size})"
    routing = (f" topic={record.topic}" if record.topic else "") + (
        "" if record.message_id is None else f" id={record.message_id}"
    )
    return f"{record.lane}:{record.offset}  {fmt_time_ms(record.timestamp_ms)}{key}{routing}  {value}"


def json_line(record: Record) -> str:
    document: dict[str, Any] = {
        "stream": record.stream,
        "lane": record.lane,
        "offset": record.offset,
        "timestamp": fmt_time_ms(record.timestamp_ms) if record.timestamp_ms is not None else None,
    }
    if record.topic:
        document["topic"] = record.topic
    if record.message_id is not None:
        document["message_id"] = record.message_id
    _put_bytes(document, "key", record.key)
    _put_bytes(document, "value", record.value)
    if record.headers:
        headers: list[dict[str, Any]] = []
        for name, raw in record.headers:
            header: dict[str, Any] = {"key": name}
            _put_bytes(header, "value", raw)
            headers.append(header)
        document["headers"] = headers
    return json.dumps(document, ensure_ascii=False)


def _put_bytes(document: dict[str, Any], name: str, raw: bytes | None) -> None:
    """Text when the bytes are UTF-8, else ``<name>_base64``: lossless either way; a typed stream's decoded value
    as the JSON object it is."""
    if raw is None:
        document[name] = None
        return
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        document[name] = json.loads(_typed_text(raw))
        return
    try:
        document[name] = bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        document[f"{name}_base64"] = base64.b64encode(bytes(raw)).decode("ascii")


def _typed_text(value: Any) -> str:
    """A typed stream's decoded value (a dict) as compact JSON, bytes fields as 0x-hex."""

    def plain(obj: Any) -> Any:
        if isinstance(obj, (bytes, bytearray)):
            return "0x" + bytes(obj).hex()
        raise TypeError(f"{type(obj).__name__} is not JSON")

    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=plain)


def _text_or_hex(raw: bytes) -> str:
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        return _typed_text(raw)
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        return "0x" + bytes(raw[:64]).hex() + ("..." if len(raw) > 64 else "")
