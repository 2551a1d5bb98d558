"""FlakeIdGenerator messages (service 0x1C)."""

from __future__ import annotations

import asyncio
from typing import Any

from meteor_spark.server.handlers.registry import RequestContext, handles
from meteor_spark.server.protocol import messages_data as m


@handles(m.FLAKE_ID_GENERATOR_NEW_ID_BATCH)
async def new_id_batch(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any]:
    batch = ctx.engine.flake_ids.new_id_batch(req["name"], req["batch_size"])
    if batch.wait_ms > 0:
        # Hazelcast delays the answer while the generator runs too far ahead of the clock; so do we, without
        # holding up anyone else.
        await asyncio.sleep(batch.wait_ms / 1000.0)
    return {"base": batch.base, "increment": batch.increment, "batch_size": batch.batch_size}
