"""A Spark micro-batch query meteor -> meteor (transactional sink) on a real two-member cluster while member 0,
then member 1, is SIGKILLed and restarted: read back with ``read_committed``, the output holds every published
record exactly once.

The query's source runner and executors are given both members (``hazelcast.members=a,b``) and fail over between
them. A micro-batch that fails during the failover ends the query (``local[2]`` does not retry tasks); it is
started again from its checkpoint, as a deployment's supervisor would, and the transactional sink keeps the replay
from publishing twice. Restarts are counted and printed with the figures.
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.format.records import Record
from meteor_spark.grid.client import Grid
from meteor_spark.grid.streams import StreamConfig, open_stream
from meteor_spark.producer.publisher import Publisher
from meteor_spark.testing import wait_until
from tests.cluster.cluster_faults import Failover, kill_and_rejoin, member_count
from tests.real_members import HazelcastCluster

pytestmark = [
    pytest.mark.real_members,
    pytest.mark.fault,
    pytest.mark.slow,
    pytest.mark.spark,
    pytest.mark.timeout(900),
]


class Query:
    """The streaming query, started again from its checkpoint whenever it ended with an error."""

    def __init__(self, spark: Any, options: dict[str, str], source: str, target: str, checkpoint: Path) -> None:
        self.spark, self.options, self.source, self.target, self.checkpoint = spark, options, source, target, checkpoint
        self.failures: list[str] = []
        self.query = self._start()

    def _start(self) -> Any:
        rows = (
            self.spark.readStream.format("meteor")
            .options(**self.options)
            .option("stream", self.source)
            .option("startingOffsets", "earliest")
            .load()
            .select("key", "value")
        )
        return (
            rows.writeStream.format("meteor")
            .options(**self.options)
            .option("stream", self.target)
            .option("checkpointLocation", str(self.checkpoint))
            .trigger(processingTime="500 milliseconds")
            .start()
        )

    def running(self) -> bool:
        """True while it runs; an ended query is recorded and started again (False this time)."""
        if self.query.isActive:
            return True
        error = self.query.exception()
        self.failures.append(str(error).splitlines()[0][:200] if error else "stopped")
        self.query = self._start()
        return False

    def stop(self) -> None:
        self.query.stop()


def _read_committed(grid: Grid, stream: str, expected: int) -> list[bytes]:
    values: list[bytes] = []
    with Subscriber(grid, stream, initial_offset_scheme="earliest", isolation="read_committed") as reader:
        wait_until(
            lambda: values.extend(r.value for r in reader.poll(200)) or len(values) >= expected,
            180,
            message=f"{expected} records committed to {stream}",
        )
        while batch := reader.poll(500):
            values.extend(r.value for r in batch)
    return values


def test_a_query_through_a_member_kill_and_restart_loses_and_duplicates_nothing(
    spark: Any, cluster: HazelcastCluster, tmp_path: Path
) -> None:
    options = {"hazelcast.members": cluster.members, "hazelcast.clusterName": cluster.cluster_name}
    acked: set[bytes] = set()
    stop = threading.Event()
    failovers: list[Failover] = []
    with Grid.connect(cluster.members, cluster_name=cluster.cluster_name) as grid:
        wait_until(lambda: member_count(grid) == 2, 60, message="the client to see both members")
        source = open_stream(grid, StreamConfig("cluster.spark.in", lanes=2, backup_count=1, capacity=50_000))
        target = open_stream(grid, StreamConfig("cluster.spark.out", lanes=2, backup_count=1, capacity=50_000))
        publisher = Publisher(grid, source.config)

        def publish() -> None:
            n = 0
            while not stop.is_set():
                values = [b"v%d" % i for i in range(n, n + 20)]
                future = publisher.publish_many([Record(v, key=v) for v in values])

                def settled(f: Any, vs: list[bytes] = values) -> None:
                    if f.exception() is None:
                        acked.update(vs)

                future.add_done_callback(settled)
                n += 20
                stop.wait(0.1)  # about 200 records/s

        feeder = threading.Thread(target=publish, name="feeder", daemon=True)
        feeder.start()
        query = Query(spark, options, source.name, target.name, tmp_path / "checkpoint")
        try:

            def output_grows(more: int) -> Any:
                def grown() -> bool:
                    return query.running() and (query.query.lastProgress or {}).get("batchId", -1) >= more

                return grown

            wait_until(output_grows(2), 240, 0.5, message="two micro-batches before the first kill")
            for index in (0, 1):
                batch = query.query.lastProgress["batchId"]
                failovers.append(kill_and_rejoin(cluster, grid, index))
                wait_until(output_grows(batch + 2), 240, 0.5, message="micro-batches after the rejoin")
            stop.set()
            feeder.join(30)
            publisher.close(timeout_s=120)
            published = len(acked)
            values = _read_committed(grid, target.name, published)
            wait_until(query.running, 60, 0.5, message="the query running at the end")
        finally:
            stop.set()
            query.stop()
            publisher.close(timeout_s=30)
    counts = Counter(values)
    lost = len(acked - set(counts))
    duplicated = sum(count - 1 for count in counts.values() if count > 1)
    summary = (
        f"Spark meteor -> meteor (transactional sink, read_committed), member 0 then 1 SIGKILLed and "
        f"restarted under the running query: published {published:,}, output {len(values):,}, lost {lost}, "
        f"duplicated {duplicated}, foreign {len(set(counts) - acked)}; query restarts {len(query.failures)} "
        f"{query.failures}; takeovers {[round(f.takeover_s, 2) for f in failovers]} s"
    )
    print(f"[fault] {summary}", flush=True)
    assert (lost, duplicated) == (0, 0), summary
    assert set(counts) <= acked, summary
