"""``meteor streams delete`` takes the stream's group state along and says how much."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from meteor_spark.grid.client import Grid
from meteor_spark.grid.streams import StreamConfig, open_stream
from meteor_spark.groups.admin import list_groups
from meteor_spark.groups.exclusive import GroupMember

Meteor = Callable[..., Any]


def test_delete_reports_the_group_state_it_removed(meteor: Meteor, grid: Grid, unique_name: str) -> None:
    info = open_stream(grid, StreamConfig(unique_name, lanes=2))
    with GroupMember(grid, info, "billing") as member:
        member.confirm(0, 0)
    # Left behind: two vacant leases, two offsets entries and the membership generation close() rewrote (the
    # heartbeat went with close()).
    assert [(g.group, g.confirmed_lanes) for g in list_groups(grid, unique_name)] == [("billing", 1)]
    deleted = meteor("streams", "delete", unique_name, "--yes")
    assert deleted.code == 0, deleted
    assert f"stream {unique_name!r} deleted with its group state (5 entries)" in deleted.out
    assert list_groups(grid, unique_name) == []
