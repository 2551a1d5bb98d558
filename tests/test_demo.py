"""``meteor demo`` end to end, as a user runs it (the console script in its own process), at a small size."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from meteor_spark.cli.demo_orders import WINDOW_MS, DemoOptions, OrderGenerator
from meteor_spark.errors import ConfigError

METEOR = Path(sys.executable).with_name("meteor")


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_demo_reads_everything_writes_results_back_and_confirms_offsets(tmp_path: Path) -> None:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    done = subprocess.run(
        [str(METEOR), "demo", "--records", "3000", "--lanes", "3", "--seconds", "4", "--minutes", "3"],
        capture_output=True,
        text=True,
        timeout=400,
        env=env,
        cwd=tmp_path,  # not the checkout: like a user's shell
    )
    out = done.stdout
    assert done.returncode == 0, f"stdout:\n{out}\nstderr:\n{done.stderr[-4000:]}"
    assert "Traceback" not in done.stderr

    assert re.search(r"orders published\s+3,000", out)
    assert re.search(r"records read by Spark\s+3,001\s+in \d+ micro-batch", out)  # every order + the clock event
    windows = re.search(r"windows written back\s+(\d+)\s+of (\d+) expected", out)
    assert windows and windows.group(1) == windows.group(2) and int(windows.group(1)) >= 15  # 3 minutes x 5
    assert re.search(r"windows checked\s+\d+\s+match the publisher's own count and revenue", out)
    lane_rows = re.findall(r"^\s+(\d)\s+([\d,]+)\s+([\d,]+)\s+at the end$", out, re.MULTILINE)
    assert sorted(int(lane) for lane, _, _ in lane_rows) == [0, 1, 2]
    assert all(confirmed == end for _, confirmed, end in lane_rows)
    assert "OK: every order was read" in out
    assert "(complete)" in out  # the live progress ran until the results were complete


def test_demo_options_are_validated() -> None:
    with pytest.raises(ConfigError, match="--records must be at least 1"):
        DemoOptions(records=0)
    with pytest.raises(ConfigError, match="--lanes must be between 1 and 64"):
        DemoOptions(lanes=65)


def test_order_generator_is_deterministic_and_keeps_event_times_in_shop_time() -> None:
    options = DemoOptions(records=500, shop_minutes=2)
    first, second = OrderGenerator(options, 1_700_000_000_000), OrderGenerator(options, 1_700_000_000_000)
    orders = [first.order(n) for n in range(500)]
    assert orders == [second.order(n) for n in range(500)]
    stamps = [r.timestamp_ms for r in orders if r.timestamp_ms is not None]
    assert len(stamps) == len(orders)  # every order carries its event time
    assert all(1_700_000_000_000 <= t < 1_700_000_000_000 + 2 * WINDOW_MS for t in stamps)
    assert first.tally.orders == 500
    assert sum(count for count, _ in first.tally.windows.values()) == 500
    clock = first.clock().timestamp_ms
    assert clock is not None and clock > max(stamps)
