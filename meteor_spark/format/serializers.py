"""Value and key serializers for the clients, after kafka-python's ``value_serializer`` / ``value_deserializer``.

A ``Publisher(value_serializer=..., key_serializer=...)`` turns the objects it is given into the bytes it stores; a
``Subscriber(value_deserializer=..., key_deserializer=...)`` turns stored bytes back into objects, so the records
it returns carry the objects in ``value`` / ``key`` (as kafka-python's ``ConsumerRecord`` does). Each setting is a
built-in's name or any callable; names are resolved once, when the client is made:

- ``"json"``: compact JSON (no spaces), UTF-8, non-ASCII characters kept as they are; ``json.loads`` back.
- ``"str"``: UTF-8 text.
- ``"bytes"``: bytes unchanged (the same as no serializer).
- ``"avro"``: a typed stream's values, with its schemas in the grid (resolved by the clients with the grid:
  ``meteor_spark.grid.typed_values``). Its serializer carries ``record_header`` (the header each record gets) and
  its deserializer ``from_record(data, headers)`` (the writer's version is in a header), which the hooks here use.

A key serializer applies only to keys that are set (a None key stays None, as in kafka-python). The ring stores
bytes only, so Arrow paths (``Publisher.publish_arrow``, ``RecordBatch.to_arrow``) and the Spark connector work on
the stored bytes; in Spark, ``from_json`` on the ``value`` column is the way to read JSON.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from meteor_spark.errors import ArgumentTypeError, DeserializationError, unknown_option
from meteor_spark.format.offsets import index_of
from meteor_spark.format.records import BatchPart, Record, with_values

__all__ = ["BUILT_INS", "DecodedLane", "Deserializer", "Serializer", "deserialize_lane", "deserializer", "serializer"]

#: ``serializer(obj) -> bytes``: what a publisher stores for a value or key.
Serializer = Callable[[Any], bytes]
#: ``deserializer(data) -> object``: what a subscriber hands out for stored bytes.
Deserializer = Callable[[bytes], Any]

_compact = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def _json_dumps(obj: Any) -> bytes:
    return _compact(obj).encode("utf-8")


def _str_encode(obj: Any) -> bytes:
    if not isinstance(obj, str):
        raise TypeError(f"the 'str' serializer takes str, got {type(obj).__name__}")
    return obj.encode("utf-8")


def _bytes_checked(obj: Any) -> bytes:
    if not isinstance(obj, (bytes, bytearray, memoryview)):
        raise TypeError(f"the 'bytes' serializer takes bytes, got {type(obj).__name__}")
    return bytes(obj)


def _str_decode(data: bytes) -> str:
    return data.decode("utf-8")


_SERIALIZERS: dict[str, Serializer] = {"json": _json_dumps, "str": _str_encode, "bytes": _bytes_checked}
_DESERIALIZERS: dict[str, Deserializer | None] = {"json": json.loads, "str": _str_decode, "bytes": None}
BUILT_INS = tuple(_SERIALIZERS)


def serializer(setting: str | Serializer | None, name: str) -> Serializer | None:
    """The callable for a publisher's ``name`` setting (``value_serializer`` / ``key_serializer``); None = none."""
    if setting is None:
        return None
    if isinstance(setting, str):
        found = _SERIALIZERS.get(setting.strip().lower())
        if found is None:
            raise unknown_option(f"{name} built-in", setting, BUILT_INS)
        return found
    if callable(setting):
        return setting
    raise ArgumentTypeError(
        f"{name} must be one of {', '.join(map(repr, BUILT_INS))} or a callable taking an object and returning "
        f"bytes, got {setting!r}"
    )


def deserializer(setting: str | Deserializer | None, name: str) -> Deserializer | None:
    """The callable for a subscriber's ``name`` setting (``value_deserializer`` / ``key_deserializer``); None for
    no conversion (``None`` or ``"bytes"``)."""
    if setting is None:
        return None
    if isinstance(setting, str):
        key = setting.strip().lower()
        if key not in _DESERIALIZERS:
            raise unknown_option(f"{name} built-in", setting, BUILT_INS)
        return _DESERIALIZERS[key]
    if callable(setting):
        return setting
    raise ArgumentTypeError(
        f"{name} must be one of {', '.join(map(repr, BUILT_INS))} or a callable taking bytes, got {setting!r}"
    )


@dataclass
class DecodedLane:
    """The records of one lane taken for delivery, deserialized.

    Attributes:
        parts: the records delivered, as stored (refused records cut out), in order.
        records: the same records with ``value`` / ``key`` deserialized.
        refused: records left out (policy skip or dead_letter), with why.
        stopped: policy error: the offset of the first record that failed, and why; nothing from it on is in
            ``parts``.
    """

    parts: list[BatchPart]
    records: list[Record]
    refused: list[tuple[Record, DeserializationError]]
    stopped: tuple[int, DeserializationError] | None


def deserialize_lane(
    parts: Iterable[BatchPart],
    value: Deserializer | None,
    key: Deserializer | None,
    *,
    stop_at_failure: bool,
) -> DecodedLane:
    """Deserialize the records of ``parts`` (one lane, in order); a failing record ends the lane's delivery
    (``stop_at_failure``) or is left out and reported in ``refused``."""
    out_parts: list[BatchPart] = []
    records: list[Record] = []
    refused: list[tuple[Record, DeserializationError]] = []
    # A deserializer that needs the record's headers (a typed stream's: the writer's schema version) has from_record.
    with_headers: Callable[[bytes, tuple[tuple[str, bytes], ...]], Any] | None = getattr(value, "from_record", None)
    for part in parts:
        try:  # the common case: every record of the part deserializes
            if with_headers is None:
                records.extend(part.records(value, key))
            else:
                stored = part.records(None, key)
                records.extend(with_values(stored, [with_headers(r.value, r.headers) for r in stored]))
            out_parts.append(part)
            continue
        except Exception:  # found and reported record by record below
            pass
        run = part.start
        for rec in part.records():
            failed = "value_deserializer"
            try:
                if with_headers is not None:
                    obj = with_headers(rec.value, rec.headers)
                else:
                    obj = rec.value if value is None else value(rec.value)
                failed = "key_deserializer"
                k = rec.key if key is None or rec.key is None else key(rec.key)
                records.append(replace(rec, value=obj, key=k))
                continue
            except Exception as exc:
                error = DeserializationError(
                    f"{failed} failed on the record at offset {rec.offset} of stream {rec.stream!r} lane {rec.lane}: "
                    f"{type(exc).__name__}: {exc}. The stored record is intact: seek past it (offset "
                    f"{rec.offset + 1}), or let the subscriber skip or dead-letter such records (on_corrupt)"
                )
                error.__cause__ = exc
            local = index_of(rec.offset)
            if local > run:
                out_parts.append(BatchPart(part.stream, part.lane, part.sequence, part.item, run, local))
            if stop_at_failure:
                return DecodedLane(out_parts, records, refused, (rec.offset, error))
            refused.append((rec, error))
            run = local + 1
        if part.stop > run:
            out_parts.append(BatchPart(part.stream, part.lane, part.sequence, part.item, run, part.stop))
    return DecodedLane(out_parts, records, refused, None)
