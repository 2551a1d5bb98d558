"""AtomicLong messages (service 0x09), on the engine's CP "unsafe mode" AtomicLongs (``group_id`` is decoded
straight into the engine's ``RaftGroupId``)."""

from __future__ import annotations

from typing import Any

from meteor_spark.server.handlers.registry import RequestContext, handles
from meteor_spark.server.protocol import messages_data as m


@handles(m.ATOMIC_LONG_GET)
async def get(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any]:
    return {"response": ctx.engine.atomics.get(req["group_id"], req["name"])}


@handles(m.ATOMIC_LONG_ADD_AND_GET)
async def add_and_get(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any]:
    return {"response": ctx.engine.atomics.add_and_get(req["group_id"], req["name"], req["delta"])}


@handles(m.ATOMIC_LONG_GET_AND_ADD)
async def get_and_add(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any]:
    return {"response": ctx.engine.atomics.get_and_add(req["group_id"], req["name"], req["delta"])}


@handles(m.ATOMIC_LONG_GET_AND_SET)
async def get_and_set(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any]:
    return {"response": ctx.engine.atomics.get_and_set(req["group_id"], req["name"], req["new_value"])}


@handles(m.ATOMIC_LONG_COMPARE_AND_SET)
async def compare_and_set(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any]:
    atomics = ctx.engine.atomics
    return {"response": atomics.compare_and_set(req["group_id"], req["name"], req["expected"], req["updated"])}


@handles(m.ATOMIC_LONG_APPLY)
async def apply(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any]:
    ctx.engine.atomics.apply_function(req["group_id"], req["name"], req["function"])
    raise AssertionError("unreachable: apply_function always raises")


@handles(m.ATOMIC_LONG_ALTER)
async def alter(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any]:
    ctx.engine.atomics.apply_function(req["group_id"], req["name"], req["function"])
    raise AssertionError("unreachable: apply_function always raises")
