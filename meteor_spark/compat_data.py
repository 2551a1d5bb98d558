"""The private coupling to hazelcast-python-client's serialized form of a byte array: ring items handed to the
client already serialized, as its ``Data``.

The client serializes every item of an ``add_all`` through its serialization service: a fresh output buffer
(zero-filled, grown by copying), the item copied in, and the used part copied out again, three passes over each
byte before the request frame copies it a fourth time. A ring item of a 10 KiB record's call is about 1 MiB, so
those passes were a good part of publishing's cost. ``byte_array_wrapper`` gives a function that builds the same
``Data`` in one copy: the serialized form of a byte array is an 8-byte head (partition hash, type id) then the
length and the bytes, and the service passes a ``Data`` through as it is. The head and the length's byte order are
taken from the client's own serialization of two probes, and the wrapper is used only when both agree with that
layout (a partitioning strategy that hashes the content would not). Reads the other way: ``read_items_as_bytes``
has a ring proxy deserialize its items into ``bytes`` in one copy. Version-guarded and checked like
``meteor_spark.compat``'s couplings (``COUPLINGS``, ``problems``; ``tests/core/test_large_records.py``);
``hazelcast`` is imported only inside functions.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import cache
from typing import Any

from meteor_spark.compat import Coupling, installed_version

_HAZELCAST = "hazelcast-python-client"
#: hazelcast-python-client versions the coupling was written and checked for.
_WRITTEN_FOR = ((5, 7), (5, 8))
_PROBES = (bytearray(b"\x01" * 0x0102), bytearray(b"\x02" * 0x0201))


def byte_array_wrapper(proxy: Any) -> Callable[[Any], Any] | None:
    """A function making a ring item (bytes-like) into the ``Data`` the proxy's client would serialize it to, in
    one copy; None when the installed client is not a version this was checked on, or its serialization of a
    byte array does not have the expected layout."""
    if not _checked_version():
        return None
    from hazelcast.serialization.data import Data

    to_data = getattr(proxy, "_to_data", None)
    if to_data is None:
        return None
    heads: set[bytes] = set()
    orders: set[str] = set()
    for probe in _PROBES:
        buffer = bytes(to_data(probe).buffer)
        if buffer[12:] != probe:
            return None
        heads.add(buffer[:8])
        orders.update(order for order in ("big", "little") if buffer[8:12] == len(probe).to_bytes(4, order))
    if len(heads) != 1 or len(orders) != 1:
        return None
    head = heads.pop()
    byte_order: Any = orders.pop()

    def wrap(item: Any) -> Any:
        return Data(b"".join((head, len(item).to_bytes(4, byte_order), item)))

    return wrap


def read_items_as_bytes(proxy: Any, wrap: Callable[[Any], Any]) -> bool:
    """Make the ring proxy's reads deserialize each item with one copy, into ``bytes``, instead of the client's
    zero-filled ``bytearray`` filled through two more copies; returns whether it is done. ``wrap`` is the
    proxy's ``byte_array_wrapper``, whose head a read item must start with: anything else (another type, an
    empty buffer) goes to the client's own deserialization. Set on the proxy object the client keeps for the
    ring's name (every reader of the ring through this client shares it)."""
    if getattr(proxy, "_meteor_items_as_bytes", False):
        return True
    to_object = getattr(proxy, "_to_object", None)
    if to_object is None:
        return False
    one = bytes(wrap(b"x").buffer)
    head = one[:8]
    byte_order: Any = "big" if one[8:12] == (1).to_bytes(4, "big") else "little"

    def item_as_bytes(data: Any) -> Any:
        buffer = data.buffer
        if buffer[:8] == head and int.from_bytes(buffer[8:12], byte_order) == len(buffer) - 12:
            return buffer[12:] if isinstance(buffer, bytes) else bytes(buffer[12:])
        return to_object(data)

    proxy._to_object = item_as_bytes
    proxy._meteor_items_as_bytes = True
    return True


@cache
def _checked_version() -> bool:
    """Whether the installed client is a version this was checked on (read once: metadata lookups are slow)."""
    found = installed_version(_HAZELCAST)
    return found is not None and _WRITTEN_FOR[0] <= found < _WRITTEN_FOR[1]


def _check_data() -> None:
    from hazelcast.serialization import service
    from hazelcast.serialization.data import Data

    assert "if isinstance(obj, Data):\n            return obj" in inspect.getsource(
        service.SerializationServiceV1.to_data
    ), "SerializationServiceV1.to_data no longer passes a Data through as it is"
    assert list(inspect.signature(Data).parameters) == ["buf"], "Data(buf) no longer takes the serialized bytes"
    from hazelcast.proxy.ringbuffer import Ringbuffer

    assert 'deserialize_list_in_place(response["items"], self._to_object)' in inspect.getsource(Ringbuffer.read_many), (
        "Ringbuffer.read_many no longer deserializes its items through the proxy's `_to_object`"
    )


COUPLINGS: tuple[Coupling, ...] = (
    Coupling(
        "ring items handed to add_all as the client's Data (Ring.add_all_async)", _HAZELCAST, _WRITTEN_FOR, _check_data
    ),
)


def problems() -> list[str]:
    """Every coupling of this module that no longer holds for the installed client (empty when all are safe)."""
    return [problem for coupling in COUPLINGS for problem in coupling.problems()]
