"""One grid client per Python process, shared by every task that process runs.

Spark reuses its Python workers across tasks and micro-batches (``spark.python.worker.reuse``), and connecting a
Hazelcast client takes far longer than reading a small lane range, so executors keep one ``Grid`` per
``GridSettings`` for the life of the worker. The driver-side source runner uses the same cache.

An executor reads ring items by the megabyte (several reads of ~3 MB in flight), so its client reads its sockets
with a larger buffer than the client's default 128,000 bytes (``RECEIVE_BUFFER_BYTES``): fewer calls into the
kernel and fewer window updates per byte: reading 100-byte records, a task worker's reactor thread spends ~20-30 ns
of CPU a record with it, ~40-45 with the default. The kernel caps the socket's buffer at ``net.core.rmem_max``; the
larger read per call is the client's own.

Asking for a client is also where a worker's long-lived objects are frozen (``worker_heap``): every task asks
first, after its imports.
"""

from __future__ import annotations

import logging
import threading

from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.spark import worker_heap

logger = logging.getLogger(__name__)

#: The socket receive buffer (and most read per call) of the grid clients of this module (see the module's notes).
RECEIVE_BUFFER_BYTES = 4 * 1024 * 1024

_lock = threading.Lock()
_grids: dict[GridSettings, Grid] = {}


def grid_for(settings: GridSettings) -> Grid:
    """The process's client for ``settings``, connecting on first use."""
    with _lock:
        grid = _grids.get(settings)
        if grid is None:
            grid = Grid(settings, receive_buffer_bytes=RECEIVE_BUFFER_BYTES)
            _grids[settings] = grid
    worker_heap.freeze_long_lived()
    return grid


def forget(settings: GridSettings) -> None:
    """Drop (and close) the cached client, e.g. after it failed, so the next task reconnects."""
    with _lock:
        grid = _grids.pop(settings, None)
    if grid is not None:
        worker_heap.release()  # the dropped client was frozen with the rest: let the collector free it
        try:
            grid.close()
        except Exception:
            logger.debug("closing a dropped grid client failed", exc_info=True)
