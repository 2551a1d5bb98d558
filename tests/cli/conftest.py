"""Running ``meteor`` in-process against the test grid, capturing what a user would see."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from meteor_spark.cli.main import main
from meteor_spark.grid.client import GridSettings


@dataclass(frozen=True)
class Run:
    """One ``meteor`` invocation: exit code, stdout, stderr."""

    code: int
    out: str
    err: str

    def assert_user_error(self, *fragments: str) -> None:
        """A user mistake: exit code 1, exactly one line on stderr naming the problem, no traceback."""
        assert self.code == 1, self
        lines = self.err.strip().splitlines()
        assert len(lines) == 1, self.err
        assert "Traceback" not in self.err
        for fragment in fragments:
            assert fragment in lines[0], lines[0]


Meteor = Callable[..., Run]


@pytest.fixture
def connection(grid_settings: GridSettings) -> list[str]:
    """The flags that point ``meteor`` at the grid under test."""
    return ["--members", ",".join(grid_settings.members), "--cluster-name", grid_settings.cluster_name]


@pytest.fixture
def meteor(connection: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Meteor:
    """``meteor(*args)`` runs ``main([*args, *connection])`` and returns what it printed. ``connect=False`` leaves
    the connection flags out."""
    for variable in ("METEOR_CONFIG", "METEOR_HAZELCAST_MEMBERS", "METEOR_CLUSTER_NAME"):
        monkeypatch.delenv(variable, raising=False)

    def run(*args: str, connect: bool = True) -> Run:
        capsys.readouterr()
        code = main([*args, *(connection if connect else [])])
        captured = capsys.readouterr()
        return Run(code, captured.out, captured.err)

    return run
