"""Avro values of typed streams: schema checks, encoding, decoding and compatibility, pure (no grid).

Why Avro (through fastavro): a compact binary encoding without field names in each record, a schema language
with defaults and aliases, and schema resolution rules written down by the Avro specification (a reader's schema
reads data written with another), which are exactly what a registry's compatibility modes check. It is what
Confluent's Schema Registry and Spark's ``from_avro`` users already know. fastavro is well kept and fast (its
encoder and decoder are compiled), and is imported only here, lazily (the ``schemas`` extra).

A typed record's value is the schemaless Avro binary encoding of the value (no magic byte, no schema id inside
the value); the writer's schema version travels in the reserved ``meteor.schema`` header (``SCHEMA_HEADER``), so
the value bytes stay what any Avro decoder reads given the writer's schema.

Compatibility (``incompatibilities``) follows the specification's resolution rules, field by field, and reports
each break with the path of the field that causes it (``order.amount: type 'int' cannot be read as 'string'``):
a reader field missing from the writer needs a default; types must match or be a promotion the specification
allows (int -> long -> float -> double, string <-> bytes); enum symbols the writer has must be in the reader
(unless the reader's enum has a default); records and named types must keep their names (or list the old one as
an alias); a writer union's every branch must be readable, a reader union must hold a branch for the writer's type.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

from meteor_spark.errors import ConfigError, DeserializationError, SerializationError

__all__ = [
    "COMPATIBILITY_MODES",
    "SCHEMA_HEADER",
    "AvroSchema",
    "AvroValues",
    "as_plain",
    "compatibility_problems",
    "incompatibilities",
    "schema_version_of",
    "spark_ddl",
]

#: The reserved header a typed record carries: its writer schema's version (decimal ASCII), e.g. ``b"3"``.
SCHEMA_HEADER = "meteor.schema"

#: Schema Registry's modes (non-transitive: a new version is checked against the latest one), plus ``none``.
COMPATIBILITY_MODES = ("backward", "forward", "full", "none")

#: Longest schema text accepted, in characters (a schema is stored once per version in one grid map entry).
MAX_SCHEMA_CHARS = 64 * 1024

_PRIMITIVES = ("null", "boolean", "int", "long", "float", "double", "bytes", "string")
_NAMED = ("record", "enum", "fixed")
#: writer type -> reader types it may be read as (the specification's promotions).
_PROMOTIONS = {
    "int": ("long", "float", "double"),
    "long": ("float", "double"),
    "float": ("double",),
    "string": ("bytes",),
    "bytes": ("string",),
}


_FASTAVRO: Any = None


def _fastavro() -> Any:
    """fastavro (with its validation module), imported once, when the first typed value is met."""
    global _FASTAVRO
    if _FASTAVRO is not None:
        return _FASTAVRO
    try:
        import fastavro
        import fastavro.validation
    except ImportError as exc:  # pragma: no cover - the extra is part of the test install
        raise ConfigError(
            "typed streams need fastavro: pip install 'meteor-spark[schemas]' (or pip install fastavro)"
        ) from exc
    _FASTAVRO = fastavro
    return fastavro


@dataclass(frozen=True)
class AvroSchema:
    """One parsed, checked schema: its canonical text (what is stored and compared), the parsed form fastavro
    encodes with, and its 64-bit Rabin fingerprint (Avro's CRC-64-AVRO of the parsing canonical form).

    Raises (``parse``):
        ConfigError: not JSON, not a valid Avro schema (fastavro's reason), not a record, or longer than
            ``MAX_SCHEMA_CHARS``.
    """

    text: str
    parsed: Any
    fingerprint: str

    @classmethod
    def parse(cls, schema: str | Mapping[str, Any], what: str = "schema") -> AvroSchema:
        fastavro = _fastavro()
        if isinstance(schema, str):
            if len(schema) > MAX_SCHEMA_CHARS:
                raise ConfigError(f"{what} has {len(schema):,} characters, more than {MAX_SCHEMA_CHARS:,}")
            try:
                data = json.loads(schema)
            except ValueError as exc:
                raise ConfigError(f"{what} is not JSON ({exc}); give an Avro record schema as JSON text") from exc
        elif isinstance(schema, Mapping):
            data = dict(schema)
        else:
            raise ConfigError(f"{what} must be Avro schema JSON text or a dict, got {type(schema).__name__}")
        if not isinstance(data, dict) or data.get("type") != "record":
            raise ConfigError(
                f'{what} must be an Avro record schema ({{"type": "record", "name": ..., "fields": [...]}}): a '
                f"typed stream's value is a record, whose fields become Spark columns"
            )
        try:
            parsed = fastavro.parse_schema(data, named_schemas={})
            canonical = fastavro.schema.to_parsing_canonical_form(parsed)
        except Exception as exc:
            raise ConfigError(f"{what} is not a valid Avro schema: {exc}") from exc
        text = json.dumps(data, separators=(",", ":"), sort_keys=True)
        if len(text) > MAX_SCHEMA_CHARS:
            raise ConfigError(f"{what} has {len(text):,} characters, more than {MAX_SCHEMA_CHARS:,}")
        fingerprint = fastavro.schema.fingerprint(canonical, "CRC-64-AVRO")
        return cls(text, parsed, fingerprint)

    @property
    def json(self) -> dict[str, Any]:
        """The schema as given (a fresh copy: fastavro's parsed form expands names in place)."""
        out: dict[str, Any] = json.loads(self.text)
        return out

    def encode(self, value: Any) -> bytes:
        """``value`` (a dict, or a dataclass instance) checked against this schema and encoded.

        Raises:
            SerializationError: the value does not fit the schema; the message names the field.
        """
        fastavro = _fastavro()
        datum = as_plain(value)
        try:
            fastavro.validation.validate(datum, self.parsed, raise_errors=True)
            out = io.BytesIO()
            fastavro.schemaless_writer(out, self.parsed, datum)
        except Exception as exc:
            raise SerializationError(f"the value does not fit the stream's schema: {_validation_text(exc)}") from exc
        return out.getvalue()

    def decode(self, data: bytes, reader: AvroSchema | None = None) -> Any:
        """The dict ``data`` (written with this schema) holds, projected onto ``reader``'s schema (default: this
        one). Every byte must be used: trailing bytes mean the value was not written with this schema.

        Raises:
            DeserializationError: the bytes are not a value of this schema.
        """
        fastavro = _fastavro()
        buffer = io.BytesIO(data)
        # The same schema on both sides needs no resolution (the common case: records of the reader's version).
        target = None if reader is None or reader.fingerprint == self.fingerprint else reader.parsed
        try:
            value = fastavro.schemaless_reader(buffer, self.parsed, target)
        except Exception as exc:
            raise DeserializationError(f"not an Avro value of this schema: {type(exc).__name__}: {exc}") from exc
        if buffer.tell() != len(data):
            raise DeserializationError(
                f"not an Avro value of this schema: {len(data) - buffer.tell()} of {len(data)} bytes left over"
            )
        return value


def _validation_text(exc: Exception) -> str:
    errors = getattr(exc, "errors", None) or [exc]
    texts = []
    for error in errors[:3]:
        field = getattr(error, "field", "") or ""
        datum = getattr(error, "datum", None)
        texts.append(f"field {field!r} got {datum!r}" if field else str(error))
    return "; ".join(texts)


def as_plain(value: Any) -> Any:
    """A dataclass instance as the dict of its fields (nested ones too); anything else unchanged."""
    if type(value) is dict:  # the common case, without is_dataclass's cost
        return value
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: as_plain(getattr(value, f.name)) for f in fields(value)}
    return value


@dataclass(frozen=True)
class AvroValues:
    """How a client encodes or decodes a typed stream's values, when ``"avro"`` alone does not say enough.

    Attributes:
        version: the schema version to write with (publisher) or to read into (subscriber); None = the stream's
            latest when the client starts.
        into: a subscriber's value type: a dataclass built from each decoded dict (its fields named as the
            reader schema's); None = dicts.
    """

    version: int | None = None
    into: type | None = None

    def __post_init__(self) -> None:
        if self.version is not None and (not isinstance(self.version, int) or self.version < 1):
            raise ConfigError(f"AvroValues version must be a schema version (1, 2, ...) or None, got {self.version!r}")
        if self.into is not None and not (isinstance(self.into, type) and is_dataclass(self.into)):
            raise ConfigError(f"AvroValues into must be a dataclass type or None, got {self.into!r}")


def is_typed_setting(setting: Any) -> bool:
    """Whether a client's (de)serializer setting asks for a typed stream's Avro codec (``"avro"``, ``AvroValues``)."""
    return isinstance(setting, AvroValues) or (isinstance(setting, str) and setting.strip().lower() == "avro")


def schema_version_of(headers: tuple[tuple[str, bytes], ...]) -> int | None:
    """The writer schema version a record's headers carry (the last ``meteor.schema``), None without one."""
    found = None
    for name, value in headers:
        if name == SCHEMA_HEADER:
            found = value
    if found is None:
        return None
    try:
        return int(found)
    except ValueError:
        return None


# ------------------------------------------------------------------------------------------- compatibility


def compatibility_problems(new: AvroSchema, old: AvroSchema, mode: str) -> list[str]:
    """What keeps ``new`` from following ``old`` under ``mode`` (empty: compatible): ``backward``: ``new`` reads
    data written with ``old``; ``forward``: ``old`` reads data written with ``new``; ``full``: both."""
    if mode not in COMPATIBILITY_MODES:
        raise ConfigError(f"compatibility {mode!r} is not a mode; use one of {', '.join(COMPATIBILITY_MODES)}")
    problems: list[str] = []
    if mode in ("backward", "full"):
        problems += [f"backward: {p}" for p in incompatibilities(reader=new.json, writer=old.json)]
    if mode in ("forward", "full"):
        problems += [f"forward: {p}" for p in incompatibilities(reader=old.json, writer=new.json)]
    return problems


def incompatibilities(reader: Any, writer: Any) -> list[str]:
    """Why data written with ``writer`` cannot be read with ``reader`` (Avro schema resolution), one entry per
    break, each starting with the path of the field that causes it; empty when it can."""
    return _Resolver(reader, writer).check(reader, writer, "")


class _Resolver:
    """Schema resolution over the schemas' JSON, with each side's named types (records, enums, fixed) known by
    full name as they are met, so references by name resolve; a pair of named types is checked once (recursion)."""

    def __init__(self, reader: Any, writer: Any) -> None:
        self.reader_names: dict[str, Any] = {}
        self.writer_names: dict[str, Any] = {}
        named_types(reader, "", self.reader_names)
        named_types(writer, "", self.writer_names)
        self.seen: set[tuple[int, int]] = set()

    def check(self, reader: Any, writer: Any, path: str) -> list[str]:
        reader = resolve_type(reader, self.reader_names)
        writer = resolve_type(writer, self.writer_names)
        where = path or "<value>"
        if isinstance(writer, list):  # every branch the writer may have written must be readable
            out = []
            for branch in writer:
                out += self.check(reader, branch, path)
            return out
        if isinstance(reader, list):
            for branch in reader:
                if not self.check(branch, writer, path):
                    return []
            return [
                f"{where}: type {_type_name(writer)!r} matches no branch of the reader's union {union_text(reader)}"
            ]
        rtype, wtype = type_of(reader), type_of(writer)
        if rtype != wtype:
            if rtype in _PROMOTIONS.get(wtype, ()):
                return []
            return [f"{where}: type {_type_name(writer)!r} cannot be read as {_type_name(reader)!r}"]
        if rtype in _PRIMITIVES:
            return []
        if rtype in _NAMED:
            rname, wname = reader.get("name", ""), writer.get("name", "")
            short = rname.rsplit(".", 1)[-1]
            aliases = {a.rsplit(".", 1)[-1] for a in reader.get("aliases", [])}
            if wname.rsplit(".", 1)[-1] not in {short, *aliases}:
                return [f"{where}: {rtype} {wname!r} cannot be read as {rtype} {rname!r} (names differ, no alias)"]
            pair = (id(reader), id(writer))  # a recursive type meets the same pair again: checked once
            if pair in self.seen:
                return []
            self.seen.add(pair)
        if rtype == "record":
            return self._record(reader, writer, path)
        if rtype == "enum":
            missing = [s for s in writer.get("symbols", []) if s not in reader.get("symbols", [])]
            if missing and "default" not in reader:
                return [f"{where}: enum symbols {missing} of the writer are not in the reader (and it has no default)"]
            return []
        if rtype == "fixed":
            if reader.get("size") != writer.get("size"):
                return [f"{where}: fixed size {writer.get('size')} cannot be read as size {reader.get('size')}"]
            return []
        if rtype == "array":
            return self.check(reader["items"], writer["items"], f"{path}[]")
        if rtype == "map":
            return self.check(reader["values"], writer["values"], f"{path}{{}}")
        return [f"{where}: unknown type {rtype!r}"]

    def _record(self, reader: dict[str, Any], writer: dict[str, Any], path: str) -> list[str]:
        written = {f["name"]: f for f in writer.get("fields", [])}
        out: list[str] = []
        for field in reader.get("fields", []):
            name = field["name"]
            field_path = f"{path}.{name}" if path else name
            source = written.get(name)
            if source is None:
                source = next((written[a] for a in field.get("aliases", []) if a in written), None)
            if source is None:
                if "default" not in field:
                    out.append(
                        f"{field_path}: the reader has the field and the writer does not, and it has no default "
                        f"(give it a default)"
                    )
                continue
            out += self.check(field["type"], source["type"], field_path)
        return out


def named_types(schema: Any, namespace: str, names: dict[str, Any]) -> None:
    """Every named type of ``schema`` by full name (and short name, which references within one namespace use)."""
    if isinstance(schema, list):
        for branch in schema:
            named_types(branch, namespace, names)
        return
    if not isinstance(schema, dict):
        return
    kind = schema.get("type")
    if kind in _NAMED:
        name = schema.get("name", "")
        space = schema.get("namespace", namespace) if "." not in name else name.rsplit(".", 1)[0]
        full = name if "." in name or not space else f"{space}.{name}"
        names[full] = schema
        names.setdefault(name.rsplit(".", 1)[-1], schema)
        namespace = space
    if kind == "record":
        for field in schema.get("fields", []):
            named_types(field.get("type"), namespace, names)
    elif kind == "array":
        named_types(schema.get("items"), namespace, names)
    elif kind == "map":
        named_types(schema.get("values"), namespace, names)
    elif isinstance(kind, (dict, list)):
        named_types(kind, namespace, names)


def resolve_type(schema: Any, names: dict[str, Any]) -> Any:
    """A reference by name as the named type it refers to; ``{"type": "int"}`` as ``"int"``."""
    if isinstance(schema, str) and schema not in _PRIMITIVES:
        found = names.get(schema) or names.get(schema.rsplit(".", 1)[-1])
        if found is None:
            raise ConfigError(f"the schema refers to the type {schema!r}, which it does not define")
        return found
    if isinstance(schema, dict) and isinstance(schema.get("type"), (str, list, dict)):
        kind = schema["type"]
        if isinstance(kind, (list, dict)) or (kind in _PRIMITIVES and "logicalType" not in schema):
            return resolve_type(kind, names)
    return schema


def type_of(schema: Any) -> str:
    if isinstance(schema, str):
        return schema
    kind = schema.get("type")
    return kind if isinstance(kind, str) else "?"


def _type_name(schema: Any) -> str:
    if isinstance(schema, dict) and schema.get("type") in _NAMED:
        return f"{schema['type']} {schema.get('name', '')}"
    return type_of(schema)


def union_text(branches: list[Any]) -> str:
    return "[" + ", ".join(_type_name(b) for b in branches) + "]"


# ------------------------------------------------------------------------------------------------ Spark types


def nullable_branch(union: list[Any], names: dict[str, Any], path: str) -> Any:
    """The one non-null branch of ``union``, as a Spark column's type (nullable); ``ConfigError`` for others."""
    branches = [b for b in union if resolve_type(b, names) != "null"]
    if len(branches) != 1:
        raise ConfigError(
            f"field {path or '<value>'}: the union {union_text(union)} has several non-null branches; Spark "
            f"columns take a union of null and one type only"
        )
    return branches[0]


def spark_ddl(schema: AvroSchema) -> str:
    """The Spark SQL type (DDL) a record of ``schema`` maps to, as Spark's ``from_avro`` maps it: int -> int, long
    -> bigint, float, double, boolean, string, bytes/fixed -> binary, enum -> string, array, map<string, _>, record
    -> struct, a union of null and one type -> that type (nullable). Other unions are refused.

    Raises:
        ConfigError: a union of several non-null types (naming the field); Spark's ``member0..`` structs for them
            are not offered here.
    """
    data = schema.json
    names: dict[str, Any] = {}
    named_types(data, "", names)
    return _ddl(data, names, "")


_DDL_PRIMITIVES = {
    "null": "string",
    "boolean": "boolean",
    "int": "int",
    "long": "bigint",
    "float": "float",
    "double": "double",
    "bytes": "binary",
    "string": "string",
}


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _ddl(schema: Any, names: dict[str, Any], path: str) -> str:
    schema = resolve_type(schema, names)
    if isinstance(schema, list):
        return _ddl(nullable_branch(schema, names, path), names, path)
    kind = type_of(schema)
    if kind in _DDL_PRIMITIVES:
        return _DDL_PRIMITIVES[kind]
    if kind == "record":
        cols = [f"`{f['name']}`: {_ddl(f['type'], names, _join(path, f['name']))}" for f in schema["fields"]]
        return f"struct<{', '.join(cols)}>"
    if kind == "enum":
        return "string"
    if kind == "fixed":
        return "binary"
    if kind == "array":
        return f"array<{_ddl(schema['items'], names, f'{path}[]')}>"
    if kind == "map":
        return f"map<string, {_ddl(schema['values'], names, f'{path}{{}}')}>"
    raise ConfigError(f"field {path or '<value>'}: Avro type {kind!r} has no Spark column type")
