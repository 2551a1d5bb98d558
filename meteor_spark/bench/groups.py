"""``meteor bench groups``: consuming one stream as a group, shared (poll + ack) against exclusive (poll + confirm).

An embedded grid in its own process; a 2-lane stream of 100-byte records (100 per ring item) published before the
clock starts; then 1, 2 and 4 member processes (one GIL each; an exclusive group's lanes balanced over them before
the clock starts) consume it, and the clock stops when the group's
stored state says every record is settled: for a shared group every lane's start offset reached the lane's end
(every record acknowledged), for an exclusive group every lane's confirmed offset did. Records are made into
``Record`` objects in both cases (a shared poll hands out objects; the exclusive members iterate their batches).

A second table is the exclusive group at full speed: a 4-lane stream of 100-byte records with the publisher's
default batching, 2 member processes polling and confirming every batch, next to one ungrouped subscriber
(another process) reading the same lanes, its ceiling.

The exclusive group is the baseline: it is the cost of reading plus one confirm per lane per poll. A shared poll
adds, per lane, a read and a compare-and-set of the lane's entry to acquire, and the ack another compare-and-set;
members of a shared group contend on the same entries. An exclusive group never gives more than one member per
lane work, so its 4-member figure is 2 members reading and 2 idle.

A third table is the rebalance after a join on 16 lanes with 2, 4 and 8 members (``meteor_spark.bench.rebalance``);
``--rebalance-only`` runs just that one.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import time
from dataclasses import dataclass
from typing import Any

from meteor_spark.bench import check_at_least_one, given, rebalance
from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.errors import ConfigError
from meteor_spark.format.offsets import first_offset_of
from meteor_spark.format.records import Record
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.streams import StreamConfig, StreamInfo, lane_bounds, open_stream
from meteor_spark.groups.admin import delete_stream, group_state, shared_group_state
from meteor_spark.producer.publisher import Publisher
from meteor_spark.server import EmbeddedGrid
from meteor_spark.tables import render_table

RECORD_BYTES = 100
LANES = 2
PER_ITEM = 100
#: The full-speed row: lanes, member processes, records per run (times ``--records``), records per poll.
WIDE_LANES = 4
WIDE_MEMBERS = 2
WIDE_FACTOR = 4
WIDE_POLL_RECORDS = 20_000


@dataclass(frozen=True)
class GroupsBenchOptions:
    """Sizes of one run (``--quick`` shrinks them to seconds)."""

    records: int
    members: tuple[int, ...]
    poll_records: int
    rebalance_members: tuple[int, ...]
    rebalance_rounds: int
    rebalance_only: bool

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> GroupsBenchOptions:
        quick = bool(getattr(args, "quick", False))
        members = _counts(args.members, "--members")
        joins = _counts(args.rebalance_members, "--rebalance-members")
        settings = cls(
            records=given(args.records, 20_000 if quick else 200_000),
            members=members or (1, 2, 4),
            poll_records=args.poll_records,
            rebalance_members=joins or (2, 4, 8),
            rebalance_rounds=given(args.rebalance_rounds, 1 if quick else 5),
            rebalance_only=bool(args.rebalance_only),
        )
        check_at_least_one(settings, ("records", "poll_records", "rebalance_rounds"))
        if min(settings.members) < 1:
            raise ConfigError(f"every --members count must be >= 1, got {args.members}")
        if min(settings.rebalance_members) < 2:
            raise ConfigError(
                f"every --rebalance-members count must be >= 2 (the members after the join), got "
                f"{args.rebalance_members}"
            )
        return settings


def _counts(text: str, flag: str) -> tuple[int, ...]:
    try:
        return tuple(int(m) for m in str(text).split(",") if m.strip())
    except ValueError:
        raise ConfigError(f"{flag} {text!r} is not a comma-separated list of counts, e.g. 2,4,8") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="small sizes (seconds instead of a minute)")
    parser.add_argument("--records", type=int, default=None, help="records consumed per run (default 200k)")
    parser.add_argument("--members", default="1,2,4", help="member process counts to run (default 1,2,4)")
    parser.add_argument("--poll-records", type=int, default=500, help="max_poll_records of each member (500)")
    parser.add_argument(
        "--rebalance-members", default="2,4,8", help="members after a join, on 16 lanes (default 2,4,8)"
    )
    parser.add_argument(
        "--rebalance-rounds", type=int, default=None, help="joins measured per member count (default 5, --quick 1)"
    )
    parser.add_argument("--rebalance-only", action="store_true", help="run only the rebalance table")


def _member(
    grid_members: str,
    cluster: str,
    stream: str,
    group: str,
    shared: bool,
    poll_records: int,
    ready: Any,
    go: Any,
    stop: Any,
    results: Any,
) -> None:
    """Child process: one group member consuming until told to stop; reports the records it settled."""
    grid = Grid(GridSettings(members=(grid_members,), cluster_name=cluster))
    sub: Any = Subscriber(
        grid, stream, group=group, shared=shared, max_poll_records=poll_records, initial_offset_scheme="earliest"
    )
    ready.put(os.getpid())
    go.wait()
    settled = 0
    while not stop.is_set():
        batch = sub.poll(50)
        if not batch:
            continue
        records = list(batch)
        if shared:
            sub.ack(records)
        else:
            sub.confirm()
        settled += len(records)
    sub.close()
    grid.close()
    results.put(settled)


def _reader(
    grid_members: str, cluster: str, stream: str, expected: int, poll_records: int, ready: Any, go: Any, results: Any
) -> None:
    """Child process: one ungrouped subscriber reading every record from the start, as Record objects; reports its
    own records/s (the ceiling of a group reading the same lanes)."""
    grid = Grid(GridSettings(members=(grid_members,), cluster_name=cluster))
    sub = Subscriber(grid, stream, max_poll_records=poll_records, initial_offset_scheme="earliest")
    ready.put(os.getpid())
    go.wait()
    start = time.perf_counter()
    seen = 0
    deadline = time.monotonic() + 600
    while seen < expected and time.monotonic() < deadline:
        seen += len(list(sub.poll(50)))
    elapsed = time.perf_counter() - start
    sub.close()
    grid.close()
    results.put({"records_s": seen / elapsed, "seconds": elapsed, "settled": seen})


def _ungrouped(grid_settings: GridSettings, info: StreamInfo, records: int, poll_records: int) -> dict[str, float]:
    context = multiprocessing.get_context("spawn")
    ready, results, go = context.Queue(), context.Queue(), context.Event()
    process = context.Process(
        target=_reader,
        args=(
            grid_settings.members[0],
            grid_settings.cluster_name,
            info.name,
            records,
            poll_records,
            ready,
            go,
            results,
        ),
    )
    process.start()
    try:
        ready.get(timeout=60)
        go.set()
        out: dict[str, float] = results.get(timeout=660)
    finally:
        process.join(30)
        if process.is_alive():
            process.kill()
    return out


def _done(grid: Grid, info: StreamInfo, group: str, shared: bool, ends: dict[int, int]) -> bool:
    if shared:
        return all(state.start == ends[state.lane] for state in shared_group_state(grid, info, group))
    return all(state.confirmed == ends[state.lane] for state in group_state(grid, info, group))


def _consume(
    grid: Grid,
    grid_settings: GridSettings,
    info: StreamInfo,
    shared: bool,
    members: int,
    settings: GroupsBenchOptions,
    records: int | None = None,
    poll_records: int | None = None,
) -> dict[str, float]:
    records = settings.records if records is None else records
    poll_records = settings.poll_records if poll_records is None else poll_records
    group = f"bench-{'shared' if shared else 'exclusive'}-{members}-{time.time_ns()}"
    ends = {lane: first_offset_of(end) for lane, (_, end) in lane_bounds(grid, info).items()}
    context = multiprocessing.get_context("spawn")
    ready, results = context.Queue(), context.Queue()
    go, stop = context.Event(), context.Event()
    processes = [
        context.Process(
            target=_member,
            args=(
                grid_settings.members[0],
                grid_settings.cluster_name,
                info.name,
                group,
                shared,
                poll_records,
                ready,
                go,
                stop,
                results,
            ),
        )
        for _ in range(members)
    ]
    for process in processes:
        process.start()
    try:
        for _ in processes:
            ready.get(timeout=60)
        if not shared:  # the lanes balanced over the members before the clock starts (a handover is not consumption)
            holders = min(members, info.lanes)
            deadline = time.monotonic() + 60
            while len({s.holder for s in group_state(grid, info, group) if s.holder is not None}) < holders or any(
                s.holder is None for s in group_state(grid, info, group)
            ):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"group {group!r} did not balance its lanes over {holders} members in 60 s")
                time.sleep(0.01)
        start = time.perf_counter()
        go.set()
        deadline = time.monotonic() + 600
        while not _done(grid, info, group, shared, ends):
            if time.monotonic() > deadline:
                raise RuntimeError(f"group {group!r} did not settle {records} records in 600 s")
            time.sleep(0.005)
        elapsed = time.perf_counter() - start
        stop.set()
        settled = sum(results.get(timeout=60) for _ in processes)
    finally:
        stop.set()
        for process in processes:
            process.join(30)
            if process.is_alive():
                process.kill()
    return {"records_s": records / elapsed, "seconds": elapsed, "settled": settled}


def run(args: argparse.Namespace) -> dict[str, Any]:
    settings = GroupsBenchOptions.from_args(args)
    server = EmbeddedGrid(port=0, process=True)
    server.start()
    grid_settings = GridSettings(members=(server.address,), cluster_name=server.cluster_name)
    grid = Grid(grid_settings)
    name = f"bench-groups-{os.getpid()}-{time.time_ns()}"
    figures: dict[str, Any] = {"settings": settings.__dict__, "exclusive": {}, "shared": {}}
    try:
        figures["rebalance"] = rebalance.measure(
            grid, name + "-rebalance", settings.rebalance_members, settings.rebalance_rounds
        )
        if settings.rebalance_only:
            return figures
        info = open_stream(grid, StreamConfig(name, lanes=LANES, capacity=max(1000, settings.records // PER_ITEM)))
        pool = [os.urandom(RECORD_BYTES) for _ in range(1024)]
        with Publisher(grid, name, max_batch_records=PER_ITEM) as publisher:
            publisher.publish_many(
                [Record(pool[i % len(pool)], lane=i % LANES) for i in range(settings.records)]
            ).result(120)
        for members in settings.members:
            figures["exclusive"][str(members)] = _consume(grid, grid_settings, info, False, members, settings)
            figures["shared"][str(members)] = _consume(grid, grid_settings, info, True, members, settings)
        delete_stream(grid, name)
        figures["wide"] = _wide(grid, grid_settings, settings, pool, name + "-wide")
    finally:
        grid.close()
        server.stop()
    return figures


def _wide(
    grid: Grid, grid_settings: GridSettings, settings: GroupsBenchOptions, pool: list[bytes], name: str
) -> dict[str, Any]:
    """The full-speed row: 2 exclusive members on 4 lanes (default batching) against one ungrouped reader."""
    records = settings.records * WIDE_FACTOR
    info = open_stream(grid, StreamConfig(name, lanes=WIDE_LANES, capacity=max(1000, records // 500)))
    try:
        with Publisher(grid, name) as publisher:
            publisher.publish_many([pool[i % len(pool)] for i in range(records)]).result(300)
        ceiling = _ungrouped(grid_settings, info, records, WIDE_POLL_RECORDS)
        group = _consume(grid, grid_settings, info, False, WIDE_MEMBERS, settings, records, WIDE_POLL_RECORDS)
    finally:
        delete_stream(grid, name)
    return {"records": records, "ungrouped": ceiling, "exclusive": group}


def render(figures: dict[str, Any]) -> str:
    """The figures of ``run`` as the tables ``meteor bench groups`` prints."""
    joins = rebalance.render(figures["rebalance"])
    if "wide" not in figures:
        return joins
    rows = []
    for members, shared in figures["shared"].items():
        exclusive = figures["exclusive"][members]
        rows.append(
            (
                f"{members} member(s), 2 lanes",
                f"{exclusive['records_s']:,.0f} rec/s",
                f"{shared['records_s']:,.0f} rec/s",
                f"{shared['records_s'] / exclusive['records_s']:.2f}",
            )
        )
    table = render_table(
        ("group, 100-byte records", "exclusive (poll + confirm)", "shared (poll + ack)", "shared / exclusive"), rows
    )
    wide = figures["wide"]
    ceiling, group = wide["ungrouped"]["records_s"], wide["exclusive"]["records_s"]
    wide_table = render_table(
        (f"{WIDE_LANES} lanes, default batching", "records/s", "ratio", "target"),
        [
            ("ceiling: one ungrouped reader (1 process)", f"{ceiling:,.0f}", "", ""),
            (
                f"exclusive group, {WIDE_MEMBERS} members, poll + confirm",
                f"{group:,.0f}",
                f"{group / ceiling:.2f}",
                ">= 1,000,000",
            ),
        ],
    )
    return "\n".join(
        [
            table,
            f"{figures['settings']['records']:,} records per run, "
            f"max_poll_records {figures['settings']['poll_records']}; "
            "members are processes; an exclusive group gives at most one member per lane work",
            "",
            wide_table,
            f"{wide['records']:,} records, max_poll_records {WIDE_POLL_RECORDS:,}; every record made a Record object",
            "",
            joins,
        ]
    )
