"""A publisher's settings (``PublisherSettings``): the batching a stream stores as its publishers' defaults
(``meteor_spark.grid.streams.Batching``) plus the publisher's own bounds, validated once and shared with its
accumulator and sender.

The dependency points from the publisher to the stream's metadata, never back: a stream's stored configuration
does not know about publishers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from meteor_spark.errors import ArgumentTypeError
from meteor_spark.grid.client import MAX_BATCH_ITEMS
from meteor_spark.grid.streams import Batching, StreamConfig, batching_of
from meteor_spark.validate import check_int, check_number

__all__ = ["DEFAULT_MAX_CALL_BYTES", "PublisherSettings"]

_MAX_I32 = (1 << 31) - 1

#: Bytes per ``add_all`` call by default (see ``PublisherSettings.max_call_bytes``).
DEFAULT_MAX_CALL_BYTES = 1 << 20


@dataclass(frozen=True)
class PublisherSettings(Batching):
    """A publisher's tuning, parsed once: the batching (the stream's stored settings fill what is not given) and
    the bounds of its buffer.

    Attributes:
        max_buffered_records: records accepted but not yet stored, at most (back-pressure beyond).
        max_block_ms: how long a publish call waits for room before ``PublishTimeoutError``.
        max_items_per_call: ring items per ``add_all`` call (at most Hazelcast's limit).
        idempotent: retry an ``add_all`` whose outcome is unknown (connection lost, invocation timed out) without
            storing its records twice: the sender first looks in the lane for the call's items (by producer id and
            sequence) and resends only when they are not there (``meteor_spark.producer.sender``). False: such a call
            fails its records at once.
        delivery_timeout_ms: with ``idempotent``, how long a call may be retried, from its first attempt, before
            its records fail with ``PublishTimeoutError`` (Kafka's ``delivery.timeout.ms``, same default).
        max_call_bytes: value/key/header bytes per ``add_all`` call at most, before compression (like Kafka's
            ``max.request.size``); a record larger than that travels alone. Items are never larger than this either.
    """

    max_buffered_records: int = 100_000
    max_block_ms: float = 60_000.0
    max_items_per_call: int = 64
    idempotent: bool = True
    delivery_timeout_ms: float = 120_000.0
    max_call_bytes: int = DEFAULT_MAX_CALL_BYTES

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("max_buffered_records", self.max_buffered_records, 1, _MAX_I32)
        check_int("max_items_per_call", self.max_items_per_call, 1, MAX_BATCH_ITEMS, what="(Hazelcast's add_all limit)")
        check_int("max_call_bytes", self.max_call_bytes, 1, _MAX_I32)
        check_number("max_block_ms", self.max_block_ms, 0, float("inf"), what="(milliseconds)")
        if not isinstance(self.idempotent, bool):
            raise ArgumentTypeError(f"idempotent must be True or False, got {self.idempotent!r}")
        check_number("delivery_timeout_ms", self.delivery_timeout_ms, 1, float("inf"), what="(milliseconds)")

    @property
    def max_item_bytes(self) -> int:
        """What bounds a ring item's bytes: ``max_batch_bytes``, or ``max_call_bytes`` when that is smaller."""
        return min(self.max_batch_bytes, self.max_call_bytes)

    @classmethod
    def parse(cls, config: StreamConfig, overrides: dict[str, Any]) -> PublisherSettings:
        """The stream's stored batching, with ``overrides`` (None = not given) applied."""
        return cls(**{**batching_of(config), **{k: v for k, v in overrides.items() if v is not None}})
