"""The console's sampler: every ``interval_s`` on a daemon thread, the lane ends of every stream (rates) and the
ring items every group lane is behind (the lag history the group page charts).

One round costs a fixed number of grid calls whatever the number of groups: the lane ends of all streams in two
(``streams_bounds``), the groups in one scan per group map (``list_groups``), every exclusive lane's confirmed
offset in one ``get_all``, every shared lane's entry in one more. It reads only; nothing is written to the grid.
"""

from __future__ import annotations

import logging
import threading
import time

from meteor_spark.console.history import LagHistory, Rates
from meteor_spark.console.readmodel import MAX_ROWS, shared_pairs
from meteor_spark.errors import MeteorError
from meteor_spark.format.offsets import first_offset_of, sequence_of
from meteor_spark.grid.client import Grid
from meteor_spark.grid.streams import streams_bounds
from meteor_spark.groups.admin import list_groups, list_streams
from meteor_spark.groups.shared_state import SHARE_MAP, LaneShare
from meteor_spark.groups.store import OFFSETS_MAP, ConfirmedOffset, lane_key

logger = logging.getLogger(__name__)


class Sampler:
    """Samples the grid each ``interval_s`` into ``history`` and ``rates`` until ``stop``. A failed round is logged
    (once per distinct error) and the next tick tries again: a grid that goes away and comes back leaves a gap in
    the chart, not a dead console."""

    def __init__(self, grid: Grid, history: LagHistory, rates: Rates, interval_s: float) -> None:
        self.grid = grid
        self.history = history
        self.rates = rates
        self.interval_s = interval_s
        self.rounds = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="meteor-console-sampler", daemon=True)
        self._last_error = ""

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample()
                self._last_error = ""
            except Exception as exc:  # the sampler outlives any one failure; the pages show the grid's own errors
                if str(exc) != self._last_error:
                    logger.warning("console sampler: %s", exc)
                self._last_error = str(exc)
            self._stop.wait(self.interval_s)

    def sample(self) -> None:
        """One round: the lane ends of every stream, then the lag of every group lane on them."""
        infos = {info.name: info for info in sorted(list_streams(self.grid), key=lambda s: s.name)[:MAX_ROWS]}
        bounds = streams_bounds(self.grid, infos.values())
        now = int(time.time() * 1000)
        for info in infos.values():
            self.rates.add(info.name, now, sum(bounds[(info.name, lane)][1] for lane in range(info.lanes)))
        exclusive = {(g.stream, g.group) for g in list_groups(self.grid) if g.stream in infos}
        lanes = {
            lane_key(stream, group, lane): (stream, group, lane)
            for stream, group in exclusive
            for lane in range(infos[stream].lanes)
        }
        for key, text in self.grid.map(OFFSETS_MAP).get_all(list(lanes)).items():
            stream, group, lane = lanes[key]
            try:
                offset = ConfirmedOffset.decode(text, key).offset
            except MeteorError:
                continue
            end = bounds[(stream, lane)][1]
            if offset is not None and offset <= first_offset_of(end):
                self.history.add(stream, group, lane, now, max(0, end - sequence_of(offset)))
        shared = {
            lane_key(stream, group, lane): (stream, group, lane)
            for stream, group in shared_pairs(self.grid) - exclusive
            if stream in infos
            for lane in range(infos[stream].lanes)
        }
        for key, text in self.grid.map(SHARE_MAP).get_all(list(shared)).items():
            stream, group, lane = shared[key]
            try:
                start = LaneShare.decode(text, key).start
            except MeteorError:
                continue
            if start is not None:
                self.history.add(stream, group, lane, now, max(0, bounds[(stream, lane)][1] - sequence_of(start)))
        self.rounds += 1
