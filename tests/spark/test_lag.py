"""Lag helpers of the connector, without Spark: exact records behind read from the grid."""

from __future__ import annotations

from meteor_spark.format.offsets import first_offset_of
from meteor_spark.format.records import Record
from meteor_spark.grid.client import Grid
from meteor_spark.grid.streams import StreamConfig, open_stream
from meteor_spark.producer.publisher import Publisher
from meteor_spark.spark.lag import LagReport, LaneLag, count_records_behind


def test_count_records_behind_reads_the_unread_items_and_leaves_out_overwritten_lanes(
    grid: Grid, unique_name: str
) -> None:
    info = open_stream(grid, StreamConfig(unique_name, lanes=2, capacity=3))
    with Publisher(grid, info.config) as publisher:
        for size in (2, 5, 7):  # lane 0: three items of 2, 5 and 7 records
            publisher.publish_many([Record(b"v", lane=0) for _ in range(size)])
            publisher.flush()
        for _ in range(5):  # lane 1: five items in a ring of 3, so items 0 and 1 are overwritten
            publisher.publish(Record(b"v", lane=1))
    report = LagReport(
        batch_id=7,
        lanes=(
            LaneLag(0, confirmed=first_offset_of(1), next_sequence=3, items=2, stream=unique_name),
            LaneLag(1, confirmed=first_offset_of(0), next_sequence=5, items=5, stream=unique_name),
        ),
        records_per_item=None,
    )
    assert count_records_behind(grid, report) == {(unique_name, 0): 12}
