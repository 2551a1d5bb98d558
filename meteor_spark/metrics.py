"""Prometheus metrics of publishers, subscribers and subscriber groups.

``Publisher(..., metrics=True)`` / ``Subscriber(..., metrics=True)`` add the client's figures to prometheus_client's
default registry (``metrics=registry`` to another ``CollectorRegistry``); ``start_http_server(port)`` serves a
registry for scraping. The clients keep counting in plain integers on their own threads (they always did, for
``Publisher.metrics()`` / ``Subscriber.metrics()``); one collector per registry reads those integers when Prometheus
scrapes, so the record path makes no prometheus_client call at all. The asyncio clients (``AsyncPublisher`` /
``AsyncSubscriber(..., metrics=...)``) export the same families; an asyncio subscriber's lag gauge is the one it
refreshes on its event loop every second (``meteor_spark.aio.exported``), not a read at scrape.

Series (labels ``stream``; subscribers and groups also ``group``, ``""`` when ungrouped; lag also ``lane``):

- ``meteor_publisher_records_total``, ``meteor_publisher_items_total`` (ring items), ``meteor_publisher_requests_total``
  (``add_all`` calls), ``meteor_publisher_failed_records_total``, ``meteor_publisher_dropped_records_total``
  (ephemeral streams: records no live entity wanted, not stored); gauge ``meteor_publisher_buffered_records``.
- ``meteor_subscriber_records_total`` (delivered by ``poll``), ``meteor_subscriber_skipped_items_total`` (lost to
  overwriting, ``skip_data_loss``), ``meteor_subscriber_corrupt_items_total``,
  ``meteor_subscriber_filtered_records_total`` (read, passed over: no pattern of ``topics`` matched); gauge
  ``meteor_subscriber_lag_items`` per lane read (ring items between the next record to deliver and the lane's end,
  read from the grid at scrape).
- ``meteor_group_lease_acquisitions_total``, ``meteor_group_lease_losses_total`` (taken over after a missed
  renewal), ``meteor_group_fencing_refusals_total`` (confirms/seeks refused by a newer epoch),
  ``meteor_group_nacked_records_total`` (records an exclusive-group member nacked: its lane rewound to them),
  ``meteor_group_dead_lettered_records_total`` (nacked too far behind, ``dead_letter_after``); gauge
  ``meteor_group_lanes_held``.
- Shared-group members (``SharedSubscriber(..., metrics=...)``): ``meteor_subscriber_records`` (handed out, a
  redelivery counts again) and ``meteor_subscriber_corrupt_items`` as above, ``meteor_shared_acked_records_total``,
  ``meteor_shared_released_records_total``, ``meteor_shared_rejected_records_total``,
  ``meteor_shared_dead_lettered_records_total``, ``meteor_shared_refused_records_total`` (settlements refused: the
  member had lost the records), ``meteor_shared_renewed_records_total``,
  ``meteor_shared_undecodable_records_total``, ``meteor_shared_truncated_lanes_total`` (lanes reset to their oldest
  record after a truncation, ``skip_data_loss``), ``meteor_shared_delayed_records_total`` (nacked with a delay),
  ``meteor_shared_distance_dead_letters_total`` (dead-lettered by ``dead_letter_after``); gauge
  ``meteor_shared_held_records``.

Counters never go down: when a client closes, its last values are kept in the collector, so a closed publisher's
records stay counted under its stream. Importing this module does not import prometheus_client; using it without
the package raises ``ConfigError`` naming the ``metrics`` extra.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from meteor_spark.errors import ConfigError, MeteorError

__all__ = ["COUNTERS", "GAUGES", "attach", "registry_of", "require_prometheus", "start_http_server"]

logger = logging.getLogger(__name__)

#: Counter families (name without ``_total``) → help text.
COUNTERS: dict[str, str] = {
    "meteor_publisher_records": "Records stored in the stream by publishers.",
    "meteor_publisher_items": "Ring items (batches of records) stored by publishers.",
    "meteor_publisher_requests": "add_all calls made by publishers.",
    "meteor_publisher_failed_records": "Records whose publish failed.",
    "meteor_publisher_dropped_records": "Records dropped unstored: no live entity of the ephemeral stream wanted them.",
    "meteor_subscriber_records": "Records delivered by Subscriber.poll.",
    "meteor_subscriber_skipped_items": "Ring items lost to overwriting and skipped (skip_data_loss).",
    "meteor_subscriber_corrupt_items": "Undecodable ring items passed over (on_corrupt skip or dead_letter).",
    "meteor_subscriber_filtered_records": "Records read and passed over: their topic matched no pattern of topics.",
    "meteor_group_lease_acquisitions": "Lane leases taken by group members.",
    "meteor_group_lease_losses": "Lane leases lost to another member after a missed renewal.",
    "meteor_group_fencing_refusals": "Confirms or seeks refused because a newer holder fenced the lane.",
    "meteor_group_nacked_records": "Records exclusive-group members nacked (their lane rewound to them).",
    "meteor_group_dead_lettered_records": "Records exclusive-group members nacked too far behind and dead-lettered.",
    "meteor_shared_acked_records": "Records acknowledged by shared-group members.",
    "meteor_shared_released_records": "Records shared-group members released for redelivery (nack, close).",
    "meteor_shared_rejected_records": "Records shared-group members rejected.",
    "meteor_shared_dead_lettered_records": "Records shared-group members published to the dead-letter stream.",
    "meteor_shared_refused_records": "Settlements refused because the member had lost the records (lock expired).",
    "meteor_shared_renewed_records": "Record locks renewed by shared-group members.",
    "meteor_shared_undecodable_records": "Records the deserializers refused and on_corrupt passed over.",
    "meteor_shared_truncated_lanes": "Lanes reset to their oldest record after a truncation (skip_data_loss).",
    "meteor_shared_delayed_records": "Records shared-group members nacked with a delay.",
    "meteor_shared_distance_dead_letters": "Records dead-lettered by dead_letter_after (distance behind the lane).",
}
#: Gauge families → help text.
GAUGES: dict[str, str] = {
    "meteor_publisher_buffered_records": "Records accepted by publishers and not stored yet.",
    "meteor_subscriber_lag_items": "Ring items between a subscriber's next record and the lane's end.",
    "meteor_group_lanes_held": "Lanes whose lease a group member holds.",
    "meteor_shared_held_records": "Records handed out to shared-group members and not settled yet.",
}

_LABELS = {
    "meteor_publisher": ("stream",),
    "meteor_subscriber": ("stream", "group"),
    "meteor_group": ("stream", "group"),
    "meteor_shared": ("stream", "group"),
}

Sample = tuple[str, tuple[str, ...], float]  # family, label values, value


def require_prometheus() -> Any:
    """The ``prometheus_client`` module, or ``ConfigError`` saying how to install it."""
    try:
        import prometheus_client
        import prometheus_client.core  # the metric families custom collectors yield
    except ImportError:
        raise ConfigError(
            "metrics need the prometheus_client package: pip install 'meteor-spark[metrics]' "
            "(or pip install prometheus-client)"
        ) from None
    return prometheus_client


def start_http_server(port: int, addr: str = "0.0.0.0", registry: Any = None) -> Any:
    """prometheus_client's ``start_http_server`` (default registry unless one is given); returns its result (the
    server and thread on prometheus_client >= 0.20)."""
    prometheus = require_prometheus()
    return prometheus.start_http_server(port, addr=addr, registry=registry or prometheus.REGISTRY)


def registry_of(metrics: Any) -> Any:
    """The registry a client's ``metrics`` argument names: True = prometheus_client's default registry, a
    ``CollectorRegistry`` itself, None/False = none. Checked before the client starts anything.

    Raises:
        ConfigError: anything else, or prometheus_client is not installed.
    """
    if metrics is None or metrics is False:
        return None
    prometheus = require_prometheus()
    if metrics is True:
        return prometheus.REGISTRY
    if isinstance(metrics, prometheus.CollectorRegistry):
        return metrics
    raise ConfigError(
        f"metrics={metrics!r} is not a prometheus_client CollectorRegistry; give True (the default registry), a "
        f"CollectorRegistry, or None"
    )


def attach(registry: Any, client: Any) -> Callable[[], None] | None:
    """Add ``client`` (a Publisher, Subscriber or shared-group member, fully built) to the collector of
    ``registry`` (``registry_of``'s result; None: nothing to do). Returns the function that detaches it (called on
    the client's close)."""
    if registry is None:
        return None
    prometheus = require_prometheus()
    with _COLLECTORS_LOCK:
        collector = _COLLECTORS.get(registry)
        if collector is None:
            collector = _COLLECTORS[registry] = _ClientCollector(prometheus)
            registry.register(collector)
    collector.add(client)
    return lambda: collector.retire(client)


class _ClientCollector:
    """Reads the figures of every attached client when the registry is scraped."""

    def __init__(self, prometheus: Any) -> None:
        self._prometheus = prometheus
        self._lock = threading.Lock()
        self._clients: list[Any] = []
        self._retired: dict[tuple[str, tuple[str, ...]], float] = {}

    def describe(self) -> list[Any]:
        """Nothing to describe up front: the registry then never calls ``collect`` at registration."""
        return []

    def add(self, client: Any) -> None:
        with self._lock:
            self._clients.append(client)

    def retire(self, client: Any) -> None:
        """Keep a closing client's counters (not its gauges) and stop reading it."""
        samples = list(_samples(client, with_lag=False))
        with self._lock:
            if client not in self._clients:
                return
            self._clients.remove(client)
            for family, labels, value in samples:
                if family in COUNTERS:
                    key = (family, labels)
                    self._retired[key] = self._retired.get(key, 0) + value

    def collect(self) -> Iterator[Any]:
        with self._lock:
            clients = list(self._clients)
            totals = dict(self._retired)
        gauges: dict[tuple[str, tuple[str, ...]], float] = {}
        for client in clients:
            for family, labels, value in _samples(client, with_lag=True):
                target = totals if family in COUNTERS else gauges
                target[(family, labels)] = target.get((family, labels), 0) + value
        core = self._prometheus.core
        for name, text in COUNTERS.items():
            metric = core.CounterMetricFamily(name, text, labels=_label_names(name))
            for (family, labels), value in sorted(totals.items()):
                if family == name:
                    metric.add_metric(labels, value)
            yield metric
        for name, text in GAUGES.items():
            names = _label_names(name) + (("lane",) if name == "meteor_subscriber_lag_items" else ())
            metric = core.GaugeMetricFamily(name, text, labels=names)
            for (family, labels), value in sorted(gauges.items()):
                if family == name:
                    metric.add_metric(labels, value)
            yield metric


_COLLECTORS: weakref.WeakKeyDictionary[Any, _ClientCollector] = weakref.WeakKeyDictionary()
_COLLECTORS_LOCK = threading.Lock()


def _label_names(family: str) -> tuple[str, ...]:
    return next(labels for prefix, labels in _LABELS.items() if family.startswith(prefix + "_"))


def _samples(client: Any, *, with_lag: bool) -> Iterator[Sample]:
    """A client's figures; the lag (a grid read per lane) only when scraping."""
    figures = client.metrics()
    stream = client.stream
    if "records_sent" in figures:  # a Publisher
        labels: tuple[str, ...] = (stream,)
        yield "meteor_publisher_records", labels, figures["records_sent"]
        yield "meteor_publisher_items", labels, figures["items_sent"]
        yield "meteor_publisher_requests", labels, figures["calls"]
        yield "meteor_publisher_failed_records", labels, figures["failed_records"]
        yield "meteor_publisher_dropped_records", labels, figures.get("dropped_records", 0)
        yield "meteor_publisher_buffered_records", labels, figures["outstanding"]
        return
    labels = (stream, client.group or "")
    if "acked_records" in figures:  # a shared-group member: no position, so no skipped items and no lag
        yield "meteor_subscriber_records", labels, figures["delivered_records"]
        yield "meteor_subscriber_corrupt_items", labels, figures["corrupt_items"]
        yield "meteor_shared_acked_records", labels, figures["acked_records"]
        yield "meteor_shared_released_records", labels, figures["released_records"]
        yield "meteor_shared_rejected_records", labels, figures["rejected_records"]
        yield "meteor_shared_dead_lettered_records", labels, figures["dead_lettered_records"]
        yield "meteor_shared_refused_records", labels, figures["refused_records"]
        yield "meteor_shared_renewed_records", labels, figures["renewed_records"]
        yield "meteor_shared_undecodable_records", labels, figures["undecodable_records"]
        yield "meteor_shared_truncated_lanes", labels, figures["truncated_lanes"]
        yield "meteor_shared_delayed_records", labels, figures["delayed_records"]
        yield "meteor_shared_distance_dead_letters", labels, figures["distance_dead_letters"]
        yield "meteor_shared_held_records", labels, figures["held_records"]
        return
    yield "meteor_subscriber_records", labels, figures["delivered_records"]
    yield "meteor_subscriber_skipped_items", labels, figures["skipped_items"]
    yield "meteor_subscriber_corrupt_items", labels, figures["corrupt_items"]
    yield "meteor_subscriber_filtered_records", labels, figures.get("filtered_records", 0)
    if client.group is not None:
        yield "meteor_group_lease_acquisitions", labels, figures.get("lease_acquisitions", 0)
        yield "meteor_group_lease_losses", labels, figures.get("lease_losses", 0)
        yield "meteor_group_fencing_refusals", labels, figures.get("fencing_refusals", 0)
        yield "meteor_group_nacked_records", labels, figures.get("nacked_records", 0)
        yield "meteor_group_dead_lettered_records", labels, figures.get("dead_lettered_records", 0)
        yield "meteor_group_lanes_held", labels, figures.get("lanes_held", 0)
    if with_lag:
        try:
            # an asyncio subscriber's lag is refreshed on its own loop and read here as kept (aio/exported.py)
            kept = getattr(client, "exported_lag", None)
            lag = client.lag() if kept is None else kept()
        except MeteorError as exc:  # a scrape must not fail because the grid is unreachable right now
            logger.debug("no lag for stream %r: %s", stream, exc)
            return
        for lane, items in sorted(lag.items()):
            yield "meteor_subscriber_lag_items", (*labels, str(lane)), items
