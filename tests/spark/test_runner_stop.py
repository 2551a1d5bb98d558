"""Spark's SIGTERM releases a grouped source runner's leases wherever it lands in the runner's main thread.

Spark stops a query's source runner with two SIGTERMs and closes its socket. A signal can land between calls, in
the middle of a batch (inside the group member's lock), as the runner's ``finally`` starts the release, or while it
releases already (it saw the closed socket first): each time the runner's ``finally`` must have left the leases
vacant when it ends (``runner_stop_script.py`` runs the reader in a process shaped like the runner).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from spark_helpers import make_stream

from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.groups.store import LEASES_MAP, lane_key

SCRIPT = Path(__file__).with_name("runner_stop_script.py")


@pytest.mark.parametrize(
    ("when", "ends_with"),
    [
        ("idle", "SystemExit 143"),
        ("in-lock", "SystemExit 143"),
        ("twice", "SystemExit 143"),
        ("in-release", "EOFError"),
    ],
)
def test_a_sigterm_releases_the_leases_wherever_it_lands(
    grid: Grid, grid_settings: GridSettings, unique_name: str, when: str, ends_with: str
) -> None:
    make_stream(grid, unique_name, lanes=2)
    args = [sys.executable, str(SCRIPT), ",".join(grid_settings.members), grid_settings.cluster_name]
    try:
        done = subprocess.run([*args, unique_name, f"query-{when}", when], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:  # run() has killed it
        pytest.fail(f"the runner hung after the SIGTERM ({when}) instead of releasing its leases")
    leases = grid.map(LEASES_MAP)
    held = [json.loads(leases.get(lane_key(unique_name, "g", lane)) or "{}") for lane in (0, 1)]
    assert [lease.get("epoch") for lease in held] == [1, 1], f"the runner never held the lanes: {done.stderr[-3000:]}"
    assert [lease.get("holder") for lease in held] == [None, None], "the runner ended without releasing its leases"
    assert done.stdout.strip() == ends_with, done.stderr[-3000:]
