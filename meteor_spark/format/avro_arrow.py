"""Typed values as Arrow columns, both directions: decoded Avro values -> an Arrow struct column (the Spark source
with ``valueFormat=avro``), an Arrow struct column -> the dicts an Avro schema encodes (the Spark sink).

The Arrow type of a schema mirrors ``avro.spark_ddl`` field for field (Spark compares the Arrow schema a reader
yields with the one it planned), every field nullable as Spark's are: int -> int32, long -> int64, float ->
float32, double -> float64, boolean, string / enum -> string, bytes / fixed -> binary, array -> list, map ->
map<string, _>, record -> struct, a union of null and one type -> that type.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from meteor_spark.errors import ConfigError
from meteor_spark.format.avro import AvroSchema, named_types, nullable_branch, resolve_type, type_of

__all__ = ["arrow_type", "struct_column"]

_ARROW_PRIMITIVES = {
    "null": pa.string(),
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "bytes": pa.binary(),
    "string": pa.string(),
}


def arrow_type(schema: AvroSchema) -> pa.DataType:
    """The Arrow type (a struct) of the records ``schema`` describes.

    Raises:
        ConfigError: a union of several non-null types (naming the field), as ``spark_ddl``.
    """
    data = schema.json
    names: dict[str, Any] = {}
    named_types(data, "", names)
    return _arrow(data, names, "")


def _arrow(schema: Any, names: dict[str, Any], path: str) -> pa.DataType:
    schema = resolve_type(schema, names)
    if isinstance(schema, list):
        return _arrow(nullable_branch(schema, names, path), names, path)
    kind = type_of(schema)
    if kind in _ARROW_PRIMITIVES:
        return _ARROW_PRIMITIVES[kind]
    if kind == "record":
        return pa.struct(
            [
                pa.field(f["name"], _arrow(f["type"], names, f"{path}.{f['name']}" if path else f["name"]))
                for f in schema["fields"]
            ]
        )
    if kind == "enum":
        return pa.string()
    if kind == "fixed":
        return pa.binary()
    if kind == "array":
        return pa.list_(_arrow(schema["items"], names, f"{path}[]"))
    if kind == "map":
        return pa.map_(pa.string(), _arrow(schema["values"], names, f"{path}{{}}"))
    raise ConfigError(f"field {path or '<value>'}: Avro type {kind!r} has no Arrow column type")


def struct_column(values: list[Any], data_type: pa.DataType) -> pa.Array:
    """Decoded values (dicts, None for none) as one Arrow column of ``data_type`` (``arrow_type``)."""
    return pa.array(values, type=data_type)
