"""A reused PySpark worker's long-lived objects frozen out of the collection PySpark runs after every task
(``meteor_spark.spark.worker_heap``): frozen once the worker imported meteor, again only when it imported more,
released when its grid client is dropped, and never outside such a worker or with the opt-out.

Each case runs in a fresh interpreter: freezing is process-wide, and the test process must keep its collector."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

from meteor_spark.grid.client import GridSettings
from meteor_spark.spark import worker_heap

#: Imports what a write task imports, then reports what ``freeze_long_lived`` did and what a full collection (as
#: PySpark's daemon runs after a task) has left to walk.
_FREEZE = """
import gc, json
import meteor_spark.spark.writer
from meteor_spark.spark import worker_heap
first = worker_heap.freeze_long_lived()
tracked_after_first = len(gc.get_objects())
frozen = gc.get_freeze_count()
again = worker_heap.freeze_long_lived()
import meteor_spark.spark.batch_reader
after_import = worker_heap.freeze_long_lived()
print(json.dumps({"first": first, "tracked": tracked_after_first, "frozen": frozen, "again": again,
                  "after_import": after_import}))
"""

#: A frozen object left unreachable in a cycle stays until ``release``; the next collection then frees it.
_RELEASE = """
import gc, json, weakref
from meteor_spark.spark import worker_heap
class Node:
    pass
node = Node()
node.me = node
alive = weakref.ref(node)
worker_heap.freeze_long_lived()
del node
gc.collect()
kept_while_frozen = alive() is not None
worker_heap.release()
gc.collect()
print(json.dumps({"kept_while_frozen": kept_while_frozen, "freed_after_release": alive() is None,
                  "frozen_after_release": gc.get_freeze_count()}))
"""

#: The cached grid client of a worker: asking for it freezes, dropping it unfreezes, asking again freezes again.
_CLIENTS = """
import gc, json, sys
from meteor_spark.grid.client import GridSettings
from meteor_spark.spark.clients import forget, grid_for
settings = GridSettings(members=tuple(sys.argv[1].split(",")), cluster_name=sys.argv[2])
grid_for(settings)
frozen = gc.get_freeze_count()
forget(settings)
released = gc.get_freeze_count()
grid_for(settings)
print(json.dumps({"frozen": frozen, "released": released, "frozen_again": gc.get_freeze_count()}))
forget(settings)
"""


def _run(script: str, env: dict[str, str], *args: str) -> dict[str, Any]:
    base = {k: v for k, v in os.environ.items() if k not in (worker_heap.REUSED_WORKER_ENV, worker_heap.OPT_OUT_ENV)}
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**base, **env},
        check=True,
    )
    outcome: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return outcome


def test_a_reused_worker_freezes_its_imports_and_again_only_after_new_ones() -> None:
    outcome = _run(_FREEZE, {worker_heap.REUSED_WORKER_ENV: "1"})
    print(f"frozen {outcome['frozen']:,} objects; a full collection then walks {outcome['tracked']:,}")
    assert outcome["first"] is True
    assert outcome["frozen"] > 30_000  # PySpark, pyarrow, numpy, the Hazelcast client and meteor
    assert outcome["tracked"] < 1_000  # what PySpark's collection after a task now walks
    assert outcome["again"] is False  # nothing imported since: nothing to do
    assert outcome["after_import"] is True  # a new code path's modules are frozen too


def test_nothing_is_frozen_outside_a_reused_worker_or_with_the_opt_out() -> None:
    assert _run(_FREEZE, {})["frozen"] == 0  # a user's own process
    for value in ("off", "0", "false", "NO"):
        outcome = _run(_FREEZE, {worker_heap.REUSED_WORKER_ENV: "1", worker_heap.OPT_OUT_ENV: value})
        assert outcome["frozen"] == 0, value
        assert outcome["first"] is False, value


def test_release_lets_the_collector_free_what_was_frozen_in_a_cycle() -> None:
    outcome = _run(_RELEASE, {worker_heap.REUSED_WORKER_ENV: "1"})
    assert outcome == {"kept_while_frozen": True, "freed_after_release": True, "frozen_after_release": 0}


def test_a_workers_grid_client_freezes_and_dropping_it_releases(grid_settings: GridSettings) -> None:
    members = ",".join(grid_settings.members)
    outcome = _run(_CLIENTS, {worker_heap.REUSED_WORKER_ENV: "1"}, members, grid_settings.cluster_name)
    assert outcome["frozen"] > 30_000
    assert outcome["released"] == 0
    assert outcome["frozen_again"] > 30_000


def test_spark_s_python_workers_are_reused_workers_and_freeze(spark: Any) -> None:
    """Spark's own Python workers are recognised (``SPARK_REUSE_WORKER``), and freezing there leaves a full
    collection little to walk: checked from inside a real worker, as a task."""

    def freeze_in_this_worker(batches: Iterator[Any]) -> Iterator[Any]:  # pickled by value, run by the worker
        import gc

        import pyarrow as pa

        import meteor_spark.spark.writer  # noqa: F401  # what a write task brings in
        from meteor_spark.spark import worker_heap as heap

        froze = heap.freeze_long_lived()
        for batch in batches:
            n = batch.num_rows
            yield pa.RecordBatch.from_pydict(
                {
                    "applies": [heap.applies()] * n,
                    "froze": [froze] * n,
                    "frozen": [gc.get_freeze_count()] * n,
                    "tracked": [len(gc.get_objects())] * n,
                }
            )

    rows = (
        spark.range(1, numPartitions=1)
        .mapInArrow(freeze_in_this_worker, "applies boolean, froze boolean, frozen long, tracked long")
        .collect()
    )
    (row,) = rows
    print(f"in a Spark worker: {row.frozen:,} objects frozen, {row.tracked:,} left for the collection after a task")
    assert row.applies is True
    assert row.frozen > 30_000
    assert row.tracked < 5_000
