"""Subscriber groups with Spark: two queries (one reads, the other stands by and takes over), and a Python
Subscriber sharing a group with a query."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from spark_helpers import grid_options, make_stream, put_items, values_items

from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.format.offsets import first_offset_of, make_offset
from meteor_spark.format.records import Record
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.groups.store import LEASES_MAP, OFFSETS_MAP, lane_key
from meteor_spark.testing import wait_until

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
            spark.readStream.format("meteor")
            .options(**grid_options(grid_settings))
            .option("stream", unique_name)
            .option("group", "g")
            .option("groupLeaseMs", str(lease_ms))
            .option("groupMemberId", f"query-{name}")
            .option("startingOffsets", "earliest")
            .load()
            .writeStream.foreachBatch(collect(name))
            .option("checkpointLocation", str(tmp_path / name))
            .trigger(processingTime="100 milliseconds")
            .start()
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
            wait_until(
                lambda: count("a") == len(first) + len(second),
                timeout_s=60,
                message="query a to read the second records",
            )
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
                timeout_s=30,
                message="query a's leases to be released",
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


def test_a_python_subscriber_and_a_spark_query_share_a_group(
    spark: Any, grid: Grid, grid_settings: GridSettings, unique_name: str, tmp_path: Path
) -> None:
    info = make_stream(grid, unique_name, lanes=2)
    lane0 = put_items(grid, info, 0, values_items("a", 3, 2))  # items 0..2 of 2 records
    lane1 = put_items(grid, info, 1, values_items("b", 2, 2))  # items 0..1
    offsets = grid.map(OFFSETS_MAP)

    def confirmed(lane: int) -> int | None:
        text = offsets.get(lane_key(unique_name, "g", lane))
        return None if text is None else json.loads(text)["offset"]

    def poll_values(subscriber: Subscriber, count: int) -> list[Record]:
        got: list[Record] = []
        wait_until(
            lambda: bool(got.extend(subscriber.poll(timeout_ms=100)) or len(got) >= count),
            timeout_s=30,
            message=f"the subscriber to read {count} records",
        )
        return got

    # The Python member holds both lanes (a Spark query is a want="all" member: it never takes a balanced share).
    subscriber = Subscriber(
        grid, unique_name, group="g", lease_ms=800, member_id="python-1", initial_offset_scheme="earliest"
    )
    query = None
    try:
        read = poll_values(subscriber, len(lane0) + len(lane1))
        assert sorted(r.value for r in read) == sorted(r.value for r in lane0 + lane1)
        by_value = {r.value: r for r in read}
        # Lane 0: confirmed inside item 1 (its first record processed); lane 1: through the end of item 0.
        subscriber.confirm(by_value[lane0[2].value])
        subscriber.confirm(by_value[lane1[1].value])
        assert (confirmed(0), confirmed(1)) == (make_offset(1, 1), first_offset_of(1))

        lock = threading.Lock()
        seen: list[tuple[int, bytes]] = []

        def on_batch(df: Any, batch_id: int) -> None:
            rows = [(r.lane, r.value) for r in df.select("lane", "value").collect()]
            with lock:
                seen.extend(rows)

        def seen_now() -> list[tuple[int, bytes]]:
            with lock:
                return list(seen)

        query = (
            spark.readStream.format("meteor")
            .options(**grid_options(grid_settings))
            .option("stream", unique_name)
            .option("group", "g")
            .option("groupLeaseMs", "1000")
            .option("groupMemberId", "spark-1")
            .option("startingOffsets", "earliest")
            .load()
            .writeStream.foreachBatch(on_batch)
            .option("checkpointLocation", str(tmp_path / "cp"))
            .trigger(processingTime="100 milliseconds")
            .start()
        )
        # Standby: its batches follow the group's confirmed sequences and read nothing while Python holds the lanes.
        wait_until(
            lambda: _end_offsets(query, unique_name) == {"0": 1, "1": 1},
            timeout_s=60,
            message="the query to follow the group as a standby",
        )
        assert seen_now() == [], "the Spark query read while the Python subscriber held the lanes"
        assert subscriber.lanes == [0, 1]
        subscriber.close()

        # It takes over exactly at the confirmed offsets: the rest of item 1 and item 2 of lane 0, item 1 of lane 1.
        expected = [(0, r.value) for r in lane0[3:]] + [(1, r.value) for r in lane1[2:]]
        wait_until(lambda: len(seen_now()) >= len(expected), timeout_s=60, message="the query to take over")
        assert sorted(seen_now()) == sorted(expected)
        # ... and confirms what it read in the grid once the batch is committed.
        wait_until(
            lambda: (confirmed(0), confirmed(1)) == (first_offset_of(3), first_offset_of(2)),
            timeout_s=30,
            message="the query's confirmed offsets",
        )
    finally:
        subscriber.close()
        if query is not None:
            query.stop()
    assert sorted(seen) == sorted(expected)  # nothing read twice

    # A new Python member resumes after what Spark confirmed (stopping the query released its leases).
    newer = put_items(grid, info, 0, values_items("c", 1, 2)) + put_items(grid, info, 1, values_items("d", 1, 1))
    with Subscriber(grid, unique_name, group="g", lease_ms=800, member_id="python-2") as again:
        assert sorted(r.value for r in poll_values(again, len(newer))) == sorted(r.value for r in newer)
        assert again.positions() == {0: first_offset_of(4), 1: first_offset_of(3)}


def _end_offsets(query: Any, stream: str) -> dict[str, int] | None:
    progress = query.lastProgress
    if not progress or not progress["sources"][0].get("endOffset"):
        return None
    end = progress["sources"][0]["endOffset"]
    return (json.loads(end) if isinstance(end, str) else end).get(stream)
