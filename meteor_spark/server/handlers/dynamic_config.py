"""DynamicConfig messages (service 0x1B): clients add ring buffer configs to the running member, as they can on a
Hazelcast 5.x cluster (``config.addRingBufferConfig`` in the Java client)."""

from __future__ import annotations

import logging
from typing import Any

from meteor_spark.server.engine.ringbuffer import RingConfig
from meteor_spark.server.errors import UnsupportedOperation
from meteor_spark.server.handlers.registry import RequestContext, handles
from meteor_spark.server.protocol import messages as m

logger = logging.getLogger(__name__)


@handles(m.DYNAMIC_CONFIG_ADD_RINGBUFFER_CONFIG)
async def add_ringbuffer_config(ctx: RequestContext, req: dict[str, Any]) -> None:
    store = req["ringbuffer_store_config"]
    if store is not None and store.enabled:
        raise UnsupportedOperation(
            f"ring buffer config {req['name']!r}: a RingbufferStore is Java code this member cannot run; start the "
            f"member with a data directory (--data-dir) to keep ring history on disk instead"
        )
    config = RingConfig(
        name=req["name"],
        capacity=req["capacity"],
        backup_count=req["backup_count"],
        async_backup_count=req["async_backup_count"],
        ttl_s=req["time_to_live_seconds"],
        in_memory_format=req["in_memory_format"],
        merge_policy=req["merge_policy"],
        merge_batch_size=req["merge_batch_size"],
        split_brain_protection_name=req["split_brain_protection_name"],
        user_code_namespace=req.get("user_code_namespace"),
    )
    rings = ctx.engine.rings
    if rings.configs.add(config):
        logger.info("added %s", config.describe())
        _warn_if_existing_rings_differ(ctx, config)
    return None


def _warn_if_existing_rings_differ(ctx: RequestContext, config: RingConfig) -> None:
    # Hazelcast applies a new config to rings created later only; an existing ring keeps its capacity and TTL.
    for name, ring in ctx.engine.rings.rings.items():
        if ctx.engine.rings.configs.find(name) is config and ring.config != config:
            logger.info(
                "ring %r already exists with capacity %d, TTL %d s; the new config %r applies from its next creation",
                name,
                ring.capacity,
                ring.config.ttl_s,
                config.name,
            )
