"""How records are cut into ring items: one frozen value, validated once, shared by the stream's stored settings
(``StreamConfig``), a publisher's settings (``PublisherSettings``, which adds the buffer's bounds) and the
publisher's accumulator."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from meteor_spark.errors import ArgumentTypeError, ConfigError
from meteor_spark.format.offsets import MAX_RECORDS_PER_ITEM
from meteor_spark.format.wire import COMPRESSIONS
from meteor_spark.grid.client import MAX_BATCH_ITEMS
from meteor_spark.validate import check_int, check_number

if TYPE_CHECKING:
    from meteor_spark.grid.streams import StreamConfig
_MAX_I32 = (1 << 31) - 1
MAX_LINGER_MS = 60_000

#: Bytes per ``add_all`` call by default (see ``PublisherSettings.max_call_bytes``).
DEFAULT_MAX_CALL_BYTES = 1 << 20


@dataclass(frozen=True)
class Batching:
    """Batching settings.

    Attributes:
        compression: ``"lz4"`` or ``"none"``.
        compression_threshold: compress an item only from this many body bytes on.
        max_batch_records: records per ring item at most (1..65,536).
        max_batch_bytes: value/key/header bytes per ring item at most, before compression.
        linger_ms: how long a publisher waits for more records before sending a partly filled item (0: send at
            once; records pile up into an item anyway while the previous one is in flight).
    """

    compression: str = "lz4"
    compression_threshold: int = 1024
    max_batch_records: int = 1000
    max_batch_bytes: int = 1 << 20
    linger_ms: float = 0.0

    def __post_init__(self) -> None:
        if self.compression not in COMPRESSIONS:
            raise ConfigError(
                f"compression {self.compression!r} is not supported; use one of {', '.join(COMPRESSIONS)}"
            )
        check_int("compression_threshold", self.compression_threshold, 0, _MAX_I32)
        check_int("max_batch_records", self.max_batch_records, 1, MAX_RECORDS_PER_ITEM)
        check_int("max_batch_bytes", self.max_batch_bytes, 1, _MAX_I32)
        check_number("linger_ms", self.linger_ms, 0, MAX_LINGER_MS, what="(milliseconds)")


#: The batching fields, by name (``StreamConfig`` carries them flat, as stored and as users give them).
BATCHING_FIELDS = tuple(f.name for f in fields(Batching))


def batching_of(settings: Any) -> dict[str, Any]:
    """The batching fields of any object carrying them (a ``StreamConfig``, a ``Batching``), by name."""
    return {name: getattr(settings, name) for name in BATCHING_FIELDS}


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
