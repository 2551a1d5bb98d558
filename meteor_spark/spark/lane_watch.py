"""The lane bounds a ``streamPattern`` query plans on, read so that a micro-batch's cost follows the lanes that
move rather than every lane the pattern matches.

A pattern may match a thousand streams, most of them idle at any one time, and every lane's bounds cost a grid
call of their own (Hazelcast has no call reading many ring buffers). Reading them all per micro-batch made
planning grow by 0.2-0.8 ms per stream. So:

* a lane whose end moved within the last ``hot_ms`` is read at every micro-batch (its tail only);
* an idle lane is read again once ``refresh_ms`` passed since its last read, at most ``idle_budget(n)`` idle lanes
  per micro-batch (those due longest first; ``4 * ceil(sqrt(n))``, at least 64, of ``n`` lanes): a micro-batch's
  cost then grows with the square root of the lanes matched, and records published to a stream idle for a while
  enter a micro-batch within ``refresh_ms`` or ``ceil(n / idle_budget(n))`` micro-batches, whichever is longer
  (1,000 one-lane streams: 500 ms or 8 micro-batches);
* a lane's head is read only when the lane is new to this source runner or its stream has a time to live; else
  it follows from the tail: a ring without TTL drops items only by overwriting them, so its head is
  ``tail + 1 - capacity`` once it wrapped (and never below the head read before). Where the grid keeps history
  below the head (a store), reads below it are served from there, as before.

A lane not read in a micro-batch keeps its last bounds: the batch reads nothing new from it, which is what it
would read had nothing been published. Lanes read that end below their last known end (a stream deleted and its
rings destroyed meanwhile, or a member that lost them) are reported in ``went_back`` so the driver lists the
streams again before trusting them.
"""

from __future__ import annotations

import math
import time
import zlib
from collections.abc import Iterable
from typing import TYPE_CHECKING

from meteor_spark.grid.client import result

if TYPE_CHECKING:  # pragma: no cover
    from meteor_spark.grid.client import Grid
    from meteor_spark.grid.streams import StreamInfo

#: Longest an idle lane of a pattern query goes unread.
IDLE_REFRESH_MS = 500.0
#: How long after its end last moved a lane stays read at every micro-batch.
HOT_MS = 200.0
#: Fewest idle lanes read per micro-batch (``idle_budget``).
MIN_IDLE_BUDGET = 64


def idle_budget(lanes: int) -> int:
    """Most idle lanes one micro-batch reads, of ``lanes`` lanes matched: grows with the square root."""
    return max(MIN_IDLE_BUDGET, 4 * math.ceil(math.sqrt(lanes)))


Key = tuple[str, int]


class LaneWatch:
    """The last bounds of every lane of a pattern query, refreshed per micro-batch as the module says. Bounded:
    it holds one entry per lane of the streams currently read (lanes of streams no longer read are dropped)."""

    def __init__(self, refresh_ms: float = IDLE_REFRESH_MS, hot_ms: float = HOT_MS) -> None:
        self.refresh_s = refresh_ms / 1000
        self.hot_s = hot_ms / 1000
        self._known: dict[Key, tuple[int, int]] = {}
        self._moved_at: dict[Key, float] = {}
        self._due: dict[Key, float] = {}
        #: Lanes the last ``bounds`` call read (heads and tails counted apart, for the benchmark and tests).
        self.read_tails = 0
        self.read_heads = 0
        #: Streams whose lanes the last ``bounds`` call found ending below their last known end.
        self.went_back: set[str] = set()

    def bounds(
        self, grid: Grid, infos: Iterable[StreamInfo], *, everything: bool = False, now: float | None = None
    ) -> dict[Key, tuple[int, int]]:
        """``(head, next)`` of every lane of ``infos``: read where due (``everything``: all read), else as last
        read."""
        now = time.monotonic() if now is None else now
        lanes = {(info.name, lane): (info, name) for info in infos for lane, name in enumerate(info.ring_names)}
        for key in [key for key in self._known if key not in lanes]:
            self._forget(key)
        due = list(lanes) if everything else self._due_lanes(lanes, now)
        heads_needed = [key for key in due if key not in self._known or lanes[key][0].config.ttl_s > 0]
        # Heads first: a tail read afterwards can only have moved forward, so head <= tail + 1 always holds.
        head_futures = {key: grid.ring(lanes[key][1]).head_async() for key in heads_needed}
        heads = {key: result(future, f"head of ring {lanes[key][1]!r}") for key, future in head_futures.items()}
        tail_futures = {key: grid.ring(lanes[key][1]).tail_async() for key in due}
        self.read_heads, self.read_tails = len(head_futures), len(tail_futures)
        self.went_back = set()
        for key, future in tail_futures.items():
            next_seq = result(future, f"tail of ring {lanes[key][1]!r}") + 1
            self._update(key, lanes[key][0], heads.get(key), next_seq, now)
        return {key: self._known[key] for key in lanes}

    def _due_lanes(self, lanes: dict[Key, tuple[StreamInfo, str]], now: float) -> list[Key]:
        """New and hot lanes, and the idle lanes due longest (``idle_budget`` of them at most)."""
        due: list[Key] = []
        idle: list[tuple[float, Key]] = []
        for key in lanes:
            if key not in self._known or now - self._moved_at.get(key, -math.inf) < self.hot_s:
                due.append(key)
            elif now >= self._due[key]:
                idle.append((self._due[key], key))
        if len(idle) > idle_budget(len(lanes)):
            idle.sort()
            del idle[idle_budget(len(lanes)) :]
        return due + [key for _, key in idle]

    def _update(self, key: Key, info: StreamInfo, head: int | None, next_seq: int, now: float) -> None:
        known = self._known.get(key)
        if head is None:
            wrapped = next_seq - info.config.capacity
            head = min(next_seq, max(0, wrapped, known[0] if known is not None and known[1] <= next_seq else 0))
        if known is None:
            # Spread the first due times over the interval: the idle lanes then come due a few at a time.
            spread = zlib.crc32(f"{key[0]}\0{key[1]}".encode()) % 1000 / 1000
            self._due[key] = now + self.refresh_s * spread
        else:
            self._due[key] = now + self.refresh_s
            if next_seq != known[1]:
                self._moved_at[key] = now
            if next_seq < known[1]:
                self.went_back.add(key[0])
        self._known[key] = (head, next_seq)

    def _forget(self, key: Key) -> None:
        self._known.pop(key, None)
        self._moved_at.pop(key, None)
        self._due.pop(key, None)
