"""The Spark side of ``meteor bench spark`` (kept in ``meteor_spark.spark``, the only package that imports pyspark):
the Spark connector's throughput next to ceilings measured in the same run.

Setup: an embedded grid in its own process, a local[2] SparkSession, 100-byte records.

* **write**: ``spark.range(n)`` turned into 100-byte ``value``s and **cached** (materialised once, so both the
  ceiling and the connector measure handing rows to Python and what happens there, not Spark generating strings:
  uncached, generating them alone capped the ceiling at ~1.3-2.3M rows/s on 2 cores), ``df.write.format("meteor")``
  into a new stream of 1 (then 4) lanes; ceiling: the same DataFrame into a no-op Python Arrow writer. Wall time of
  the write job.
* **read**: ``readStream.format("meteor")`` of that stream with ``Trigger.AvailableNow`` into the ``noop`` sink,
  with the connector's default task planning (or ``--partitions``); rows / ``addBatch`` time summed over the
  batches; ceiling: a synthetic Python Arrow stream source with the same schema (Arrow built from buffers, no grid)
  and as many tasks as the machine has cores (or ``--partitions``), into the same sink.

Figures are steady state: a warm-up first runs a small meteor write and read, because the first task of every
Python worker imports meteor and connects its grid client (reported as ``warm-up``; a long-running query pays it
once per worker), then 500,000 rows through every path so the JVM has compiled them. Each measurement is
repeated (``--repeat``, ceilings interleaved with the runs they bound; the two writes alternate which goes first;
the lane counts alternate run by run, so the JVM getting cheaper over a session weighs on each alike)
and the **median** is reported, because a shared 2-core machine varies by tens of percent between runs; the load
average before and after is printed next to the table. The share of the ceiling is the median of each run's own
ratio (meteor over the ceiling measured right beside it, so a slow moment of the machine weighs on both sides of
one ratio instead of on one side of the medians), printed with the lowest and highest run's, so the table shows
how far one run can be trusted. Both writes read the same cached DataFrame with the same partitions (in workers of
their own: measured, Spark ran each side's tasks in its own pair of Python workers all session). Every timed job
starts once the Python processes and the member are idle (``process_cpu.settle``): a job's workers go on after
Spark reports it done (PySpark's full garbage collection after every task, 25-55 ms of CPU each), and that work used
to run inside the next job's time, whichever side that was; it now counts in the CPU of the job that caused it.

Next to the table, CPU time per record of every path, split by process (``process_cpu``: the JVM, PySpark's
Python task workers, the other Python processes Spark starts to plan a query, the grid member, the driver),
medians of the runs: the share of a path that is Spark's own (the JVM, and PySpark's task worker, which the
ceilings pay as well) and what the connector adds on top (the difference in task workers and member against the
ceiling). The planning processes are mostly a fixed cost per query (a streaming query starts its own Python source
runner), so they are left out of the CPU share printed under the table: the ceiling's CPU per record over meteor's,
both without planning, which is what the wall-time ratio approaches on a machine whose cores are all busy. CPU per
record varies far less than wall time on a shared machine.

Targets on 2 cores: read >= 4,000,000 records/s and >= 80% of its ceiling; write >= 2,000,000 records/s; 4 lanes
no worse than 1 lane.
"""

from __future__ import annotations

import functools
import logging
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)

from meteor_spark.bench.jobs import process_cpu
from meteor_spark.bench.jobs.session import bench_member_session
from meteor_spark.config import grid_options
from meteor_spark.format.arrow_columns import ARROW_SCHEMA
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.streams import StreamConfig, open_stream
from meteor_spark.groups.admin import delete_stream
from meteor_spark.spark.datasource import SOURCE_SCHEMA
from meteor_spark.spark.planning import default_partitions
from meteor_spark.tables import render_table

logger = logging.getLogger(__name__)

RECORD_BYTES = 100
READ_TARGET = 4_000_000
WRITE_TARGET = 2_000_000
#: Rows sent through every path before measuring, so the JVM has compiled them (runs of at least this many rows).
VOLUME_WARM_UP_ROWS = 500_000
#: The paths whose CPU per record is measured, in the order the CPU table prints them.
CPU_PATHS = ("write", "write ceiling", "read", "read ceiling")


def run(records: int, lane_counts: Sequence[int], partitions: int | None, repeat: int = 5) -> dict[str, Any]:
    """Run the benchmark and return the figures (medians; ``samples`` holds every run); ``render`` prints them."""
    load_before = os.getloadavg()
    # The same quiet, local[2] settings as the demo (conf/spark-defaults.conf, conf/log4j2.properties), with more
    # driver memory for the cached write input.
    with bench_member_session("meteor-bench-spark", {"spark.driver.memory": "3g"}) as (spark, settings, server):
        spark.dataSource.register(SyntheticSource)
        spark.dataSource.register(NoopArrowSink)
        input_tasks = partitions or default_partitions()
        rows = (
            spark.range(records, numPartitions=input_tasks)
            .selectExpr(f"CAST(lpad(CAST(id AS STRING), {RECORD_BYTES}, 'x') AS BINARY) AS value")
            .cache()
        )
        try:
            rows.count()
            figures = _measure(spark, settings, rows, records, lane_counts, partitions, input_tasks, repeat, server.pid)
        finally:
            rows.unpersist()
        figures["load_average"] = (load_before[0], os.getloadavg()[0])
        return figures


def _measure(
    spark: Any,
    settings: GridSettings,
    rows: Any,
    records: int,
    lane_counts: Sequence[int],
    partitions: int | None,
    input_tasks: int,
    repeat: int,
    member_pid: int | None,
) -> dict[str, Any]:
    """The warm-up, then ``repeat`` runs of every path per lane count, over the cached 100-byte ``rows``."""
    options = grid_options(settings)
    # Meteor's read planning unless --partitions pins the task count (then min = max = partitions).
    planning = {} if partitions is None else {"minPartitions": str(partitions), "maxPartitions": str(partitions)}

    def meteor_read(name: str) -> Any:
        return (
            spark.readStream.format("meteor")
            .options(**options)
            .option("stream", name)
            .option("startingOffsets", "earliest")
            .options(**planning)
            .load()
        )

    def ceiling_read(n: int) -> Any:
        return (
            spark.readStream.format("bench-synthetic")
            .option("rows", str(n))
            .option("partitions", str(input_tasks))
            .load()
        )

    figures: dict[str, Any] = {"records": records, "repeat": repeat, "samples": {}, "cpu": {}}
    with Grid(settings) as grid:
        figures["warm_up_s"] = _warm_up(
            spark, grid, rows, options, records, max(lane_counts), meteor_read, ceiling_read
        )
        # Lane counts alternate run by run rather than one after the other: the JVM keeps getting cheaper over a
        # session (a write ceiling's JVM CPU per record fell by a fifth between the first lane count's runs and the
        # second's), so a lane count measured second had the cheaper ceilings and the lower shares.
        samples = {lanes: _empty_samples() for lanes in lane_counts}
        cpu = {lanes: _empty_cpu() for lanes in lane_counts}
        for run_index in range(repeat):
            for lanes in lane_counts:
                _one_run(
                    grid,
                    rows,
                    options,
                    records,
                    lanes,
                    run_index,
                    meteor_read,
                    ceiling_read,
                    member_pid,
                    samples[lanes],
                    cpu[lanes],
                )
        for lanes in lane_counts:
            figures["samples"][f"{lanes}_lanes"] = samples[lanes]
            figures[f"{lanes}_lanes"] = _medians(samples[lanes])
            figures["cpu"][f"{lanes}_lanes"] = _cpu_medians(cpu[lanes])
    return figures


def _warm_up(
    spark: Any,
    grid: Grid,
    rows: Any,
    options: dict[str, str],
    records: int,
    lanes: int,
    meteor_read: Callable[[str], Any],
    ceiling_read: Callable[[int], Any],
) -> float:
    """Run every path once before anything is timed; returns the seconds the meteor part took."""
    # Warm-up: the first Python task and the first streaming query of a session pay for starting workers;
    # the first meteor task of each worker pays for importing meteor and connecting its grid client.
    rows.limit(1000).write.format("bench-noop-arrow").mode("append").save()
    _stream_seconds(ceiling_read(1000))
    warm = f"bench-spark-warm-{uuid.uuid4().hex[:6]}"
    open_stream(grid, StreamConfig(warm, lanes=lanes))
    started = time.perf_counter()
    spark.range(2000, numPartitions=2).selectExpr("CAST(id AS STRING) AS value").write.format("meteor").options(
        **options
    ).mode("append").save(warm)
    _stream_seconds(meteor_read(warm).selectExpr("value"))
    warm_up_s = time.perf_counter() - started
    # Then at volume, untimed: the JVM compiles its Arrow/row conversion paths only after enough rows,
    # and whichever run comes first would otherwise pay for it (it was often the slowest sample).
    # Quick runs (tests) skip it: their figures are not meant to be precise.
    if records >= VOLUME_WARM_UP_ROWS:
        rows.limit(VOLUME_WARM_UP_ROWS).write.format("bench-noop-arrow").mode("append").save()
        rows.limit(VOLUME_WARM_UP_ROWS).write.format("meteor").options(**options).mode("append").save(warm)
        _stream_seconds(meteor_read(warm))
        _stream_seconds(ceiling_read(VOLUME_WARM_UP_ROWS))
    delete_stream(grid, warm)
    return warm_up_s


def _empty_samples() -> dict[str, list[float]]:
    return {
        "read_records_per_s": [],
        "read_ceiling_records_per_s": [],
        "write_records_per_s": [],
        "write_ceiling_records_per_s": [],
    }


def _empty_cpu() -> dict[str, list[dict[str, float]]]:
    return {path: [] for path in CPU_PATHS}


def _one_run(
    grid: Grid,
    rows: Any,
    options: dict[str, str],
    records: int,
    lanes: int,
    run_index: int,
    meteor_read: Callable[[str], Any],
    ceiling_read: Callable[[int], Any],
    member_pid: int | None,
    samples: dict[str, list[float]],
    cpu: dict[str, list[dict[str, float]]],
) -> None:
    """One run of the four paths (meteor and ceiling, write and read) on a fresh stream of ``lanes`` lanes: adds
    its records/s per path to ``samples`` and its CPU per record of each kind of process to ``cpu``
    (``process_cpu``; the whole job or query, start-up included)."""

    def timed(path: str, action: Callable[[], Any]) -> Any:
        # Each path starts on idle Python workers, and its CPU counts the collections its workers run after it.
        process_cpu.settle(member_pid)
        before = process_cpu.sample(member_pid)
        outcome = action()
        process_cpu.settle(member_pid)
        cpu[path].append(process_cpu.per_record(before, process_cpu.sample(member_pid), records))
        return outcome

    name = f"bench-spark-{lanes}-{uuid.uuid4().hex[:6]}"
    capacity = max(10_000, 4 * records // 1000)
    open_stream(grid, StreamConfig(name, lanes=lanes, capacity=capacity))
    try:
        write_ceiling = functools.partial(rows.write.format("bench-noop-arrow").mode("append").save)
        write = functools.partial(rows.write.format("meteor").options(**options).mode("append").save, name)
        # Sides alternate which goes first, so neither always runs right after the other's job.
        if run_index % 2:
            write_s = timed("write", functools.partial(_timed, write))
            write_ceiling_s = timed("write ceiling", functools.partial(_timed, write_ceiling))
        else:
            write_ceiling_s = timed("write ceiling", functools.partial(_timed, write_ceiling))
            write_s = timed("write", functools.partial(_timed, write))
        read_s, read_rows = timed("read", functools.partial(_read_stream, meteor_read, name))
        if read_rows != records:
            raise RuntimeError(f"the read returned {read_rows} rows, {records} were written")
        ceiling_s, ceiling_rows = timed("read ceiling", lambda: _stream_seconds(ceiling_read(records)))
    finally:
        delete_stream(grid, name)
    samples["write_ceiling_records_per_s"].append(records / write_ceiling_s)
    samples["write_records_per_s"].append(records / write_s)
    samples["read_records_per_s"].append(read_rows / read_s)
    samples["read_ceiling_records_per_s"].append(ceiling_rows / ceiling_s)


def _cpu_medians(cpu: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Per path, the median over its runs of each kind's CPU ns per record (empty where ``/proc`` is not
    readable)."""
    return {
        path: {kind: statistics.median(run[kind] for run in runs) for kind in runs[0]}
        for path, runs in cpu.items()
        if runs and runs[0]
    }


def _medians(samples: dict[str, list[float]]) -> dict[str, Any]:
    """Per path the median of its runs, and per side (read, write) the median and range of meteor / ceiling, each
    run against the ceiling of the same run (so a slow moment of the machine hits both)."""
    figures: dict[str, Any] = {key: statistics.median(values) for key, values in samples.items()}
    for side in ("read", "write"):
        ratios = [
            ours / ceiling
            for ours, ceiling in zip(
                samples[f"{side}_records_per_s"], samples[f"{side}_ceiling_records_per_s"], strict=True
            )
        ]
        figures[f"{side}_vs_ceiling"] = statistics.median(ratios)
        figures[f"{side}_vs_ceiling_range"] = (min(ratios), max(ratios))
    return figures


def _timed(action: Callable[[], Any]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def _read_stream(read: Callable[[str], Any], stream: str) -> tuple[float, int]:
    return _stream_seconds(read(stream))


def _stream_seconds(df: Any) -> tuple[float, int]:
    """(sum of addBatch seconds, rows) of an AvailableNow run of ``df`` into the noop sink."""
    with tempfile.TemporaryDirectory(prefix="meteor-bench-") as checkpoint:
        query = (
            df.writeStream.format("noop").option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
        )
        query.awaitTermination()
        progress = [p for p in query.recentProgress if p["numInputRows"]]
    seconds = sum(p["durationMs"].get("addBatch", 0) for p in progress) / 1000
    return max(seconds, 1e-9), sum(p["numInputRows"] for p in progress)


def render(figures: dict[str, Any]) -> str:
    """The figures of ``run`` as the table ``meteor bench spark`` prints."""
    rows = []
    for key in figures["samples"]:
        lanes = int(key.split("_")[0])
        f = figures[f"{lanes}_lanes"]
        for side, target in (("read", READ_TARGET), ("write", WRITE_TARGET)):
            low, high = f[f"{side}_vs_ceiling_range"]
            rows.append(
                [
                    f"{side}, {lanes} lane(s)",
                    f"{f[f'{side}_records_per_s']:,.0f}",
                    f"{f[f'{side}_ceiling_records_per_s']:,.0f}",
                    f"{f[f'{side}_vs_ceiling']:.0%}",
                    f"{low:.0%}-{high:.0%}",
                    f"{target:,}",
                ]
            )
    before, after = figures["load_average"]
    return "\n".join(
        [
            f"meteor bench spark: {figures['records']:,} records of {RECORD_BYTES} bytes, local[2], median of "
            f"{figures['repeat']} run(s)",
            render_table(
                ["RUN", "RECORDS/S", "CEILING/S", "OF CEILING", "RUNS", "TARGET/S"], rows, right=[1, 2, 3, 4, 5]
            ),
            f"warm-up (first meteor write + read of the session: workers import meteor and connect): "
            f"{figures['warm_up_s']:.1f} s; load average {before:.2f} before, {after:.2f} after",
            "records/s: medians; of ceiling: the median of each run's ratio to the ceiling measured beside it; "
            "runs: the lowest and highest run's ratio",
            *_render_cpu(figures.get("cpu", {})),
        ]
    )


def _render_cpu(cpu: dict[str, dict[str, dict[str, float]]]) -> list[str]:
    """The CPU table: per lane count and path, ns of CPU per record by kind of process (medians of the runs)."""
    rows = [
        [f"{path}, {key.split('_')[0]} lane(s)", *(f"{by_kind[kind]:,.0f}" for kind in (*process_cpu.KINDS, "total"))]
        for key, paths in cpu.items()
        for path, by_kind in paths.items()
    ]
    if not rows:
        return []
    return [
        render_table(
            ["CPU NS/RECORD", "JVM", "PY TASKS", "PY PLANNING", "MEMBER", "DRIVER", "TOTAL"],
            rows,
            right=[1, 2, 3, 4, 5, 6],
        ),
        "CPU: every process of the job or query, start-up included (jvm: Spark's own work; py tasks: PySpark's task "
        "workers, the data source's read/write with PySpark's Arrow transfer around it; py planning: the Python "
        "processes that plan the query, mostly a fixed cost per query; member: the embedded grid)",
        *_cpu_shares(cpu),
    ]


def _cpu_shares(cpu: dict[str, dict[str, dict[str, float]]]) -> list[str]:
    """Per lane count and side, the ceiling's CPU per record over meteor's without the planning processes, and what
    the connector adds in the task workers and the member."""
    lines = []
    for key, paths in cpu.items():
        for side in ("read", "write"):
            ours, ceiling = paths.get(side), paths.get(f"{side} ceiling")
            if not ours or not ceiling:
                continue
            own = ours["total"] - ours["python planning"]
            bound = ceiling["total"] - ceiling["python planning"]
            lines.append(
                f"{side}, {key.split('_')[0]} lane(s): CPU share {bound / own:.0%} (ceiling {bound:,.0f} ns/record, "
                f"meteor {own:,.0f}, without planning); the connector adds "
                f"{ours['python tasks'] - ceiling['python tasks']:+,.0f} ns in the task workers, "
                f"{ours['member'] - ceiling['member']:+,.0f} ns in the member"
            )
    return lines


# ---------------------------------------------------------------------------------------------- the ceilings


@dataclass(frozen=True)
class RowRange(InputPartition):
    """Rows ``[start, end)`` of a synthetic bench source (this one's and ``latency_benchmark``'s)."""

    start: int
    end: int


class SyntheticSource(DataSource):
    """In-memory Arrow stream source with meteor's schema: the read ceiling (no grid, no decoding)."""

    @classmethod
    def name(cls) -> str:
        return "bench-synthetic"

    def schema(self) -> Any:
        return SOURCE_SCHEMA

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return _SyntheticReader(int(self.options["rows"]), int(self.options["partitions"]))


class _SyntheticReader(DataSourceStreamReader):
    def __init__(self, rows: int, partitions: int) -> None:
        self.rows = rows
        self.partitions_count = partitions

    def initialOffset(self) -> dict:
        return {"rows": 0}

    def latestOffset(self, start: dict, limit: Any) -> dict:
        return {"rows": self.rows}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        lo, hi = start["rows"], end["rows"]
        step = -(-(hi - lo) // self.partitions_count)
        return [RowRange(a, min(hi, a + step)) for a in range(lo, hi, step)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        import numpy as np
        import pyarrow as pa

        assert isinstance(partition, RowRange)
        chunk = 65_536
        data = pa.py_buffer(b"x" * (RECORD_BYTES * chunk))
        value_offsets = pa.py_buffer((np.arange(chunk + 1, dtype=np.int32) * RECORD_BYTES).tobytes())
        now = pa.scalar(int(time.time() * 1_000_000), pa.timestamp("us", tz="UTC"))
        for lo in range(partition.start, partition.end, chunk):
            n = min(chunk, partition.end - lo)
            values = pa.Array.from_buffers(pa.binary(), chunk, [None, value_offsets, data]).slice(0, n)
            yield pa.RecordBatch.from_arrays(
                [
                    pa.nulls(n, pa.binary()),
                    values,
                    pa.array(["synthetic"] * 1, pa.string()).take(pa.array(np.zeros(n, dtype=np.int32))),
                    pa.array(np.zeros(n, dtype=np.int32)),
                    pa.array(np.arange(lo, lo + n, dtype=np.int64)),
                    pa.array(np.full(n, now.value, dtype=np.int64)).cast(pa.timestamp("us", tz="UTC")),
                ],
                schema=ARROW_SCHEMA,
            )


class NoopArrowSink(DataSource):
    """A Python Arrow writer that drops its rows: the write ceiling."""

    @classmethod
    def name(cls) -> str:
        return "bench-noop-arrow"

    def writer(self, schema: Any, overwrite: bool) -> DataSourceArrowWriter:
        return _NoopWriter()


class _NoopWriter(DataSourceArrowWriter):
    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        for _ in iterator:
            pass
        return WriterCommitMessage()
