"""Slow-reader scenario: what a client that reads slower than the member sends costs the member.

One raw connection keeps ``--subscribers`` large ``read_many`` calls (``--items`` x 64 KiB each, ~6 MB) in flight and
reads the responses at ``--rate-mb-s`` (with ``--official``: that many threads share one official client, whose
Python reactor is the slow reader); a second (official) client meanwhile makes small calls. Reported: bytes the
slow client received, the member process's CPU seconds and resident memory (peak), and the other client's latency.

    .venv/bin/python tests/server/slow_reader_scenario.py [--duration-s 15] [--rate-mb-s 40] [--official]

Not a test (timing decides nothing here); the bounded-buffer behaviour itself is asserted by
``test_flow_control.py``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from typing import Any

from raw_client import RawClient, correlation_id_of

from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.server import EmbeddedGrid, RingConfig
from meteor_spark.server.protocol import messages as m

MB = 1024 * 1024
RING = "scenario.slow-reader"


def proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_memory_mb(pid: int) -> tuple[float, float]:
    """(current RSS, peak RSS) in MiB."""
    values: dict[str, float] = {}
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0]) / 1024
    return values["VmRSS"], values["VmHWM"]


def run(args: argparse.Namespace) -> dict[str, Any]:
    item = os.urandom(64 * 1024)
    with EmbeddedGrid(process=True, ring_configs=[RingConfig(RING, capacity=args.items)]) as member:
        assert member.pid is not None
        with Grid(GridSettings(members=(member.address,), cluster_name=member.cluster_name)) as grid:
            ring = grid.ring(RING)
            ring.add_all([item] * args.items)
            stop = threading.Event()
            latencies: list[float] = []
            other_grid = Grid(GridSettings(members=(member.address,), cluster_name=member.cluster_name)).__enter__()

            def other_client() -> None:
                other_ring = other_grid.ring(RING)
                while not stop.is_set():
                    started = time.perf_counter()
                    other_ring.size()
                    latencies.append(time.perf_counter() - started)
                    stop.wait(0.02)

            _, rss_start = proc_memory_mb(member.pid)
            cpu_start = proc_cpu_s(member.pid)
            other = threading.Thread(target=other_client, daemon=True)
            other.start()
            peak_rss = 0.0
            responses = 0
            if args.official:
                figures = _official(grid, member.pid, args)
                stop.set()
                other.join()
                other_grid.__exit__(None, None, None)
                return _report(figures, latencies)
            with RawClient(member.address, receive_buffer=256 * 1024, timeout_s=30) as slow:
                slow.authenticate(client_name="slow-reader")

                def request() -> int:
                    return slow.send(
                        m.RINGBUFFER_READ_MANY,
                        name=RING,
                        start_sequence=0,
                        min_count=1,
                        max_count=args.items,
                        filter=None,
                    )

                outstanding = {request() for _ in range(args.subscribers)}
                started = time.monotonic()
                next_sample = started
                chunk = 64 * 1024
                while time.monotonic() - started < args.duration_s:
                    # Pace the reads: one 64 KiB recv per chunk / rate seconds.
                    due = started + slow.received_bytes / (args.rate_mb_s * MB)
                    delay = due - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                    for message in slow.read_some(chunk):
                        outstanding.discard(correlation_id_of(message))
                        responses += 1
                        outstanding.add(request())
                    if time.monotonic() >= next_sample:
                        peak_rss = max(peak_rss, proc_memory_mb(member.pid)[0])
                        next_sample += 0.2
                elapsed = time.monotonic() - started
                cpu = proc_cpu_s(member.pid) - cpu_start
                _rss_now, hwm = proc_memory_mb(member.pid)
            stop.set()
            other.join()
            other_grid.__exit__(None, None, None)
    return _report(_figures(elapsed, slow.received_bytes, responses, cpu, rss_start, peak_rss, hwm), latencies)


def _figures(
    elapsed: float, received: int, responses: int, cpu: float, rss_start: float, peak_rss: float, hwm: float
) -> dict[str, Any]:
    return {
        "duration_s": round(elapsed, 1),
        "slow_client_mb": round(received / MB, 1),
        "slow_client_mb_s": round(received / MB / elapsed, 1),
        "responses": responses,
        "member_cpu_s": round(cpu, 2),
        "member_cpu_pct": round(100 * cpu / elapsed, 1),
        "member_cpu_ms_per_mb": round(1000 * cpu / max(1e-9, received / MB), 2),
        "member_rss_start_mb": round(rss_start, 1),
        "member_rss_peak_sampled_mb": round(peak_rss, 1),
        "member_rss_hwm_mb": round(hwm, 1),
    }


def _official(grid: Grid, pid: int, args: argparse.Namespace) -> dict[str, Any]:
    """``--subscribers`` threads sharing one official client, each calling read_many in a loop: the client's
    Python reactor is the slow reader."""
    ring = grid.ring(RING)
    received = [0] * args.subscribers
    deadline = time.monotonic() + args.duration_s
    _, rss_start = proc_memory_mb(pid)
    cpu_start = proc_cpu_s(pid)
    started = time.monotonic()

    def subscriber(index: int) -> None:
        while time.monotonic() < deadline:
            batch = ring.read_many(0, 1, args.items)
            received[index] += sum(len(item) for item in batch.items)

    threads = [threading.Thread(target=subscriber, args=(index,), daemon=True) for index in range(args.subscribers)]
    for thread in threads:
        thread.start()
    peak_rss = 0.0
    while any(thread.is_alive() for thread in threads):
        peak_rss = max(peak_rss, proc_memory_mb(pid)[0])
        threads[0].join(0.2)
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    cpu = proc_cpu_s(pid) - cpu_start
    _, hwm = proc_memory_mb(pid)
    return _figures(elapsed, sum(received), -1, cpu, rss_start, peak_rss, hwm)


def _report(figures: dict[str, Any], latencies: list[float]) -> dict[str, Any]:
    latencies.sort()
    figures = {
        **figures,
        "other_client_calls": len(latencies),
        "other_client_p50_ms": round(1000 * statistics.median(latencies), 2) if latencies else None,
        "other_client_p99_ms": round(1000 * latencies[int(0.99 * (len(latencies) - 1))], 2) if latencies else None,
        "other_client_max_ms": round(1000 * latencies[-1], 2) if latencies else None,
    }
    for key, value in figures.items():
        print(f"{key:28s} {value}")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration-s", type=float, default=15.0)
    parser.add_argument("--rate-mb-s", type=float, default=40.0, help="how fast the slow client reads")
    parser.add_argument("--subscribers", type=int, default=16, help="read_many calls kept in flight")
    parser.add_argument("--items", type=int, default=96, help="64 KiB items per read_many response")
    parser.add_argument(
        "--official", action="store_true", help="the subscribers are threads sharing one official client instead"
    )
    run(parser.parse_args())


if __name__ == "__main__":
    main()
