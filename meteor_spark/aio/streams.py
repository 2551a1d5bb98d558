"""Opening a stream from asyncio: ``open_stream``'s grid calls, awaited.

The decisions (name checks, what is stored for a new stream, the comparison with the stored configuration, the
lanes' ring configs and what a refused one means) are ``meteor_spark.grid.streams``' own functions, shared with the
threaded ``open_stream``; only the awaiting is here.
"""

from __future__ import annotations

from meteor_spark.errors import GridOperationError
from meteor_spark.grid.aio_client import AsyncGrid
from meteor_spark.grid.streams import (
    STREAMS_MAP,
    StreamConfig,
    StreamInfo,
    created_log,
    parse_metadata,
    ring_config_conflict,
    ring_configs,
    settled_info,
    stream_creation,
    stream_name,
)


async def open_stream_async(grid: AsyncGrid, config: StreamConfig | str, *, create: bool = True) -> StreamInfo:
    """``meteor_spark.grid.streams.open_stream`` on an ``AsyncGrid``: by configuration (created when missing, if
    ``create``) or by name alone; the same errors."""
    name = stream_name(config)
    metadata = await grid.map(STREAMS_MAP)
    stored = await metadata.get(name)
    if stored is None:
        candidate = stream_creation(config, create)
        stored = await metadata.put_if_absent(name, candidate)
        if stored is None:
            created_log(config)
            stored = candidate
    info = settled_info(config, stored)
    for ring, capacity, backups, async_backups, ttl_s in ring_configs(info):
        try:
            await grid.add_ring_config(ring, capacity, backups, async_backups, ttl_s)
        except GridOperationError as exc:
            conflict = ring_config_conflict(info, ring, exc)
            if conflict is None:
                raise
            raise conflict from exc
    return info


async def delete_ungrouped_stream_async(grid: AsyncGrid, name: str) -> bool:
    """``meteor_spark.groups.admin.delete_stream`` for a stream no group ever read (a requester's reply stream): the
    metadata first (a reader sees the stream whole or gone), then its lanes, the metadata put back should destroying
    fail; False when it did not exist. Group entries are not looked for, as such a stream has none."""
    metadata = await grid.map(STREAMS_MAP)
    stored = await metadata.get(name)
    if stored is None:
        return False
    info = parse_metadata(name, stored)
    if not await metadata.remove_if_same(name, stored):
        return await delete_ungrouped_stream_async(grid, name)
    try:
        for ring_name in info.ring_names:
            ring = await grid.ring(ring_name)
            await ring.destroy()
    except BaseException:
        await metadata.put_if_absent(name, stored)
        raise
    return True
