"""Generate ``docs/supported-protocol.md`` from the handler registry (the list can never drift from the code)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from meteor_spark.server.fidelity import (
    CP_UNSAFE_VERSION,
    KNOWN_DIFFERENCES,
    MIMICKED_VERSION,
    UNCOMPARED_DIFFERENCES,
)
from meteor_spark.server.handlers import supported_messages
from meteor_spark.server.handlers.registry import HandlerEntry
from meteor_spark.server.protocol.codecs import Param

SERVICES = {
    0x00: "Client",
    0x01: "Map",
    0x04: "Topic",
    0x07: "FencedLock",
    0x09: "AtomicLong",
    0x17: "Ringbuffer",
    0x1B: "DynamicConfig",
    0x1C: "FlakeIdGenerator",
    0x1E: "CPGroup",
    0x1F: "CPSession",
}


def _params(params: tuple[Param, ...]) -> str:
    return ", ".join(f"{param.name}: {param.type}" for param in params) or "-"


def supported_protocol_markdown() -> str:
    """The Markdown page listing every message the member serves, grouped by service."""
    by_service: dict[int, list[HandlerEntry]] = defaultdict(list)
    for entry in supported_messages():
        by_service[entry.spec.request_type >> 16].append(entry)
    total = sum(len(entries) for entries in by_service.values())
    lines = [
        "# Client protocol messages served by the embedded grid",
        "",
        "Generated from the handler registry by `meteor_spark.server.handlers.docs` (a test keeps it in sync);",
        "do not edit by hand. Parameters are listed in protocol-definition order; on the wire fixed-size parameters",
        "come first. Any other message type from an authenticated client is answered with Hazelcast's",
        "`UnsupportedOperationException` (code 61), never a dropped connection.",
        "",
        "Before authentication a connection may send one message, the authentication request, of at most 64 KiB",
        "(the official client's is a few hundred bytes). Any other request, or an unknown message type, is answered",
        'with an `AuthenticationException` ("must authenticate before any operation") and the connection is closed,',
        "as a Hazelcast member does; a bigger or fragmented message, or bytes that are not frames, close it at once.",
        "A connection that has not authenticated within 10 s (`--auth-timeout-s` /",
        "`EmbeddedGrid(auth_timeout_s=...)`) is closed. Authenticated clients may send frames of up to 256 MiB.",
        "Received bytes are buffered as they arrive, never by announced length, and released when a connection",
        "closes.",
        "",
        "Map entry views follow Hazelcast 5.x: per-entry statistics are off unless the map's config enables them",
        "(`--map-config 'PATTERN:per-entry-stats=1'` / `MapConfig(per_entry_stats_enabled=True)`); off, hits, last",
        "access time, creation time and last stored time are -1, and so is the last update time of an entry that",
        "does not expire.",
        "",
        "Connections behave as on a Hazelcast member in two more ways. A client that reads its responses slower than",
        "the member produces them is held back (its further requests and woken long polls wait, about 4 MiB stay",
        "queued for it) instead of making the member buffer without bound; other clients are not affected. A",
        "connection the member hears nothing from for the client heartbeat timeout (60 s by default,",
        "`--client-heartbeat-timeout-s` / `EmbeddedGrid(client_heartbeat_timeout_s=...)`; idle clients ping every",
        "5 s) is closed, which releases the client's locks and listeners.",
        "",
        *_fidelity_section(),
        f"{total} message types in {len(by_service)} services.",
        "",
    ]
    for service in sorted(by_service):
        entries = by_service[service]
        lines += [f"## {SERVICES.get(service, f'service 0x{service:02X}')} ({len(entries)})", ""]
        lines += ["| id | message | request | response | events |", "|---|---|---|---|---|"]
        for entry in entries:
            spec = entry.spec
            events = "; ".join(f"0x{event.type_id:06X} {event.name}" for event in spec.events) or "-"
            lines.append(
                f"| 0x{spec.request_type:06X} | {spec.name} | {_params(spec.request)} | {_params(spec.response)} "
                f"| {events} |"
            )
        lines.append("")
    return "\n".join(lines)


def _fidelity_section() -> list[str]:
    known = [f"- `{name}`: {reason}." for name, reason in sorted(KNOWN_DIFFERENCES.items())]
    uncompared = [f"- **{name}**: {reason}." for name, reason in UNCOMPARED_DIFFERENCES.items()]
    return [
        f"## Fidelity to Hazelcast {MIMICKED_VERSION}",
        "",
        f"The member reports Hazelcast {MIMICKED_VERSION} (authentication and member list) and answers as a",
        f"{MIMICKED_VERSION} member does. `tests/server/test_fidelity.py` checks it the fakeredis way: each of its",
        "scenarios (every grid operation meteor-spark uses, the errors it relies on, and their neighbours) runs",
        f"against a real {MIMICKED_VERSION} member started from `hazelcast/member.xml` and against the embedded",
        "member through the official client, and the answers are compared field by field, normalized only where a",
        "real member is legitimately random (uuids, clock readings, Java identity hashes).",
        "",
        "**CP subsystem (AtomicLong).** Hazelcast 5.7 open source refuses CP: `createCPGroup` is answered with",
        '`UnsupportedOperationException` (61) "CP subsystem is an Enterprise feature...". The embedded member',
        'refuses it in the same words by default (`cp_mode="disabled"`, `--cp-mode disabled`): it reports 5.7.0,',
        "so code that works against it works against the open-source cluster it stands for, and code that needs CP",
        "learns so on the developer's machine rather than in production. meteor-spark itself uses no CP structure.",
        '`cp_mode="unsafe"` (`--cp-mode unsafe`) serves AtomicLong as Hazelcast 4.x-5.4 do without CP members',
        '("unsafe mode"), for applications written against those members; the test compares it with a real',
        f"{CP_UNSAFE_VERSION} member.",
        "",
        "Known differences (the differential test allows exactly these):",
        "",
        *(known or ["- none: every scenario answers identically."]),
        "",
        "Differences no scenario can show:",
        "",
        *uncompared,
        "",
    ]


def write_supported_protocol(path: str | Path) -> None:
    Path(path).write_text(supported_protocol_markdown(), encoding="utf-8")


if __name__ == "__main__":
    write_supported_protocol(Path(__file__).resolve().parents[3] / "docs" / "supported-protocol.md")
