"""The private couplings to the asyncio Hazelcast client (``hazelcast.asyncio``, hazelcast-python-client 5.7).

The asyncio twins of two couplings of ``meteor_spark.compat`` (kept apart because that module is at its size limit):
the dynamic ring-buffer config sent through the client's private ``_invocation_service`` (``AsyncGrid``), and a test
client's connections routed through a ``TcpProxy`` (``TcpProxy.connect_async``). Each is version-guarded and
checked like ``compat``'s (``COUPLINGS``, ``problems``; ``tests/core/test_aio.py``); ``hazelcast`` is imported only
inside functions.
"""

from __future__ import annotations

import inspect
from typing import Any

from meteor_spark.compat import Coupling

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
)


def problems() -> list[str]:
    """Every coupling of the asyncio client that no longer holds for the installed dependency."""
    return [problem for coupling in COUPLINGS for problem in coupling.problems()]
