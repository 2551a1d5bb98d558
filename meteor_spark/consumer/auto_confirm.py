"""Auto-confirm: when a grouped reader confirms on its own (Kafka's ``enable.auto.commit`` /
``auto.commit.interval.ms``).

``Subscriber(..., group=..., auto_confirm_interval_ms=N)``: at the start of a ``poll``, once at least ``N`` ms have
passed since the last auto-confirm (or since the subscriber was created), the positions of every record handed out
by the *previous* polls are confirmed (``Subscriber.confirm()``), before anything new is taken; ``close`` confirms
them too. The check is made only in ``poll`` and ``close``: a subscriber that stops polling confirms nothing more
(Kafka behaves the same way). ``N = 0`` confirms at every poll.

``Receiver(..., auto_confirm_interval_ms=N)`` confirms only records whose callback has finished (returned, or
raised and was reported to ``on_error``: the receiver has passed over it either way); the check is made before
each poll and when the receiver closes, so a receiver stopped in the middle of a batch never confirms the records
it did not hand to the callback.

Semantics: **at-least-once**. A crash (or a SIGKILL) re-delivers to the lane's next holder every record handed out
since the last auto-confirm, up to ``N`` ms of records plus the last batch. A rebalance that moves a lane away from
a member delivers the same tail again to the new holder; the member's next auto-confirm logs the lane as lost
(``FencedError``, nothing written for it) and goes on with its other lanes. Nothing is ever confirmed that was not
handed out, so nothing is lost.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from meteor_spark.validate import check_int

__all__ = ["AutoConfirm"]

#: The longest interval accepted (about 24 days).
MAX_INTERVAL_MS = (1 << 31) - 1


class AutoConfirm:
    """The auto-confirm clock of one reader: ``due()`` at most once per interval, ``done()`` after a confirm.

    Attributes:
        interval_ms: the interval.
        confirms: auto-confirms made (each is one ``confirm``: at most one grid write per lane that moved).
    """

    def __init__(
        self, interval_ms: int, *, name: str = "auto_confirm_interval_ms", clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.interval_ms = check_int(name, interval_ms, 0, MAX_INTERVAL_MS, what="(milliseconds between confirms)")
        self._clock = clock
        self._next = clock() + interval_ms / 1000.0
        self.confirms = 0

    def due(self) -> bool:
        """The interval has passed since the last ``done()`` (or creation)."""
        return self._clock() >= self._next

    def done(self) -> None:
        """A confirm was made: the next one is due one interval from now."""
        self.confirms += 1
        self._next = self._clock() + self.interval_ms / 1000.0
