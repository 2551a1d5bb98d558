"""The console's HTML: one layout, and per page its tables rendered on the server (the page reads without
JavaScript) plus the hooks ``static/console.js`` refreshes them through (``data-*`` attributes naming the JSON
endpoint). Every value from the grid goes through ``html.escape``; nothing here is fetched from elsewhere."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from html import escape
from typing import Any
from urllib.parse import quote

from meteor_spark.console.security import Access


def when(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def age(ms: int | None) -> str:
    """A duration in ms, short (``42 s``, ``3.5 min``, ``2.1 h``, ``4.0 d``)."""
    if ms is None:
        return "-"
    seconds = ms / 1000
    for unit, size in (("d", 86_400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"


def num(value: int | float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.1f}" if isinstance(value, float) else f"{value:,}"


def link(href: str, text: str) -> str:
    return f'<a href="{escape(href)}">{escape(text)}</a>'


def path(*parts: str) -> str:
    return "/" + "/".join(quote(part, safe="") for part in parts)


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, body_id: str = "") -> str:
    """A table; cells are HTML already (escape values with ``escape`` or the helpers above)."""
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    ident = f' id="{body_id}"' if body_id else ""
    return f"<table><thead><tr>{head}</tr></thead><tbody{ident}>{body}</tbody></table>"


def layout(title: str, body: str, access: Access, *, page: str, data: dict[str, str] | None = None) -> str:
    attributes = "".join(f' data-{k}="{escape(v)}"' for k, v in (data or {}).items())
    mode = (
        '<span class="mode actions">actions allowed</span>'
        if access.allow_actions
        else '<span class="mode">read-only</span>'
    )
    nav = " ".join(
        link(href, text)
        for href, text in (("/", "Streams"), ("/groups", "Groups"), ("/dlq", "Dead letters"), ("/txns", "Transactions"))
    )
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<title>{escape(title)} · meteor console</title>"
        '<link rel="icon" href="data:,"><link rel="stylesheet" href="/static/console.css"></head>'
        f'<body data-page="{page}"{attributes}><header><b>meteor console</b> <nav>{nav}</nav> {mode}</header>'
        f'<main><h1>{escape(title)}</h1><p id="status" class="status"></p>{body}</main>'
        '<script src="/static/console.js"></script></body></html>'
    )


def streams_rows(streams: list[dict[str, Any]]) -> list[list[str]]:
    return [
        [
            link(path("streams", s["name"]), s["name"]),
            num(s["lane_count"]),
            num(s["capacity"]),
            num(s["held"]),
            num(s["rate"]),
            age(s["depth_ms"]),
            escape(when(s["created_ms"])),
        ]
        for s in streams
    ]


STREAM_HEADERS = ["stream", "lanes", "capacity / lane", "items held", "items / s", "history depth", "created"]


def streams_page(streams: list[dict[str, Any]], access: Access) -> str:
    body = table(STREAM_HEADERS, streams_rows(streams), body_id="streams")
    body += (
        '<p class="note">Items are ring items (each a batch of records); items / s from the last two samples; '
        "history depth: the age of the oldest item the lanes hold.</p>"
    )
    return layout("Streams", body, access, page="streams", data={"api": "/api/streams"})


def stream_page(stream: dict[str, Any], access: Access) -> str:
    lanes = table(
        ["lane", "head sequence", "next sequence", "items held", "oldest item"],
        [
            [num(x["lane"]), num(x["head"]), num(x["next"]), num(x["held"]), escape(when(x["oldest_ms"]))]
            for x in stream["lanes"]
        ],
    )
    name = stream["name"]
    form = (
        '<form id="tail-filter" class="filters">'
        'key <input name="key" size="16"> topic <input name="topic" size="16" placeholder="orders.#"> '
        'lane <input name="lane" size="4"> <button type="submit">filter</button></form>'
    )
    tail = table(["lane:offset", "time (UTC)", "key", "topic", "value"], [], body_id="tail")
    body = (
        f"{lanes}<h2>Live tail</h2>{form}"
        f'<p class="note">New records appear on top (at most 500 kept on the page).</p>{tail}'
    )
    return layout(f"Stream {name}", body, access, page="tail", data={"api": path("api", "tail", name), "stream": name})


def groups_rows(groups: list[dict[str, Any]]) -> list[list[str]]:
    return [
        [
            link(path("streams", g["stream"]), g["stream"]),
            link(path("groups", g["stream"], g["group"]), g["group"]),
            escape(g["kind"]),
            num(g["members"]),
            num(g["held"]),
        ]
        for g in groups
    ]


GROUP_HEADERS = ["stream", "group", "kind", "members", "lanes held"]


def groups_page(groups: list[dict[str, Any]], access: Access) -> str:
    body = table(GROUP_HEADERS, groups_rows(groups), body_id="groups")
    return layout("Groups", body, access, page="groups", data={"api": "/api/groups"})


def group_page(view: dict[str, Any], access: Access) -> str:
    stream, group = view["stream"], view["group"]
    chart = (
        '<h2>Lag trend (ring items behind, per lane)</h2><svg id="lag-chart" width="800" height="260" '
        'viewBox="0 0 800 260" role="img" aria-label="lag per lane over time"></svg><div id="legend"></div>'
    )
    body = (
        f"<p>{escape(view['kind'])} group of stream {link(path('streams', stream), stream)}</p>"
        f'{chart}<h2>Lanes</h2><div id="lanes"></div><h2>Members</h2><div id="members"></div>'
    )
    return layout(f"Group {group}", body, access, page="group", data={"api": path("api", "groups", stream, group)})


def dlq_index_page(streams: list[dict[str, Any]], access: Access) -> str:
    rows = [[link(path("dlq", s["name"]), s["name"]), num(s["held"])] for s in streams]
    body = (
        "<p>Pick the dead-letter stream to look into (the one a group or subscriber was given as "
        "dead_letter_stream).</p>" + table(["stream", "items held"], rows)
    )
    return layout("Dead letters", body, access, page="dlq-index")


def dlq_page(view: dict[str, Any], access: Access) -> str:
    name = view["stream"]
    rows = [
        [
            f"{d['lane']}:{d['offset']}",
            escape(
                f"{d['source'] or '?'}:{'?' if d['source_lane'] is None else d['source_lane']}:"
                f"{'?' if d['source_offset'] is None else d['source_offset']}"
            ),
            escape(d["group"] or "-"),
            escape(d["error"] or ""),
            escape(d["key"] or ""),
            escape(d["value"] or ""),
            "yes" if d["redriven"] else "no",
        ]
        for d in view["letters"]
    ]
    if access.allow_actions:
        action = (
            '<p><button id="redrive" data-api="' + escape(path("api", "dlq", name, "redrive")) + '">Redrive all '
            "to their source streams</button> (each dead letter once, however often it is pressed)</p>"
        )
    else:
        action = '<p class="note">Read-only console: start it with --allow-actions to redrive.</p>'
    body = (
        f"<p>{num(view['total'])} dead letter(s) in the newest ring items read ({num(view['scanned_items'])} "
        f'items, {num(view["undecodable_items"])} undecodable).</p>{action}<p id="redrive-result"></p>'
        + table(DLQ_HEADERS, rows, body_id="letters")
    )
    return layout(f"Dead letters of {name}", body, access, page="dlq", data={"api": path("api", "dlq", name)})


DLQ_HEADERS = ["lane:offset", "source stream:lane:offset", "group", "error", "key", "value", "redriven"]


def txns_page(txns: list[dict[str, Any]], access: Access) -> str:
    now = int(time.time() * 1000)
    rows = [
        [
            escape(t["key"]),
            escape(", ".join(t["streams"]) or "-"),
            escape(when(t["deadline_ms"])),
            escape(age(t["deadline_ms"] - now)) if t["deadline_ms"] > now else "past (aborted at the next read)",
        ]
        for t in txns
    ]
    body = (
        table(["transaction", "streams written", "deadline (UTC)", "aborted by readers in"], rows)
        if rows
        else "<p>No transaction is open.</p>"
    )
    return layout("Open transactions", body, access, page="txns")


def error_page(title: str, message: str, access: Access) -> str:
    return layout(title, f'<p class="error">{escape(message)}</p>', access, page="error")
