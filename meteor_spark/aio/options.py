"""The option names the asyncio clients take: an unknown name, or one only the threaded client has, is a
``ConfigError`` naming it (and, for a threaded-only one, why and what to use instead), before anything connects."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from meteor_spark.errors import ConfigError

#: The AsyncPublisher's options that override the stream's batching settings (``PublisherSettings.parse``).
PUBLISHER_SETTINGS = (
    "linger_ms",
    "max_batch_records",
    "max_batch_bytes",
    "max_buffered_records",
    "max_block_ms",
    "max_items_per_call",
    "max_call_bytes",
    "compression",
    "compression_threshold",
    "idempotent",
    "delivery_timeout_ms",
)

#: Every option the AsyncPublisher takes.
PUBLISHER_OPTIONS = (
    *PUBLISHER_SETTINGS,
    "value_serializer",
    "key_serializer",
    "transactional",
    "metrics",
    "subscription_refresh_ms",
    "tracing",
)

#: Options of the threaded Publisher the AsyncPublisher does not take, and why.
PUBLISHER_ONLY_THREADED: Mapping[str, str] = {
    "dedup_owner": "it names the Spark sink's task attempts; an AsyncPublisher claims message ids as itself",
}

#: Options of the threaded Subscriber the AsyncSubscriber does not take, and why.
SUBSCRIBER_ONLY_THREADED: Mapping[str, str] = {
    **{
        name: "only for shared groups; use AsyncSharedSubscriber(members_or_grid, stream, group=..., ...) or "
        "AsyncSubscriber(..., group=..., shared=True)"
        for name in ("acquisition_timeout_ms", "max_deliveries")
    },
}


def check_option_names(client: str, given: Iterable[str], accepted: Iterable[str], threaded: Mapping[str, str]) -> None:
    """``ConfigError`` for the first option of ``given`` that ``client`` does not take."""
    known = set(accepted)
    for name in sorted(given):
        if name in known:
            continue
        if name in threaded:
            raise ConfigError(f"{client}({name}=...): {threaded[name]}")
        raise ConfigError(f"{client} got an unknown option {name!r}; it takes {', '.join(sorted(known))}")
