"""``meteor streams ensure`` against the test grid: created, unchanged, each difference and its fate, exit codes."""

from __future__ import annotations

from pathlib import Path

from meteor_spark.grid.client import Grid
from meteor_spark.grid.streams import open_stream
from tests.cli.conftest import Meteor


def test_created_then_unchanged(meteor: Meteor, grid: Grid, unique_name: str) -> None:
    created = meteor("streams", "ensure", unique_name, "--lanes", "2", "--dedup-window-ms", "5000", "--region", "eu")
    assert created.code == 0, created
    assert f"stream {unique_name!r} created: 2 lane(s)" in created.out
    assert "dedup window 5,000 ms, region eu" in created.out
    config = open_stream(grid, unique_name, create=False).config
    assert (config.lanes, config.dedup_window_ms, config.region) == (2, 5000, "eu")

    again = meteor("streams", "ensure", unique_name, "--lanes", "2", "--dedup-window-ms", "5000", "--region", "eu")
    assert again.code == 0 and f"stream {unique_name!r} unchanged" in again.out


def test_error_is_the_default_and_exits_1_with_every_difference(meteor: Meteor, grid: Grid, unique_name: str) -> None:
    assert meteor("streams", "ensure", unique_name, "--capacity", "500").code == 0
    refused = meteor("streams", "ensure", unique_name, "--capacity", "600", "--linger-ms", "3")
    refused.assert_user_error("differs from the declared configuration in 2 setting(s)", "Nothing was changed")
    table = refused.out.splitlines()
    assert table[0].split() == ["SETTING", "STORED", "DECLARED", "FATE"]
    assert any(line.split()[:4] == ["capacity", "500", "600", "refused"] for line in table)
    assert any(line.split()[:4] == ["linger_ms", "0.0", "3.0", "refused"] for line in table)
    assert open_stream(grid, unique_name, create=False).config.capacity == 500


def test_warn_reports_and_keeps(meteor: Meteor, grid: Grid, unique_name: str) -> None:
    assert meteor("streams", "ensure", unique_name).code == 0
    warned = meteor("streams", "ensure", unique_name, "--compression", "none", "--on-difference", "warn")
    assert warned.code == 0, warned
    assert "1 difference(s) reported; the stored configuration is kept" in warned.out
    assert any(line.split()[:4] == ["compression", "'lz4'", "'none'", "kept"] for line in warned.out.splitlines())
    assert open_stream(grid, unique_name, create=False).config.compression == "lz4"


def test_apply_changes_metadata_and_refuses_the_layout(meteor: Meteor, grid: Grid, unique_name: str) -> None:
    assert meteor("streams", "ensure", unique_name, "--lanes", "2").code == 0
    applied = meteor("streams", "ensure", unique_name, "--lanes", "2", "--region", "us", "--on-difference", "apply")
    assert applied.code == 0, applied
    assert any(line.split() == ["region", "''", "'us'", "applied"] for line in applied.out.splitlines())
    assert "1 setting(s) applied" in applied.out
    assert open_stream(grid, unique_name, create=False).config.region == "us"

    refused = meteor("streams", "ensure", unique_name, "--lanes", "4", "--region", "eu", "--on-difference", "apply")
    refused.assert_user_error("lanes: 4 asked, 2 stored -> refused (cannot change", "new stream name")
    assert "  lanes: refused: cannot change: a key's lane is CRC-32" in refused.out
    assert "  region: kept: not applied: lanes cannot change" in refused.out
    assert open_stream(grid, unique_name, create=False).config.region == "us"


def test_the_toml_stream_table_is_part_of_the_declared_configuration(
    meteor: Meteor, grid: Grid, unique_name: str, tmp_path: Path
) -> None:
    settings = tmp_path / "meteor.toml"
    settings.write_text("[stream]\nlanes = 3\nlinger_ms = 4.0\n")
    assert meteor("streams", "ensure", unique_name, "--config", str(settings)).code == 0
    assert open_stream(grid, unique_name, create=False).config.lanes == 3
    unchanged = meteor("streams", "ensure", unique_name, "--config", str(settings), "--lanes", "3")
    assert "unchanged" in unchanged.out, unchanged


def test_bad_values_are_one_line_errors(meteor: Meteor, unique_name: str) -> None:
    meteor("streams", "ensure", unique_name, "--dedup-window-ms", "-1").assert_user_error("dedup_window_ms")
    meteor("streams", "ensure", unique_name, "--region", "eu west").assert_user_error("region 'eu west'")
    usage = meteor("streams", "ensure", unique_name, "--on-difference", "force")
    assert usage.code == 1 and "invalid choice: 'force'" in usage.err
