"""The Spark side of ``meteor bench spark --pushdown``: a batch read's ``where timestamp >= t`` selecting the newest
1 % of a stream, with filter pushdown on and off (``spark.sql.python.filterPushdown.enabled``), side by side.

Setup: an embedded grid in its own process, a local[2] SparkSession with the packaged defaults, a stream of
``--records`` records over 4 lanes written by one Spark task (so each lane's timestamps rise: record ``i`` has
time ``T0 + i`` ms and lane ``i % 4``), the default publisher batching.

Per run and side: wall time of ``df.where(...).count()`` (planning included, since pushdown moves work into
planning), the rows it counted, and the ring items read: the reader's own planning of the same read run in this
process (``MeteorBatchReader.planned_items``; executors read exactly the planned ranges). A warm-up read first
starts Spark's Python workers; the sides alternate which goes first; medians of ``--repeat`` runs.

Target (issue 22): the pushed read reads at most 2 % of the items.
"""

from __future__ import annotations

import statistics
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from pyspark.sql.datasource import GreaterThanOrEqual

from meteor_spark.bench.jobs.session import bench_session
from meteor_spark.config import grid_options
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.streams import StreamConfig, open_stream
from meteor_spark.groups.admin import delete_stream
from meteor_spark.spark.batch_reader import MeteorBatchReader, MeteorPushdownReader
from meteor_spark.spark.datasource import SOURCE_SCHEMA
from meteor_spark.spark.options import SourceOptions
from meteor_spark.tables import render_table

PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"
LANES = 4
SELECTED = 0.01
#: The first record's timestamp (ms since the epoch); record i is T0 + i.
T0 = 1_700_000_000_000
#: Largest share of the items the pushed read may read (issue 22).
TARGET_SHARE = 0.02


def run(records: int, repeat: int) -> dict[str, Any]:
    """Fill a stream of ``records`` records and time the filtered read with and without pushdown."""
    with bench_session("meteor-bench-pushdown") as (spark, settings):
        options = {**grid_options(settings)}
        name = f"bench-pushdown-{uuid.uuid4().hex[:6]}"
        with Grid(settings) as grid:
            open_stream(grid, StreamConfig(name, lanes=LANES, capacity=max(10_000, 4 * records // 1000)))
            try:
                return _measure(spark, settings, options, name, records, repeat)
            finally:
                delete_stream(grid, name)


def _measure(
    spark: Any, settings: GridSettings, options: dict[str, str], name: str, records: int, repeat: int
) -> dict[str, Any]:
    started = time.perf_counter()
    spark.range(records, numPartitions=1).selectExpr(
        "CAST(id AS STRING) AS value", f"CAST(id % {LANES} AS INT) AS lane", f"timestamp_millis({T0} + id) AS timestamp"
    ).write.format("meteor").options(**options).mode("append").save(name)
    fill_s = time.perf_counter() - started
    since = datetime.fromtimestamp((T0 + records - max(1, round(records * SELECTED))) / 1000, UTC)
    where = f"timestamp >= '{since.isoformat()}'"
    reader_options = SourceOptions.parse({**options, "stream": name}, batch=True)
    items = {False: _planned(reader_options, None), True: _planned(reader_options, since)}
    saved = spark.conf.get(PUSHDOWN_CONF)
    seconds: dict[bool, list[float]] = {False: [], True: []}
    rows: dict[bool, int] = {}
    try:
        _count(spark, options, name, where, pushdown=True)  # warm-up: Python workers, grid clients
        for run_index in range(repeat):
            for pushdown in (True, False) if run_index % 2 == 0 else (False, True):
                took, rows[pushdown] = _count(spark, options, name, where, pushdown=pushdown)
                seconds[pushdown].append(took)
    finally:
        spark.conf.set(PUSHDOWN_CONF, saved)
    if rows[True] != rows[False]:
        raise AssertionError(f"pushdown changed the result: {rows[True]} rows with it, {rows[False]} without")
    return {
        "records": records,
        "repeat": repeat,
        "where": where,
        "fill_s": fill_s,
        "sides": {
            "pushed" if pushdown else "not pushed": {
                "rows": rows[pushdown],
                "items_read": items[pushdown],
                "items_share": items[pushdown] / items[False] if items[False] else 0.0,
                "wall_s": statistics.median(seconds[pushdown]),
            }
            for pushdown in (False, True)
        },
    }


def _planned(options: SourceOptions, since: datetime | None) -> int:
    """Ring items the read plans (what its tasks read): with the timestamp filter pushed, or without it."""
    reader = (
        MeteorBatchReader(options, SOURCE_SCHEMA) if since is None else MeteorPushdownReader(options, SOURCE_SCHEMA)
    )
    if since is not None:
        list(reader.pushFilters([GreaterThanOrEqual(("timestamp",), since)]))
    reader.partitions()
    return reader.planned_items or 0


def _count(spark: Any, options: dict[str, str], name: str, where: str, *, pushdown: bool) -> tuple[float, int]:
    spark.conf.set(PUSHDOWN_CONF, str(pushdown).lower())
    started = time.perf_counter()
    count = spark.read.format("meteor").options(**options).option("stream", name).load().where(where).count()
    return time.perf_counter() - started, int(count)


def render(figures: dict[str, Any]) -> str:
    """The figures of ``run`` as the table ``meteor bench spark --pushdown`` prints."""
    rows = [
        [side, f"{f['rows']:,}", f"{f['items_read']:,}", f"{f['items_share']:.2%}", f"{f['wall_s']:.2f}"]
        for side, f in figures["sides"].items()
    ]
    pushed = figures["sides"]["pushed"]
    verdict = "met" if pushed["items_share"] <= TARGET_SHARE else "MISSED"
    return "\n".join(
        [
            f"meteor bench spark --pushdown: {figures['records']:,} records over {LANES} lanes (filled in "
            f"{figures['fill_s']:.1f} s), where {figures['where']} (the newest {SELECTED:.0%}), local[2], median of "
            f"{figures['repeat']} run(s)",
            render_table(["READ", "ROWS", "RING ITEMS READ", "OF ALL ITEMS", "WALL S"], rows, right=[1, 2, 3, 4]),
            f"target: the pushed read reads <= {TARGET_SHARE:.0%} of the items: {verdict}",
        ]
    )
