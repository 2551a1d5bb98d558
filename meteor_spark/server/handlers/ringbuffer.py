"""Ringbuffer messages (service 0x17): the engine's ring semantics plus long polls for read_one / read_many."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

from meteor_spark.server.engine.ringbuffer import (
    WOULD_BLOCK,
    ReadManyState,
    Ringbuffer,
    RingService,
    RingStore,
    check_read_many_arguments,
    refuse_filter,
)
from meteor_spark.server.handlers.registry import Parked, RequestContext, handles
from meteor_spark.server.protocol import messages as m


def _ring(ctx: RequestContext, req: dict[str, Any]) -> Ringbuffer:
    return ctx.engine.rings.get(req["name"])


@handles(m.RINGBUFFER_SIZE)
async def size(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any]:
    return {"response": _ring(ctx, req).size()}


@handles(m.RINGBUFFER_TAIL_SEQUENCE)
async def tail_sequence(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any]:
    return {"response": _ring(ctx, req).tail_sequence()}


@handles(m.RINGBUFFER_HEAD_SEQUENCE)
async def head_sequence(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any]:
    return {"response": _ring(ctx, req).head_sequence()}


@handles(m.RINGBUFFER_CAPACITY)
async def capacity(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any]:
    return {"response": _ring(ctx, req).capacity}


@handles(m.RINGBUFFER_REMAINING_CAPACITY)
async def remaining_capacity(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any]:
    return {"response": _ring(ctx, req).remaining_capacity()}


def _acknowledge(ring: Ringbuffer, sequence: int) -> dict[str, Any] | Coroutine[Any, Any, dict[str, Any]]:
    """The response to a write: at once without a store (a plain handler, no coroutine, on the publish path),
    else a coroutine answering once the write is as durable as the fsync policy promises."""
    if ring.store is not None and sequence >= 0:
        return _durable_acknowledgement(ring.store, sequence)
    return {"response": sequence}


async def _durable_acknowledgement(store: RingStore, sequence: int) -> dict[str, Any]:
    await store.commit()
    return {"response": sequence}


@handles(m.RINGBUFFER_ADD)
def add(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any] | Coroutine[Any, Any, dict[str, Any]]:
    ring = _ring(ctx, req)
    return _acknowledge(ring, ring.add(req["value"], req["overflow_policy"]))


@handles(m.RINGBUFFER_ADD_ALL)
def add_all(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any] | Coroutine[Any, Any, dict[str, Any]]:
    ring = _ring(ctx, req)
    return _acknowledge(ring, ring.add_all(req["value_list"], req["overflow_policy"]))


@handles(m.RINGBUFFER_READ_ONE)
async def read_one(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any]:
    name, sequence = req["name"], req["sequence"]
    rings = ctx.engine.rings
    key = RingService.waiter_key(name)
    # Hazelcast parks a read_one on a ring no operation has created yet, whatever the sequence.
    ring = rings.get_or_none(name)
    while ring is None:
        await ctx.park(key)
        ring = rings.get_or_none(name)
    while True:
        item = ring.read_one(sequence)
        if item is not WOULD_BLOCK:
            return {"response": item}
        await ctx.park(key)
        RingService.check_not_destroyed(ring)


@handles(m.RINGBUFFER_READ_MANY)
def read_many(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any] | Parked:
    """Answered at once when the items are there; else parked (``answer_when``) until an add brings them, and
    answered from inside that add: a plain handler, with no coroutine either way."""
    if req["filter"] is not None:
        raise refuse_filter(req["filter"])
    start, min_count, max_count = req["start_sequence"], req["min_count"], req["max_count"]
    check_read_many_arguments(start, min_count, max_count)
    ring = ctx.engine.rings.get(req["name"])
    state = ReadManyState(start, min_count, max_count)
    if ring.read_many(state):
        return _read_many_response(state)

    def answer() -> dict[str, Any] | None:
        RingService.check_not_destroyed(ring)
        return _read_many_response(state) if ring.read_many(state) else None

    return ctx.answer_when(RingService.waiter_key(req["name"]), answer)


def _read_many_response(state: ReadManyState) -> dict[str, Any]:
    return {
        "read_count": state.read_count,
        "items": state.items,
        "item_seqs": state.sequences,
        "next_seq": state.next_sequence,
    }
