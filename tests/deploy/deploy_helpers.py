"""Processes of the deployment tier: Spark launched from the deployed pyspark wheel, free ports, process trees."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from meteor_spark.format.records import Record, decode_batch
from meteor_spark.grid.client import Grid
from meteor_spark.grid.streams import StreamConfig, lane_bounds, open_stream
from meteor_spark.producer.publisher import Publisher

SCRIPTS = Path(__file__).with_name("scripts")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def pyspark_home(python: Path) -> Path:
    """SPARK_HOME of the pyspark installed in ``python``'s environment (the wheel ships bin/ and jars/)."""
    done = subprocess.run(
        [str(python), "-c", "import os, pyspark; print(os.path.dirname(pyspark.__file__))"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return Path(done.stdout.strip())


def run_script(
    python: Path, name: str, args: Sequence[str], cwd: Path, env: dict[str, str], timeout_s: float
) -> subprocess.CompletedProcess[str]:
    """Run ``scripts/<name>`` with the deployed Python from ``cwd`` (a copy, so sys.path never sees the checkout)."""
    script = cwd / name
    script.write_text((SCRIPTS / name).read_text())
    return subprocess.run(
        [str(python), str(script), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s
    )


def start(args: Sequence[str], log: Path, env: dict[str, str], cwd: Path) -> subprocess.Popen[bytes]:
    """A long-running process in a session of its own, its output in ``log``."""
    with log.open("wb") as out:
        return subprocess.Popen(
            list(args), stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True
        )


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, grandchildren, ...), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, pending = [], [pid]
    while pending:
        for child in children.get(pending.pop(), []):
            found.append(child)
            pending.append(child)
    return found


def kill_tree(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL a process started by ``start`` and everything below it (executors, Python workers)."""
    if process.poll() is None:
        for pid in [process.pid, *descendants(process.pid)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    process.wait(timeout=60)


def stop(process: subprocess.Popen[bytes]) -> None:
    """Stop a process started by ``start``: SIGTERM to its session, SIGKILL after 20 s."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=60)


def wait_for_log(log: Path, text: str, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    """Wait until ``text`` appears in ``log``; fail with the log's tail when the process dies or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        content = log.read_text(errors="replace") if log.exists() else ""
        if text in content:
            return
        if process.poll() is not None:
            raise AssertionError(f"{log.name}: exited with {process.returncode} before {text!r}:\n{content[-3000:]}")
        time.sleep(0.2)
    raise AssertionError(f"{log.name}: no {text!r} within {timeout_s:g} s:\n{log.read_text(errors='replace')[-3000:]}")


def publish_numbered(grid: Grid, stream: str, count: int, lanes: int, per_item: int) -> None:
    """Records ``0 .. count-1`` (value = the number, keyed by it) into a new stream; returns once acknowledged."""
    config = StreamConfig(stream, lanes=lanes, capacity=100_000, max_batch_records=per_item)
    with Publisher(grid, config) as publisher:
        publisher.publish_many([Record(str(n).encode(), key=str(n).encode()) for n in range(count)]).result()


def read_all_values(grid: Grid, stream: str) -> list[bytes]:
    """Every record value the stream holds, all lanes (ring reads of at most 999 items each)."""
    info = open_stream(grid, stream, create=False)
    values: list[bytes] = []
    for lane, (head, end) in lane_bounds(grid, info).items():
        ring = grid.ring(info.ring_names[lane])
        sequence = head
        while sequence < end:
            batch = ring.read_many(sequence, 0, min(999, end - sequence))
            for item, item_sequence in zip(batch.items, batch.sequences, strict=True):
                values.extend(r.value for r in decode_batch(item, stream=stream, lane=lane, sequence=item_sequence))
            sequence += len(batch.items)
    return values


def record_count(grid: Grid, stream: str) -> int:
    return len(read_all_values(grid, stream))


def losses(expected: int, values: list[bytes]) -> tuple[int, int]:
    """(lost, duplicated) of records ``0 .. expected-1`` among ``values``."""
    seen = [int(v) for v in values]
    unique = set(seen)
    return len(set(range(expected)) - unique), len(seen) - len(unique)


def deploy_env(python: Path) -> dict[str, str]:
    """The environment of a process of the deployed install: its Python for Spark, nothing of the checkout."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPARK_HOME", "VIRTUAL_ENV")}
    env.update(
        PYSPARK_PYTHON=str(python),
        PYSPARK_DRIVER_PYTHON=str(python),
        PATH=f"{python.parent}{os.pathsep}{env.get('PATH', '')}",
        SPARK_LOCAL_IP="127.0.0.1",
        PYTHONUNBUFFERED="1",
    )
    return env
