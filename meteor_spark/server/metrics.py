"""The embedded member's figures in Prometheus text format (``meteor grid start --metrics-port N``).

A scrape takes one snapshot on the member's event loop (the engine is not thread-safe), so the figures of one scrape
are consistent with each other, and the loop pays only when Prometheus asks. prometheus_client is imported here
only, when a metrics port is given; the member runs without it otherwise.

Series: ``meteor_member_connections`` (open client connections), ``meteor_member_authenticated_clients``,
``meteor_member_requests_total{type}`` (requests served, by Hazelcast message name), ``meteor_member_ring_items{ring}``
and ``meteor_member_ring_bytes{ring}`` (items held in memory and their bytes), ``meteor_member_map_entries{map}``,
``meteor_member_fsyncs_total`` (persistence), ``meteor_member_quarantined_ranges`` and
``meteor_member_quarantined_sequences`` (damaged log ranges moved aside at the last start, and the ring sequences
they held).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from meteor_spark.server.tcp import MemberServer
logger = logging.getLogger(__name__)

#: How long a scrape waits for the member's loop.
SNAPSHOT_TIMEOUT_S = 5.0


@dataclass
class MemberFigures:
    """One consistent snapshot of a member's figures."""

    connections: int = 0
    authenticated: int = 0
    requests: dict[str, int] = field(default_factory=dict)
    ring_items: dict[str, int] = field(default_factory=dict)
    ring_bytes: dict[str, int] = field(default_factory=dict)
    map_entries: dict[str, int] = field(default_factory=dict)
    fsyncs: int = 0
    quarantined_ranges: int = 0
    quarantined_sequences: int = 0


def snapshot(server: MemberServer) -> MemberFigures:
    """The member's figures now (call on the member's loop)."""
    engine = server.engine
    figures = MemberFigures(
        connections=len(server.connections),
        authenticated=sum(1 for connection in server.connections if connection.endpoint.authenticated),
        requests=dict(server.requests),
    )
    for name, ring in engine.rings.rings.items():
        figures.ring_items[name] = ring.size()
        figures.ring_bytes[name] = ring.item_bytes()
    for name in engine.maps.names():
        figures.map_entries[name] = engine.maps.size(name)
    persistence = engine.persistence
    if persistence is not None:
        figures.fsyncs = persistence.syncer.fsyncs
        for damage in persistence.quarantined():
            figures.quarantined_ranges += 1
            if damage.lost_first >= 0:
                figures.quarantined_sequences += damage.lost_last - damage.lost_first + 1
    return figures


class MemberCollector:
    """A prometheus_client collector reading the member's figures on its loop at each scrape."""

    def __init__(self, server: MemberServer, loop: asyncio.AbstractEventLoop, prometheus: Any) -> None:
        self._server = server
        self._loop = loop
        self._core = prometheus.core

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        async def take() -> MemberFigures:
            return snapshot(self._server)

        try:
            figures = asyncio.run_coroutine_threadsafe(take(), self._loop).result(SNAPSHOT_TIMEOUT_S)
        except Exception as exc:  # a stopping member or a busy loop: an empty scrape, not an HTTP error
            logger.warning("no member figures for this scrape: %s", exc)
            return
        core = self._core
        yield core.GaugeMetricFamily("meteor_member_connections", "Open client connections.", figures.connections)
        yield core.GaugeMetricFamily(
            "meteor_member_authenticated_clients", "Connections that authenticated.", figures.authenticated
        )
        requests = core.CounterMetricFamily(
            "meteor_member_requests", "Requests served, by Hazelcast message name.", labels=("type",)
        )
        for name, count in sorted(figures.requests.items()):
            requests.add_metric((name,), count)
        yield requests
        items = core.GaugeMetricFamily("meteor_member_ring_items", "Items held by a ring buffer.", labels=("ring",))
        size = core.GaugeMetricFamily(
            "meteor_member_ring_bytes", "Bytes of the items a ring buffer holds in memory.", labels=("ring",)
        )
        for name in sorted(figures.ring_items):
            items.add_metric((name,), figures.ring_items[name])
            size.add_metric((name,), figures.ring_bytes[name])
        yield items
        yield size
        entries = core.GaugeMetricFamily("meteor_member_map_entries", "Entries of a map.", labels=("map",))
        for name, count in sorted(figures.map_entries.items()):
            entries.add_metric((name,), count)
        yield entries
        yield core.CounterMetricFamily("meteor_member_fsyncs", "fsync calls made for persistence.", figures.fsyncs)
        yield core.GaugeMetricFamily(
            "meteor_member_quarantined_ranges",
            "Damaged log ranges moved aside when the member started.",
            figures.quarantined_ranges,
        )
        yield core.GaugeMetricFamily(
            "meteor_member_quarantined_sequences",
            "Ring sequences lost in the quarantined ranges.",
            figures.quarantined_sequences,
        )


def start_metrics_server(server: MemberServer, host: str, port: int) -> tuple[Any, int]:
    """Serve the member's figures over HTTP on ``host:port`` (0 = a free port); (the HTTP server, its port).

    Raises:
        ValueError: prometheus_client is not installed (the message names the ``metrics`` extra), or the port
            cannot be bound.
    """
    try:
        import prometheus_client
        import prometheus_client.core  # the metric families custom collectors yield
    except ImportError:
        raise ValueError(
            "--metrics-port needs the prometheus_client package: pip install 'meteor-spark[metrics]' "
            "(or pip install prometheus-client)"
        ) from None
    registry = prometheus_client.CollectorRegistry(auto_describe=False)
    registry.register(MemberCollector(server, asyncio.get_running_loop(), prometheus_client))
    try:
        http, _thread = prometheus_client.start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise ValueError(
            f"cannot serve metrics on {host}:{port}: {exc}; choose another --metrics-port (0 = any free port)"
        ) from exc
    return http, http.server_address[1]
