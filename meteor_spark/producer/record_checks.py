"""The checks a record passes before a publisher queues it: types, ranges, topic and message id, and its size.

Kept apart from ``Publisher`` so the publishing paths (``publish_async``, ``publish_many``, the claimed and
topic-gated paths) share one definition of a valid record and of what it weighs against the grid's frame limit.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from meteor_spark.errors import ArgumentTypeError, SerializationError, SizeLimitError
from meteor_spark.format.records import Record, as_record, with_routing
from meteor_spark.format.routing import check_message_id, check_topic
from meteor_spark.format.serializers import Serializer
from meteor_spark.grid.settings import HAZELCAST_MAX_FRAME_BYTES, ITEM_FRAME_OVERHEAD
from meteor_spark.validate import check_int


def checked_record(item: Record | bytes | str, *, route: bool = True) -> Record:
    """``item`` as a valid ``Record``, its topic and message id in its headers (unless ``route`` is False: a record
    only checked, e.g. before it is dropped)."""
    item = as_record(item)
    if not isinstance(item.value, (bytes, bytearray)):
        raise ArgumentTypeError(f"Record.value must be bytes, got {type(item.value).__name__}; encode it first")
    if item.key is not None and not isinstance(item.key, (bytes, bytearray)):
        raise ArgumentTypeError(f"Record.key must be bytes or None, got {type(item.key).__name__}; encode it first")
    if item.headers:
        for pair in item.headers:
            if (
                not isinstance(pair, tuple)
                or len(pair) != 2
                or not isinstance(pair[0], str)
                or not isinstance(pair[1], (bytes, bytearray))
            ):
                raise ArgumentTypeError(
                    f"Record.headers must be (str, bytes) pairs, e.g. (('trace-id', b'abc'),); got {pair!r}"
                )
    if item.topic or item.message_id is not None:
        check_topic(item.topic, "Record.topic")
        if item.message_id is not None:
            check_message_id(item.message_id, "Record.message_id")
        if route:
            item = with_routing(item)
    stamp = item.timestamp_ms
    if stamp is not None:
        if isinstance(stamp, bool) or not isinstance(stamp, int):
            raise ArgumentTypeError(
                f"Record.timestamp_ms must be an int (ms since the epoch) or None, got {item.timestamp_ms!r}"
            )
        check_int("Record.timestamp_ms", stamp, 0, _MAX_I64, what="(ms since the epoch; None = now)")
    lane = item.lane
    if lane != -1:
        check_int("Record.lane", lane, 0, _MAX_I32, what="(-1 = by key; the stream's lanes are checked next)")
    return item


def routed(item: Record | bytes | str, topic: str | None, message_id: str | None) -> Record:
    """``item`` with the ``topic`` / ``message_id`` given to ``publish`` (None: the record's own)."""
    record = as_record(item)
    if topic is not None:
        record = replace(record, topic=check_topic(topic))
    if message_id is not None:
        record = replace(record, message_id=check_message_id(message_id))
    return record


_MAX_I64 = (1 << 63) - 1
_MAX_I32 = (1 << 31) - 1


def shown(value: object) -> str:
    """A short ``repr`` for an error message (a refused argument may be megabytes)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


#: Column bytes one record adds to a ring item besides its data (value and key lengths, timestamp, header count),
#: rounded up: what many small records add to an item filled to ``max_batch_bytes``.
RECORD_COLUMN_BYTES = 32


def record_bytes(record: Record) -> int:
    """Value, key and header bytes of a record: what it weighs against the grid's frame limit."""
    size = len(record.value)
    if record.key is not None:
        size += len(record.key)
    for name, value in record.headers or ():
        size += len(name.encode("utf-8", "surrogatepass")) + len(value)
    return size


def size_refusal(stream: str, size: int, what: str, limit: int) -> SizeLimitError:
    """The error of a record no ring item of the grid can carry (``limit``: ``GridSettings.max_record_bytes``),
    raised before anything of the call is queued or sent: the member would drop the connection (and every call on
    it) on the oversize frame."""
    return SizeLimitError(
        f"{what} for stream {stream!r} carries {size:,} bytes (value, key and headers), more than the "
        f"{limit:,} bytes one record may carry (hazelcast.maxFrameBytes = {limit + ITEM_FRAME_OVERHEAD:,}, the "
        f"grid's frame limit, less {ITEM_FRAME_OVERHEAD} bytes of item framing); nothing of this call was sent. "
        f"Split the record, or raise GridSettings.max_frame_bytes if every member accepts larger frames "
        f"(a Hazelcast member: up to {HAZELCAST_MAX_FRAME_BYTES:,})"
    )


def serialized(
    item: Any,
    value_serializer: Serializer | None,
    key_serializer: Serializer | None,
    stream: str,
    position: int | None,
    count: int,
    record_header: tuple[str, bytes] | None = None,
) -> Record | bytes:
    """``item`` with its value (and a Record's key) through the serializers; ``position`` of ``count`` in a
    ``publish_many`` call (None: a single record) names it when a serializer fails (``SerializationError``).
    ``record_header``: the header every record gets from the value serializer (a typed stream's schema version)."""
    rec = item if isinstance(item, Record) else None
    value = item if rec is None else rec.value
    if value_serializer is not None:
        value = _apply(value_serializer, "value_serializer", value, stream, position, count)
    if rec is None:
        return value if record_header is None else Record(value, headers=(record_header,))
    key = rec.key
    if key is not None and key_serializer is not None:
        key = _apply(key_serializer, "key_serializer", key, stream, position, count)
    if record_header is None:
        return replace(rec, value=value, key=key)
    headers = (*(h for h in rec.headers if h[0] != record_header[0]), record_header)
    return replace(rec, value=value, key=key, headers=headers)


def _apply(function: Serializer, name: str, obj: Any, stream: str, position: int | None, count: int) -> bytes:
    try:
        out = function(obj)
        if type(out) is bytes:
            return out
        if not isinstance(out, (bytes, bytearray)):
            raise TypeError(f"it returned {type(out).__name__}, not bytes")
        return bytes(out)
    except Exception as exc:
        where = "the record"
        if position is not None:
            where = f"record {position} (0-based) of the {count} given to publish_many"
        raise SerializationError(
            f"{name} failed on {where} for stream {stream!r}: {type(exc).__name__}: {exc}; nothing of "
            f"this call was queued"
        ) from exc
