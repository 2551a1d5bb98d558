"""The sink's input columns (``df.write`` / ``df.writeStream`` with ``format("meteor")``): which columns and types
a row to publish may have, checked once when the query starts so a wrong column fails with its name, its type and
the list of expected columns instead of failing a task later."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    ByteType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from meteor_spark.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from meteor_spark.spark.options import SinkOptions

__all__ = ["expected_columns", "validate_input_schema"]

_INTEGER_TYPES = (ByteType, ShortType, IntegerType, LongType)

#: column -> (accepted types as text, check)
_COLUMNS: dict[str, str] = {
    "value": "binary or string, or a struct for a typed stream (required)",
    "key": "binary or string",
    "headers": "array<struct<key: string, value: binary or string>> or map<string, binary or string>",
    "timestamp": "timestamp",
    "lane": "int",
    "stream": "string",
    "topic": "string",
    "message_id": "string",
    "offset": "bigint (ignored)",
}


def expected_columns() -> str:
    return ", ".join(f"{name} {kind}" for name, kind in _COLUMNS.items())


def _type_ok(name: str, data_type: DataType) -> bool:
    if name == "value" and isinstance(data_type, StructType):  # a typed stream's value (typed_columns)
        return True
    if name in ("value", "key"):
        return isinstance(data_type, (BinaryType, StringType))
    if name == "headers" and isinstance(data_type, MapType):
        return isinstance(data_type.keyType, StringType) and isinstance(data_type.valueType, (BinaryType, StringType))
    if name == "headers":
        if not isinstance(data_type, ArrayType) or not isinstance(data_type.elementType, StructType):
            return False
        fields = {f.name: f.dataType for f in data_type.elementType.fields}
        return (
            set(fields) == {"key", "value"}
            and isinstance(fields["key"], StringType)
            and isinstance(fields["value"], (BinaryType, StringType))
        )
    if name == "timestamp":
        return isinstance(data_type, (TimestampType, TimestampNTZType))
    if name == "lane":
        return isinstance(data_type, _INTEGER_TYPES)
    if name in ("stream", "topic", "message_id"):
        return isinstance(data_type, StringType)
    if name == "offset":
        return isinstance(data_type, _INTEGER_TYPES)
    return False


def validate_input_schema(schema: StructType, options: SinkOptions) -> None:
    """Fail at query start when the rows cannot be published; the message lists the expected columns.

    Raises:
        ConfigError: a missing ``value`` column, a column of the wrong type, an unknown column, or no target
            stream (neither the ``stream`` option nor a ``stream`` column).
    """
    names = [f.name for f in schema.fields]
    expected = expected_columns()
    lowered = {n.lower(): n for n in names}
    if len(lowered) != len(names):
        raise ConfigError(f"the rows to write have duplicate column names {names}; expected columns: {expected}")
    if "value" not in names:
        hint = f" (found {lowered['value']!r}: column names are case-sensitive)" if "value" in lowered else ""
        raise ConfigError(
            f"the rows to write have no 'value' column{hint}; columns given: {', '.join(names) or 'none'}. Expected "
            f'columns: {expected}. Select or rename, e.g. df.selectExpr("CAST(id AS STRING) AS key", '
            f'"to_json(struct(*)) AS value")'
        )
    for f in schema.fields:
        if f.name not in _COLUMNS:
            raise ConfigError(
                f"the rows to write have an unknown column {f.name!r} ({f.dataType.simpleString()}); expected "
                f"columns: {expected}. Drop it or fold it into 'value' (e.g. to_json(struct(...)))"
            )
        if not _type_ok(f.name, f.dataType):
            raise ConfigError(
                f"column {f.name!r} has type {f.dataType.simpleString()}, expected {_COLUMNS[f.name]}; cast it "
                f"(expected columns: {expected})"
            )
    if options.stream is None and "stream" not in names:
        raise ConfigError(
            'no target stream: set option \'stream\' (or save("name") / start("name")), or give the rows a '
            "'stream' column"
        )
