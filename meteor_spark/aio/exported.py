"""Prometheus export of an ``AsyncSubscriber``'s lag: figures the collector can read from its scrape thread.

``meteor_spark.metrics`` reads a client's figures synchronously when Prometheus scrapes, on prometheus_client's
thread. The threaded subscriber's lag is a grid read per lane made right then; an asyncio subscriber's grid calls
belong to its event loop, so ``LagWatch`` makes them there instead: a task refreshes each lane's bounds every
``LAG_REFRESH_S`` and keeps the lag it computed as one dict, replaced whole (the scrape thread reads it without a
lock). The gauge is thus at most ``LAG_REFRESH_S`` old; the counters are read at scrape as the threaded ones.
"""

from __future__ import annotations

import asyncio
import logging

from meteor_spark.aio.lane_reads import LaneReads
from meteor_spark.errors import MeteorError
from meteor_spark.format.offsets import sequence_of

__all__ = ["LAG_REFRESH_S", "LagWatch", "lane_lag", "refreshed_lag"]

logger = logging.getLogger(__name__)

#: How often an exported asyncio subscriber reads its lanes' ends for the lag gauge.
LAG_REFRESH_S = 1.0


def lane_lag(reads: LaneReads) -> dict[int, int]:
    """Ring items behind each lane's end (as its bounds were last read), from the next record to deliver."""
    return {
        lane: max(0, reads.bounds[lane].tail() + 1 - sequence_of(state.position))
        for lane, state in list(reads.lanes.items())
        if lane in reads.bounds
    }


async def refreshed_lag(reads: LaneReads) -> dict[int, int]:
    """``lane_lag`` after reading every lane's bounds again."""
    for lane in list(reads.lanes):
        bounds = reads.bounds.get(lane)
        if bounds is not None:
            await bounds.refresh()
    return lane_lag(reads)


class LagWatch:
    """The lag gauge of one exported ``AsyncSubscriber``, refreshed on its loop (module docs)."""

    def __init__(self, reads: LaneReads, stream: str) -> None:
        self._reads = reads
        self._stream = stream
        self.lag: dict[int, int] = lane_lag(reads)
        self._task: asyncio.Task[None] | None = asyncio.get_running_loop().create_task(
            self._run(), name=f"meteor-aio-lag-{stream}"
        )

    async def _run(self) -> None:
        while True:
            try:
                self.lag = await refreshed_lag(self._reads)
            except MeteorError as exc:  # the gauge keeps its last value while the grid is unreachable
                logger.debug("no lag for stream %r: %s", self._stream, exc)
            await asyncio.sleep(LAG_REFRESH_S)

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
