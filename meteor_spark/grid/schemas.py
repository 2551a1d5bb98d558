"""The schema registry of typed streams, in the grid: map ``meteor.schemas``, one entry per stream (its subject).

An entry is JSON: the subject's compatibility mode and its versions, each with its version number, its schema
text (canonical JSON) and its fingerprint (CRC-64-AVRO). Like Confluent's Schema Registry: registering a schema
identical to a registered one returns that version (idempotent); a new one is checked against the latest version
under the subject's mode (``backward`` by default, ``forward``, ``full`` or ``none``; non-transitive) and refused
with the fields that break it (``IncompatibleSchemaError``). A version is taken by compare-and-set on the entry
(``replace(key, old, new)``), so two writers can never both take the same version number: the loser reads the
winner's entry and checks again (it may then find its schema registered by the other, or incompatible with it).

Bounded: at most ``MAX_VERSIONS`` versions per stream (an entry holds every version, and readers must be able to
decode every record still in the ring with its writer's version); registering past it is refused with a clear
error. Versions are never removed one by one: ``forget_schemas`` drops a stream's subject whole (after the stream
is deleted).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from meteor_spark.errors import ConfigError, GridError, IncompatibleSchemaError
from meteor_spark.format.avro import COMPATIBILITY_MODES, AvroSchema, compatibility_problems
from meteor_spark.grid.client import Grid
from meteor_spark.grid.streams import check_stream_name

__all__ = [
    "MAX_VERSIONS",
    "SCHEMAS_MAP",
    "SchemaVersion",
    "Subject",
    "check_schema",
    "forget_schemas",
    "get_subject",
    "list_subjects",
    "register_schema",
    "require_subject",
    "set_compatibility",
]

SCHEMAS_MAP = "meteor.schemas"

#: Versions one stream may register at most. Each record names its writer's version and a reader keeps every
#: version it meets, so the bound also bounds what readers hold; 100 is far beyond a schema's usual life.
MAX_VERSIONS = 100

#: Compare-and-set attempts before giving up (each failure means another writer changed the entry in between).
_MAX_ATTEMPTS = 32


@dataclass(frozen=True)
class SchemaVersion:
    """One registered version of a stream's schema."""

    version: int
    schema: AvroSchema
    registered_at_ms: int

    @property
    def fingerprint(self) -> str:
        return self.schema.fingerprint

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "schema": self.schema.text,
            "fingerprint": self.schema.fingerprint,
            "registered_at_ms": self.registered_at_ms,
        }


@dataclass(frozen=True)
class Subject:
    """A stream's schemas: its compatibility mode and versions (oldest first)."""

    stream: str
    compatibility: str
    versions: tuple[SchemaVersion, ...] = field(default=())

    @property
    def latest(self) -> SchemaVersion:
        return self.versions[-1]

    def version(self, number: int) -> SchemaVersion:
        """Version ``number``.

        Raises:
            ConfigError: the stream has no such version (naming the versions it has).
        """
        for found in self.versions:
            if found.version == number:
                return found
        raise ConfigError(
            f"stream {self.stream!r} has no schema version {number}; it has versions "
            f"{[v.version for v in self.versions]} (meteor schemas list {self.stream})"
        )

    def to_json(self) -> str:
        return json.dumps(
            {
                "stream": self.stream,
                "compatibility": self.compatibility,
                "versions": [v.to_dict() for v in self.versions],
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> Subject:
        data = json.loads(text)
        versions = tuple(
            SchemaVersion(int(v["version"]), AvroSchema.parse(v["schema"]), int(v["registered_at_ms"]))
            for v in data["versions"]
        )
        return cls(data["stream"], data["compatibility"], versions)


def get_subject(grid: Grid, stream: str) -> Subject | None:
    """The stream's schemas, None when it has none registered."""
    text = grid.map(SCHEMAS_MAP).get(stream)
    return None if text is None else Subject.from_json(text)


def require_subject(grid: Grid, stream: str, what: str) -> Subject:
    """The stream's schemas; ``what`` (the setting that needs them) names the error when it has none.

    Raises:
        ConfigError: no schema is registered for the stream.
    """
    found = get_subject(grid, stream)
    if found is None:
        raise ConfigError(
            f"{what}: stream {stream!r} has no schema; register one first (meteor schemas register {stream} "
            f"schema.avsc, or meteor_spark.grid.schemas.register_schema)"
        )
    return found


def list_subjects(grid: Grid) -> list[Subject]:
    """Every stream's schemas, by stream name."""
    entries = grid.map(SCHEMAS_MAP).entries()
    return [Subject.from_json(entries[name]) for name in sorted(entries)]


def _check_mode(mode: str) -> str:
    if not isinstance(mode, str) or mode.strip().lower() not in COMPATIBILITY_MODES:
        raise ConfigError(f"compatibility {mode!r} is not a mode; use one of {', '.join(COMPATIBILITY_MODES)}")
    return mode.strip().lower()


def check_schema(grid: Grid, stream: str, schema: str | dict[str, Any], compatibility: str | None = None) -> list[str]:
    """What would keep ``schema`` from being registered as the stream's next version (empty: it would be), under
    ``compatibility`` or the subject's mode. Registers nothing."""
    parsed = AvroSchema.parse(schema)
    subject = get_subject(grid, stream)
    if subject is None:
        return []
    if any(v.fingerprint == parsed.fingerprint for v in subject.versions):
        return []
    mode = subject.compatibility if compatibility is None else _check_mode(compatibility)
    return compatibility_problems(parsed, subject.latest.schema, mode)


def register_schema(
    grid: Grid,
    stream: str,
    schema: str | dict[str, Any],
    *,
    compatibility: str | None = None,
    max_versions: int = MAX_VERSIONS,
) -> SchemaVersion:
    """Register ``schema`` as the stream's next version, or return the version already holding it.

    Args:
        compatibility: the subject's mode when this creates it (default ``backward``); on an existing subject it
            must be None or the stored mode (change it with ``set_compatibility``).
        max_versions: the bound on versions (``MAX_VERSIONS``; lower only to test it).

    Raises:
        IncompatibleSchemaError: the schema breaks the subject's mode; the message and ``problems`` name the
            fields.
        ConfigError: not a valid Avro record schema, a differing ``compatibility``, or the stream already has
            ``max_versions`` versions.
    """
    check_stream_name(stream)
    parsed = AvroSchema.parse(schema)
    mode = None if compatibility is None else _check_mode(compatibility)
    schemas = grid.map(SCHEMAS_MAP)
    for _ in range(_MAX_ATTEMPTS):
        now = int(time.time() * 1000)
        text = schemas.get(stream)
        if text is None:
            first = SchemaVersion(1, parsed, now)
            subject = Subject(stream, mode or "backward", (first,))
            if schemas.put_if_absent(stream, subject.to_json()) is None:
                return first
            continue
        subject = Subject.from_json(text)
        for existing in subject.versions:
            if existing.fingerprint == parsed.fingerprint:
                return existing
        if mode is not None and mode != subject.compatibility:
            raise ConfigError(
                f"compatibility={mode!r}: stream {stream!r} keeps its schemas under {subject.compatibility!r}; "
                f"change it with set_compatibility (meteor schemas register --compatibility applies it only to a "
                f"new stream), or leave it unset"
            )
        problems = compatibility_problems(parsed, subject.latest.schema, subject.compatibility)
        if problems:
            raise IncompatibleSchemaError(
                f"the schema is not {subject.compatibility}-compatible with version {subject.latest.version} of "
                f"stream {stream!r}: {'; '.join(problems)}. Nothing was registered",
                problems,
            )
        if len(subject.versions) >= max_versions:
            raise ConfigError(
                f"stream {stream!r} has {len(subject.versions)} schema versions, the most one stream may keep "
                f"({max_versions}); evolve the schema less often, or start a new stream for a new shape"
            )
        added = SchemaVersion(subject.latest.version + 1, parsed, now)
        grown = Subject(stream, subject.compatibility, (*subject.versions, added))
        if schemas.replace_if_same(stream, text, grown.to_json()):
            return added
    raise GridError(f"registering a schema for stream {stream!r}: the entry kept changing ({_MAX_ATTEMPTS} attempts)")


def set_compatibility(grid: Grid, stream: str, compatibility: str) -> Subject:
    """Set the stream's compatibility mode for the versions registered from now on (compare-and-set)."""
    mode = _check_mode(compatibility)
    schemas = grid.map(SCHEMAS_MAP)
    for _ in range(_MAX_ATTEMPTS):
        text = schemas.get(stream)
        if text is None:
            raise ConfigError(f"stream {stream!r} has no schema; register one first")
        subject = Subject.from_json(text)
        changed = Subject(stream, mode, subject.versions)
        if mode == subject.compatibility or schemas.replace_if_same(stream, text, changed.to_json()):
            return changed
    raise GridError(f"setting the compatibility of stream {stream!r}: the entry kept changing")


def forget_schemas(grid: Grid, stream: str) -> bool:
    """Remove the stream's subject (every version); True when there was one. Readers of records still stored
    with those versions can no longer decode them: do it after the stream is deleted."""
    return grid.map(SCHEMAS_MAP).remove(stream) is not None
