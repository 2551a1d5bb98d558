"""``meteor groups`` names the last stable offset of a lane where a transaction is still open."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from meteor_spark.format.offsets import first_offset_of
from meteor_spark.grid import transactions
from meteor_spark.grid.client import Grid
from meteor_spark.grid.streams import StreamConfig, open_stream
from meteor_spark.groups.admin import seek_group
from meteor_spark.producer.publisher import Publisher

Meteor = Callable[..., Any]


def test_groups_shows_where_read_committed_readers_wait(meteor: Meteor, grid: Grid, unique_name: str) -> None:
    info = open_stream(grid, StreamConfig(unique_name, lanes=1))
    with Publisher(grid, unique_name) as plain:
        plain.publish(b"before")
    with Publisher(grid, unique_name, transactional=True) as pub:
        transactions.begin(grid, f"{unique_name}/t", pub.producer_id, 600_000, stream=unique_name)
        pub.publish(b"open")
    with Publisher(grid, unique_name) as plain:
        plain.publish(b"after")
    seek_group(grid, info, "g", {0: 0})
    run = meteor("groups", unique_name, "g")
    assert run.code == 0, run
    assert (
        f"lane 0: read_committed readers wait at offset {first_offset_of(1)} (last stable offset: a transaction "
        f"still open), 2 ring items before the lane's end"
    ) in run.out
    transactions.commit(grid, f"{unique_name}/t", [pub.producer_id])
    assert "read_committed readers wait" not in meteor("groups", unique_name, "g").out
