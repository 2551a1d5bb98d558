"""Fixtures of the core tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.core.processes import Child


@pytest.fixture
def children() -> Iterator[list[Child]]:
    """Child processes a test starts; every one is killed when the test ends."""
    made: list[Child] = []
    yield made
    for child in made:
        child.close()
