"""The shared-group source (``shared=true``): records acquired per micro-batch, spread over more tasks than lanes,
acknowledged when the batch commits, replayed exactly after a failure, dead-lettered after the group's limit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from spark_helpers import grid_options, make_stream, put_items, values_items

from meteor_spark.errors import ConfigError
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.groups.shared_state import SHARE_MAP, LaneShare
from meteor_spark.groups.store import lane_key
from meteor_spark.spark.options import SourceOptions

pytestmark = [pytest.mark.spark, pytest.mark.slow]

RETRY_SCRIPT = Path(__file__).with_name("shared_retry_script.py")


def _shared_query(spark: Any, settings: GridSettings, stream: str, **options: str) -> Any:
    return (
        spark.readStream.format("meteor")
        .options(**grid_options(settings))
        .option("stream", stream)
        .option("group", "work")
        .option("shared", "true")
        .options(**options)
        .load()
    )


def _marker_udf(marker: Path, poison: bytes, failures: int | None) -> Any:
    """A UDF failing the task that meets ``poison``: its first ``failures`` times (None: always)."""
    from pyspark.sql.functions import udf
    from pyspark.sql.types import BinaryType

    def check(value: bytes) -> bytes:
        if value == poison:
            seen = marker.read_text().count("x") if marker.exists() else 0
            if failures is None or seen < failures:
                with marker.open("a") as f:
                    f.write("x")
                raise RuntimeError(f"poison record {value!r}")
        return value

    return udf(check, BinaryType())


def _run_until_done(make: Any, deadline_s: float) -> int:
    """Start queries from ``make()`` until one processes everything; returns how many failed."""
    from pyspark.errors import StreamingQueryException

    failures = 0
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        query = make()
        try:
            query.processAllAvailable()
            query.stop()
            return failures
        except StreamingQueryException:
            failures += 1
            query.stop()
    raise AssertionError(f"the query did not finish in {deadline_s} s ({failures} failed runs)")


def _run_while(make: Any, done: Any, deadline_s: float) -> int:
    """Start queries from ``make()``, each running until ``done()`` or its failure; returns how many failed."""
    from pyspark.errors import StreamingQueryException

    failures = 0
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        query = make()
        try:
            while not done() and time.monotonic() < deadline:
                query.awaitTermination(0.2)
            return failures
        except StreamingQueryException:
            failures += 1
        finally:
            query.stop()
    raise AssertionError(f"not done in {deadline_s} s ({failures} failed runs)")


def test_four_lanes_read_by_sixteen_tasks_a_failing_task_replays_exactly(
    spark: Any, grid: Grid, grid_settings: GridSettings, unique_name: str, tmp_path: Path
) -> None:
    info = make_stream(grid, unique_name, lanes=4)
    for lane in range(4):
        put_items(grid, info, lane, values_items(f"l{lane}", 40, 10))
    total = 4 * 40 * 10
    poison = b"l2-17-3"
    check = _marker_udf(tmp_path / "marker", poison, failures=2)
    sink: dict[tuple[int, int], int] = {}
    duplicates: list[tuple[int, int]] = []
    tasks: list[int] = []

    def on_batch(batch: Any, batch_id: int) -> None:
        tasks.append(batch.rdd.getNumPartitions())
        rows = batch.select(check("value").alias("value"), "lane", "offset", "delivery_count").collect()
        for row in rows:  # reached only when every task of the batch succeeded
            key = (row.lane, row.offset)
            if key in sink:
                duplicates.append(key)
            sink[key] = row.delivery_count

    def make() -> Any:
        df = _shared_query(spark, grid_settings, unique_name, maxRecordsPerTrigger="800", minPartitions="16")
        return df.writeStream.foreachBatch(on_batch).option("checkpointLocation", str(tmp_path / "cp")).start()

    started = time.monotonic()
    failed_runs = _run_until_done(make, 240)
    elapsed = time.monotonic() - started
    texts = [grid.map(SHARE_MAP).get(lane_key(unique_name, "work", lane)) for lane in range(4)]
    entries = [LaneShare.decode(text or "", "test") for text in texts]
    print(
        f"\nshared source: {total} records, 4 lanes, tasks per batch {tasks}, failed runs {failed_runs}, "
        f"in sink {len(sink)}, duplicated {len(duplicates)}, lost {total - len(sink)}, "
        f"unacknowledged {sum(e.next - e.start for e in entries if e.spans)}, {elapsed:.1f} s"
    )
    assert failed_runs == 2
    assert max(tasks) == 16
    assert duplicates == [] and len(sink) == total
    assert all(not e.spans for e in entries)  # every acquisition acknowledged (DONE folded into start)
    assert set(sink.values()) == {1}  # the replays re-read the same acquisitions: no new delivery


def test_a_task_failing_twice_then_succeeding_under_task_retries_loses_and_duplicates_nothing(
    grid: Grid, grid_settings: GridSettings, unique_name: str, tmp_path: Path
) -> None:
    """Spark's own task retries (a driver of its own on ``local[2,4]``): the retried task re-reads its chunk."""
    info = make_stream(grid, unique_name, lanes=4)
    for lane in range(4):
        put_items(grid, info, lane, values_items(f"l{lane}", 40, 10))
    total = 4 * 40 * 10
    marker = tmp_path / "marker"
    marker.write_text("")
    args = [sys.executable, str(RETRY_SCRIPT), ",".join(grid_settings.members), grid_settings.cluster_name]
    args += [unique_name, str(tmp_path / "cp"), str(marker), "l1-5-5"]
    child = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        out, _ = child.communicate(timeout=240)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert lines, f"the retry driver printed no result (exit {child.returncode})"
    result = json.loads(lines[0][len("RESULT ") :])
    keys = [(lane, offset) for lane, offset, _ in result["rows"]]
    duplicated = len(keys) - len(set(keys))
    print(
        f"\ntask retries: {total} records, tasks per batch {result['tasks']}, failed attempts {result['attempts']}, "
        f"in sink {len(set(keys))}, duplicated {duplicated}, lost {total - len(set(keys))}"
    )
    assert result["attempts"] == 2 and max(result["tasks"]) == 16
    assert duplicated == 0 and len(set(keys)) == total
    assert {count for _, _, count in result["rows"]} == {1}


def test_a_poison_record_is_dead_lettered_after_the_group_limit(
    spark: Any, grid: Grid, grid_settings: GridSettings, unique_name: str, tmp_path: Path
) -> None:
    info = make_stream(grid, unique_name, lanes=2)
    dead = f"{unique_name}-dlq"
    make_stream(grid, dead)
    for lane in range(2):
        put_items(grid, info, lane, values_items(f"l{lane}", 3, 2))
    total = 2 * 3 * 2  # a batch per record: few records keep each run short on a loaded machine
    poison = b"l1-1-1"
    check = _marker_udf(tmp_path / "marker", poison, failures=None)
    sink: dict[bytes, int] = {}
    duplicates: list[bytes] = []
    runs = [0]

    def on_batch(batch: Any, batch_id: int) -> None:
        for row in batch.select(check("value").alias("value"), "delivery_count").collect():
            if row.value in sink:
                duplicates.append(row.value)
            sink[row.value] = row.delivery_count

    def make() -> Any:
        runs[0] += 1  # a new checkpoint per run: the group's state, not the checkpoint, says what is left
        df = _shared_query(
            spark,
            grid_settings,
            unique_name,
            maxRecordsPerTrigger="1",
            acquisitionTimeoutMs="1500",
            maxDeliveries="3",
            deadLetterStream=dead,
        )
        return (
            df.writeStream.foreachBatch(on_batch).option("checkpointLocation", str(tmp_path / f"cp{runs[0]}")).start()
        )

    from meteor_spark.consumer.subscriber import Subscriber

    failed_runs = 0
    letters: list[Any] = []
    with Subscriber(grid, dead, initial_offset_scheme="earliest") as reader:
        # A query runs until the dead letter is there (or it fails): records a failed run held time out once a
        # member has watched them unchanged for the group's lock time, so the last run must outlive that lock.
        def done() -> bool:
            letters.extend(reader.poll(100))
            return bool(letters) and len(sink) == total - 1

        failed_runs = _run_while(make, done, 480)
    print(
        f"\npoison: {total} records, failed runs {failed_runs}, dead letters {len(letters)}, in sink {len(sink)}, "
        f"duplicated {len(duplicates)}, lost {total - 1 - len(sink)}, runs {runs[0]}, "
        f"lane 1 {grid.map(SHARE_MAP).get(lane_key(unique_name, 'work', 1))}"
    )
    assert len(letters) == 1 and letters[0].value == poison
    assert poison not in sink and duplicates == [] and len(sink) == total - 1
    assert (tmp_path / "marker").read_text() == "xxx"  # delivered (and failed) max_deliveries times, no more
    assert failed_runs >= 3  # a query start failing on a loaded machine is one more run, not one more delivery


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"stream": "s", "shared": "true"}, "needs option 'group'"),
        ({"stream": "s", "group": "g", "shared": "true", "startingOffsets": "earliest"}, "startingOffsets"),
        ({"stream": "s,t", "group": "g", "shared": "true"}, "one stream"),
        ({"stream": "s", "group": "g", "maxRecordsPerTrigger": "5"}, "needs shared=true"),
        ({"stream": "s", "group": "g", "shared": "true", "maxOffsetsPerTrigger": "5"}, "maxRecordsPerTrigger"),
        ({"stream": "s", "group": "g", "shared": "true", "maxDeliveries": "2"}, "deadLetterStream"),
    ],
)
def test_wrong_combinations_are_clear_errors(options: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SourceOptions.parse(options)


def test_shared_on_an_ephemeral_stream_is_a_clear_error(
    grid: Grid, grid_settings: GridSettings, unique_name: str
) -> None:
    from meteor_spark.grid.streams import StreamConfig, open_stream
    from meteor_spark.spark.shared_reader import MeteorSharedStreamReader

    open_stream(grid, StreamConfig(unique_name, ephemeral=True))
    options = SourceOptions.parse(
        {**grid_options(grid_settings), "stream": unique_name, "group": "g", "shared": "true"}
    )
    with pytest.raises(ConfigError, match="ephemeral"):
        MeteorSharedStreamReader(options, None).initialOffset()  # type: ignore[arg-type]
