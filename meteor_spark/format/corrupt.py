"""What a reader does with a ring item it cannot decode: the corrupt-item policy.

A ring item that is not a valid record batch (damaged bytes, a foreign writer's ``ring.add(b"...")``, a format
version newer than this reader) cannot be turned into records, and nothing after it in its lane can be read past
without a decision. The default is to stop with ``FormatError`` naming stream, lane and sequence, like data loss.
Two opt-in ways on, modelled on Kafka Connect's ``errors.tolerance`` / ``errors.deadletterqueue.topic.name``:

- ``skip``: the item is passed over and counted (like skipped data loss), with a warning naming where it was;
- ``dead_letter``: the raw item is published, unchanged, as the value of one record to a dead-letter stream, with
  headers naming where it came from and why it was refused; reading goes on once that record is acknowledged.

The same choice covers a record whose stored bytes a subscriber's ``value_deserializer`` / ``key_deserializer``
refuses (e.g. invalid JSON): ``error`` raises ``DeserializationError`` (the position stays at the record),
``skip`` passes over the record, ``dead_letter`` publishes it (value, key and headers as stored, plus the source
headers and the error) with ``dead_letter_for_record``.

The core (``Subscriber(on_corrupt=..., dead_letter_stream=...)``) and the Spark source (options ``onCorrupt`` and
``deadLetterStream``) both parse into one ``CorruptItemPolicy``, so both behave alike.
"""

from __future__ import annotations

from dataclasses import dataclass

from meteor_spark.errors import ConfigError, DeserializationError, FormatError
from meteor_spark.format.offsets import first_offset_of, sequence_of
from meteor_spark.format.records import Record

CORRUPT_MODES = ("error", "skip", "dead_letter")

#: Headers of a dead-letter record (values are UTF-8 text).
HEADER_SOURCE_STREAM = "meteor.source.stream"
HEADER_SOURCE_LANE = "meteor.source.lane"
HEADER_SOURCE_SEQUENCE = "meteor.source.sequence"
HEADER_SOURCE_OFFSET = "meteor.source.offset"
HEADER_ERROR = "meteor.error"
#: Headers a shared group adds to a record it dead-letters (``meteor_spark.consumer.shared_subscriber``).
HEADER_SOURCE_GROUP = "meteor.source.group"
HEADER_DELIVERY_COUNT = "meteor.delivery.count"
#: The record's topic in the source stream (a dead letter has none of its own: it must reach every reader).
HEADER_SOURCE_TOPIC = "meteor.source.topic"
#: ``item`` on the dead letter of a whole undecodable ring item (its value is the raw item, not a record).
HEADER_SOURCE_KIND = "meteor.source.kind"
KIND_ITEM = "item"
#: Every header a dead letter adds (what a redrive strips again).
DEAD_LETTER_HEADERS = frozenset(
    (
        HEADER_SOURCE_STREAM,
        HEADER_SOURCE_LANE,
        HEADER_SOURCE_SEQUENCE,
        HEADER_SOURCE_OFFSET,
        HEADER_ERROR,
        HEADER_SOURCE_GROUP,
        HEADER_DELIVERY_COUNT,
        HEADER_SOURCE_TOPIC,
        HEADER_SOURCE_KIND,
    )
)


@dataclass(frozen=True)
class CorruptItemPolicy:
    """How a reader treats an undecodable ring item: ``error`` (default), ``skip`` or ``dead_letter``.

    Attributes:
        mode: one of ``CORRUPT_MODES``.
        dead_letter_stream: the stream refused items go to (set exactly when ``mode == "dead_letter"``).
    """

    mode: str = "error"
    dead_letter_stream: str | None = None

    @classmethod
    def parse(
        cls,
        on_corrupt: str | None,
        dead_letter_stream: str | None,
        *,
        mode_name: str = "on_corrupt",
        stream_name: str = "dead_letter_stream",
    ) -> CorruptItemPolicy:
        """The policy from the two user-facing settings, named as the caller names them in errors.

        ``dead_letter_stream`` alone means ``dead_letter``; ``on_corrupt`` left None means ``error``.
        """
        if dead_letter_stream is not None and (not isinstance(dead_letter_stream, str) or not dead_letter_stream):
            raise ConfigError(f"{stream_name} must be a non-empty stream name, got {dead_letter_stream!r}")
        if on_corrupt is None:
            on_corrupt = "dead_letter" if dead_letter_stream else "error"
        if not isinstance(on_corrupt, str) or on_corrupt.strip().lower() not in CORRUPT_MODES:
            raise ConfigError(f"{mode_name} must be one of {', '.join(CORRUPT_MODES)}, got {on_corrupt!r}")
        mode = on_corrupt.strip().lower()
        if mode == "dead_letter" and not dead_letter_stream:
            raise ConfigError(f"{mode_name}=dead_letter needs {stream_name}: the stream refused items are sent to")
        if mode != "dead_letter" and dead_letter_stream:
            raise ConfigError(
                f"{stream_name}={dead_letter_stream!r} goes with {mode_name}=dead_letter, not {mode_name}={mode}; "
                f"drop one of the two"
            )
        return cls(mode, dead_letter_stream)

    @property
    def is_error(self) -> bool:
        return self.mode == "error"


def dead_letter_record(raw: bytes, *, stream: str, lane: int, sequence: int, error: FormatError) -> Record:
    """The record a refused ring item becomes in the dead-letter stream: the raw bytes, and where and why."""
    return Record(
        value=bytes(raw),
        headers=(
            (HEADER_SOURCE_STREAM, stream.encode()),
            (HEADER_SOURCE_LANE, str(lane).encode()),
            (HEADER_SOURCE_SEQUENCE, str(sequence).encode()),
            (HEADER_SOURCE_OFFSET, str(first_offset_of(sequence)).encode()),
            (HEADER_ERROR, str(error).encode()),
            (HEADER_SOURCE_KIND, KIND_ITEM.encode()),
        ),
    )


def dead_letter_for_record(raw: Record, error: DeserializationError | str) -> Record:
    """The record a stored record that failed deserialization (or a shared group gave up on) becomes in the
    dead-letter stream: its value, key, headers and timestamp as stored, then headers naming where it came from
    and why it was refused."""
    return Record(
        value=raw.value,
        key=raw.key,
        headers=(
            *raw.headers,
            (HEADER_SOURCE_STREAM, raw.stream.encode()),
            (HEADER_SOURCE_LANE, str(raw.lane).encode()),
            (HEADER_SOURCE_SEQUENCE, str(sequence_of(raw.offset)).encode()),
            (HEADER_SOURCE_OFFSET, str(raw.offset).encode()),
            (HEADER_ERROR, str(error).encode()),
            *(((HEADER_SOURCE_TOPIC, raw.topic.encode()),) if raw.topic else ()),
        ),
        timestamp_ms=raw.timestamp_ms,
    )


def dead_letter_for_delivery(raw: Record, *, group: str, deliveries: int, reason: str) -> Record:
    """The record a shared group dead-letters (``max_deliveries`` reached, or rejected by a member): as
    ``dead_letter_for_record`` with ``reason`` as the error, plus the group and the record's delivery count."""
    letter = dead_letter_for_record(raw, reason)
    return Record(
        value=letter.value,
        key=letter.key,
        headers=(
            *letter.headers,
            (HEADER_SOURCE_GROUP, group.encode()),
            (HEADER_DELIVERY_COUNT, str(deliveries).encode()),
        ),
        timestamp_ms=letter.timestamp_ms,
    )
