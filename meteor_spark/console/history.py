"""What the console remembers between samples: each group lane's lag over the last minutes and each stream's
recent ring tails (for rates). Pure and bounded: a fixed number of points per series, a fixed number of series
(the least recently sampled go first), so a console left running on a busy grid holds constant memory."""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from dataclasses import dataclass

from meteor_spark.validate import check_int

#: Points kept per lag series (10 minutes at the default 2 s sample interval).
DEFAULT_POINTS = 300
#: Series kept at most (stream x group x lane); beyond it the least recently sampled series is dropped.
DEFAULT_SERIES = 2_000


@dataclass(frozen=True)
class LagPoint:
    """One sample of one group lane: when (ms since the epoch) and how many ring items it was behind."""

    at_ms: int
    items: int


class LagHistory:
    """Lag samples per ``(stream, group, lane)``, each series a bounded deque; thread-safe (the sampler writes,
    request handlers read)."""

    def __init__(self, points: int = DEFAULT_POINTS, series: int = DEFAULT_SERIES) -> None:
        self.points = check_int("points", points, 2, 100_000)
        self.max_series = check_int("series", series, 1, 1_000_000)
        self._series: OrderedDict[tuple[str, str, int], deque[LagPoint]] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, stream: str, group: str, lane: int, at_ms: int, items: int) -> None:
        key = (stream, group, lane)
        with self._lock:
            series = self._series.get(key)
            if series is None:
                series = self._series[key] = deque(maxlen=self.points)
                while len(self._series) > self.max_series:
                    self._series.popitem(last=False)
            else:
                self._series.move_to_end(key)
            series.append(LagPoint(at_ms, items))

    def of_group(self, stream: str, group: str) -> dict[int, list[LagPoint]]:
        """lane -> its points, oldest first (lanes never sampled are absent)."""
        with self._lock:
            return {lane: list(points) for (s, g, lane), points in self._series.items() if s == stream and g == group}

    def __len__(self) -> int:
        with self._lock:
            return len(self._series)


class Rates:
    """Ring items appended per second per stream, from the last two samples of the sum of its lanes' tails; the
    first sample of a stream has no rate yet (None). Bounded like ``LagHistory``: one pair of samples per stream,
    at most ``max_streams`` streams."""

    def __init__(self, max_streams: int = DEFAULT_SERIES) -> None:
        self.max_streams = check_int("max_streams", max_streams, 1, 1_000_000)
        self._samples: OrderedDict[str, deque[tuple[int, int]]] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, stream: str, at_ms: int, next_sequences: int) -> None:
        with self._lock:
            samples = self._samples.get(stream)
            if samples is None:
                samples = self._samples[stream] = deque(maxlen=2)
                while len(self._samples) > self.max_streams:
                    self._samples.popitem(last=False)
            else:
                self._samples.move_to_end(stream)
            samples.append((at_ms, next_sequences))

    def per_second(self, stream: str) -> float | None:
        with self._lock:
            samples = self._samples.get(stream)
            if samples is None or len(samples) < 2:
                return None
            (t0, n0), (t1, n1) = samples
        if t1 <= t0:
            return None
        return max(0, n1 - n0) * 1000.0 / (t1 - t0)
