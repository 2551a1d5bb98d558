"""What an ``AsyncSubscriber`` reports about itself: lag, the threaded ``Subscriber.metrics()`` counters and the
skip and refusal tallies (``SubscriberFigures``, a base class of ``AsyncSubscriber``).

Kept apart from the reading code because it only reads the subscriber's parts (its lanes, refusals, item gate,
topics and group side) and never changes them; the Prometheus collector (``meteor_spark.metrics``) reads the same
figures from its scrape thread.
"""

from __future__ import annotations

from meteor_spark.aio.exported import LagWatch, refreshed_lag
from meteor_spark.aio.grouped import GroupedLanes
from meteor_spark.aio.lane_reads import LaneReads
from meteor_spark.aio.topics import AsyncTopics
from meteor_spark.consumer.refusals import Refusals
from meteor_spark.grid.item_gate import ItemGate

__all__ = ["SubscriberFigures"]


class SubscriberFigures:
    """The figures of an ``AsyncSubscriber`` (see the module docs); every attribute is the subscriber's."""

    _reads: LaneReads | None
    _lag_watch: LagWatch | None
    _grouped: GroupedLanes | None
    _topics: AsyncTopics
    refusals: Refusals
    item_gate: ItemGate
    delivered_records: int

    def _lane_reads(self) -> LaneReads:
        assert self._reads is not None, "started subscribers have their lanes"
        return self._reads

    async def lag(self) -> dict[int, int]:
        """Ring items behind each lane's end, from the next record to deliver."""
        return await refreshed_lag(self._lane_reads())

    def exported_lag(self) -> dict[int, int]:
        """The lag as last refreshed on the loop, for Prometheus (``meteor_spark.aio.exported``)."""
        return {} if self._lag_watch is None else self._lag_watch.lag

    def metrics(self) -> dict[str, int]:
        """The threaded ``Subscriber.metrics()`` counters; grouped, also the member's lease figures and the lanes it
        holds."""
        refusals = self.refusals
        return {
            "delivered_records": self.delivered_records,
            "skipped_items": self.skipped_items,
            "corrupt_items": refusals.corrupt_items,
            "undecodable_records": refusals.undecodable_records,
            "nacked_records": 0,
            "delayed_records": 0,
            "dead_lettered_records": 0,
            "filtered_records": self._topics.filtered_records,
            **self.item_gate.counters(),
            **({} if self._grouped is None else self._grouped.metrics()),
        }

    @property
    def skipped_items(self) -> int:
        """Ring items skipped because they were gone before they were read (``skip_data_loss``)."""
        return 0 if self._reads is None else self._reads.skipped_items

    @property
    def skips(self) -> list[tuple[int, int, int]]:
        """Each skip: (lane, first offset lost, the oldest offset read on from)."""
        return [] if self._reads is None else list(self._reads.skips)

    @property
    def corrupt_items(self) -> int:
        return self.refusals.corrupt_items

    @property
    def undecodable_records(self) -> int:
        return self.refusals.undecodable_records
