"""``format("meteor")``: the Spark data source (PySpark Python Data Source API, PySpark >= 4.2).

Where each piece runs ::

    planner worker     MeteorDataSource(options) -> schema()                 (at load(); errors surface there)
    source runner      streamReader() #1: initialOffset, latestOffset, partitions, commit   (driver side, one
                       long-lived process per query run: it holds the group's leases; with shared=true
                       it is the shared group's member: spark.shared_reader)
    planner worker     streamReader() #2: pickled into the read UDF (never talks to the grid)
    executor workers   #2.read(partition): reads its lane range(s) from the grid, yields Arrow batches
    planner worker     streamWriter()/writer(): validates the input schema; pickled into the write UDF
    executor workers   write(batches): publishes through the core Publisher
    commit worker      commit(messages, batchId): records the committed batch id (no duplicates on replay)

Module imports stay light on purpose: Spark imports ``pyspark_meteor`` (which imports this module) in every
data-source lookup, so the reader and writer modules (and the grid client) load only when used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from meteor_spark.spark import worker_heap

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession
    from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, DataSourceWriter

    from meteor_spark.spark.options import SinkOptions, SourceOptions
#: Row schema of the source (Kafka's column names where the concept is the same: topic -> stream,
#: partition -> lane). Every field is nullable: Spark compares the Arrow schema of read() with this one exactly.
SOURCE_SCHEMA = StructType(
    [
        StructField("key", BinaryType(), True),
        StructField("value", BinaryType(), True),
        StructField("stream", StringType(), True),
        StructField("lane", IntegerType(), True),
        StructField("offset", LongType(), True),
        StructField("timestamp", TimestampType(), True),
    ]
)

HEADERS_TYPE = ArrayType(
    StructType([StructField("key", StringType(), True), StructField("value", BinaryType(), True)]), True
)

SOURCE_SCHEMA_WITH_HEADERS = StructType([*SOURCE_SCHEMA.fields, StructField("headers", HEADERS_TYPE, True)])

#: ``headersAsMap``: one value per header key (the last one of the record).
HEADERS_MAP_TYPE = MapType(StringType(), BinaryType(), True)

SOURCE_SCHEMA_WITH_HEADERS_MAP = StructType([*SOURCE_SCHEMA.fields, StructField("headers", HEADERS_MAP_TYPE, True)])


class MeteorDataSource(DataSource):
    """Read and write Meteor streams: ``spark.readStream.format("meteor").option("stream", "orders").load()``.

    Options are documented in ``meteor_spark.spark.option_table.OPTION_TABLE`` (and docs/spark.md). They are parsed
    once, here, into frozen objects; an unknown or invalid option fails with a message naming it: at ``load()`` for a
    read (``schema()``), at ``save()`` for a batch write (``writer()``), and for a streaming write when its first
    micro-batch is planned, as a ``StreamingQueryException`` of the query: PySpark calls nothing of a Python data
    source at ``writeStream.start()`` (measured: ``__init__`` and ``streamWriter()`` run first in a planner worker
    at the first batch, ``schema()`` never runs for a write).
    """

    @classmethod
    def name(cls) -> str:
        return "meteor"

    def _source_options(self, *, batch: bool) -> SourceOptions:
        from meteor_spark.spark.options import SourceOptions

        worker_heap.freeze_long_lived()  # this worker plans reads: its imports are long-lived

        return SourceOptions.parse(self.options, batch=batch)

    def _sink_options(self) -> SinkOptions:
        from meteor_spark.spark.options import SinkOptions

        worker_heap.freeze_long_lived()  # this worker plans writes: its imports are long-lived

        return SinkOptions.parse(self.options)

    def schema(self) -> StructType:
        # Validate the options now: schema() runs at load(), the one place where Spark reports errors synchronously
        # (everything later surfaces asynchronously as a StreamingQueryException).
        # Whether this is a batch or a streaming read is not known yet; reader()/streamReader() check the rest.
        from meteor_spark.spark.options import SourceOptions
        from meteor_spark.spark.typed_columns import ValueFormat, typed_value_field

        options = SourceOptions.parse(self.options, batch=None)
        if not options.include_headers:
            schema = SOURCE_SCHEMA
        else:
            schema = SOURCE_SCHEMA_WITH_HEADERS_MAP if options.headers_as_map else SOURCE_SCHEMA_WITH_HEADERS
        value_format = ValueFormat.parse(self.options, options)
        if value_format.avro:  # the stream's schema, read from the grid now: the plan needs the column's type
            typed = typed_value_field(options, value_format)
            schema = StructType([typed if f.name == "value" else f for f in schema.fields])
        if options.shared:  # how often the record was delivered to the group (1 the first time)
            return StructType([*schema.fields, StructField("delivery_count", IntegerType(), True)])
        return schema

    def reader(self, schema: StructType) -> DataSourceReader:
        # pushFilters only where Spark asks for it: a reader class with it fails every read while
        # spark.sql.python.filterPushdown.enabled is off (compat.planning_filter_pushdown says why).
        from meteor_spark.compat import planning_filter_pushdown
        from meteor_spark.spark.batch_reader import MeteorBatchReader, MeteorPushdownReader

        kind = MeteorPushdownReader if planning_filter_pushdown() else MeteorBatchReader
        return kind(self._source_options(batch=True), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = self._source_options(batch=False)
        if options.shared:
            from meteor_spark.spark.shared_reader import MeteorSharedStreamReader

            return MeteorSharedStreamReader(options, schema)
        from meteor_spark.spark.reader import MeteorStreamReader

        return MeteorStreamReader(options, schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from meteor_spark.spark.writer import MeteorBatchWriter

        return MeteorBatchWriter(self._sink_options(), schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> Any:
        from meteor_spark.spark.writer import MeteorStreamWriter

        return MeteorStreamWriter(self._sink_options(), schema, overwrite)


def register(spark: SparkSession) -> None:
    """Register ``format("meteor")`` in ``spark`` explicitly.

    Not needed after ``pip install meteor-spark``: Spark finds the ``pyspark_meteor`` package by itself. Use it
    when the package is not installed in the Python that Spark's workers run (then also make ``meteor_spark``
    importable there, e.g. ``PYTHONPATH``).

    Checks first that the workers' interpreter can import ``meteor_spark`` (``workers.ensure_workers_python``): on
    a local master, one that cannot is replaced by this interpreter; elsewhere it is a ``ConfigError`` naming
    ``PYSPARK_PYTHON`` and the fix, at once rather than as a worker's ``ModuleNotFoundError`` at the first read.
    """
    from meteor_spark.spark.workers import ensure_workers_python

    ensure_workers_python(spark)
    spark.dataSource.register(MeteorDataSource)
