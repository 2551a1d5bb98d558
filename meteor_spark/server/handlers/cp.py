"""CP group messages (service 0x1E): create a group for a CP proxy, destroy a CP object (Hazelcast "unsafe mode")."""

from __future__ import annotations

from typing import Any

from meteor_spark.server.handlers.registry import RequestContext, handles
from meteor_spark.server.protocol import messages_data as m


@handles(m.CP_GROUP_CREATE_CP_GROUP)
async def create_cp_group(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any]:
    return {"response": ctx.engine.atomics.create_group(req["proxy_name"])}


@handles(m.CP_GROUP_DESTROY_CP_OBJECT)
async def destroy_cp_object(ctx: RequestContext, req: dict[str, Any]) -> None:
    ctx.engine.atomics.destroy(req["group_id"], req["service_name"], req["object_name"])
