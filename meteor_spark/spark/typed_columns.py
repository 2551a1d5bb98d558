"""Typed ``value`` columns of the Spark connector: Avro values of a typed stream as a struct column and back.

Read (``valueFormat=avro``): ``schema()`` reads the stream's schemas from the registry (``meteor.schemas``) when the
query is defined, so the ``value`` column is typed from the stream's latest version (or ``valueSchemaVersion``);
the version travels to the executors in the column's metadata (``VERSION_KEY``), so every task decodes into the
same version even when a newer one is registered while the query runs. Each record is decoded with its writer's
version (its ``meteor.schema`` header) and projected onto that reader version; a record that cannot be decoded
goes through ``onCorrupt`` (error fails the task, skip drops the row and counts it, dead_letter publishes it first).

Write: a struct ``value`` column is encoded with the target stream's latest schema version, and every row gets the
``meteor.schema`` header; a binary or string ``value`` going to a stream declared ``value_format="avro"`` is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from meteor_spark.errors import ConfigError, DeserializationError
from meteor_spark.format.avro import SCHEMA_HEADER, AvroValues
from meteor_spark.format.avro_arrow import arrow_type
from meteor_spark.format.records import Record
from meteor_spark.grid.client import Grid
from meteor_spark.grid.schemas import require_subject
from meteor_spark.grid.typed_values import AvroDeserializer, AvroSerializer

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow
    from pyspark.sql.types import StructField, StructType

    from meteor_spark.consumer.refusals import Refusals
    from meteor_spark.spark.options import SourceOptions

__all__ = [
    "VERSION_KEY",
    "ValueFormat",
    "decode_values",
    "encode_values",
    "cached_encoder",
    "typed_value_field",
    "value_version_of",
]

#: Metadata key of the ``value`` field: the reader schema version the executors decode into.
VERSION_KEY = "meteor.schemaVersion"

#: Decoders per (grid, stream, version) in one worker process; a query reads one version, so this stays tiny.
_DECODERS: dict[tuple[Any, str, int], AvroDeserializer] = {}
_MAX_DECODERS = 64


def typed_value_field(options: SourceOptions, value_format: ValueFormat) -> StructField:
    """The ``value`` field of a ``valueFormat=avro`` read: the struct of the stream's schema version, with the
    version in its metadata. Connects to the grid once (``schema()`` runs when the query is defined).

    Raises:
        ConfigError: the stream has no schema, no such version, or a type with no Spark column.
    """
    from pyspark.sql.pandas.types import from_arrow_type
    from pyspark.sql.types import StructField

    (stream,) = options.streams
    with Grid(options.grid) as grid:
        subject = require_subject(grid, stream, "option valueFormat=avro")
    chosen = subject.latest if value_format.version is None else subject.version(value_format.version)
    spark_type = from_arrow_type(arrow_type(chosen.schema))
    return StructField("value", spark_type, True, metadata={VERSION_KEY: chosen.version})


def value_version_of(schema: StructType) -> int | None:
    """The reader schema version a read's ``value`` column carries (None: a bytes ``value``)."""
    for f in schema.fields:
        if f.name == "value" and VERSION_KEY in (f.metadata or {}):
            return int(f.metadata[VERSION_KEY])
    return None


def _decoder(grid: Grid, settings: Any, stream: str, version: int) -> AvroDeserializer:
    key = (settings, stream, version)
    found = _DECODERS.get(key)
    if found is None:
        if len(_DECODERS) >= _MAX_DECODERS:
            _DECODERS.clear()
        found = _DECODERS[key] = AvroDeserializer(grid, stream, AvroValues(version=version))
    return found


def decode_values(
    batch: pyarrow.RecordBatch, grid: Grid, part: Any, refusals: Refusals | None, keep_headers: bool
) -> pyarrow.RecordBatch:
    """``batch`` (with its ``headers`` column) with ``value`` decoded into the struct of ``part.value_version``;
    rows that cannot be decoded raise (``refusals`` None: ``onCorrupt=error``) or are dead-lettered / skipped
    through ``refusals``; the ``headers`` column dropped unless ``keep_headers``."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import from_arrow_type, to_arrow_type

    decoder = _decoder(grid, part.grid, part.stream, part.value_version)
    target = to_arrow_type(from_arrow_type(arrow_type(decoder.reader)))
    values = batch.column("value").to_pylist()
    headers = batch.column("headers").to_pylist()
    decoded: list[Any] = []
    keep: list[bool] = []
    for row, (data, entries) in enumerate(zip(values, headers, strict=True)):
        pairs = tuple((e["key"], e["value"]) for e in entries or ())
        try:
            decoded.append(decoder.from_record(data, pairs))
            keep.append(True)
        except DeserializationError as exc:
            offset = batch.column("offset")[row].as_py()
            error = DeserializationError(
                f"valueFormat=avro: the record at offset {offset} of stream {part.stream!r} lane {part.lane} cannot "
                f"be decoded: {exc}. The stored record is intact; onCorrupt=skip or dead_letter passes such records"
            )
            if refusals is None:
                raise error from exc
            raw = Record(data, batch.column("key")[row].as_py(), pairs, None, offset, part.lane, part.stream)
            refusals.refuse_record(raw, error)
            keep.append(False)
    index = batch.schema.get_field_index("value")
    if not all(keep):
        batch = batch.filter(pa.array(keep))
    out = batch.set_column(index, "value", pa.array(decoded, type=target))
    return out if keep_headers else out.drop_columns(["headers"])


def encode_values(
    batch: pyarrow.RecordBatch, stream: str, value_format: str, encoder: Callable[[], AvroSerializer]
) -> pyarrow.RecordBatch:
    """``batch`` with a struct ``value`` column encoded by ``encoder()`` (``stream``'s latest schema version, made
    once per task) and its rows given the ``meteor.schema`` header; unchanged when ``value`` is bytes (refused when
    the stream is typed).

    Raises:
        ConfigError: a struct ``value`` for a stream without a schema, or bytes for a typed stream.
        SerializationError: a row does not fit the schema (naming the field).
    """
    import pyarrow as pa

    column = batch.column("value")
    if not pa.types.is_struct(column.type):
        if value_format == "avro":
            raise ConfigError(
                f"stream {stream!r} is typed (value_format='avro'): write a struct 'value' column (e.g. "
                f"struct(id, customer) AS value), which is encoded with its schema, not {column.type}"
            )
        return batch
    encode = encoder()
    encoded = pa.array([encode(v) for v in column.to_pylist()], type=pa.binary())
    header = {"key": SCHEMA_HEADER, "value": encode.record_header[1]}
    if "headers" in batch.schema.names:
        given = batch.column("headers")
        rows = [_header_pairs(h) for h in given.to_pylist()]
        lists = [[*(p for p in row if p["key"] != SCHEMA_HEADER), header] for row in rows]
        batch = batch.drop_columns(["headers"])
    else:
        lists = [[header] for _ in range(batch.num_rows)]
    headers_type = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
    batch = batch.set_column(batch.schema.get_field_index("value"), "value", encoded)
    return batch.append_column("headers", pa.array(lists, type=headers_type))


def _header_pairs(row: Any) -> list[dict[str, Any]]:
    """A row's headers (array of structs, or a map's list of pairs) as ``{"key", "value": bytes}`` entries."""
    out = []
    for entry in row or ():
        key, value = (entry["key"], entry["value"]) if isinstance(entry, dict) else entry
        out.append({"key": key, "value": value.encode("utf-8") if isinstance(value, str) else value})
    return out


def cached_encoder(encoders: dict[str, AvroSerializer], grid: Grid, stream: str) -> Callable[[], AvroSerializer]:
    """What makes the encoder of a sink's struct ``value`` column for ``stream`` (its latest schema version) when
    first needed, kept in ``encoders`` (one per stream and task)."""

    def make() -> AvroSerializer:
        if stream not in encoders:
            encoders[stream] = AvroSerializer(grid, stream, AvroValues(), what="a struct 'value' column")
        return encoders[stream]

    return make


@dataclass(frozen=True)
class ValueFormat:
    """The ``valueFormat`` / ``valueSchemaVersion`` read options, parsed once (in ``schema()``)."""

    avro: bool = False
    version: int | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str], source: SourceOptions) -> ValueFormat:
        """Raises ``ConfigError`` naming the option: an unknown format, a version without ``valueFormat=avro``,
        or a typed read of several streams (each has its own schemas)."""
        from meteor_spark.spark.option_table import OPTION_TABLE
        from meteor_spark.spark.option_values import RawOptions

        raw = RawOptions(options, frozenset(d.name for d in OPTION_TABLE), "read option")
        text = (raw.text("valueFormat") or "bytes").strip().lower()
        if text not in ("bytes", "avro"):
            raise ConfigError(f"option 'valueFormat': expected bytes or avro, got {raw.text('valueFormat')!r}")
        version = raw.positive_int("valueSchemaVersion")
        if text == "bytes":
            if version is not None:
                raise ConfigError("option 'valueSchemaVersion' needs valueFormat=avro; add it or remove the version")
            return cls()
        if source.stream_pattern is not None or len(source.streams) != 1:
            raise ConfigError(
                "valueFormat=avro reads one stream (the value column is typed from its schema); give one 'stream'"
            )
        return cls(True, version)
