"""Map messages (service 0x01): CRUD, CAS, TTL, locks and entry listeners over ``engine.maps``.

Lock-aware operations of a non-owner wait while another owner holds the key's lock (``parked``); ``try_put`` /
``try_remove`` / ``try_lock`` wait at most their timeout. Every mutation is made durable (``engine.persistence``,
when configured) before it is acknowledged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from meteor_spark.server.engine.map_types import EntryEvent, LockOwner, WouldBlock
from meteor_spark.server.engine.maps import Maps
from meteor_spark.server.errors import IllegalArgument
from meteor_spark.server.handlers.registry import RequestContext, handles
from meteor_spark.server.protocol import messages_data as m
from meteor_spark.server.protocol.message_codec import EventSpec

SERVICE_NAME = "hz:impl:mapService"

T = TypeVar("T")


class _TimedOut:
    def __repr__(self) -> str:
        return "TIMED_OUT"


TIMED_OUT = _TimedOut()


def _maps(ctx: RequestContext) -> Maps:
    return ctx.engine.maps


def _owner(ctx: RequestContext, req: dict[str, Any]) -> LockOwner:
    return LockOwner(ctx.endpoint.client_uuid, req["thread_id"])


async def parked(ctx: RequestContext, attempt: Callable[[], T], timeout_ms: int | None = None) -> T | _TimedOut:
    """Run ``attempt`` until it stops raising ``WouldBlock``, parking on the key it names in between.

    ``timeout_ms`` None waits without bound (Hazelcast parks a lock-aware operation until the lock is free);
    otherwise returns ``TIMED_OUT`` once that much time passed. A lock whose lease ends by itself notifies nobody,
    so the wait is also capped at the lease end the engine reports.
    """
    try:
        return attempt()  # the common case: no lock in the way, so no clock reads and no loop
    except WouldBlock as first:
        blocked = first
    loop = asyncio.get_running_loop()
    deadline = None if timeout_ms is None else loop.time() + max(timeout_ms, 0) / 1000.0
    clock = ctx.engine.clock
    while True:
        wait_s = None if deadline is None else deadline - loop.time()
        if wait_s is not None and wait_s <= 0:
            return TIMED_OUT
        if blocked.retry_at_ms is not None:
            # A tiny margin so the retry lands after the lease end, not a hair before it.
            lease_s = max(blocked.retry_at_ms - clock.monotonic_ms(), 0.0) / 1000.0 + 0.001
            wait_s = lease_s if wait_s is None else min(wait_s, lease_s)
        await ctx.park(blocked.wait_key, wait_s)
        try:
            return attempt()
        except WouldBlock as again:
            blocked = again


async def _durable(ctx: RequestContext) -> None:
    """Wait until the mutation just made is as durable as the fsync policy promises (no-op without persistence)."""
    persistence = ctx.engine.persistence
    if persistence is not None:
        await persistence.commit()


# ------------------------------------------------------------------------------------------------ reads


@handles(m.MAP_GET)
def get(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any]:
    return {"response": ctx.engine.maps.get(req["name"], req["key"])}


@handles(m.MAP_CONTAINS_KEY)
async def contains_key(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any]:
    return {"response": _maps(ctx).contains_key(req["name"], req["key"])}


@handles(m.MAP_CONTAINS_VALUE)
async def contains_value(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any]:
    return {"response": _maps(ctx).contains_value(req["name"], req["value"])}


@handles(m.MAP_GET_ALL)
async def get_all(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any]:
    return {"response": _maps(ctx).get_all(req["name"], req["keys"])}


@handles(m.MAP_KEY_SET)
async def key_set(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any]:
    return {"response": _maps(ctx).key_set(req["name"])}


@handles(m.MAP_VALUES)
async def values(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any]:
    return {"response": _maps(ctx).values(req["name"])}


@handles(m.MAP_ENTRY_SET)
async def entry_set(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any]:
    return {"response": _maps(ctx).entry_set(req["name"])}


@handles(m.MAP_SIZE)
async def size(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any]:
    return {"response": _maps(ctx).size(req["name"])}


@handles(m.MAP_IS_EMPTY)
async def is_empty(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any]:
    return {"response": _maps(ctx).is_empty(req["name"])}


@handles(m.MAP_GET_ENTRY_VIEW)
async def get_entry_view(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any]:
    view = _maps(ctx).get_entry_view(req["name"], req["key"])
    return {"response": view, "max_idle": view.max_idle if view is not None else -1}


@handles(m.MAP_IS_LOCKED)
async def is_locked(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any]:
    return {"response": _maps(ctx).is_locked(req["name"], req["key"])}


# ------------------------------------------------------------------------------------------------ writes


def _put_like(
    ctx: RequestContext, req: dict[str, Any], op: Callable[..., T], respond: Callable[[T], dict[str, Any]]
) -> dict[str, Any] | Coroutine[Any, Any, dict[str, Any]]:
    """A map write, answered at once in the common case (no lock in the way, no persistence to wait for); else a
    coroutine the dispatcher drives (the handlers are plain functions: no coroutine for the common case)."""
    owner = LockOwner(ctx.endpoint.client_uuid, req["thread_id"])
    args = (req["name"], req["key"], req["value"], owner, req["ttl"], req.get("max_idle", -1))
    try:
        result = op(*args)  # the hot path of every map write: no closure, no extra coroutine unless it must wait
    except WouldBlock:
        return _put_when_free(ctx, op, args, respond)
    if ctx.engine.persistence is not None:
        return _durable_response(ctx, respond(result))
    return respond(result)


async def _put_when_free(
    ctx: RequestContext, op: Callable[..., T], args: tuple[Any, ...], respond: Callable[[T], dict[str, Any]]
) -> dict[str, Any]:
    """A write another owner's lock made wait: retried once the lock is released, then made durable."""
    waited = await parked(ctx, lambda: op(*args))
    assert not isinstance(waited, _TimedOut)
    await _durable(ctx)
    return respond(waited)


async def _durable_response(ctx: RequestContext, response: dict[str, Any]) -> dict[str, Any]:
    await _durable(ctx)
    return response


def _value_response(value: bytes | None) -> dict[str, Any]:
    return {"response": value}


def _empty_response(_: object) -> dict[str, Any]:
    return {"response": None}


# The "...WithMaxIdle" variants differ only by their max_idle parameter (``_put_like`` reads it when present), and a
# response value a spec does not declare is not encoded, so one handler serves both messages of each pair.


@handles(m.MAP_PUT)
@handles(m.MAP_PUT_WITH_MAX_IDLE)
def put(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any] | Coroutine[Any, Any, dict[str, Any]]:
    return _put_like(ctx, req, ctx.engine.maps.put, _value_response)


@handles(m.MAP_SET)
@handles(m.MAP_SET_WITH_MAX_IDLE)
def set_(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any] | Coroutine[Any, Any, dict[str, Any]]:
    return _put_like(ctx, req, ctx.engine.maps.set, _empty_response)


@handles(m.MAP_PUT_TRANSIENT)
@handles(m.MAP_PUT_TRANSIENT_WITH_MAX_IDLE)
def put_transient(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any] | Coroutine[Any, Any, dict[str, Any]]:
    return _put_like(ctx, req, ctx.engine.maps.put_transient, _empty_response)


@handles(m.MAP_PUT_IF_ABSENT)
@handles(m.MAP_PUT_IF_ABSENT_WITH_MAX_IDLE)
def put_if_absent(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any] | Coroutine[Any, Any, dict[str, Any]]:
    return _put_like(ctx, req, ctx.engine.maps.put_if_absent, _value_response)


async def _keyed(ctx: RequestContext, req: dict[str, Any], attempt: Callable[[LockOwner], T]) -> T:
    owner = _owner(ctx, req)
    result = await parked(ctx, lambda: attempt(owner))
    assert not isinstance(result, _TimedOut)
    if ctx.engine.persistence is not None:
        await _durable(ctx)
    return result


@handles(m.MAP_REPLACE)
async def replace(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any]:
    maps, name, key, value = _maps(ctx), req["name"], req["key"], req["value"]
    return {"response": await _keyed(ctx, req, lambda owner: maps.replace(name, key, value, owner))}


@handles(m.MAP_REPLACE_IF_SAME)
async def replace_if_same(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any]:
    maps, name, key = _maps(ctx), req["name"], req["key"]
    test_value, value = req["test_value"], req["value"]
    return {"response": await _keyed(ctx, req, lambda owner: maps.replace_if_same(name, key, test_value, value, owner))}


@handles(m.MAP_REMOVE)
async def remove(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any]:
    maps, name, key = _maps(ctx), req["name"], req["key"]
    return {"response": await _keyed(ctx, req, lambda owner: maps.remove(name, key, owner))}


@handles(m.MAP_REMOVE_IF_SAME)
async def remove_if_same(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any]:
    maps, name, key, value = _maps(ctx), req["name"], req["key"], req["value"]
    return {"response": await _keyed(ctx, req, lambda owner: maps.remove_if_same(name, key, value, owner))}


@handles(m.MAP_DELETE)
async def delete(ctx: RequestContext, req: dict[str, Any]) -> None:
    maps, name, key = _maps(ctx), req["name"], req["key"]
    await _keyed(ctx, req, lambda owner: maps.delete(name, key, owner))


@handles(m.MAP_EVICT)
async def evict(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any]:
    maps, name, key = _maps(ctx), req["name"], req["key"]
    return {"response": await _keyed(ctx, req, lambda owner: maps.evict(name, key, owner))}


@handles(m.MAP_SET_TTL)
async def set_ttl(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any]:
    # The request carries no thread id (Hazelcast runs setTtl as a lock-aware operation without one).
    # Any thread of the lock-holding client may set the TTL, so a client never waits on its own lock.
    maps, name, key, ttl = _maps(ctx), req["name"], req["key"], req["ttl"]

    def attempt() -> bool:
        holder = maps.lock_owner(name, key)
        owner = holder if holder is not None and holder.client_uuid == ctx.endpoint.client_uuid else None
        return maps.set_ttl(name, key, ttl, owner or LockOwner(ctx.endpoint.client_uuid, -1))

    result = await parked(ctx, attempt)
    await _durable(ctx)
    return {"response": result}


@handles(m.MAP_TRY_PUT)
async def try_put(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any]:
    maps, name, key, value, owner = _maps(ctx), req["name"], req["key"], req["value"], _owner(ctx, req)
    result = await parked(ctx, lambda: maps.set(name, key, value, owner), req["timeout"])
    if result is TIMED_OUT:
        return {"response": False}
    await _durable(ctx)
    return {"response": True}


@handles(m.MAP_TRY_REMOVE)
async def try_remove(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any]:
    maps, name, key, owner = _maps(ctx), req["name"], req["key"], _owner(ctx, req)
    result = await parked(ctx, lambda: maps.remove(name, key, owner), req["timeout"])
    if result is TIMED_OUT or result is None:
        return {"response": False}
    await _durable(ctx)
    return {"response": True}


@handles(m.MAP_PUT_ALL)
async def put_all(ctx: RequestContext, req: dict[str, Any]) -> None:
    _maps(ctx).put_all(req["name"], req["entries"])
    await _durable(ctx)


@handles(m.MAP_CLEAR)
async def clear(ctx: RequestContext, req: dict[str, Any]) -> None:
    _maps(ctx).clear(req["name"])
    await _durable(ctx)


@handles(m.MAP_EVICT_ALL)
async def evict_all(ctx: RequestContext, req: dict[str, Any]) -> None:
    _maps(ctx).evict_all(req["name"])
    await _durable(ctx)


@handles(m.MAP_FLUSH)
async def flush(ctx: RequestContext, req: dict[str, Any]) -> None:
    _maps(ctx).flush(req["name"])
    await _durable(ctx)


# ------------------------------------------------------------------------------------------------ locks


@handles(m.MAP_LOCK)
async def lock(ctx: RequestContext, req: dict[str, Any]) -> None:
    maps, name, key, owner = _maps(ctx), req["name"], req["key"], _owner(ctx, req)
    lease, reference_id = req["ttl"], req["reference_id"]
    await parked(ctx, lambda: maps.lock(name, key, owner, lease, reference_id))


@handles(m.MAP_TRY_LOCK)
async def try_lock(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any]:
    maps, name, key, owner = _maps(ctx), req["name"], req["key"], _owner(ctx, req)
    lease, reference_id, timeout = req["lease"], req["reference_id"], req["timeout"]
    result = await parked(ctx, lambda: maps.lock(name, key, owner, lease, reference_id), max(timeout, 0))
    return {"response": result is not TIMED_OUT}


@handles(m.MAP_UNLOCK)
async def unlock(ctx: RequestContext, req: dict[str, Any]) -> None:
    _maps(ctx).unlock(req["name"], req["key"], _owner(ctx, req), req["reference_id"])


@handles(m.MAP_FORCE_UNLOCK)
async def force_unlock(ctx: RequestContext, req: dict[str, Any]) -> None:
    _maps(ctx).force_unlock(req["name"], req["key"])


# ------------------------------------------------------------------------------------------------ listeners


def _listen(ctx: RequestContext, req: dict[str, Any], event_spec: EventSpec, key: bytes | None) -> dict[str, Any]:
    maps, name = _maps(ctx), req["name"]
    member_uuid = ctx.member.member_uuid

    def deliver(event: EntryEvent) -> None:
        ctx.send_event(
            event_spec,
            event_type=int(event.event_type),
            uuid=member_uuid,
            number_of_affected_entries=event.affected_entries,
            key=event.key,
            value=event.value,
            old_value=event.old_value,
            merging_value=None,
        )

    flags = req["listener_flags"]
    if flags < 0:
        raise IllegalArgument(f"listener_flags {flags} is negative; pass a bit set of EntryEventType values")
    registration = maps.add_listener(name, deliver, key=key, include_value=req["include_value"], flags=flags)
    ctx.endpoint.on_close(("map-listener", registration), lambda: maps.remove_listener(name, registration))
    ctx.engine.housekeeping.ensure_started()
    return {"response": registration}


@handles(m.MAP_ADD_ENTRY_LISTENER)
async def add_entry_listener(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any]:
    return _listen(ctx, req, m.MAP_ADD_ENTRY_LISTENER.event("Entry"), None)


@handles(m.MAP_ADD_ENTRY_LISTENER_TO_KEY)
async def add_entry_listener_to_key(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any]:
    return _listen(ctx, req, m.MAP_ADD_ENTRY_LISTENER_TO_KEY.event("Entry"), req["key"])


@handles(m.MAP_REMOVE_ENTRY_LISTENER)
async def remove_entry_listener(ctx: RequestContext, req: dict[str, Any]) -> dict[str, Any]:
    registration = req["registration_id"]
    removed = _maps(ctx).remove_listener(req["name"], registration)
    ctx.endpoint.remove_on_close(("map-listener", registration))
    return {"response": removed}
