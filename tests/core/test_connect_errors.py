"""The client says why it cannot connect when the member told it, and checks TLS files before connecting."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from meteor_spark.errors import ConfigError, GridConnectionError
from meteor_spark.grid.client import Grid, GridSettings


def test_a_wrong_cluster_name_is_named_as_the_cause(grid_settings: GridSettings) -> None:
    wrong = replace(grid_settings, cluster_name="not-the-cluster", connect_timeout_s=2)
    with pytest.raises(GridConnectionError) as refused:
        Grid(wrong)
    message = str(refused.value)
    print(f"\nwrong cluster name: {message}")
    assert "refused the client's authentication" in message
    assert "cluster name 'not-the-cluster'" in message
    assert "is a member running there" not in message


def test_no_member_still_asks_whether_one_runs() -> None:
    with pytest.raises(GridConnectionError, match="is a member running there"):
        Grid(GridSettings(members=("127.0.0.1:1",), connect_timeout_s=1))


@pytest.mark.parametrize(
    ("option", "field"),
    [
        ("hazelcast.ssl.cafile", "ssl_cafile"),
        ("hazelcast.ssl.certfile", "ssl_certfile"),
        ("hazelcast.ssl.keyfile", "ssl_keyfile"),
    ],
)
def test_a_missing_tls_file_is_named_before_connecting(
    grid_settings: GridSettings, tmp_path: Path, option: str, field: str
) -> None:
    missing = tmp_path / "missing.pem"
    tls_file: dict[str, Any] = {field: str(missing)}
    settings = replace(grid_settings, ssl_enabled=True, connect_timeout_s=10, **tls_file)
    started = time.monotonic()
    with pytest.raises(ConfigError) as refused:
        Grid(settings)
    assert time.monotonic() - started < 1.0
    assert f"{option} {str(missing)!r}: no such file" in str(refused.value)
