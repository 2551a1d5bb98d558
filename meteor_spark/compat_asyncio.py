"""The private couplings to the asyncio Hazelcast client (``hazelcast.asyncio``, hazelcast-python-client 5.7).

The asyncio twins of two couplings of ``meteor_spark.compat`` (kept apart because that module is at its size limit):
the dynamic ring-buffer config sent through the client's private ``_invocation_service`` (``AsyncGrid``), and a test
client's connections routed through a ``TcpProxy`` (``TcpProxy.connect_async``); and a ring's ``read_many`` and
``add_all`` issued as the invocation's own future (``read_many_sender``, ``add_all_sender``: the latter is
``compat_ring``'s append path, whose framing checks hold for both clients). Each is version-guarded and
checked like ``compat``'s (``COUPLINGS``, ``problems``; ``tests/core/test_aio.py``); ``hazelcast`` is imported only
inside functions.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Sequence
from typing import Any, cast

from meteor_spark.compat import Coupling
from meteor_spark.compat_ring import add_path_of, check_read_many_request, read_answers

#: hazelcast-python-client versions these couplings were written and checked for.
_WRITTEN_FOR = ((5, 7), (5, 8))
_HAZELCAST = "hazelcast-python-client"


async def invoke_async(client: Any, request: Any) -> None:
    """``compat.invoke`` on the asyncio client: ``request`` through its private ``_invocation_service``, awaited."""
    from hazelcast.internal.asyncio_invocation import Invocation

    await client._invocation_service.ainvoke(Invocation(request, response_handler=lambda message: None))


async def route_member_through_async(
    client: Any, member_port: int, proxy_address: str, *, retry_pause_s: float
) -> None:
    """``compat.route_member_through`` on the asyncio client: the same private attributes, with the address
    provider's ``load_addresses`` and ``translate`` coroutines."""
    provider = client._connection_manager._address_provider
    proxied = (await provider.load_addresses())[0][0]
    if proxied.port != int(proxy_address.rsplit(":", 1)[1]):
        raise ValueError(f"the client was not connected through {proxy_address}: its first address is {proxied}")
    original = provider.translate

    async def translate(address: Any) -> Any:
        return proxied if address.port == member_port else await original(address)

    provider.translate = translate
    client._invocation_service._invocation_retry_pause = retry_pause_s


def read_many_sender(
    proxy: Any, make: Callable[[list[Any], list[int], int], Any]
) -> Callable[[int, int, int], asyncio.Future[Any]]:
    """``Ringbuffer.read_many`` of the asyncio client without its coroutine: the request goes out at once and what
    comes back is the invocation's own future, answered with ``make(items, sequences, next_sequence)``, the answer
    read by ``compat_ring.ReadAnswers`` (off its frames, items as bytes in one copy) on the loop.

    A parked read awaited through the public coroutine costs a ``Task`` per read and one more turn of the loop
    between the answer and its reader; a subscriber keeps one such read out per lane all the time, so that is paid
    on every record's hop. The public method's client-side checks are the caller's: ``max_count`` below the
    ring's capacity and ``MAX_BATCH_SIZE``, ``min_count <= max_count``, no filter.
    """
    from hazelcast.protocol.codec import ringbuffer_read_many_codec

    encode = ringbuffer_read_many_codec.encode_request
    name, invoke, answers = proxy.name, proxy._invoke, read_answers(proxy)

    def handler(message: Any) -> Any:
        return make(*answers.read(message))

    def send(start: int, min_count: int, max_count: int) -> asyncio.Future[Any]:
        return cast("asyncio.Future[Any]", invoke(encode(name, start, min_count, max_count, None), handler))

    return send


def add_all_sender(proxy: Any) -> Callable[[Sequence[bytes], int], asyncio.Future[Any] | None]:
    """``compat_ring``'s append path on the asyncio client: byte items written once into a copy of the ring's encoded
    ``add_all`` request, sent as the asyncio invocation's own future (its value: the last item's sequence). The
    sender answers None for items the path does not frame (the caller then takes the public ``add_all``).

    An append through the public coroutine serializes each item into a ``Data`` and copies it again into the
    request, in three coroutine frames; a publisher with one record in flight pays that per record.
    """
    from hazelcast.internal.asyncio_invocation import Invocation

    path = add_path_of(proxy, Invocation)

    def send(items: Sequence[bytes], overflow_policy: int) -> asyncio.Future[Any] | None:
        return cast("asyncio.Future[Any]", path.add_all(items, overflow_policy)) if path.takes(items) else None

    return send


def _check_invoke() -> None:
    from hazelcast.internal.asyncio_client import HazelcastClient
    from hazelcast.internal.asyncio_invocation import Invocation, InvocationService

    assert "self._invocation_service" in inspect.getsource(HazelcastClient.__init__), (
        "the asyncio HazelcastClient no longer has `_invocation_service`"
    )
    assert inspect.iscoroutinefunction(InvocationService.ainvoke), "asyncio InvocationService.ainvoke is gone"
    assert "response_handler" in inspect.signature(Invocation.__init__).parameters, (
        "the asyncio Invocation() no longer takes response_handler"
    )


def _check_routing() -> None:
    from hazelcast.internal import asyncio_client, asyncio_connection, asyncio_invocation

    assert "self._connection_manager" in inspect.getsource(asyncio_client.HazelcastClient.__init__), (
        "the asyncio HazelcastClient no longer has `_connection_manager`"
    )
    assert "await self._address_provider.translate(" in inspect.getsource(asyncio_connection.ConnectionManager), (
        "the asyncio ConnectionManager no longer awaits `_address_provider.translate`"
    )
    assert inspect.iscoroutinefunction(asyncio_connection.DefaultAsyncioAddressProvider.load_addresses), (
        "the asyncio address provider's load_addresses is no longer a coroutine"
    )
    assert "self._invocation_retry_pause" in inspect.getsource(asyncio_invocation.InvocationService.__init__), (
        "the asyncio InvocationService no longer has `_invocation_retry_pause`"
    )


def _check_read_many() -> None:
    from hazelcast.internal.asyncio_proxy import base
    from hazelcast.internal.asyncio_proxy.base import PartitionSpecificProxy
    from hazelcast.internal.asyncio_proxy.ringbuffer import Ringbuffer
    from hazelcast.protocol.codec import ringbuffer_read_many_codec

    source = inspect.getsource(Ringbuffer.read_many)
    assert "ringbuffer_read_many_codec.encode_request(" in source and "ReadResult(" in source, (
        "the asyncio Ringbuffer.read_many no longer encodes and answers as read_many_sender does"
    )
    assert "return invocation.future" in inspect.getsource(PartitionSpecificProxy._invoke_on_partition), (
        "the asyncio PartitionSpecificProxy._invoke no longer returns the invocation's future"
    )
    assert "self._invocation_service = context.invocation_service" in inspect.getsource(base), (
        "the asyncio proxies no longer keep the client's invocation service as `_invocation_service`"
    )
    assert "self._partition_id = " in inspect.getsource(PartitionSpecificProxy), (
        "the asyncio PartitionSpecificProxy no longer keeps `_partition_id` (the append path invokes on it)"
    )
    check_read_many_request(ringbuffer_read_many_codec)


COUPLINGS: tuple[Coupling, ...] = (
    Coupling(
        "dynamic ring-buffer config via the asyncio client's _invocation_service (AsyncGrid.add_ring_config)",
        _HAZELCAST,
        _WRITTEN_FOR,
        _check_invoke,
    ),
    Coupling(
        "proxy routing of an asyncio test client (TcpProxy.connect_async)", _HAZELCAST, _WRITTEN_FOR, _check_routing
    ),
    Coupling(
        "a ring's read_many and add_all as the asyncio invocation's future (AsyncRing.read_soon, AsyncRing.add_all)",
        _HAZELCAST,
        _WRITTEN_FOR,
        _check_read_many,
    ),
)


def problems() -> list[str]:
    """Every coupling of the asyncio client that no longer holds for the installed dependency."""
    return [problem for coupling in COUPLINGS for problem in coupling.problems()]
