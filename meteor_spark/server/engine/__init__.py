"""The embedded member's engine: Hazelcast data-structure semantics with no sockets and no protocol.

Threading contract: the engine is NOT thread-safe. Everything runs on the member's event-loop thread (the TCP shell
and handlers call it from there; ``EmbeddedGrid`` marshals other threads' calls onto that loop). Operations never
block: an operation that would block in Hazelcast (``read_many`` with ``min_count`` not yet met, ``lock`` held by
someone else, ...) reports that it cannot complete yet, and the caller parks on ``Engine.waiters`` for the object's
key, to be woken when that object changes.

Time comes from ``Engine.clock`` (injectable) so TTL, lease and expiry logic is unit-testable without sleeping.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from meteor_spark.server.engine.clock import Clock, SystemClock, Waiters
from meteor_spark.server.engine.clock import ManualClock as ManualClock  # tests build engines with it
from meteor_spark.server.errors import InvalidConfiguration

if TYPE_CHECKING:
    from meteor_spark.server.engine.atomics import Atomics
    from meteor_spark.server.engine.flake_ids import FlakeIds
    from meteor_spark.server.engine.map_types import MapConfig
    from meteor_spark.server.engine.maps import Maps
    from meteor_spark.server.engine.persistence import Persistence
    from meteor_spark.server.engine.ringbuffer import RingConfig
    from meteor_spark.server.engine.services import Housekeeping
    from meteor_spark.server.engine.topics import Topics
logger = logging.getLogger(__name__)


FSYNC_POLICIES = ("always", "interval", "never")
"""When persisted writes reach the disk; what each risks is in ``docs/persistence.md``."""

CP_MODES = ("unsafe", "disabled")
"""What ``createCPGroup`` does on a member without CP members (see ``engine/atomics.py``)."""


@dataclass(frozen=True)
class EngineConfig:
    """Member-wide settings the engine needs (the TCP shell and ``EmbeddedGrid`` hold the rest).

    Attributes:
        partition_count: partitions reported to clients (Hazelcast's default 271; must never change for a cluster).
        cluster_name: the cluster name clients must present.
        data_dir: persistence directory, or None for memory only.
        fsync: persistence fsync policy: "always", "interval" or "never" (see docs/persistence.md).
        fsync_interval_ms: with ``fsync="interval"``, how often written data is fsynced.
        cp_mode: "disabled" (CP refused as an Enterprise feature, as Hazelcast 5.7 open source refuses it; the
            default) or "unsafe" (CP data structures in AP mode, as Hazelcast 4.x-5.4 without CP members run them).

    Raises:
        InvalidConfiguration: (a ``ValueError``) naming the setting, the value and the allowed ones.
    """

    partition_count: int = 271
    cluster_name: str = "dev"
    data_dir: str | None = None
    fsync: str = "interval"
    fsync_interval_ms: int = 100
    cp_mode: str = "disabled"

    def __post_init__(self) -> None:
        if self.partition_count < 1:
            raise InvalidConfiguration(f"partition_count must be >= 1, got {self.partition_count}")
        if self.fsync not in FSYNC_POLICIES:
            raise InvalidConfiguration(
                f"fsync policy {self.fsync!r} is unknown; use one of {', '.join(FSYNC_POLICIES)}"
            )
        if self.fsync_interval_ms <= 0:
            raise InvalidConfiguration(
                f"fsync_interval_ms must be a positive number of milliseconds, got {self.fsync_interval_ms}"
            )
        if self.cp_mode not in CP_MODES:
            raise InvalidConfiguration(f"cp_mode {self.cp_mode!r} is unknown; use one of {', '.join(CP_MODES)}")


class Engine:
    """All the member's state: one instance per member, used only from the member's event-loop thread.

    Services (attributes): ``rings`` (ring buffers), ``proxies`` (distributed-object registry), ``schemas`` (compact
    serialization schemas sent by clients), ``maps`` (maps and their locks), ``atomics``, ``flake_ids``, ``topics``
    (each in its own module, wired by ``services.attach_data_services``) and ``persistence`` (set by ``open()`` when
    a data directory is configured, else None).
    """

    def __init__(
        self,
        config: EngineConfig | None = None,
        clock: Clock | None = None,
        ring_configs: Iterable[RingConfig] = (),
        map_configs: Iterable[MapConfig] = (),
    ) -> None:
        from meteor_spark.server.engine.proxies import ProxyRegistry
        from meteor_spark.server.engine.ringbuffer import SERVICE_NAME as RING_SERVICE
        from meteor_spark.server.engine.ringbuffer import RingConfigs, RingService

        self.config = config or EngineConfig()
        self.clock: Clock = clock or SystemClock()
        self.waiters = Waiters()
        self.proxies = ProxyRegistry()
        self.rings = RingService(self.clock.monotonic_ms, self.waiters.notify, RingConfigs(ring_configs))
        self.proxies.on_destroy(RING_SERVICE, self.rings.destroy)
        self.schemas: dict[int, object] = {}
        #: Called with a client uuid when its last connection closes (locks, listeners); services append to it.
        self.disconnect_hooks: list[Callable[[object], None]] = []
        #: Called (and awaited when they return an awaitable) by ``close()``, last added first: flush, close files.
        self.close_hooks: list[Callable[[], object]] = []
        # Maps, AtomicLong, FlakeId, Topic and their housekeeping (engine/services.py); ``persistence`` is set by
        # ``persistence.attach`` in ``open()`` when a data directory is configured.
        from meteor_spark.server.engine.services import attach_data_services

        self.maps: Maps
        self.atomics: Atomics
        self.flake_ids: FlakeIds
        self.topics: Topics
        self.housekeeping: Housekeeping
        self.persistence: Persistence | None = None
        attach_data_services(self, map_configs)

    async def open(self) -> None:
        """Attach persistence (``engine/persistence.py``) when ``config.data_dir`` is set; called on the member's
        event loop before it accepts clients."""
        if self.config.data_dir is not None:
            from meteor_spark.server.engine.persistence import attach

            attach(self)

    async def close(self) -> None:
        """Run ``close_hooks`` (newest first); every hook runs even if one fails."""
        hooks, self.close_hooks = self.close_hooks, []
        for hook in reversed(hooks):
            try:
                result = hook()
                if inspect.isawaitable(result):
                    await result
            except Exception:
                logger.exception("engine close hook %r failed", hook)

    def client_disconnected(self, client_uuid: object) -> None:
        """Release what a client held (services hook into ``disconnect_hooks``)."""
        for hook in list(self.disconnect_hooks):
            hook(client_uuid)
