"""One grid client per Python process, shared by every task that process runs.

Spark reuses its Python workers across tasks and micro-batches (``spark.python.worker.reuse``), and connecting a
Hazelcast client takes far longer than reading a small lane range, so executors keep one ``Grid`` per
``GridSettings`` for the life of the worker. The driver-side source runner uses the same cache.
"""

from __future__ import annotations

import logging
import threading

from meteor_spark.grid.client import Grid, GridSettings

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_grids: dict[GridSettings, Grid] = {}


def grid_for(settings: GridSettings) -> Grid:
    """The process's client for ``settings``, connecting on first use."""
    with _lock:
        grid = _grids.get(settings)
        if grid is None:
            grid = Grid(settings)
            _grids[settings] = grid
        return grid


def forget(settings: GridSettings) -> None:
    """Drop (and close) the cached client, e.g. after it failed, so the next task reconnects."""
    with _lock:
        grid = _grids.pop(settings, None)
    if grid is not None:
        try:
            grid.close()
        except Exception:
            logger.debug("closing a dropped grid client failed", exc_info=True)
