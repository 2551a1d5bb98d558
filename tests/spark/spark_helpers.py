"""Shared helpers of the Spark tests: put exact ring items into lanes, read the grid back, build options."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from meteor_spark.format.records import Record, decode_batch, encode_batch
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.streams import StreamConfig, StreamInfo, lane_bounds, open_stream

_producer_seq = itertools.count()


def grid_options(settings: GridSettings) -> dict[str, str]:
    return {"hazelcast.members": ",".join(settings.members), "hazelcast.clusterName": settings.cluster_name}


def make_stream(grid: Grid, name: str, lanes: int = 1, capacity: int = 10_000) -> StreamInfo:
    return open_stream(grid, StreamConfig(name, lanes=lanes, capacity=capacity))


def put_items(grid: Grid, info: StreamInfo, lane: int, items: Sequence[Sequence[Record]]) -> list[Record]:
    """Append one ring item per inner sequence to ``lane`` (exact item boundaries); return the records."""
    encoded = [encode_batch(list(records), producer_id=7, producer_seq=next(_producer_seq)) for records in items]
    grid.ring(info.ring_names[lane]).add_all(encoded)
    return [record for records in items for record in records]


def values_items(prefix: str, items: int, per_item: int) -> list[list[Record]]:
    return [
        [
            Record(f"{prefix}-{i}-{j}".encode(), key=f"k{j}".encode(), headers=(("h", b"%d" % j),))
            for j in range(per_item)
        ]
        for i in range(items)
    ]


def read_values(grid: Grid, name: str) -> dict[int, list[bytes]]:
    """Every value in every lane of stream ``name``, in lane order."""
    info = open_stream(grid, name)
    result: dict[int, list[bytes]] = {}
    for lane, (head, next_seq) in lane_bounds(grid, info).items():
        values: list[bytes] = []
        if next_seq > head:
            batch = grid.ring(info.ring_names[lane]).read_many(head, 0, next_seq - head)
            for item, sequence in zip(batch.items, batch.sequences, strict=True):
                values.extend(r.value for r in decode_batch(item, stream=name, lane=lane, sequence=sequence))
        result[lane] = values
    return result


def rows_of(df: Any) -> list[tuple[Any, ...]]:
    return [tuple(row) for row in df.collect()]


def stream_reader(spark: Any, settings: GridSettings, stream: str, **options: str) -> Any:
    """A streaming ``format("meteor")`` DataFrame of ``stream`` on the grid under test."""
    return (
        spark.readStream.format("meteor")
        .options(**grid_options(settings))
        .option("stream", stream)
        .options(**options)
        .load()
    )


def run_available_now(df: Any, checkpoint: Any, rows: list[bytes]) -> Any:
    """Run ``df`` with an AvailableNow trigger, collecting every row's value into ``rows``; the finished query."""

    def on_batch(batch: Any, batch_id: int) -> None:
        rows.extend(r.value for r in batch.select("value").collect())

    query = (
        df.writeStream.foreachBatch(on_batch)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return query
