"""``meteor trace``: where a record is and what became of it (``meteor_spark.consumer.trace``)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from meteor_spark.cli.common import EXIT_OK, config_of, fmt_int, fmt_time_ms, out, render_table
from meteor_spark.cli.tail_cmd import json_line
from meteor_spark.errors import ConfigError
from meteor_spark.grid.client import Grid
from meteor_spark.validate import check_int

MAX_OFFSET = (1 << 63) - 1


def register(commands: Any, parent: argparse.ArgumentParser) -> None:
    trace = commands.add_parser(
        "trace",
        parents=[parent],
        help="where a record is, which groups confirmed past it, its deliveries, whether it was dead-lettered",
        description=(
            "Trace a record of a stream: its lane, offset, ring item and timestamp, whether the ring still holds "
            "it; for every group of the stream whether it has confirmed past it (exclusive groups) or its state "
            "and delivery count (shared groups); and the dead letters made of it, looked for in the dead-letter "
            "streams the groups name (and --dlq), through the newest --dlq-items ring items of each lane (the "
            "output says which offsets were looked at). With --key: the key's lane and its --limit most recent "
            "records among the newest --max-items ring items there."
        ),
    )
    trace.add_argument("stream", help="stream name")
    what = trace.add_mutually_exclusive_group(required=True)
    what.add_argument("--key", metavar="K", help="the record key (UTF-8 text)")
    what.add_argument("--offset", type=int, metavar="O", help="the record offset (with --lane on a multi-lane stream)")
    trace.add_argument(
        "--lane",
        type=int,
        default=None,
        metavar="N",
        help="with --offset: the lane (default: 0 on a one-lane stream; required otherwise)",
    )
    trace.add_argument("--limit", type=int, default=5, metavar="N", help="with --key: records shown (default 5)")
    trace.add_argument(
        "--max-items", type=int, default=None, metavar="N", help="with --key: ring items read back at most (10,000)"
    )
    trace.add_argument(
        "--dlq", action="append", default=[], metavar="STREAM", help="another dead-letter stream to look through"
    )
    trace.add_argument(
        "--dlq-items",
        type=int,
        default=None,
        metavar="N",
        help="ring items per lane of each dead-letter stream looked through, the newest (default 10,000)",
    )
    trace.add_argument("--json", action="store_true", help="one JSON document")
    trace.set_defaults(run=run_trace)


def run_trace(args: argparse.Namespace) -> int:
    from meteor_spark.consumer.trace import DEFAULT_DLQ_ITEMS, DEFAULT_KEY_ITEMS, MAX_LOOK_ITEMS, Tracer
    from meteor_spark.grid.reading import check_lane
    from meteor_spark.grid.streams import check_stream_name, open_stream

    dlq_items = (
        DEFAULT_DLQ_ITEMS if args.dlq_items is None else check_int("--dlq-items", args.dlq_items, 1, MAX_LOOK_ITEMS)
    )
    for name in args.dlq:
        check_stream_name(name)
    if args.key is None and (args.max_items is not None or args.limit != 5):
        raise ConfigError("--limit and --max-items go with --key")
    if args.key is not None and args.lane is not None:
        raise ConfigError("--lane goes with --offset; a key's lane follows from the key")
    with Grid(config_of(args).grid) as grid:
        info = open_stream(grid, args.stream, create=False)
        tracer = Tracer(grid, info, dlqs=tuple(args.dlq), max_dlq_items=dlq_items)
        if args.key is not None:
            check_int("--limit", args.limit, 1, 10_000)
            max_items = (
                DEFAULT_KEY_ITEMS
                if args.max_items is None
                else check_int("--max-items", args.max_items, 1, MAX_LOOK_ITEMS)
            )
            found = tracer.trace_key(args.key.encode("utf-8"), limit=args.limit, max_items=max_items)
            traces = found.records
        else:
            check_int("--offset", args.offset, 0, MAX_OFFSET)
            if args.lane is None and info.lanes > 1:
                raise ConfigError(
                    f"stream {info.name!r} has {info.lanes} lanes and an offset names a record only within one: "
                    f"give --lane (0 to {info.lanes - 1})"
                )
            lane = 0 if args.lane is None else check_lane(info, args.lane)
            found = None
            traces = [tracer.trace(lane, args.offset)]
    if args.json:
        _print_json(info.name, args.key, found, traces, tracer.looks)
    else:
        _print_text(info.name, args.key, found, traces, tracer.looks)
    return EXIT_OK


def _print_json(stream: str, key: str | None, found: Any, traces: list[Any], looks: list[Any]) -> None:
    document: dict[str, Any] = {"stream": stream}
    if found is not None:
        document |= {"key": key, "lane": found.lane, "looked_at_sequences": list(found.looked)}
    document["records"] = [_trace_json(t) for t in traces]
    document["dead_letter_streams"] = [
        {
            "stream": look.dlq,
            "missing": look.missing,
            "items": look.items,
            "lanes": {str(lane): list(b) for lane, b in sorted(look.lanes.items())},
        }
        for look in looks
    ]
    out(json.dumps(document, ensure_ascii=False))


def _print_text(stream: str, key: str | None, found: Any, traces: list[Any], looks: list[Any]) -> None:
    if found is not None:
        first, end = found.looked
        out(
            f"key {key!r} of stream {stream!r}: lane {found.lane}; {len(traces)} most recent record(s) among "
            f"ring items {fmt_int(first)} to {fmt_int(end - 1 if end > first else end)}"
        )
    for number, trace in enumerate(traces):
        if number or found is not None:
            out()
        _show(trace)
    out()
    _show_looks(looks)


def _trace_json(trace: Any) -> dict[str, Any]:
    document: dict[str, Any] = {
        "lane": trace.lane,
        "offset": trace.offset,
        "sequence": trace.sequence,
        "index": trace.index,
        "status": trace.status,
        "item_records": trace.item_records,
    }
    if trace.record is not None:
        document["record"] = json.loads(json_line(trace.record))
    document["groups"] = [
        {"group": g.group, "kind": g.kind, "state": g.state, "position": g.position, "deliveries": g.deliveries}
        for g in trace.groups
    ]
    document["dead_letters"] = [
        {
            "stream": d.dlq,
            "lane": d.lane,
            "offset": d.offset,
            "error": d.error,
            "group": d.group,
            "deliveries": d.deliveries,
            "redriven": d.redriven,
        }
        for d in trace.dead_letters
    ]
    return document


def _show(trace: Any) -> None:
    where = f"stream {trace.stream!r} lane {trace.lane} offset {fmt_int(trace.offset)}"
    out(f"{where}: ring item {fmt_int(trace.sequence)}, record {trace.index}; {trace.status}")
    record = trace.record
    if record is not None:
        value = record.value[:120].decode("utf-8", "replace") + ("..." if len(record.value) > 120 else "")
        key = "-" if record.key is None else record.key.decode("utf-8", "replace")
        out(f"  timestamp {fmt_time_ms(record.timestamp_ms)}  key {key}  value {value}")
    if trace.groups:
        rows = [[g.group, g.kind, g.state, fmt_int(g.position), fmt_int(g.deliveries)] for g in trace.groups]
        out(render_table(["group", "kind", "state", "confirmed/start", "deliveries"], rows))
    else:
        out("  no group reads this stream")
    for d in trace.dead_letters:
        out(
            f"  dead-lettered to {d.dlq!r} at {d.lane}:{fmt_int(d.offset)}"
            + (f" by group {d.group!r} after {fmt_int(d.deliveries)} deliveries" if d.group else "")
            + f": {d.error}"
            + ("; redriven" if d.redriven else "")
        )
    if not trace.dead_letters:
        out("  not dead-lettered (in what was looked through, below)")


def _show_looks(looks: list[Any]) -> None:
    if not looks:
        out("dead-letter streams looked through: none (no group of the stream names one; add --dlq STREAM)")
        return
    for look in looks:
        if look.missing:
            out(f"dead-letter stream {look.dlq!r}: does not exist")
            continue
        spans = ", ".join(
            f"lane {lane} offsets [{fmt_int(a)}, {fmt_int(b)})" for lane, (a, b) in sorted(look.lanes.items())
        )
        out(f"dead-letter stream {look.dlq!r}: looked through {look.items:,} ring item(s) ({spans})")
