"""A Spark driver SIGKILLed mid-stream, several times, and restarted from its checkpoint loses nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from meteor_spark.grid import Grid, GridSettings
from meteor_spark.groups import OFFSETS_MAP, lane_key
from meteor_spark.offsets import first_offset_of
from meteor_spark.testing import wait_until
from spark_helpers import make_stream, put_items, read_values, values_items

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SCRIPT = Path(__file__).with_name("driver_script.py")


def _driver(grid_settings: GridSettings, source: str, target: str, checkpoint: Path, mode: str) -> subprocess.Popen:
    args = [sys.executable, str(SCRIPT), ",".join(grid_settings.members), grid_settings.cluster_name, source, target,
            str(checkpoint), mode]
    # A session of its own, so the whole driver (Python and its JVM) can be killed as one process group.
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)


KILLS = 3


@pytest.mark.fault
def test_driver_killed_mid_stream_several_times_and_restarted_loses_nothing(
    grid: Grid, grid_settings: GridSettings, unique_name: str, tmp_path: Path
) -> None:
    source, target = f"{unique_name}-in", f"{unique_name}-out"
    info = make_stream(grid, source, lanes=1)
    make_stream(grid, target, lanes=1)
    items = 30
    published = [r.value for r in put_items(grid, info, 0, values_items("rec", items=items, per_item=2))]
    checkpoint = tmp_path / "cp"

    for kill in range(KILLS):
        written = len(read_values(grid, target)[0])
        driver = _driver(grid_settings, source, target, checkpoint, "forever")
        try:
            # Kill once this run has written a few batches (one ring item of 2 records each).
            wait_until(lambda: len(read_values(grid, target)[0]) >= written + 6 or driver.poll() is not None,
                       timeout_s=180, interval_s=0.2, message=f"driver run {kill + 1} to write a few batches")
            assert driver.poll() is None, "the driver exited before it was killed"
            os.killpg(driver.pid, signal.SIGKILL)
        finally:
            if driver.poll() is None:
                os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
    written_before = len(read_values(grid, target)[0])
    assert written_before < len(published), "killed too late to test anything; publish more"

    restarted = _driver(grid_settings, source, target, checkpoint, "available-now")
    try:
        out, _ = restarted.communicate(timeout=300)
    finally:
        if restarted.poll() is None:
            os.killpg(restarted.pid, signal.SIGKILL)
            restarted.wait()
    assert restarted.returncode == 0 and "DONE" in out

    written = read_values(grid, target)[0]
    lost = len(set(published) - set(written))
    duplicates = Counter(written) - Counter(published)
    print(f"driver SIGKILL x{KILLS}, meteor -> meteor: {len(published)} records published, {len(written)} written, "
          f"lost {lost}, duplicated {sum(duplicates.values())}, written before the final run {written_before}")
    assert lost == 0
    # A batch whose records were published when the driver died, but whose sink commit was not recorded yet, is
    # published again when Spark replays it (at least once): at most one ring item of 2 records per kill.
    assert sum(duplicates.values()) <= 2 * KILLS, duplicates
    offsets = grid.map(OFFSETS_MAP)
    assert json.loads(offsets.get(lane_key(source, "killed", 0)))["offset"] == first_offset_of(items)
