"""Keep PySpark's collection after every task off the long-lived objects of a Python worker.

A reused PySpark worker (``spark.python.worker.reuse``, Spark's default) runs a full ``gc.collect()`` after every
task (``pyspark/daemon.py``). A full collection walks every object the cyclic collector tracks, and a worker that
imported PySpark, pyarrow, numpy, the Hazelcast client and meteor and holds a connected grid client tracks about
107,000: measured on 2 cores, 43-55 ms of CPU after every meteor task (the task's own work on 1,000,000 100-byte
records was about 60 ms), and 25-45 ms in the worker that plans a write, every job. Those objects live as long
as the process, so the collection can never free them.

So at a meteor entry point of such a worker (a grid client asked for, a read or write planned), whenever the
process imported modules since the last time (imports are what bring long-lived objects: a task's first use of a
code path imports it), everything the collector tracks is frozen (``gc.freeze``): the collection after a task then
walks only what later tasks left behind (measured: 0.1 ms, ~100 objects). Freezing does not keep anything alive:
reference counting still frees a frozen object no longer referenced. What a freeze costs is that a frozen object
left unreachable inside a reference cycle stays until it is unfrozen. That is bounded: freezes happen only when
modules were added (a few times per process), and ``release`` unfreezes everything when a cached grid client is
dropped (its connection failed), so the dropped client and anything else frozen is collected again; the next entry
point freezes afresh.

Only in PySpark's reused workers (Spark sets ``SPARK_REUSE_WORKER`` for them), never in a user's own process.
``METEOR_WORKER_GC_FREEZE=off`` leaves the collector alone.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
import threading

logger = logging.getLogger(__name__)

#: Set to ``off`` (or ``0``, ``false``, ``no``) to leave a worker's collector alone.
OPT_OUT_ENV = "METEOR_WORKER_GC_FREEZE"
#: Set by Spark in the environment of its reused Python workers (``PythonWorkerFactory``).
REUSED_WORKER_ENV = "SPARK_REUSE_WORKER"

_lock = threading.Lock()
_modules_at_freeze = -1  # len(sys.modules) when this process last froze; -1: never, or released since


def applies() -> bool:
    """Whether this process is a reused PySpark worker that did not opt out."""
    if not os.environ.get(REUSED_WORKER_ENV):
        return False
    return os.environ.get(OPT_OUT_ENV, "").strip().lower() not in ("off", "0", "false", "no")


def freeze_long_lived() -> bool:
    """Freeze every object the collector tracks if this is a reused PySpark worker that imported modules since its
    last freeze; returns whether it froze. Cheap otherwise (a length and an environment lookup)."""
    global _modules_at_freeze
    if len(sys.modules) == _modules_at_freeze or not applies():
        return False
    with _lock:
        if len(sys.modules) == _modules_at_freeze:
            return False
        gc.freeze()
        _modules_at_freeze = len(sys.modules)
    logger.debug("froze %d long-lived objects of this Python worker", gc.get_freeze_count())
    return True


def release() -> None:
    """Unfreeze everything frozen (a cached client was dropped: it may now be garbage in cycles), so the next
    collection can free it; the next entry point freezes again."""
    global _modules_at_freeze
    with _lock:
        if _modules_at_freeze == -1:
            return
        gc.unfreeze()
        _modules_at_freeze = -1
