"""The record-size sweep of ``meteor bench sizes`` measured as a new client process sees it: every side of every
size (raw ``add_all``, ``publish_many``, one subscriber, ``publish_async``) runs in a process of its own, started
for that one run (``spawn``: a fresh interpreter, nothing allocated before), with its minor page faults counted
over the timed part.

Why: a process's first hundreds of MB of 10 KiB records ran at half the speed of the same process warmed up,
because of glibc's malloc (``meteor_spark.allocator``); a sweep measuring everything in one warm process hid it.
With ``--allocator both`` each side also runs with ``METEOR_MALLOC_TUNING=off``, so the settings' effect is
measured in the same run. The member is the sweep's own (one process for the whole sweep, already warm).
"""

from __future__ import annotations

import multiprocessing
import os
import resource
from typing import Any

from meteor_spark.allocator import OPT_OUT_ENV, tune_allocator
from meteor_spark.bench import sizes_measure
from meteor_spark.bench.sizes_measure import Shape
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.streams import StreamConfig
from meteor_spark.groups.admin import delete_stream

#: The sides of one size, in the order they run (``consume`` reads what ``publish_many`` wrote).
SIDES = ("ceiling", "publish_many", "consume", "publish_async")
#: ``--allocator`` choices: the settings applied (the product's default), off, or both side by side.
ALLOCATOR_MODES = ("tuned", "off", "both")


def size_points(settings: GridSettings, options: Any, size: int, modes: tuple[bool, ...]) -> list[dict[str, Any]]:
    """One size per allocator mode (True: tuned), every side in a fresh process per run, best of
    ``options.repeats`` runs (the fastest run's faults); the modes alternate run by run, so a neighbour's load
    falls on both."""
    n = sizes_measure.records_for(options, size)
    shape = Shape.of(options.publisher_settings(), size)
    best: dict[bool, dict[str, tuple[float, int, float]]] = {tuned: {} for tuned in modes}
    context = multiprocessing.get_context("spawn")
    for _ in range(options.repeats):
        for tuned in modes:
            stream = sizes_measure.stream_for("many", 1, n, shape)
            try:
                for side in SIDES:
                    with context.Pool(1) as pool:
                        measured = pool.apply(_run_side, (side, settings, options, size, stream, tuned))
                    if side not in best[tuned] or measured[0] < best[tuned][side][0]:
                        best[tuned][side] = measured
            finally:
                with Grid(settings) as grid:
                    delete_stream(grid, stream.name)
    return [_point(size, n, shape, tuned, best[tuned]) for tuned in modes]


def _point(size: int, n: int, shape: Any, tuned: bool, best: dict[str, tuple[float, int, float]]) -> dict[str, Any]:
    return {
        "record_bytes": size,
        "records": n,
        "records_per_item": shape.records_per_item,
        "items_per_call": shape.items_per_call,
        "allocator": "tuned" if tuned else "off",
        "ceiling_records_s": n / best["ceiling"][0],
        "publish_many_records_s": n / best["publish_many"][0],
        "publish_async_records": sizes_measure.async_records(n),
        "publish_async_records_s": sizes_measure.async_records(n) / best["publish_async"][0],
        "consume_records_s": n / best["consume"][0],
        "minor_faults": {side: faults for side, (_, faults, _) in best.items()},
        # CPU seconds of the client process per MB moved (all its threads): the figure a shared machine's load
        # disturbs least.
        "cpu_ms_per_mb": {
            side: 1000 * cpu / ((sizes_measure.async_records(n) if side == "publish_async" else n) * size / 1e6)
            for side, (_, _, cpu) in best.items()
        },
    }


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
