"""Grid access for asyncio: ``AsyncGrid``, the asyncio twin of ``meteor_spark.grid.client.Grid``.

The one module that imports ``hazelcast.asyncio`` (the official asyncio client of hazelcast-python-client 5.7):
the ``meteor_spark.aio`` clients reach the grid through it and never through ``hazelcast`` itself, so an asyncio
program runs meteor on its own event loop with no thread of meteor's. Errors go through the same
``translate_errors`` as the threaded client's (the two clients raise the same ``hazelcast.errors``), so both APIs
raise the same ``meteor_spark.errors``.

What it offers is what the asyncio clients need: ring buffers (head, tail, capacity, add_all, read_many), maps of
``str`` (get, put, put_if_absent, replace_if_same, remove...), cluster-wide ids and the dynamic ring-buffer config a
stream's lanes get when the stream is created.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any, cast

from hazelcast import errors as hz_errors
from hazelcast.asyncio import HazelcastClient

from meteor_spark.allocator import tune_allocator
from meteor_spark.compat import add_ringbuffer_config_request, connect_failures
from meteor_spark.compat_asyncio import add_all_sender, invoke_async, read_many_sender
from meteor_spark.errors import ArgumentTypeError, ConfigError, GridConnectionError, GridOperationError
from meteor_spark.grid.client import (
    MAX_BATCH_ITEMS,
    OVERWRITE,
    ReadBatch,
    Ring,
    _why_not_connected,
    check_ring_config,
    translate_errors,
)
from meteor_spark.grid.settings import DEFAULT_ADDRESS, GridSettings, check_tls_files, split_members

__all__ = ["AsyncGrid", "AsyncGridMap", "AsyncRing", "connect_async"]

logger = logging.getLogger(__name__)


class AsyncRing:
    """A ring buffer of byte items (one lane of a stream), awaited."""

    def __init__(self, proxy: Any, name: str) -> None:
        self._proxy = proxy
        self.name = name
        self._send_read = read_many_sender(proxy, ReadBatch)
        self._send_add = add_all_sender(proxy)

    async def capacity(self) -> int:
        with translate_errors(f"capacity of ring {self.name!r}"):
            return int(await self._proxy.capacity())

    async def head(self) -> int:
        """Sequence of the oldest item still held (``tail + 1`` when empty)."""
        with translate_errors(f"head of ring {self.name!r}"):
            return int(await self._proxy.head_sequence())

    async def tail(self) -> int:
        """Sequence of the newest item (-1 when nothing was ever added)."""
        with translate_errors(f"tail of ring {self.name!r}"):
            return int(await self._proxy.tail_sequence())

    async def add_all(self, items: Sequence[bytes], overflow_policy: int = OVERWRITE) -> int:
        """Append items in order (stored contiguously); returns the sequence of the last one."""
        with translate_errors(f"add_all to ring {self.name!r}"):
            sent = self._send_add(items, overflow_policy)
            if sent is not None:
                return int(await sent)
            return int(await self._proxy.add_all([bytearray(i) for i in items], overflow_policy))

    async def read_many(self, start: int, min_count: int, max_count: int) -> ReadBatch:
        """Read up to ``max_count`` items from ``start`` (clamped by the grid to ``[head, tail + 1]``)."""
        with translate_errors(f"read from ring {self.name!r} at sequence {start}"):
            answer = await self._proxy.read_many(start, min_count, min(max_count, MAX_BATCH_ITEMS))
        return Ring.to_batch(answer)

    def read_soon(self, start: int, min_count: int, max_count: int) -> asyncio.Future[Any]:
        """``read_many`` sent now, its answer a plain future (no task: a parked read costs one wake-up less);
        ``max_count`` must not exceed the ring's capacity. ``batch_of`` takes the finished future in."""
        if start < 0 or not 0 <= min_count <= max_count:
            raise GridOperationError(
                f"read from ring {self.name!r} at sequence {start}: min {min_count} and max {max_count} items "
                "must be 0 <= min <= max, and the sequence not negative"
            )
        return self._send_read(start, min_count, min(max_count, MAX_BATCH_ITEMS))

    def batch_of(self, answer: asyncio.Future[Any], start: int) -> ReadBatch:
        """The ``ReadBatch`` of a finished ``read_soon`` future (its error as ``read_many``'s)."""
        with translate_errors(f"read from ring {self.name!r} at sequence {start}"):
            return cast(ReadBatch, answer.result())

    async def destroy(self) -> None:
        with translate_errors(f"destroy ring {self.name!r}"):
            await self._proxy.destroy()


class AsyncGridMap:
    """A grid map with ``str`` keys and ``str`` values, awaited (``GridMap``'s twin)."""

    def __init__(self, proxy: Any, name: str) -> None:
        self._proxy = proxy
        self.name = name

    async def _call(self, what: str, awaitable: Any) -> Any:
        with translate_errors(f"{what} on map {self.name!r}"):
            return await awaitable

    async def get(self, key: str) -> str | None:
        return await self._call("get", self._proxy.get(key))

    async def get_all(self, keys: Sequence[str]) -> dict[str, str]:
        if not keys:
            return {}
        return dict(await self._call("get_all", self._proxy.get_all(list(keys))))

    async def put(self, key: str, value: str, ttl_s: float | None = None) -> str | None:
        return await self._call("put", self._proxy.put(key, value, ttl_s))

    async def set(self, key: str, value: str, ttl_s: float | None = None) -> None:
        await self._call("set", self._proxy.set(key, value, ttl_s))

    async def put_if_absent(self, key: str, value: str, ttl_s: float | None = None) -> str | None:
        """Store unless present; returns the existing value, or None when this call stored it."""
        return await self._call("put_if_absent", self._proxy.put_if_absent(key, value, ttl_s))

    async def replace_if_same(self, key: str, old: str, new: str) -> bool:
        """Compare-and-set: replace only when the current value equals ``old`` byte for byte."""
        return bool(await self._call("replace_if_same", self._proxy.replace_if_same(key, old, new)))

    async def remove(self, key: str) -> str | None:
        return await self._call("remove", self._proxy.remove(key))

    async def remove_if_same(self, key: str, value: str) -> bool:
        return bool(await self._call("remove_if_same", self._proxy.remove_if_same(key, value)))

    async def entries(self) -> dict[str, str]:
        return dict(await self._call("entry_set", self._proxy.entry_set()))

    async def set_ttl(self, key: str, ttl_s: float) -> None:
        """A new time to live for an existing entry (a claim marked written: ``replace`` drops its TTL)."""
        await self._call("set_ttl", self._proxy.set_ttl(key, ttl_s))


class AsyncGrid:
    """A connection of the asyncio client to a Hazelcast cluster (embedded or real).

    Made with ``await AsyncGrid.connect("host:port[,host:port]", **settings)`` or
    ``await AsyncGrid.start(GridSettings(...))``; an async context manager (``close`` on leaving).
    """

    def __init__(self, settings: GridSettings, client: Any) -> None:
        self.settings = settings
        self.client = client
        self._rings: dict[str, AsyncRing] = {}
        self._maps: dict[str, AsyncGridMap] = {}
        self._connection_losses = 0
        client.lifecycle_service.add_listener(self._on_lifecycle)

    @classmethod
    async def start(cls, settings: GridSettings) -> AsyncGrid:
        """Connect with ``settings``; ``GridConnectionError`` saying why when no member accepts the client."""
        if not isinstance(settings, GridSettings):
            raise ArgumentTypeError(f"settings must be a GridSettings, got {type(settings).__name__} {settings!r}")
        logger.info(
            "connecting to Hazelcast cluster %r at %s (asyncio)", settings.cluster_name, ",".join(settings.members)
        )
        check_tls_files(settings)
        tune_allocator()  # large records: freed buffers reused, not unmapped (meteor_spark.allocator)
        try:
            with connect_failures() as failures:
                client = await HazelcastClient.create_and_start(**settings.client_config())
        except hz_errors.IllegalStateError as exc:
            raise GridConnectionError(
                f"could not connect to cluster {settings.cluster_name!r} at {', '.join(settings.members)} within "
                f"{settings.connect_timeout_s:g} s: {_why_not_connected(settings, failures)}"
            ) from exc
        return cls(settings, client)

    @classmethod
    async def connect(cls, members: str | Sequence[str] = DEFAULT_ADDRESS, **settings: Any) -> AsyncGrid:
        """Connect to a cluster: ``members`` is ``host:port`` or a comma-separated list of them; other keyword
        arguments are ``GridSettings`` fields (``cluster_name``, ``username``, ``password``, ``ssl_*``, timeouts)."""
        return await cls.start(GridSettings(members=split_members(members), **settings))

    @property
    def connection_losses(self) -> int:
        """How often the client lost its connection to the cluster (``Grid.connection_losses``' twin)."""
        return self._connection_losses

    def _on_lifecycle(self, state: str) -> None:
        if state == "DISCONNECTED":
            self._connection_losses += 1

    async def ring(self, name: str) -> AsyncRing:
        ring = self._rings.get(name)
        if ring is None:
            with translate_errors(f"open ring {name!r}"):
                ring = AsyncRing(await self.client.get_ringbuffer(name), name)
            self._rings[name] = ring
        return ring

    async def map(self, name: str) -> AsyncGridMap:
        grid_map = self._maps.get(name)
        if grid_map is None:
            with translate_errors(f"open map {name!r}"):
                grid_map = AsyncGridMap(await self.client.get_map(name), name)
            self._maps[name] = grid_map
        return grid_map

    async def flake_id(self, name: str) -> int:
        """A cluster-wide unique id (FlakeIdGenerator)."""
        with translate_errors(f"new id from {name!r}"):
            generator = await self.client.get_flake_id_generator(name)
            return int(await generator.new_id())

    async def add_ring_config(
        self, pattern: str, capacity: int, backups: int = 1, async_backups: int = 0, ttl_s: int = 0
    ) -> None:
        """``Grid.add_ring_config``, awaited: rings created afterwards under ``pattern`` get these settings."""
        check_ring_config(pattern, capacity, backups, async_backups, ttl_s)
        request = add_ringbuffer_config_request(pattern, capacity, backups, async_backups, ttl_s)
        with translate_errors(f"add ring buffer config {pattern!r}"):
            await invoke_async(self.client, request)

    async def close(self) -> None:
        with translate_errors("shutdown client"):
            await self.client.shutdown()

    async def __aenter__(self) -> AsyncGrid:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def connect_async(members_or_grid: object) -> tuple[AsyncGrid, bool]:
    """The grid an asyncio client uses, and whether it owns it (closes it on leaving): an ``AsyncGrid`` as it is;
    a ``"host:port[,host:port]"`` string or a ``GridSettings`` connected anew."""
    if isinstance(members_or_grid, AsyncGrid):
        return members_or_grid, False
    if isinstance(members_or_grid, GridSettings):
        return await AsyncGrid.start(members_or_grid), True
    if isinstance(members_or_grid, str):
        if not split_members(members_or_grid):
            raise ConfigError(
                f"members {members_or_grid!r} names no member; write host:port[,host:port], e.g. 127.0.0.1:5701"
            )
        return await AsyncGrid.connect(members_or_grid), True
    raise ArgumentTypeError(
        f"members_or_grid must be a 'host:port[,host:port]' string, a GridSettings or an AsyncGrid, got "
        f"{type(members_or_grid).__name__} {members_or_grid!r}"
    )
