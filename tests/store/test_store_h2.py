"""The same stores on H2 in TCP server mode (the alternative docs/deploying.md names): the Java code is plain JDBC,
the dialect differs only in the binary type and the upsert. One member, a stream four times its ring capacity and a
group's confirmed offsets; the member is SIGKILLed and started again, and the history and the offsets are all there.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from store_helpers import CAPACITY, STORE_JAR, STORE_XML, driver_jar

from meteor_spark.consumer.subscriber import InitialOffsetScheme, Subscriber
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.streams import StreamConfig
from meteor_spark.groups.store import OFFSETS_MAP, lane_key
from meteor_spark.producer.publisher import Publisher
from meteor_spark.testing import wait_until
from tests.real_members import HazelcastMember, free_port

pytestmark = [pytest.mark.real_members, pytest.mark.fault, pytest.mark.slow, pytest.mark.timeout(600)]

RECORDS = 200


@pytest.fixture
def h2_url(tmp_path: Path, store_classpath: list[Path]) -> Iterator[str]:
    """An H2 TCP server on 127.0.0.1 (its own JVM, ended by PID), databases under ``tmp_path``."""
    port = free_port()
    log = (tmp_path / "h2.log").open("wb")
    server = subprocess.Popen(
        ["java", "-Xmx256m", "-cp", str(driver_jar("h2")), "org.h2.tools.Server", "-tcp", "-tcpPort", str(port),
         "-ifNotExists", "-baseDir", str(tmp_path / "h2")],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    log.close()
    try:
        wait_until(
            lambda: "TCP server running" in (tmp_path / "h2.log").read_text() or server.poll() is not None,
            timeout_s=60, message="the H2 server to start",
        )  # fmt: skip
        assert server.poll() is None, (tmp_path / "h2.log").read_text()
        yield f"jdbc:h2:tcp://127.0.0.1:{port}/meteor"
    finally:
        server.kill()
        server.wait(timeout=30)


def _drain(subscriber: Subscriber) -> list[int]:
    values: list[int] = []
    while batch := subscriber.poll(timeout_ms=1000):
        values.extend(int(record.value) for record in batch)
    return values


def test_history_and_offsets_survive_a_member_restart_on_h2(tmp_path: Path, h2_url: str) -> None:
    member = HazelcastMember(
        tmp_path / "member", cluster_name="store-h2", config=STORE_XML, classpath=[STORE_JAR, driver_jar("h2")],
        heap="512m", properties={
            "meteor.ring.capacity": str(CAPACITY), "meteor.store.jdbc-url": h2_url, "meteor.store.jdbc-user": "sa",
        },
    )  # fmt: skip
    config = StreamConfig("store-h2", capacity=CAPACITY, max_batch_records=4)
    key = lane_key(config.name, "g", 0)
    with member:
        settings = GridSettings(members=(member.address,), cluster_name=member.cluster_name)
        with Grid(settings) as grid:
            with Publisher(grid, config) as publisher:
                futures = [publisher.publish_async(str(n).encode()) for n in range(RECORDS)]
            assert all(future.result(timeout=60) is not None for future in futures)
            assert grid.ring("meteor.stream::store-h2.0").head() > 0
            with Subscriber(grid, config, group="g", initial_offset_scheme=InitialOffsetScheme.EARLIEST) as group:
                wait_until(group.is_assigned, timeout_s=30, message="the group member to hold its lane")
                consumed = _drain(group)
                group.confirm()
            offset_before = grid.map(OFFSETS_MAP).get(key)
        member.kill()
        member.start()
        with Grid(settings) as grid:
            offset_after = grid.map(OFFSETS_MAP).get(key)
            with Subscriber(grid, config.name, initial_offset_scheme=InitialOffsetScheme.EARLIEST) as reader:
                read_back = _drain(reader)
    print(f"\nH2: acked {RECORDS}, read back {len(read_back)}; group offset before {offset_before}")
    print(f"H2: group offset after {offset_after}")
    assert sorted(consumed) == list(range(RECORDS))
    assert sorted(read_back) == list(range(RECORDS))
    assert offset_after == offset_before is not None
