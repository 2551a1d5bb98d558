"""Two streaming queries in one subscriber group: one reads, the other stands by and takes over."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from meteor_spark.grid import Grid, GridSettings
from meteor_spark.groups import LEASES_MAP, OFFSETS_MAP, lane_key
from meteor_spark.offsets import first_offset_of
from meteor_spark.testing import wait_until
from spark_helpers import grid_options, make_stream, put_items, values_items

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_two_queries_in_one_group_never_read_at_once_and_the_standby_takes_over(
    spark: Any, grid: Grid, grid_settings: GridSettings, unique_name: str, tmp_path: Path
) -> None:
    info = make_stream(grid, unique_name, lanes=2)
    lock = threading.Lock()
    seen: dict[str, list[bytes]] = {"a": [], "b": []}

    def collect(name: str) -> Any:
        def on_batch(df: Any, batch_id: int) -> None:
            values = [r.value for r in df.select("value").collect()]
            with lock:
                seen[name].extend(values)

        return on_batch

    def start(name: str, lease_ms: int) -> Any:
        return (
            spark.readStream.format("meteor").options(**grid_options(grid_settings)).option("stream", unique_name)
            .option("group", "g").option("groupLeaseMs", str(lease_ms)).option("groupMemberId", f"query-{name}")
            .option("startingOffsets", "earliest").load()
            .writeStream.foreachBatch(collect(name)).option("checkpointLocation", str(tmp_path / name))
            .trigger(processingTime="100 milliseconds").start()
        )

    def end_of(query: Any) -> dict[str, int] | None:
        progress = query.lastProgress
        if not progress or not progress["sources"][0].get("endOffset"):
            return None
        end = progress["sources"][0]["endOffset"]
        return (json.loads(end) if isinstance(end, str) else end).get(unique_name)

    def count(name: str) -> int:
        with lock:
            return len(seen[name])

    offsets = grid.map(OFFSETS_MAP)

    def confirmed(lane: int) -> int | None:
        text = offsets.get(lane_key(unique_name, "g", lane))
        return None if text is None else json.loads(text)["offset"]

    first = put_items(grid, info, 0, values_items("one", 2, 2)) + put_items(grid, info, 1, values_items("one", 1, 2))
    # Query a's leases would take a minute to expire: b can only take over within the deadlines below because
    # stopping a releases them.
    query_a = start("a", 60_000)
    try:
        wait_until(lambda: count("a") == len(first), timeout_s=60, message="query a to read the first records")
        query_b = start("b", 1500)
        try:
            # The standby's checkpoint follows the group's confirmed offsets with batches that read nothing.
            wait_until(lambda: end_of(query_b) == {"0": 2, "1": 1}, timeout_s=60, message="b to follow the group")
            second = put_items(grid, info, 1, values_items("two", 2, 2))
            wait_until(lambda: count("a") == len(first) + len(second), timeout_s=60,
                       message="query a to read the second records")
            wait_until(lambda: end_of(query_b) == {"0": 2, "1": 3}, timeout_s=60, message="b to follow the group")
            assert count("b") == 0, "the standby query read records while the holder was running"

            query_a.stop()
            leases = grid.map(LEASES_MAP)
            # Stopping a query releases its leases (Spark SIGTERMs the source runner; the reader's hook runs).
            wait_until(
                lambda: all(
                    json.loads(leases.get(lane_key(unique_name, "g", lane)) or "{}").get("holder") != "query-a"
                    for lane in (0, 1)
                ),
                timeout_s=30, message="query a's leases to be released",
            )
            third = put_items(grid, info, 0, values_items("three", 1, 2))
            wait_until(lambda: count("b") == len(third), timeout_s=30, message="query b to take over")
            # b confirms its batch once Spark has committed it and plans the next trigger.
            wait_until(lambda: confirmed(0) == first_offset_of(3), timeout_s=30, message="b's confirmation")
        finally:
            query_b.stop()
    finally:
        query_a.stop()

    with lock:
        assert sorted(seen["a"]) == sorted(r.value for r in first + second)
        assert sorted(seen["b"]) == sorted(r.value for r in third)
    assert (confirmed(0), confirmed(1)) == (first_offset_of(3), first_offset_of(3))
