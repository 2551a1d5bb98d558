"""Fixtures of the core tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from meteor_spark.grid.client import Grid, GridSettings
from tests.core.processes import Child


@pytest.fixture
def children() -> Iterator[list[Child]]:
    """Child processes a test starts; every one is killed when the test ends."""
    made: list[Child] = []
    yield made
    for child in made:
        child.close()


@pytest.fixture
def persistent_grid(tmp_path: Path) -> Iterator[Grid]:
    """A client of a persistent embedded member in its own process (it serves history below a ring's head)."""
    from meteor_spark.server import EmbeddedGrid

    member = EmbeddedGrid(port=0, process=True, data_dir=tmp_path / "data")
    member.start()
    try:
        with Grid(GridSettings(members=(member.address,), cluster_name=member.cluster_name)) as client:
            yield client
    finally:
        member.stop()
