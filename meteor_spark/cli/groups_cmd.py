"""``meteor groups``: who holds which lane of a stream for a subscriber group, and how far behind it is; and moving
a stopped group's confirmed offsets (``--seek``, Kafka's ``kafka-consumer-groups --reset-offsets``)."""

from __future__ import annotations

import argparse
import time
from typing import Any

from meteor_spark.cli.common import (
    EXIT_OK,
    config_of,
    deferred_interrupts,
    fmt_int,
    fmt_time_ms,
    interrupted_code,
    out,
    render_table,
)
from meteor_spark.errors import ConfigError, unknown_option
from meteor_spark.format.offsets import first_offset_of
from meteor_spark.grid.client import Grid
from meteor_spark.grid.reading import check_lane
from meteor_spark.validate import check_int, check_number


def register(commands: Any, parent: argparse.ArgumentParser) -> None:
    groups = commands.add_parser(
        "groups",
        parents=[parent],
        help="per lane of a stream: lease holder, epoch, lease expiry, confirmed offset, lag",
        description=(
            "Show the subscriber groups reading a stream. Per lane: the member holding the lane's lease, the lease's "
            "fencing epoch, when the lease expires unless renewed, the confirmed offset (the next record the group "
            "will read), how far behind the end of the lane that is (records; ring items when too many to count), "
            "and how many unread items the grid can no longer serve. A confirmed offset past the lane's end (stream "
            "re-created, lane truncated) is marked 'PAST END'. A shared group (queue semantics) shows per lane its "
            "start offset (everything before it settled), the first offset never handed out, the records in flight "
            "(ranges acquired by members' polls, ranges released for redelivery) and the ring items from its start "
            "to the end. Without a group, every group of the stream is shown; "
            "an unknown group is an error listing the stream's groups. With --watch the tables are refreshed every "
            "--interval seconds until Ctrl-C. With --seek (or --seek-time) the group's confirmed offsets move, on "
            "every lane or the --lane given, so its members resume there (Kafka's --reset-offsets): stop the group's "
            "members first, a lane a member holds is refused; --dry-run shows the moves without making them."
        ),
    )
    groups.add_argument("stream", help="stream name")
    groups.add_argument("group", nargs="?", help="only this group")
    groups.add_argument("--watch", action="store_true", help="refresh the tables until Ctrl-C")
    groups.add_argument(
        "--interval", type=float, default=None, metavar="S", help="with --watch: seconds between refreshes (default 2)"
    )
    groups.add_argument(
        "--count", type=int, default=None, metavar="N", help="with --watch: stop after N refreshes (default: never)"
    )
    groups.add_argument(
        "--seek",
        metavar="WHERE",
        help="move the group's confirmed offsets: earliest (the oldest record the grid holds), latest (the end: "
        "only new records), or a record offset (with --lane)",
    )
    groups.add_argument(
        "--seek-time",
        metavar="TIME",
        help="move the group's confirmed offsets to the first record at or after TIME: ISO-8601 (UTC when no zone "
        "is given), ms since the epoch, or a duration back from now (90s, 10m, 2h, 1d); lanes with no record that "
        "late go to their end",
    )
    groups.add_argument("--lane", type=int, default=None, metavar="N", help="with --seek: only this lane")
    groups.add_argument("--dry-run", action="store_true", help="with --seek: show the moves, change nothing")
    groups.set_defaults(run=run_groups)


def run_groups(args: argparse.Namespace) -> int:
    from meteor_spark.grid.streams import open_stream

    if args.seek is not None or args.seek_time is not None:
        return run_seek(args)
    if args.lane is not None or args.dry_run:
        raise ConfigError("--lane and --dry-run go with --seek or --seek-time")
    if not args.watch and (args.count is not None or args.interval is not None):
        raise ConfigError("--interval and --count go with --watch; add --watch to refresh the tables")
    interval = check_number("--interval", 2.0 if args.interval is None else args.interval, 0.01, 86_400)
    if args.count is not None:
        check_int("--count", args.count, 1, 1 << 31)
    with Grid(config_of(args).grid) as grid:
        info = open_stream(grid, args.stream, create=False)
        if not args.watch:
            _show(grid, info, args)
            return EXIT_OK
        refreshes = 0
        try:
            while True:
                if refreshes:
                    out()
                out(f"-- {fmt_time_ms(int(time.time() * 1000))} (every {interval:g} s; Ctrl-C stops)")
                with deferred_interrupts():  # held until shown: raised inside a lazy import, importlib swallows it
                    _show(grid, info, args)
                refreshes += 1
                if args.count is not None and refreshes >= args.count:
                    break
                time.sleep(interval)
        except KeyboardInterrupt as exc:
            return interrupted_code(exc)  # the way a watch is meant to end; 130 as for every command
    return EXIT_OK


def run_seek(args: argparse.Namespace) -> int:
    """Work out every lane's new offset first, then move them in one ``seek_group`` (which refuses held lanes and
    offsets past a lane's end), so a refusal changes nothing."""
    from meteor_spark.grid.streams import open_stream
    from meteor_spark.groups.admin import group_state, seek_group

    if args.group is None:
        raise ConfigError("--seek needs the group: meteor groups STREAM GROUP --seek WHERE")
    if args.seek is not None and args.seek_time is not None:
        raise ConfigError("--seek and --seek-time exclude each other: give one place to move to")
    if args.watch:
        raise ConfigError("--seek does not go with --watch: move the offsets, then watch")
    with Grid(config_of(args).grid) as grid:
        info = open_stream(grid, args.stream, create=False)
        lanes = range(info.config.lanes) if args.lane is None else [check_lane(info, args.lane)]
        targets = {lane: _seek_target(grid, info, lane, args) for lane in lanes}
        before = {state.lane: state.confirmed for state in group_state(grid, info, args.group)}
        if not args.dry_run:
            seek_group(grid, info, args.group, targets)
    verb = "would move" if args.dry_run else "moved"
    out(f"group {args.group!r} on stream {args.stream!r}: {verb} {len(targets)} lane(s)")
    rows = [[str(lane), fmt_int(before.get(lane)), fmt_int(offset)] for lane, offset in targets.items()]
    out(render_table(["lane", "confirmed before", "confirmed now" if not args.dry_run else "would be"], rows))
    return EXIT_OK


def _seek_target(grid: Grid, info: Any, lane: int, args: argparse.Namespace) -> int:
    """The record offset ``--seek`` / ``--seek-time`` names for ``lane``."""
    from meteor_spark.cli.tail_cmd import parse_since
    from meteor_spark.grid.reading import oldest_sequence
    from meteor_spark.grid.timestamps import offset_for_timestamp

    end = first_offset_of(grid.ring(info.ring_names[lane]).tail() + 1)
    if args.seek_time is not None:
        found = offset_for_timestamp(grid, info, lane, parse_since(args.seek_time, option="--seek-time"))
        return end if found is None else found
    if args.seek == "earliest":
        return first_offset_of(oldest_sequence(grid, info, lane))
    if args.seek == "latest":
        return end
    try:
        offset = int(args.seek)
    except ValueError:
        raise ConfigError(
            f"--seek {args.seek!r}: expected earliest, latest or a record offset (a whole number, with --lane); "
            "for a time use --seek-time"
        ) from None
    if args.lane is None:
        raise ConfigError(f"--seek {offset} names a record offset, which belongs to one lane: add --lane N")
    return offset


def _show(grid: Grid, info: Any, args: argparse.Namespace) -> None:
    """The tables of the groups asked for, once."""
    from meteor_spark.groups.admin import group_state, lag_report, list_groups, list_shared_groups

    exclusive = {g.group for g in list_groups(grid, info.config.name)}
    shared = set(list_shared_groups(grid, info.config.name)) - exclusive
    known = sorted(exclusive | shared)
    if args.group and args.group not in known:
        if not known:
            raise ConfigError(f"group {args.group!r} is unknown: no group has read stream {args.stream!r} yet")
        raise unknown_option("group", args.group, known)
    names = [args.group] if args.group else known
    if not names:
        out(f"no group has read stream {args.stream!r} yet")
        return
    now_ms = int(time.time() * 1000)
    for number, group in enumerate(names):
        if number:
            out()
        if group in shared:
            _show_shared(grid, info, group)
            continue
        states = group_state(grid, info, group)
        behind = {entry.lane: entry for entry in lag_report(grid, info, group, count_records=True)}
        out(f"group {group!r} on stream {args.stream!r}")
        rows = []
        for state in sorted(states, key=lambda s: s.lane):
            rows.append(
                [
                    state.lane,
                    state.holder or "(free)",
                    fmt_int(state.epoch),
                    _expiry(state.lease_expires_ms, now_ms, state.holder),
                    fmt_int(state.confirmed),
                    _behind(behind.get(state.lane)),
                    _lost(behind.get(state.lane)),
                ]
            )
        out(
            render_table(
                ["LANE", "HOLDER", "EPOCH", "LEASE EXPIRES", "CONFIRMED OFFSET", "BEHIND", "LOST"],
                rows,
                right=[0, 2, 4, 5, 6],
            )
        )
        for entry in sorted(behind.values(), key=lambda e: e.lane):
            if entry.stable_sequence is not None:
                out(
                    f"lane {entry.lane}: read_committed readers wait at offset "
                    f"{first_offset_of(entry.stable_sequence)} (last stable offset: a transaction still open), "
                    f"{entry.next_sequence - entry.stable_sequence:,} ring items before the lane's end"
                )
            if entry.past_end:
                out(
                    f"lane {entry.lane}: the confirmed offset {entry.confirmed} is past the lane's end (offset "
                    f"{first_offset_of(entry.next_sequence)}): the stream was re-created or the lane truncated. "
                    f"Members of the group get OffsetOutOfRangeError until the lane is sought to a valid offset"
                )


def _expiry(expires_ms: int | None, now_ms: int, holder: str | None) -> str:
    if holder is None or expires_ms is None:
        return "-"
    seconds = (expires_ms - now_ms) / 1000
    when = fmt_time_ms(expires_ms)
    return f"{when} (in {seconds:.1f} s)" if seconds >= 0 else f"{when} (expired {-seconds:.1f} s ago)"


def _behind(entry: Any) -> str:
    """Records behind when counted; else ring items (each holds a batch of records), labelled as such."""
    if entry is not None and entry.past_end:
        return f"PAST END (lane ends at offset {first_offset_of(entry.next_sequence)})"
    if entry is None or entry.items is None:
        return "-"
    if entry.records is not None:
        count = entry.corrupt_items
        corrupt = f" + {count:,} corrupt item{'' if count == 1 else 's'}" if count else ""
        return f"{entry.records:,} records{corrupt}"
    return f"{entry.items:,} items"


def _lost(entry: Any) -> str:
    """Ring items the group has not read that the grid can no longer serve (reading will raise DataLossError)."""
    if entry is None or not entry.lost_items:
        return "-"
    return f"{entry.lost_items:,} items"


def _show_shared(grid: Grid, info: Any, group: str) -> None:
    """The table of a shared group: per lane its start offset, window and records in flight."""
    from meteor_spark.format.offsets import sequence_of
    from meteor_spark.grid.streams import lane_bounds
    from meteor_spark.groups.admin import shared_group_state

    ends = {lane: end for lane, (_, end) in lane_bounds(grid, info).items()}
    out(f"shared group {group!r} on stream {info.config.name!r}")
    rows = []
    for state in shared_group_state(grid, info, group):
        behind = "-" if state.start is None else f"{max(0, ends[state.lane] - sequence_of(state.start)):,} items"
        rows.append(
            [
                state.lane,
                fmt_int(state.start),
                fmt_int(state.next),
                f"{state.acquired_ranges} range(s), {state.acquisitions} acquisition(s)",
                f"{state.available_ranges} range(s)",
                behind,
            ]
        )
    out(
        render_table(
            ["LANE", "START OFFSET", "NEVER ACQUIRED FROM", "IN FLIGHT", "TO REDELIVER", "BEHIND"],
            rows,
            right=[0, 1, 2, 5],
        )
    )
