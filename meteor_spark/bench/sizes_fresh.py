"""The record-size sweep of ``meteor bench sizes`` measured as a new client process sees it: every side of every
size (raw ``add_all``, ``publish_many``, one subscriber, ``publish_async``) runs in a process of its own, started
for that one run (``spawn``: a fresh interpreter, nothing allocated before), with its minor page faults counted
over the timed part.

Why: a process's first hundreds of MB of 10 KiB records ran at half the speed of the same process warmed up,
because of glibc's malloc (``meteor_spark.allocator``); a sweep measuring everything in one warm process hid it.
With ``--allocator both`` each side also runs with ``METEOR_MALLOC_TUNING=off``, so the settings' effect is
measured in the same run.

Every side meets a member in the same state: a member process of its own per run (``consume`` reads what
``publish_many`` wrote, on that side's member), warmed before the side starts by as many bytes written to a scratch
ring, in items of the side's size, and destroyed: the side's items then land in memory the member has used before,
as in a member that has been running, as far as its allocator keeps freed memory (``M_TRIM_THRESHOLD``, 128 MiB:
with ``--megabytes 400`` every side faults the rest in alike, ~65,000-81,000 faults). One member for the whole sweep
gave the sides unequal members: the side that ran while ``publish_many``'s stream was alive (``publish_async``,
fourth) found no freed memory to reuse and took ~24,000 minor faults in the member for 100 MB (about 100 MB of new
pages, 50-70 ms of the member's CPU), the sides before it ~0 (a second ``publish_many`` in that place ran as
slowly). The member's minor faults and CPU over each side's run are reported beside the client's.
"""

from __future__ import annotations

import multiprocessing
import os
import resource
from typing import Any, NamedTuple

from meteor_spark.allocator import OPT_OUT_ENV, tune_allocator
from meteor_spark.bench import sizes_measure
from meteor_spark.bench.sizes_measure import Shape
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.streams import StreamConfig
from meteor_spark.groups.admin import delete_stream
from meteor_spark.server import EmbeddedGrid

#: The sides of one size, in the order they run, each group against a member of its own (``consume`` reads what
#: ``publish_many`` wrote).
SIDE_GROUPS = (("ceiling",), ("publish_many", "consume"), ("publish_async",))
SIDES = tuple(side for group in SIDE_GROUPS for side in group)


class Measured(NamedTuple):
    """One side's run: wall seconds, the client's minor faults and CPU seconds while timed, and the member's minor
    faults and CPU seconds over the whole run of the side's process (None when they cannot be read)."""

    seconds: float
    faults: int
    cpu: float
    member_faults: int | None
    member_cpu: float | None


#: ``--allocator`` choices: the settings applied (the product's default), off, or both side by side.
ALLOCATOR_MODES = ("tuned", "off", "both")


def size_points(options: Any, size: int, modes: tuple[bool, ...]) -> list[dict[str, Any]]:
    """One size per allocator mode (True: tuned), every side in a fresh process per run against a warmed member
    of its own, best of ``options.repeats`` runs (the fastest run's faults); the modes alternate run by run, so a
    neighbour's load falls on both."""
    n = sizes_measure.records_for(options, size)
    shape = Shape.of(options.publisher_settings(), size)
    best: dict[bool, dict[str, Measured]] = {tuned: {} for tuned in modes}
    for _ in range(options.repeats):
        for tuned in modes:
            stream = sizes_measure.stream_for("many", 1, n, shape)
            for group in SIDE_GROUPS:
                with EmbeddedGrid(port=0, process=True) as member:
                    settings = GridSettings(members=(member.address,), cluster_name=member.cluster_name)
                    warm_member(settings, shape, size, n)
                    for side in group:
                        measured = _run_fresh(member.pid, (side, settings, options, size, stream, tuned))
                        if side not in best[tuned] or measured[0] < best[tuned][side][0]:
                            best[tuned][side] = measured
    return [_point(size, n, shape, tuned, best[tuned]) for tuned in modes]


def warm_member(settings: GridSettings, shape: Shape, size: int, records: int) -> None:
    """Write ``records`` records' worth of items of the side's size (and a page more) to a scratch ring of the
    member, then destroy it: the member has then held as many bytes as the side will write, and reuses that memory
    (nothing of the measured client is warmed: this is the sweep's own process)."""
    item = bytes(shape.records_per_item * size + 4096)
    calls = -(-records // (shape.records_per_item * shape.items_per_call))
    with Grid(settings) as grid:
        ring = grid.ring(sizes_measure.unique_name("warm"))
        try:
            for _ in range(calls):
                ring.add_all_async([item] * shape.items_per_call).result()
        finally:
            ring.destroy()


def _run_fresh(member_pid: int | None, args: tuple[Any, ...]) -> Measured:
    """``_run_side(*args)`` in a fresh process, with the member's minor faults and CPU seconds over that run."""
    before = process_usage(member_pid)
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        seconds, faults, cpu = pool.apply(_run_side, args)
    after = process_usage(member_pid)
    if before is None or after is None:
        return Measured(seconds, faults, cpu, None, None)
    return Measured(seconds, faults, cpu, after[0] - before[0], after[1] - before[1])


def process_usage(pid: int | None) -> tuple[int, float] | None:
    """A process's minor page faults and CPU seconds so far (Linux's ``/proc``, CPU in clock ticks of usually 10 ms:
    coarse for a run of a few MB; None elsewhere or without a pid)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[7]), (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _point(size: int, n: int, shape: Any, tuned: bool, best: dict[str, Measured]) -> dict[str, Any]:
    n_async = sizes_measure.async_records(n)
    mb = {side: (n_async if side == "publish_async" else n) * size / 1e6 for side in best}
    point = {
        "record_bytes": size,
        "records": n,
        "records_per_item": shape.records_per_item,
        "items_per_call": shape.items_per_call,
        "allocator": "tuned" if tuned else "off",
        "ceiling_records_s": n / best["ceiling"].seconds,
        "publish_many_records_s": n / best["publish_many"].seconds,
        "publish_async_records": n_async,
        "publish_async_records_s": n_async / best["publish_async"].seconds,
        "consume_records_s": n / best["consume"].seconds,
        "minor_faults": {side: run.faults for side, run in best.items()},
        # CPU seconds of the client process per MB moved (all its threads): the figure a shared machine's load
        # disturbs least.
        "cpu_ms_per_mb": {side: 1000 * run.cpu / mb[side] for side, run in best.items()},
    }
    if all(run.member_faults is not None for run in best.values()):
        point["member_minor_faults"] = {side: run.member_faults for side, run in best.items()}
        point["member_cpu_ms_per_mb"] = {side: 1000 * (run.member_cpu or 0.0) / mb[side] for side, run in best.items()}
    return point


def _run_side(
    side: str, settings: GridSettings, options: Any, size: int, stream: StreamConfig, tuned: bool
) -> tuple[float, int, float]:
    """In the fresh process: connect (which applies the allocator settings unless opted out), prepare the values,
    then time ``side``; (seconds, minor page faults and CPU seconds while timed)."""
    if not tuned:
        os.environ[OPT_OUT_ENV] = "off"
    n = sizes_measure.records_for(options, size)
    shape = Shape.of(options.publisher_settings(), size)
    with Grid(settings) as grid:
        if tuned and not tune_allocator().applied:
            raise RuntimeError(f"the allocator settings were not applied: {tune_allocator().reason}")
        values = [] if side == "consume" else sizes_measure.value_pool(size, n)
        if side == "ceiling":
            calls, records = sizes_measure.encoded_calls(values, shape, 1)
            return _timed(lambda: sizes_measure.raw_add_all(grid, calls), records / n)
        if side == "publish_many":
            return _timed(lambda: sizes_measure.publish_many(grid, stream, options.publisher_overrides(), values))
        if side == "consume":
            return _timed(lambda: sizes_measure.consume(grid, stream.name, n))
        async_stream = StreamConfig(sizes_measure.unique_name("async"), capacity=1000)  # overwritten: nobody reads it
        try:
            return _timed(
                lambda: sizes_measure.publish_async(
                    grid, async_stream, options.publisher_overrides(), values[: sizes_measure.async_records(n)]
                )
            )
        finally:
            delete_stream(grid, async_stream.name)


def _timed(measure: Any, scale: float = 1.0) -> tuple[float, int, float]:
    """``measure()``'s seconds (scaled: the ceiling's padded calls carry a few more records than ``n``), the
    minor page faults of this process meanwhile (a publisher's start included) and its CPU seconds over the timed
    window (``Seconds.cpu``, all threads; scaled the same way)."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    seconds = measure()
    return seconds / scale, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before, seconds.cpu / scale
