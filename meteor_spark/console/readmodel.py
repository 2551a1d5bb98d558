"""What the console shows, gathered from the grid through the functions the CLI uses (stream metadata and lane
bounds, group state and lag, dead letters, transactions), as plain JSON-ready dicts.

Every answer is bounded: at most ``MAX_ROWS`` rows of a kind, dead letters read from at most ``DLQ_ITEMS`` ring
items per lane (the newest), so a page over a large grid costs a bounded number of round trips and bytes.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

from meteor_spark.console.history import LagHistory, Rates
from meteor_spark.errors import FormatError, MeteorError
from meteor_spark.format.item_header import item_base_timestamp
from meteor_spark.grid.client import Grid, Ring, result
from meteor_spark.grid.streams import StreamInfo, open_stream, streams_bounds
from meteor_spark.grid.transactions import OPEN, OPEN_MAP, TXNS_MAP, TxnState
from meteor_spark.groups.admin import (
    group_members,
    group_state,
    lag_report,
    list_groups,
    list_shared_groups,
    list_streams,
    shared_group_state,
)
from meteor_spark.groups.shared_state import SHARE_MAP
from meteor_spark.groups.store import parse_key

#: Rows of one kind (streams, groups, dead letters, transactions) one answer holds at most.
MAX_ROWS = 500
#: Ring items per lane a dead-letter page reads (the newest).
DLQ_ITEMS = 200


def _sorted_streams(grid: Grid) -> list[StreamInfo]:
    return sorted(list_streams(grid), key=lambda s: s.name)[:MAX_ROWS]


def _oldest_timestamps(
    grid: Grid, infos: list[StreamInfo], bounds: dict[tuple[str, int], tuple[int, int]]
) -> dict[tuple[str, int], int | None]:
    """The base timestamp of every lane's oldest item held: one single-item read per non-empty lane, all in flight
    at once (None for an empty lane, an item gone meanwhile or an undecodable one)."""
    futures = {}
    for info in infos:
        for lane, ring in enumerate(info.ring_names):
            head, end = bounds[(info.name, lane)]
            if end > head:
                futures[(info.name, lane)] = grid.ring(ring).read_many_async(head, 0, 1)
    found: dict[tuple[str, int], int | None] = {}
    for (name, lane), future in futures.items():
        try:
            batch = Ring.to_batch(result(future, f"oldest item of stream {name!r} lane {lane}"))
            found[(name, lane)] = (
                item_base_timestamp(batch.items[0], stream=name, lane=lane, sequence=batch.sequences[0])
                if batch.items
                else None
            )
        except FormatError:
            found[(name, lane)] = None
    return found


def streams_view(grid: Grid, rates: Rates) -> list[dict[str, Any]]:
    """Every stream: lanes, capacity, items held, append rate, and history depth (the age of its oldest item)."""
    infos = _sorted_streams(grid)
    bounds = streams_bounds(grid, infos)
    oldest_of = _oldest_timestamps(grid, infos, bounds)
    now = int(time.time() * 1000)
    rows = []
    for info in infos:
        lanes: list[dict[str, Any]] = []
        for lane in range(info.lanes):
            head, end = bounds[(info.name, lane)]
            oldest = oldest_of.get((info.name, lane))
            lanes.append({"lane": lane, "head": head, "next": end, "held": end - head, "oldest_ms": oldest})
        oldest_all = [lane["oldest_ms"] for lane in lanes if lane["oldest_ms"] is not None]
        rows.append(
            {
                "name": info.name,
                "lanes": lanes,
                "lane_count": info.lanes,
                "capacity": info.config.capacity,
                "held": sum(lane["held"] for lane in lanes),
                "rate": rates.per_second(info.name),
                "depth_ms": now - min(oldest_all) if oldest_all else None,
                "created_ms": info.created_at_ms,
            }
        )
    return rows


def groups_index(grid: Grid) -> list[dict[str, Any]]:
    """Every group of every stream, exclusive and shared, with its member and held-lane counts."""
    rows: list[dict[str, Any]] = [
        {"stream": g.stream, "group": g.group, "kind": "exclusive", "members": g.members, "held": g.held_lanes}
        for g in list_groups(grid)
    ]
    known = {(row["stream"], row["group"]) for row in rows}
    for stream, name in sorted(shared_pairs(grid) - known):
        rows.append({"stream": stream, "group": name, "kind": "shared", "members": None, "held": None})
    return sorted(rows, key=lambda r: (r["stream"], r["group"]))[:MAX_ROWS]


def shared_pairs(grid: Grid) -> set[tuple[str, str]]:
    """Every ``(stream, shared group)`` with state in the grid, from one scan of the shared groups' map keys."""
    keys = grid.map(SHARE_MAP).keys()
    return {(parsed[0], parsed[1]) for parsed in map(parse_key, keys) if parsed is not None}


def group_view(grid: Grid, stream: str, group: str, history: LagHistory) -> dict[str, Any]:
    """One group: per lane its holder, lease and lag (records when few enough to count), its members, and the
    lag history (ring items behind per lane) for the chart."""
    info = open_stream(grid, stream, create=False)
    shared = group in list_shared_groups(grid, stream) and not any(g.group == group for g in list_groups(grid, stream))
    view: dict[str, Any] = {"stream": stream, "group": group, "kind": "shared" if shared else "exclusive"}
    if shared:
        view["lanes"] = [
            {
                "lane": s.lane,
                "start": s.start,
                "next": s.next,
                "acquired_ranges": s.acquired_ranges,
                "available_ranges": s.available_ranges,
                "acquisitions": s.acquisitions,
            }
            for s in shared_group_state(grid, info, group)
        ]
        view["members"] = []
    else:
        lag = {entry.lane: entry for entry in lag_report(grid, info, group, count_records=True, max_items=500)}
        view["lanes"] = [
            {
                "lane": s.lane,
                "holder": s.holder,
                "epoch": s.epoch,
                "lease_expires_ms": s.lease_expires_ms,
                "confirmed": s.confirmed,
                "items_behind": lag[s.lane].items if s.lane in lag else None,
                "records_behind": lag[s.lane].records if s.lane in lag else None,
                "lost_items": lag[s.lane].lost_items if s.lane in lag else 0,
                "past_end": lag[s.lane].past_end if s.lane in lag else False,
            }
            for s in group_state(grid, info, group)
        ]
        view["members"] = [
            {"member": m.member, "host": m.host, "pid": m.pid, "renewed_ms": m.renewed_ms, "lease_ms": m.lease_ms}
            for m in group_members(grid, info, group)
        ]
    view["history"] = lag_history(history, stream, group)
    return view


def lag_history(history: LagHistory, stream: str, group: str) -> dict[str, list[list[int]]]:
    """lane (as text, a JSON key) -> ``[[at_ms, items behind], ...]``, oldest first."""
    return {
        str(lane): [[p.at_ms, p.items] for p in points]
        for lane, points in sorted(history.of_group(stream, group).items())
    }


def open_transactions(grid: Grid) -> list[dict[str, Any]]:
    """Transactions still open, with the streams they wrote to and how long until readers abort them."""
    streams: dict[str, list[str]] = defaultdict(list)
    opened = grid.map(OPEN_MAP).keys()
    for key in opened:
        txn, _, stream = key.partition("\t")
        streams[txn].append(stream)
    now = int(time.time() * 1000)
    rows: list[dict[str, Any]] = []
    for key, text in grid.map(TXNS_MAP).entries().items():
        try:
            state = TxnState.parse(key, text)
        except MeteorError:
            continue  # not one of ours: the transactions' own sweep reports it
        if state.state != OPEN:
            continue
        rows.append(
            {
                "key": key,
                "deadline_ms": state.deadline_ms,
                "expires_in_ms": state.deadline_ms - now,
                "streams": sorted(streams.get(key, [])),
            }
        )
    return sorted(rows, key=lambda r: r["deadline_ms"])[:MAX_ROWS]


def _text(raw: bytes | None, limit: int = 200) -> str | None:
    """A value or key for display: UTF-8 text cut at ``limit`` characters, else hex of its start."""
    if raw is None:
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = "0x" + raw[: limit // 2].hex()
    return text if len(text) <= limit else text[:limit] + "…"


def dead_letters_view(grid: Grid, stream: str) -> dict[str, Any]:
    """The newest dead letters of dead-letter stream ``stream`` (``DLQ_ITEMS`` ring items per lane), each with
    its source, error and whether a redrive sent it back already."""
    from meteor_spark.consumer.dead_letters import ScanReport, scan_dead_letters
    from meteor_spark.consumer.redrive import read_progress

    info = open_stream(grid, stream, create=False)
    progress = read_progress(grid, info.name)
    report = ScanReport()
    letters = []
    for letter in scan_dead_letters(grid, info, report, max_items=DLQ_ITEMS):
        letters.append(
            {
                "lane": letter.lane,
                "offset": letter.offset,
                "source": letter.source_stream,
                "source_lane": letter.source_lane,
                "source_offset": letter.source_offset,
                "group": letter.group,
                "error": _text(letter.error.encode(), 300),
                "key": _text(letter.record.key, 80),
                "value": _text(letter.record.value),
                "redriven": progress.is_done(letter.lane, letter.offset),
            }
        )
    letters.sort(key=lambda d: (d["lane"], d["offset"]), reverse=True)
    return {
        "stream": stream,
        "letters": letters[:MAX_ROWS],
        "total": len(letters),
        "scanned_items": report.items,
        "undecodable_items": report.undecodable_items,
    }
