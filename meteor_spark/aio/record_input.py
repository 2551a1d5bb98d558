"""What an ``AsyncPublisher`` was given, made into what it queues: the threaded publisher's checks and serializing
(``meteor_spark.producer.record_checks``) applied to one ``publish`` or one record of ``publish_many``, with the
asyncio publisher's fast path (a plain ``bytes`` value stays as it is: the common case costs one size check)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from meteor_spark.errors import ArgumentTypeError, ConfigError
from meteor_spark.format.records import Record
from meteor_spark.format.serializers import Serializer
from meteor_spark.producer.record_checks import checked_record, record_bytes, routed, serialized, size_refusal

__all__ = ["RecordInput"]


class RecordInput:
    """One started publisher's serializers and limits (its stream's name and lanes, the grid's record size)."""

    def __init__(
        self, stream: str, value: Serializer | None, key: Serializer | None, max_bytes: int, lanes: int
    ) -> None:
        self.stream = stream
        self._value = value
        self._key = key
        #: the header every record gets from the value serializer (a typed stream's schema version), if any
        self._header: tuple[str, bytes] | None = getattr(value, "record_header", None)
        self._max_bytes = max_bytes
        self._lanes = lanes

    def checked(
        self,
        value: Any,
        key: Any,
        headers: Iterable[tuple[str, bytes]] | None,
        lane: int | None,
        timestamp_ms: int | None,
        topic: str | None,
        message_id: str | None,
        position: int | None,
        count: int,
    ) -> Record | bytes:
        """The record, serialized and checked as the threaded publisher does (``position``/``count``: its place in
        ``publish_many``, named by a size refusal)."""
        if (
            type(value) is bytes
            and key is None
            and headers is None
            and lane is None
            and timestamp_ms is None
            and topic is None
            and message_id is None
            and self._value is None
        ):
            if len(value) > self._max_bytes:
                raise size_refusal(self.stream, len(value), _where(position, count), self._max_bytes)
            return value
        fields: dict[str, Any] = {}
        if key is not None:
            fields["key"] = key
        if headers is not None:
            fields["headers"] = tuple(headers)
        if lane is not None:
            fields["lane"] = lane
        if timestamp_ms is not None:
            fields["timestamp_ms"] = timestamp_ms
        item: Any = value
        if fields:
            if isinstance(value, Record):
                raise ArgumentTypeError(
                    f"publish got a Record and {', '.join(sorted(fields))}: set them on the Record, or pass a value"
                )
            item = Record(value, **fields)
        if self._value is not None or self._key is not None:
            item = serialized(item, self._value, self._key, self.stream, position, count, self._header)
        if topic is not None or message_id is not None:
            item = routed(item, topic, message_id)
        rec = checked_record(item)
        size = record_bytes(rec)
        if size > self._max_bytes:
            raise size_refusal(self.stream, size, _where(position, count), self._max_bytes)
        if rec.lane >= self._lanes:
            raise ConfigError(
                f"record lane {rec.lane} does not exist in stream {self.stream!r} (lanes 0..{self._lanes - 1}); "
                f"use -1 to choose by key"
            )
        return rec


def _where(position: int | None, count: int) -> str:
    """How a size refusal names the record: ``publish``'s one, or its place in ``publish_many``'s."""
    return "the record" if position is None else f"record {position} (0-based) of the {count} given to publish_many"
