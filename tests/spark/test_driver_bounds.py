"""The source runner's lane bounds (``streams.streams_bounds``: every lane's head, then every tail, asked for at
once) over several streams, empty lanes and rings that overwrote, and ``streams.lane_bounds`` agreeing with them."""

from __future__ import annotations

from spark_helpers import grid_options, make_stream, put_items, values_items

from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.streams import lane_bounds
from meteor_spark.spark.driver import DriverState
from meteor_spark.spark.options import SourceOptions


def test_driver_bounds_match_lane_bounds_for_every_lane(
    grid: Grid, grid_settings: GridSettings, unique_name: str
) -> None:
    small = make_stream(grid, f"{unique_name}-a", lanes=3, capacity=3)
    wide = make_stream(grid, f"{unique_name}-b", lanes=2)
    put_items(grid, small, 0, values_items("a0", items=5, per_item=2))  # overwrote 2 items: head 2, next 5
    put_items(grid, small, 2, values_items("a2", items=1, per_item=1))
    put_items(grid, wide, 1, values_items("b1", items=4, per_item=3))
    state = DriverState(SourceOptions.parse({**grid_options(grid_settings), "stream": f"{small.name},{wide.name}"}))
    try:
        expected = {
            (info.name, lane): bounds for info in (small, wide) for lane, bounds in lane_bounds(grid, info).items()
        }
        assert (
            state.bounds()
            == expected
            == {
                (small.name, 0): (2, 5),  # overwrote: head and next both past 0
                (small.name, 1): (0, 0),
                (small.name, 2): (0, 1),
                (wide.name, 0): (0, 0),
                (wide.name, 1): (0, 4),
            }
        )
    finally:
        state.close()
