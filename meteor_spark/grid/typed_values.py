"""The value codecs of typed streams: a publisher's Avro serializer and a subscriber's Avro deserializer, each
bound to a stream's schemas in the grid (``meteor_spark.grid.schemas``).

They plug into the clients' existing hooks (``value_serializer`` / ``value_deserializer``): ``value_codec_setting``
turns ``"avro"``, an ``AvroValues`` or (on a stream declared ``value_format="avro"``) no setting at all into one.
The serializer carries the header its records get (``record_header``: ``meteor.schema`` = its version); the
deserializer reads each record's header (``from_record``) to pick the writer's version, and projects the value
onto the reader's version (the latest when the client started, or the pinned one). A version the reader has not
seen yet (registered after it started) is looked up in the registry when a record first carries it, then at most
once per ``REFRESH_MS`` for that version; versions past ``MAX_VERSIONS`` cannot exist and are never looked up, so a
damaged header costs at most one registry read per possible version a second. A record whose version is still
unknown, that has no version, or whose bytes do not decode raises, and the subscriber's ``on_corrupt`` policy
settles it.
"""

from __future__ import annotations

import time
from typing import Any

from meteor_spark.errors import ConfigError, DeserializationError
from meteor_spark.format.avro import SCHEMA_HEADER, AvroSchema, AvroValues, is_typed_setting, schema_version_of
from meteor_spark.format.serializers import Deserializer, Serializer, deserializer, serializer
from meteor_spark.grid.client import Grid
from meteor_spark.grid.schemas import MAX_VERSIONS, Subject, get_subject, require_subject
from meteor_spark.grid.streams import StreamInfo

__all__ = [
    "AvroDeserializer",
    "AvroSerializer",
    "value_codec_setting",
    "value_deserializer_for",
    "value_serializer_for",
]

#: How often a reader asks the registry again for one version it did not find there, at most.
REFRESH_MS = 1000


def value_codec_setting(setting: Any, info: StreamInfo) -> AvroValues | None:
    """The Avro setting ``setting`` asks for on the stream ``info`` describes, None when it asks for another
    codec: ``"avro"`` and ``AvroValues`` ask for one, and so does no setting on a stream declared
    ``value_format="avro"``. Any other setting there is the caller's own (raw bytes or a custom codec)."""
    if is_typed_setting(setting):
        return setting if isinstance(setting, AvroValues) else AvroValues()
    if setting is None and info.config.value_format == "avro":
        return AvroValues()
    return None


class AvroSerializer:
    """A publisher's ``value_serializer`` for a typed stream: checks and encodes dicts (or dataclass instances)
    with one schema version; ``record_header`` is the header every record it encodes must carry."""

    def __init__(self, grid: Grid, stream: str, setting: AvroValues, what: str = "value_serializer='avro'") -> None:
        if setting.into is not None:
            raise ConfigError("value_serializer: AvroValues(into=...) is for subscribers; a publisher takes any dict")
        subject = require_subject(grid, stream, what)
        chosen = subject.latest if setting.version is None else subject.version(setting.version)
        self.version = chosen.version
        self.schema = chosen.schema
        self.record_header = (SCHEMA_HEADER, str(chosen.version).encode("ascii"))

    def __call__(self, value: Any) -> bytes:
        return self.schema.encode(value)

    def __repr__(self) -> str:
        return f"AvroSerializer(version={self.version})"


class AvroDeserializer:
    """A subscriber's ``value_deserializer`` for a typed stream: each record decoded with its writer's version
    (its ``meteor.schema`` header) into the reader's version, as a dict or a dataclass instance."""

    def __init__(self, grid: Grid, stream: str, setting: AvroValues) -> None:
        subject = require_subject(grid, stream, "value_deserializer='avro'")
        self._grid = grid
        self._stream = stream
        reader = subject.latest if setting.version is None else subject.version(setting.version)
        self.version = reader.version
        self.reader: AvroSchema = reader.schema
        self._into = setting.into
        self._writers: dict[int, AvroSchema] = {}
        self._take(subject)
        self._missed: dict[int, float] = {}  # version -> when it was last looked up in vain (<= MAX_VERSIONS keys)

    def _take(self, subject: Subject) -> None:
        for version in subject.versions:
            self._writers.setdefault(version.version, version.schema)

    def _writer(self, version: int) -> AvroSchema | None:
        found = self._writers.get(version)
        if found is not None or not 1 <= version <= MAX_VERSIONS:
            return found
        now = time.monotonic()
        if now - self._missed.get(version, -REFRESH_MS) < REFRESH_MS / 1000:
            return None
        subject = get_subject(self._grid, self._stream)
        if subject is not None:
            self._take(subject)
        found = self._writers.get(version)
        if found is None:
            self._missed[version] = now
        else:
            self._missed.pop(version, None)
        return found

    def forget_misses(self) -> None:
        """Look versions up again at their next record (the registry was just read again by the caller)."""
        self._missed.clear()

    def from_record(self, data: bytes, headers: tuple[tuple[str, bytes], ...]) -> Any:
        """The value of a stored record, decoded (raises ``DeserializationError`` when it cannot be)."""
        version = schema_version_of(headers)
        if version is None:
            raise DeserializationError(
                f"the record carries no {SCHEMA_HEADER} header (written without the stream's schema?)"
            )
        writer = self._writer(version)
        if writer is None:
            raise DeserializationError(f"schema version {version} is not registered for stream {self._stream!r}")
        value = writer.decode(data, self.reader)
        return value if self._into is None else self._into(**value)

    def __call__(self, data: bytes) -> Any:
        raise DeserializationError("an Avro value is decoded with its record's headers (from_record), not alone")

    def __repr__(self) -> str:
        return f"AvroDeserializer(reader version={self.version})"


def value_serializer_for(grid: Grid, info: StreamInfo, setting: Any) -> Serializer | None:
    """A publisher's value serializer for ``setting`` on the stream ``info`` describes: a typed stream's Avro one
    (``value_codec_setting``), else the built-in or callable ``setting`` names."""
    typed = value_codec_setting(setting, info)
    if typed is not None:
        return AvroSerializer(grid, info.name, typed)
    return serializer(setting, "value_serializer")


def value_deserializer_for(grid: Grid, info: StreamInfo, setting: Any) -> Deserializer | None:
    """A subscriber's value deserializer for ``setting`` on the stream ``info`` describes: a typed stream's Avro
    one (``value_codec_setting``), else the built-in or callable ``setting`` names."""
    typed = value_codec_setting(setting, info)
    if typed is not None:
        return AvroDeserializer(grid, info.name, typed)
    return deserializer(setting, "value_deserializer")
