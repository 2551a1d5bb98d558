"""``meteor groups`` on a shared group: per lane start offset, window and records in flight."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from meteor_spark.consumer.shared_subscriber import SharedSubscriber
from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.format.offsets import first_offset_of
from meteor_spark.format.records import Record
from meteor_spark.grid.client import Grid
from meteor_spark.grid.streams import StreamConfig
from meteor_spark.producer.publisher import Publisher
from meteor_spark.testing import wait_until

Meteor = Callable[..., Any]


def test_a_shared_groups_lanes_show_start_window_and_in_flight(meteor: Meteor, grid: Grid, unique_name: str) -> None:
    with Publisher(grid, StreamConfig(unique_name, lanes=2), max_batch_records=1) as publisher:
        publisher.publish_many([Record(f"r{n}".encode(), lane=n % 2) for n in range(6)]).result()
    with Subscriber(grid, unique_name, group="queue", shared=True, max_poll_records=2) as member:
        assert isinstance(member, SharedSubscriber)
        batch = wait_until(lambda: member.poll(50), 10, message="two records")
        member.ack(batch[0])  # the other stays in flight
        run = meteor("groups", unique_name)
        assert run.code == 0, run
        assert f"shared group 'queue' on stream {unique_name!r}" in run.out
        lane = batch[0].lane
        row = next(line.split() for line in run.out.splitlines() if line.split()[:1] == [str(lane)])
        assert row[1] == f"{first_offset_of(1):,}"  # the start moved past the acknowledged record
        assert row[2] == f"{first_offset_of(2):,}"  # two records were handed out
        assert "1 range(s), 1 acquisition(s)" in run.out and row[-2:] == ["2", "items"]
        assert meteor("groups", unique_name, "queue").code == 0
