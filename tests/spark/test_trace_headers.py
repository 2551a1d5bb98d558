"""The trace context publishers put in record headers reaches Spark: ``header_sql()`` reads ``traceparent`` from the
source's ``headers`` column in both shapes, and ``extract`` / ``traceparent`` take a row's ``headers`` as they are."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from spark_helpers import grid_options

from meteor_spark import Publisher, Record, StreamConfig
from meteor_spark.format.trace_context import TRACEPARENT_HEADER, extract, header_sql, traceparent
from meteor_spark.grid.client import Grid, GridSettings

pytestmark = [pytest.mark.spark, pytest.mark.slow]

OWN = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_spark_reads_the_traceparent_publishers_put_in_the_headers(
    spark: Any, grid: Grid, grid_settings: GridSettings, unique_name: str
) -> None:
    tracer = TracerProvider().get_tracer("test")  # not set globally: the publisher injects the current span
    with Publisher(grid, StreamConfig(unique_name, lanes=1)) as pub:
        pub.publish(b"plain")
        with tracer.start_as_current_span("request") as request:
            pub.publish(b"traced")
        pub.publish(Record(b"own", headers=((TRACEPARENT_HEADER, OWN), ("x", b"1"))))
    context = request.get_span_context()
    current = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"

    for options, as_map in (
        ({"includeHeaders": "true"}, False),
        ({"includeHeaders": "true", "headersAsMap": "true"}, True),
    ):
        df = (
            spark.read.format("meteor")
            .options(**grid_options(grid_settings))
            .option("stream", unique_name)
            .options(**options)
            .load()
            .selectExpr("CAST(value AS STRING) AS value", "headers", f"{header_sql(as_map=as_map)} AS traceparent")
            .orderBy("offset")
        )
        rows = df.collect()
        assert [(r.value, r.traceparent) for r in rows] == [
            ("plain", None),
            ("traced", current),
            ("own", OWN.decode()),
        ], options
        # a row's headers (array of (key, value) rows, or a dict) go to the Python helpers as they are
        assert [traceparent(r.headers) for r in rows] == [None, current, OWN.decode()]
        assert trace.get_current_span(extract(rows[1].headers)).get_span_context().span_id == context.span_id
