"""Topics and ephemeral streams on the asyncio clients: the threaded rules, with the registry's grid calls awaited.

Publisher side (``AsyncTopicGate``): the threaded ``TopicGate`` (``meteor_spark.producer.topic_gate``) decides
which records some live entity wants; its registry copy (``SubscriptionView``) reads the map
``meteor.subscriptions::<stream>`` synchronously, so the gate is handed a ``RegistrySnapshot`` instead, read
ahead (awaited) every ``subscription_refresh_ms``. A dropped record's future completes at once with
``NOT_STORED`` and is counted in ``dropped_records``.

Subscriber side (``AsyncTopics``): ``topics=`` filters what a poll hands out (``consumer.topics.filtered_batch``,
counted in ``filtered_records``); on an ephemeral stream the reader starts at the lanes' ends
(``consumer.topics.ephemeral_scheme``), registers its patterns (``consumer.topics.registration``) and renews the
entry while it polls (``grid.subscriptions.RenewalSchedule``), removing it on close. A member of an exclusive group
there follows the threaded ``Subscriber``'s rules: when its group had no live member as it joined, the group's
stored offsets are kept as stale (``consumer.topics.entity_was_gone`` / ``stale_offsets``; ``GroupedLanes`` starts
a lane still at its stale offset at the lane's end), and a poll saves the grouped lanes' positions before handing
their records out, leaving out a lane whose save is refused (``GroupedLanes.save_positions``,
``consumer.topics.without_lanes``). ``auto_confirm_interval_ms`` is refused there, as ``confirm`` is.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

from meteor_spark.consumer.topics import (
    entity_of,
    entity_was_gone,
    ephemeral_scheme,
    filtered_batch,
    refuse_on_ephemeral,
    registration,
    stale_offsets,
    without_lanes,
)
from meteor_spark.errors import GridError
from meteor_spark.format.offsets import InitialOffsetScheme
from meteor_spark.format.records import RecordBatch
from meteor_spark.format.routing import TopicMatcher
from meteor_spark.grid.aio_client import AsyncGrid, AsyncGridMap
from meteor_spark.grid.client import Grid
from meteor_spark.grid.streams import StreamInfo
from meteor_spark.grid.subscriptions import DEFAULT_REFRESH_MS, RenewalSchedule, parse_subscriptions, subscriptions_map
from meteor_spark.groups.store import OFFSETS_MAP, ConfirmedOffset, lane_key
from meteor_spark.producer.topic_gate import TopicGate

__all__ = ["AsyncTopicGate", "AsyncTopics", "RegistrySnapshot"]

logger = logging.getLogger(__name__)


class RegistrySnapshot:
    """An ephemeral stream's registry map as last read (``read``), answering the ``entries()`` of
    ``grid.subscriptions.live_subscriptions``."""

    def __init__(self, grid: AsyncGrid, stream: str) -> None:
        self._grid = grid
        self.name = subscriptions_map(stream)
        self._entries: dict[str, str] = {}

    async def read(self) -> None:
        registry = await self._grid.map(self.name)
        self._entries = await registry.entries()

    def map(self, name: str) -> RegistrySnapshot:
        if name != self.name:
            raise AssertionError(f"a RegistrySnapshot answers for {self.name!r} only, not {name!r}")
        return self

    def entries(self) -> dict[str, str]:
        return dict(self._entries)


class AsyncTopicGate:
    """An ``AsyncPublisher``'s gate on an ephemeral stream: ``TopicGate`` over a ``RegistrySnapshot`` read again
    when older than ``refresh_ms``."""

    def __init__(self, grid: AsyncGrid, stream: str, refresh_ms: int | None) -> None:
        self._snapshot = RegistrySnapshot(grid, stream)
        self.gate = TopicGate(cast(Grid, self._snapshot), stream, refresh_ms)
        self._refresh_s = (DEFAULT_REFRESH_MS if refresh_ms is None else refresh_ms) / 1000.0
        self._read_at = float("-inf")

    async def _refresh_if_due(self) -> None:
        if time.monotonic() - self._read_at >= self._refresh_s:
            await self._snapshot.read()
            self._read_at = time.monotonic()
            self.gate.view.refresh()

    async def wants(self, record: Any) -> bool:
        """Whether some live entity wants ``record``; a record nobody wants is counted as dropped."""
        await self._refresh_if_due()
        if self.gate.wants(record):
            return True
        self.gate.count(1)
        return False

    async def split(self, records: list[Any]) -> list[int]:
        """The positions of the records some entity wants (nothing counted: ``count`` once accepted)."""
        await self._refresh_if_due()
        return self.gate.split(records)

    def count(self, dropped: int) -> None:
        self.gate.count(dropped)

    @property
    def dropped(self) -> int:
        return self.gate.dropped


class AsyncTopics:
    """An ``AsyncSubscriber``'s topics: the filter, and on an ephemeral stream its registration (module docs)."""

    def __init__(self, topics: Any, ttl_ms: int | None) -> None:
        self.matcher = None if topics is None else TopicMatcher(topics, "topics")
        self._ttl_ms = ttl_ms
        self._schedule: RenewalSchedule | None = None
        self._map: AsyncGridMap | None = None
        self.ephemeral = False
        #: Ephemeral, grouped: lane -> the group's offset stored when it had no live member (for ``GroupedLanes``).
        self.stale_offsets: dict[int, int] = {}
        self.filtered_records = 0

    async def open(
        self,
        grid: AsyncGrid,
        info: StreamInfo,
        scheme: InitialOffsetScheme,
        group: str | None,
        member_id: str,
        *,
        auto_confirm: bool = False,
    ) -> InitialOffsetScheme:
        """Check the options against the stream; on an ephemeral one, read a gone group's stale offsets, then
        register, before anything is read. Returns where the lanes start."""
        scheme = ephemeral_scheme(info, scheme, self._ttl_ms)
        if not info.config.ephemeral:
            return scheme
        if auto_confirm:
            refuse_on_ephemeral(info, "auto_confirm_interval_ms")
        self.ephemeral = True
        entity = entity_of(group, member_id)
        self._map = await grid.map(subscriptions_map(info.name))
        if group is not None and entity_was_gone(entity, parse_subscriptions(await self._map.entries())):
            self.stale_offsets = await _stored_offsets(grid, info, group)
        subscription, ttl_ms = registration(entity, member_id, self.matcher, self._ttl_ms)
        self._schedule = RenewalSchedule(subscription, ttl_ms)
        await self.renew()
        return scheme

    async def renew(self) -> float:
        """Renew the registry entry when due; how long a waiting poll may sleep before the next renewal."""
        schedule = self._schedule
        if schedule is None or self._map is None:
            return float("inf")
        if schedule.due():
            await self._map.set(schedule.key, schedule.text, ttl_s=schedule.ttl_s)
            schedule.renewed()
        return schedule.seconds_to_renewal()

    async def hand_out(
        self, batch: RecordBatch, decoded: bool, save: Callable[[list[int]], Awaitable[set[int]]] | None
    ) -> RecordBatch:
        """The records of ``batch`` matching ``topics`` (``decoded``: the batch carries deserialized records); on an
        ephemeral stream, grouped (``save``: ``GroupedLanes.save_positions``), the lanes' positions saved first and
        a lane whose save is refused left out."""
        if not batch:
            return batch
        lanes = sorted({part.lane for part in batch.parts})
        if self.matcher is not None and not self.matcher.match_all:
            kept = filtered_batch(batch, self.matcher, decoded)
            self.filtered_records += len(batch) - len(kept)
            batch = kept
        if self.ephemeral and save is not None:
            batch = without_lanes(batch, await save(lanes), decoded)
        return batch

    async def close(self) -> None:
        """Leave the registry now; a failure is logged, the TTL removes the entry anyway."""
        schedule, self._schedule = self._schedule, None
        if schedule is not None and self._map is not None:
            try:
                await self._map.remove(schedule.key)
            except GridError as exc:
                logger.warning("could not remove subscription %r (it expires with its TTL): %s", schedule.key, exc)


async def _stored_offsets(grid: AsyncGrid, info: StreamInfo, group: str) -> dict[int, int]:
    """``stale_offsets`` of ``group`` on every lane of the stream, read with one ``get_all``."""
    keys = {lane: lane_key(info.name, group, lane) for lane in range(info.lanes)}
    texts = await (await grid.map(OFFSETS_MAP)).get_all(list(keys.values()))
    stored = {
        lane: None if texts.get(key) is None else ConfirmedOffset.decode(texts[key], f"{key} in map {OFFSETS_MAP!r}")
        for lane, key in keys.items()
    }
    return stale_offsets(stored)
