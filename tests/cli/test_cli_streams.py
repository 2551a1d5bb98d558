"""``meteor streams list|describe|create|delete`` against the test grid."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from meteor_spark.grid.client import Grid
from meteor_spark.grid.streams import open_stream

Meteor = Callable[..., Any]


def test_create_list_describe_delete(meteor: Meteor, grid: Grid, unique_name: str) -> None:
    created = meteor("streams", "create", unique_name, "--lanes", "3", "--capacity", "500")
    assert created.code == 0, created
    assert f"stream {unique_name!r} created: 3 lane(s), capacity 500" in created.out
    info = open_stream(grid, unique_name, create=False)
    assert (info.config.lanes, info.config.capacity) == (3, 500)

    again = meteor("streams", "create", unique_name, "--lanes", "3", "--capacity", "500")
    assert again.code == 0 and "exists already with these settings" in again.out

    listing = meteor("streams", "list")
    assert listing.code == 0
    row = next(line for line in listing.out.splitlines() if line.startswith(unique_name + " "))
    assert row.split()[1:3] == ["3", "500"]

    described = meteor("streams", "describe", unique_name)
    assert described.code == 0
    for lane in range(3):
        assert f"meteor.stream::{unique_name}.{lane}" in described.out
    assert "capacity               500" in described.out

    refused = meteor("streams", "delete", unique_name)  # stdin is not a terminal under pytest
    assert refused.code == 1 and "add --yes" in refused.err
    deleted = meteor("streams", "delete", unique_name, "--yes")
    assert deleted.code == 0 and "deleted" in deleted.out
    gone = meteor("streams", "describe", unique_name)
    gone.assert_user_error(f"stream {unique_name!r} does not exist")


def test_create_with_another_layout_is_a_conflict(meteor: Meteor, unique_name: str) -> None:
    assert meteor("streams", "create", unique_name, "--lanes", "2").code == 0
    conflict = meteor("streams", "create", unique_name, "--lanes", "4")
    conflict.assert_user_error("already exists with another layout", "lanes: 4 asked, 2 stored")


def test_bad_values_are_one_line_errors(meteor: Meteor, unique_name: str) -> None:
    meteor("streams", "create", unique_name, "--lanes", "0").assert_user_error("lanes", "got 0")
    meteor("streams", "create", unique_name, "--compression", "zip").assert_user_error("compression 'zip'")
    meteor("streams", "create", "bad name!").assert_user_error("stream name 'bad name!' is not valid")


def test_unknown_stream_and_usage_errors(meteor: Meteor, unique_name: str) -> None:
    meteor("streams", "describe", unique_name).assert_user_error("does not exist", "meteor streams create")
    usage = meteor("streams", "lst")
    assert usage.code == 1 and "invalid choice: 'lst'" in usage.err  # every user error exits 1


def test_stream_defaults_come_from_the_config_file(meteor: Meteor, unique_name: str, tmp_path) -> None:
    config = tmp_path / "meteor.toml"
    config.write_text("[stream]\nlanes = 5\ncapacity = 123\n")
    created = meteor("--config", str(config), "streams", "create", unique_name, "--capacity", "77")
    assert created.code == 0, created
    assert "5 lane(s), capacity 77" in created.out  # the flag wins over the file


def test_create_with_backup_counts_stores_them(meteor: Meteor, grid: Grid, unique_name: str) -> None:
    created = meteor("streams", "create", unique_name, "--backup-count", "2", "--async-backup-count", "1")
    assert created.code == 0, created
    assert "2 backup(s) + 1 async" in created.out
    config = open_stream(grid, unique_name, create=False).config
    assert (config.backup_count, config.async_backup_count) == (2, 1)
    conflict = meteor("streams", "create", unique_name, "--backup-count", "1")
    conflict.assert_user_error("already exists with another layout", "backup_count: 1 asked, 2 stored")
    meteor("streams", "create", unique_name + "-x", "--backup-count", "7").assert_user_error("backup_count", "got 7")
