"""``meteor dlq``: look at a dead-letter stream (``list``, ``show``) and send its dead letters back to the streams
they came from (``redrive``), once each however often it is run (``meteor_spark.consumer.redrive``)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from meteor_spark.cli.common import EXIT_OK, config_of, err, fmt_int, fmt_time_ms, out, render_table
from meteor_spark.cli.tail_cmd import json_line
from meteor_spark.errors import ConfigError
from meteor_spark.grid.client import Grid
from meteor_spark.validate import check_int

#: Characters of an error shown in a table row (``show`` and ``--json`` give it whole).
ERROR_CHARS = 100
#: Characters of a value ``show`` prints (``--json`` gives it whole).
VALUE_CHARS = 300
MAX_OFFSET = (1 << 63) - 1


def register(commands: Any, parent: argparse.ArgumentParser) -> None:
    dlq = commands.add_parser(
        "dlq",
        parents=[parent],
        help="dead-letter streams: list, show and redrive their dead letters",
        description=(
            "Dead letters are records a reader could not process: a shared group's records past max_deliveries or "
            "rejected, records past a group's dead_letter_after, and what on_corrupt=dead_letter passes over. Each "
            "carries headers naming its source stream, lane and offset, the error, and in shared groups the group "
            "and the delivery count. `list` groups them by source and by error; `show` prints dead letters in full; "
            "`redrive` publishes them again to their source streams, once each: a second redrive (or one after a "
            "redrive that died midway) sends nothing twice."
        ),
    )
    actions = dlq.add_subparsers(dest="action", metavar="ACTION", title="actions")
    actions.required = True
    _register_list(actions, parent)
    _register_show(actions, parent)
    _register_redrive(actions, parent)


def _register_list(actions: Any, parent: argparse.ArgumentParser) -> None:
    listing = actions.add_parser(
        "list",
        parents=[parent],
        help="dead letters grouped by source stream / lane / group and by error, with counts and offset ranges",
        description="Dead letters grouped by source (stream, lane, group) and by error: counts, how many were "
        "redriven, the dead-letter offsets and source offsets they span. An empty stream is an empty listing.",
    )
    listing.add_argument("stream", help="the dead-letter stream")
    listing.add_argument("--json", action="store_true", help="one JSON document")
    listing.set_defaults(run=run_list)


def _register_show(actions: Any, parent: argparse.ArgumentParser) -> None:
    show = actions.add_parser(
        "show",
        parents=[parent],
        help="dead letters in full: value, key, headers, source, error, delivery count",
        description="Dead letters in full, oldest first: the one at --offset, or the first --limit that match the "
        "filters.",
    )
    show.add_argument("stream", help="the dead-letter stream")
    show.add_argument("--offset", type=int, default=None, metavar="O", help="the dead letter at this offset")
    show.add_argument(
        "--lane", type=int, default=None, metavar="N", help="with --offset: lane of the dead-letter stream"
    )
    _add_filters(show)
    show.add_argument("--limit", type=int, default=10, metavar="N", help="dead letters shown at most (default 10)")
    show.add_argument("--json", action="store_true", help="one JSON object per dead letter")
    show.set_defaults(run=run_show)


def _register_redrive(actions: Any, parent: argparse.ArgumentParser) -> None:
    redrive = actions.add_parser(
        "redrive",
        parents=[parent],
        help="publish dead letters again to their source streams, each once",
        description=(
            "Publish the dead letters (all, or those the filters take) again to their source streams: the original "
            "value, key, topic, timestamp and headers, the dead-letter headers removed, a meteor.redriven.from "
            "header naming the dead letter and the message id dlq:<stream>:<lane>:<offset>, to the source lane. "
            "Progress is kept in the grid (map meteor.dlq.redrive): dead letters redriven before are skipped, and a "
            "redrive that died midway is settled by the next one (what reached its stream is not sent again). Whole "
            "undecodable ring items cannot be redriven and are counted."
        ),
    )
    redrive.add_argument("stream", help="the dead-letter stream")
    _add_filters(redrive)
    redrive.add_argument("--from-offset", type=int, default=None, metavar="O", help="only dead letters at offsets >= O")
    redrive.add_argument("--to-offset", type=int, default=None, metavar="O", help="only dead letters at offsets < O")
    redrive.add_argument("--dry-run", action="store_true", help="count what would be redriven, send nothing")
    redrive.add_argument(
        "--step", type=int, default=None, metavar="N", help="dead letters per step (progress write; default 200)"
    )
    redrive.add_argument("--json", action="store_true", help="the report as one JSON document")
    redrive.set_defaults(run=run_redrive)


def _add_filters(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--source", metavar="STREAM", default=None, help="only dead letters from this stream")
    parser.add_argument(
        "--source-lane", type=int, default=None, metavar="N", help="only dead letters from this lane of their source"
    )
    parser.add_argument(
        "--error", metavar="TEXT", default=None, help="only dead letters whose error contains TEXT (any case)"
    )


def _selection(args: argparse.Namespace) -> Any:
    from meteor_spark.consumer.redrive import RedriveFilter

    if args.error is not None and not args.error:
        raise ConfigError("--error needs a text to look for in the errors, got an empty one")
    if args.source_lane is not None:
        check_int("--source-lane", args.source_lane, 0, 1 << 20)
    start = getattr(args, "from_offset", None)
    end = getattr(args, "to_offset", None)
    if start is not None:
        check_int("--from-offset", start, 0, MAX_OFFSET)
    if end is not None:
        check_int("--to-offset", end, 1, MAX_OFFSET)
    if start is not None and end is not None and end <= start:
        raise ConfigError(f"--to-offset {end} must be above --from-offset {start} (the range is [from, to))")
    return RedriveFilter(args.source, args.source_lane, args.error, start, end)


def run_list(args: argparse.Namespace) -> int:
    from meteor_spark.consumer.dead_letters import LetterGroup, ScanReport, scan_dead_letters
    from meteor_spark.consumer.redrive import read_progress
    from meteor_spark.grid.streams import open_stream

    with Grid(config_of(args).grid) as grid:
        info = open_stream(grid, args.stream, create=False)
        progress = read_progress(grid, info.name)
        report = ScanReport()
        by_source: dict[tuple[str, str, str], LetterGroup] = {}
        by_error: dict[str, LetterGroup] = {}
        total = LetterGroup()
        for letter in scan_dead_letters(grid, info, report):
            done = progress.is_done(letter.lane, letter.offset)
            source = (
                letter.source_stream or "?",
                "?" if letter.source_lane is None else str(letter.source_lane),
                letter.group or "-",
            )
            by_source.setdefault(source, LetterGroup()).add(letter, done)
            by_error.setdefault(letter.error, LetterGroup()).add(letter, done)
            total.add(letter, done)
    if args.json:
        _list_json(info.name, total, by_source, by_error, report)
    else:
        _list_text(info.name, total, by_source, by_error, report)
    return EXIT_OK


def _list_json(name: str, total: Any, by_source: dict[Any, Any], by_error: dict[str, Any], report: Any) -> None:
    document = {
        "stream": name,
        "dead_letters": total.count,
        "redriven": total.redriven,
        "by_source": [
            {"source": s, "lane": None if lane == "?" else int(lane), "group": None if g == "-" else g}
            | _group_json(group)
            for (s, lane, g), group in sorted(by_source.items())
        ],
        "by_error": [{"error": e} | _group_json(group) for e, group in sorted(by_error.items())],
        "scanned": _scan_json(report),
    }
    out(json.dumps(document, ensure_ascii=False))


def _list_text(name: str, total: Any, by_source: dict[Any, Any], by_error: dict[str, Any], report: Any) -> None:
    out(
        f"dead-letter stream {name!r}: {total.count:,} dead letter(s), {total.redriven:,} redriven"
        + ("" if not total.count else f" (offsets {fmt_int(total.first_offset)} to {fmt_int(total.last_offset)})")
    )
    _passed_over(report)
    if not total.count:
        return
    rows = [
        [
            s,
            lane,
            g,
            fmt_int(group.count),
            fmt_int(group.redriven),
            _span(group.first_offset, group.last_offset),
            _span(group.first_source, group.last_source),
        ]
        for (s, lane, g), group in sorted(by_source.items())
    ]
    out()
    out(render_table(["source", "lane", "group", "count", "redriven", "dlq offsets", "source offsets"], rows))
    rows = [
        [fmt_int(group.count), fmt_int(group.redriven), _span(group.first_offset, group.last_offset), _short(e)]
        for e, group in sorted(by_error.items(), key=lambda pair: (-pair[1].count, pair[0]))
    ]
    out()
    out(render_table(["count", "redriven", "dlq offsets", "error"], rows))


def _group_json(group: Any) -> dict[str, Any]:
    return {
        "count": group.count,
        "redriven": group.redriven,
        "first_offset": group.first_offset,
        "last_offset": group.last_offset,
        "first_source_offset": group.first_source,
        "last_source_offset": group.last_source,
    }


def _scan_json(report: Any) -> dict[str, Any]:
    return {
        "lanes": {str(lane): list(bounds) for lane, bounds in sorted(report.lanes.items())},
        "items": report.items,
        "overwritten_items": report.overwritten_items,
        "undecodable_items": report.undecodable_items,
    }


def _passed_over(report: Any) -> None:
    if report.overwritten_items or report.undecodable_items:
        err(
            f"note: {report.overwritten_items:,} ring item(s) were overwritten while being read and "
            f"{report.undecodable_items:,} could not be decoded; they are not counted"
        )


def _span(first: int | None, last: int | None) -> str:
    if first is None or last is None:
        return "-"
    return fmt_int(first) if first == last else f"{fmt_int(first)}..{fmt_int(last)}"


def _short(text: str) -> str:
    text = " ".join(text.split()) or "-"
    return text if len(text) <= ERROR_CHARS else text[: ERROR_CHARS - 3] + "..."


def run_show(args: argparse.Namespace) -> int:
    from meteor_spark.consumer.dead_letters import ScanReport, find_dead_letter, scan_dead_letters
    from meteor_spark.consumer.redrive import read_progress
    from meteor_spark.grid.reading import check_lane
    from meteor_spark.grid.streams import open_stream

    check_int("--limit", args.limit, 1, 1_000_000)
    selection = _selection(args)
    if args.lane is not None and args.offset is None:
        raise ConfigError("--lane goes with --offset (the lane of the dead-letter stream holding that offset)")
    if args.offset is not None:
        check_int("--offset", args.offset, 0, MAX_OFFSET)
        if (args.source, args.source_lane, args.error) != (None, None, None):
            raise ConfigError("--offset names one dead letter: drop --source, --source-lane and --error, or --offset")
    with Grid(config_of(args).grid) as grid:
        info = open_stream(grid, args.stream, create=False)
        progress = read_progress(grid, info.name)
        if args.offset is not None:
            lane = None if args.lane is None else check_lane(info, args.lane)
            letters = [find_dead_letter(grid, info, args.offset, lane)]
        else:
            letters = []
            for letter in scan_dead_letters(grid, info, ScanReport()):
                if selection.matches(letter):
                    letters.append(letter)
                    if len(letters) >= args.limit:
                        break
    for number, letter in enumerate(letters):
        redriven = progress.is_done(letter.lane, letter.offset)
        if args.json:
            document = json.loads(json_line(letter.record))
            document |= {
                "source": {
                    "stream": letter.source_stream,
                    "lane": letter.source_lane,
                    "offset": letter.source_offset,
                    "topic": letter.topic or None,
                },
                "group": letter.group,
                "error": letter.error,
                "deliveries": letter.deliveries,
                "undecodable_item": letter.is_item,
                "redriven": redriven,
            }
            out(json.dumps(document, ensure_ascii=False))
            continue
        if number:
            out()
        _show_one(letter, redriven)
    if not letters and not args.json:
        out(f"dead-letter stream {info.name!r}: no dead letter matches")
    return EXIT_OK


def _show_one(letter: Any, redriven: bool) -> None:
    record = letter.record
    source = (
        "?"
        if letter.source_stream is None
        else f"{letter.source_stream} lane {letter.source_lane} offset " + (fmt_int(letter.source_offset))
    )
    out(f"dead letter {record.lane}:{record.offset} ({fmt_time_ms(record.timestamp_ms)})")
    out(f"  source:     {source}" + (f" topic {letter.topic}" if letter.topic else ""))
    out(f"  error:      {letter.error or '-'}")
    if letter.group is not None:
        out(f"  group:      {letter.group} (delivered {fmt_int(letter.deliveries)} time(s))")
    out(f"  redriven:   {'yes' if redriven else 'no'}" + (" (an undecodable ring item)" if letter.is_item else ""))
    out(f"  key:        {'-' if record.key is None else _preview(record.key)}")
    out(f"  value:      {_preview(record.value)}")
    for name, raw in letter.user_headers:
        out(f"  header:     {name}={_preview(raw)}")


def _preview(raw: bytes) -> str:
    try:
        text = bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        text = "0x" + bytes(raw[: VALUE_CHARS // 2]).hex()
    if len(text) > VALUE_CHARS:
        text = text[:VALUE_CHARS] + "..."
    return text + (f" ({len(raw):,} bytes)" if len(raw) > VALUE_CHARS // 2 else "")


def run_redrive(args: argparse.Namespace) -> int:
    from meteor_spark.consumer.redrive import DEFAULT_STEP, redrive
    from meteor_spark.grid.streams import open_stream

    selection = _selection(args)
    step = DEFAULT_STEP if args.step is None else check_int("--step", args.step, 1, 10_000)
    with Grid(config_of(args).grid) as grid:
        info = open_stream(grid, args.stream, create=False)
        report = redrive(grid, info, selection, dry_run=args.dry_run, step=step, on_wait=err)
    if args.json:
        document = {
            "stream": info.name,
            "dry_run": report.dry_run,
            "matched": report.matched,
            "already_redriven": report.already,
            "redriven": report.redriven,
            "refused_duplicates": report.refused_duplicates,
            "recovered": report.recovered,
            "resent": report.resent,
            "not_redrivable": report.not_redrivable,
            "no_source": report.no_source,
            "missing_sources": sorted(report.missing_sources),
            "per_source": dict(sorted(report.per_source.items())),
            "scanned": _scan_json(report.scan),
        }
        out(json.dumps(document, ensure_ascii=False))
        return EXIT_OK
    verb = "would redrive" if report.dry_run else "redrove"
    out(
        f"dead-letter stream {info.name!r}: {report.matched:,} dead letter(s) matched; {verb} {report.redriven:,}, "
        f"{report.already:,} redriven before"
    )
    if report.recovered or report.resent:
        out(
            f"a redrive that died midway was settled: {report.recovered:,} of its record(s) had arrived, "
            f"{report.resent:,} had not"
        )
    if report.refused_duplicates:
        out(f"{report.refused_duplicates:,} refused by the source stream's deduplication window (already there)")
    if report.not_redrivable:
        out(f"{report.not_redrivable:,} undecodable ring item(s) left (they hold no record to send)")
    if report.no_source:
        missing = f" (streams gone: {', '.join(sorted(report.missing_sources))})" if report.missing_sources else ""
        out(f"{report.no_source:,} without a source stream to send to{missing}")
    if report.per_source:
        out(render_table(["source", verb], [[s, fmt_int(n)] for s, n in sorted(report.per_source.items())]))
    _passed_over(report.scan)
    return EXIT_OK
