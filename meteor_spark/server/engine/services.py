"""Wiring of the member's data services (maps, AtomicLong, FlakeId, Topic) and their housekeeping.

``attach_data_services`` is called once by ``Engine.__init__``; it keeps that constructor short and puts the
decisions about these services (which destroy callbacks, which disconnect hooks, when persistence recovers) in one
place.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from meteor_spark.server.engine.atomics import Atomics, CpMode
from meteor_spark.server.engine.flake_ids import FlakeIds
from meteor_spark.server.engine.map_types import MapConfig, MapConfigs
from meteor_spark.server.engine.maps import Maps
from meteor_spark.server.engine.topics import Topics

if TYPE_CHECKING:
    from meteor_spark.server.engine import Engine
log = logging.getLogger(__name__)

MAP_SERVICE = "hz:impl:mapService"
TOPIC_SERVICE = "hz:impl:topicService"
SWEEP_PERIOD_S = 1.0
"""How often expired map entries are purged (firing EXPIRED) when nobody touches them; Hazelcast's own background
expiry runs every 5 s, so listeners must not expect EXPIRED the instant an entry's TTL ends."""


class Housekeeping:
    """A background task on the member's loop that expires map entries nobody reads (so EXPIRED events fire)."""

    def __init__(self, maps: Maps) -> None:
        self._maps = maps
        self._task: asyncio.Task[None] | None = None

    def ensure_started(self) -> None:
        """Start the sweep on the running loop unless it runs already (called from handlers, on the loop)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="meteor-map-expiry")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_PERIOD_S)
            try:
                self._maps.sweep()
            except Exception:  # never let one bad sweep end expiry for the member's lifetime
                log.exception("map expiry sweep failed")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None


def attach_data_services(engine: Engine, map_configs: Iterable[MapConfig] = ()) -> None:
    """Create ``engine.maps``, ``atomics``, ``flake_ids``, ``topics`` and ``housekeeping`` (persistence is attached
    later, by ``persistence.attach`` from ``Engine.open``)."""
    engine.maps = Maps(engine.clock, engine.waiters, MapConfigs(map_configs))
    engine.atomics = Atomics(CpMode(engine.config.cp_mode))  # validated by EngineConfig
    engine.flake_ids = FlakeIds(engine.clock)
    engine.topics = Topics(engine.clock)
    engine.housekeeping = Housekeeping(engine.maps)
    engine.proxies.on_destroy(MAP_SERVICE, engine.maps.destroy)
    engine.proxies.on_destroy(TOPIC_SERVICE, engine.topics.destroy)
    engine.disconnect_hooks.append(lambda client_uuid: engine.maps.client_disconnected(client_uuid))  # type: ignore[arg-type]
    engine.close_hooks.append(engine.housekeeping.stop)
