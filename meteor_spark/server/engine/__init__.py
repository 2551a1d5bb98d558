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
import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from meteor_spark.server.errors import InvalidConfiguration

if TYPE_CHECKING:
    from meteor_spark.server.engine.atomics import Atomics
    from meteor_spark.server.engine.flake_ids import FlakeIds
    from meteor_spark.server.engine.maps import MapConfig, Maps
    from meteor_spark.server.engine.persistence import Persistence
    from meteor_spark.server.engine.ringbuffer import RingConfig
    from meteor_spark.server.engine.services import Housekeeping
    from meteor_spark.server.engine.topics import Topics


logger = logging.getLogger(__name__)


class Clock(Protocol):
    def now_ms(self) -> int:
        """Wall-clock milliseconds since the epoch (what Hazelcast reports in entry views, publish times)."""

    def monotonic_ms(self) -> float:
        """Monotonic milliseconds for expiry and leases (never jumps)."""


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic_ms(self) -> float:
        return time.monotonic() * 1000.0


@dataclass
class ManualClock:
    """A clock tests move by hand."""

    wall_ms: int = 1_700_000_000_000
    mono_ms: float = 0.0

    def now_ms(self) -> int:
        return self.wall_ms

    def monotonic_ms(self) -> float:
        return self.mono_ms

    def advance(self, ms: float) -> None:
        self.wall_ms += int(ms)
        self.mono_ms += ms


@dataclass
class Waiters:
    """One-shot wake-up callbacks keyed by object (e.g. ``("ring", name)``, ``("map", name, key)``).

    ``notify(key)`` calls and forgets every callback registered for ``key``; callers re-check their condition and
    register again if it still does not hold, so spurious wake-ups are harmless.
    """

    _callbacks: dict[Hashable, dict[int, Callable[[], None]]] = field(default_factory=dict)
    _next: int = 0

    def register(self, key: Hashable, callback: Callable[[], None]) -> int:
        self._next += 1
        self._callbacks.setdefault(key, {})[self._next] = callback
        return self._next

    def cancel(self, key: Hashable, handle: int) -> None:
        callbacks = self._callbacks.get(key)
        if callbacks is not None:
            callbacks.pop(handle, None)
            if not callbacks:
                del self._callbacks[key]

    def notify(self, key: Hashable) -> None:
        callbacks = self._callbacks.pop(key, None)
        if callbacks:
            for callback in callbacks.values():
                callback()


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
        cp_mode: "unsafe" (CP data structures in AP mode, Hazelcast 4.x-5.4 without CP members) or "disabled"
            ("CP Subsystem is not enabled!", newer members).

    Raises:
        InvalidConfiguration: (a ``ValueError``) naming the setting, the value and the allowed ones.
    """

    partition_count: int = 271
    cluster_name: str = "dev"
    data_dir: str | None = None
    fsync: str = "interval"
    fsync_interval_ms: int = 100
    cp_mode: str = "unsafe"

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
