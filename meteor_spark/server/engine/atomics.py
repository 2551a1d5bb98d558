"""CP AtomicLong on a member without CP members: refused as Hazelcast 5.7 open source refuses it, or served in
"unsafe mode" (AP, on normal partitions) as Hazelcast 4.x-5.4 serve it.

Hazelcast 5.7 open source answers ``createCPGroup`` with an ``UnsupportedOperationException`` ("CP subsystem is an
Enterprise feature..."): the member the embedded grid reports being, hence the default (``CpMode.DISABLED``).
Hazelcast 4.x-5.4 with ``cp-member-count: 0`` answer it with a ``RaftGroupId`` and run AtomicLong on ordinary
partitions (``CpMode.UNSAFE``, for code written against those members). A destroyed AtomicLong can never be used
again under the same name (Hazelcast keeps a tombstone), so every later operation raises
``DistributedObjectDestroyed``.
"""

from __future__ import annotations

import enum
import zlib
from dataclasses import dataclass

from meteor_spark.server.engine.functions import refuse_java_function
from meteor_spark.server.errors import DistributedObjectDestroyed, IllegalArgument, UnsupportedOperation

DEFAULT_GROUP = "default"
METADATA_GROUP = "metadata"
ATOMIC_LONG_SERVICE = "hz:raft:atomicLongService"
_PARTITION_COUNT = 271
_LONG_MASK = (1 << 64) - 1


class CpMode(enum.Enum):
    """What ``createCPGroup`` does on a member without CP members."""

    UNSAFE = "unsafe"
    """Hazelcast 4.x-5.4: CP data structures run in AP "unsafe mode"."""
    DISABLED = "disabled"
    """Hazelcast 5.7 open source: refused, the CP subsystem being an Enterprise feature (UnsupportedOperation)."""


CP_REFUSED = (
    "CP subsystem is an Enterprise feature. Please use the latest applicable Hazelcast Enterprise client to "
    "interact with Enterprise clusters using CP."
)
"""Hazelcast 5.7.0's own words (an open-source member's answer to any CP request)."""


@dataclass(frozen=True)
class RaftGroupId:
    """Hazelcast's ``RaftGroupId``: what ``createCPGroup`` answers and every CP operation carries back (also the
    protocol's custom struct of that name)."""

    name: str
    seed: int
    id: int


def _wrap(value: int) -> int:
    """Java ``long`` overflow: keep the low 64 bits, signed."""
    value &= _LONG_MASK
    return value - (1 << 64) if value >= 1 << 63 else value


def split_proxy_name(proxy_name: str) -> tuple[str, str]:
    """``"counter@group"`` -> ``("counter", "group")``; no group means the default group."""
    object_name, _, group = proxy_name.partition("@")
    group = group.strip() or DEFAULT_GROUP
    if not object_name.strip():
        raise IllegalArgument(
            f"CP object name {proxy_name!r} is empty; pass a name such as 'counter' or 'counter@group'"
        )
    if "@" in group:
        raise IllegalArgument(f"CP object name {proxy_name!r} has more than one '@'; use 'object@group'")
    if group.lower() == METADATA_GROUP:
        raise IllegalArgument(f"CP object name {proxy_name!r}: the CP group name 'metadata' is reserved by Hazelcast")
    return object_name, group


class Atomics:
    """Every AtomicLong of the member, keyed by (CP group name, object name). Not thread-safe."""

    def __init__(self, mode: CpMode = CpMode.DISABLED) -> None:
        self.mode = mode
        self._values: dict[tuple[str, str], int] = {}
        self._destroyed: set[tuple[str, str]] = set()

    def create_group(self, proxy_name: str) -> RaftGroupId:
        """Answer ``CPGroup.createCPGroup``: the group id the proxy will send with each operation."""
        if self.mode is CpMode.DISABLED:
            raise UnsupportedOperation(CP_REFUSED)
        _, group = split_proxy_name(proxy_name)
        # Unsafe mode places the group on the partition of its name; any stable number in range works for clients.
        return RaftGroupId(group, 0, zlib.crc32(group.encode("utf-8")) % _PARTITION_COUNT)

    def _key(self, group: RaftGroupId, name: str) -> tuple[str, str]:
        if self.mode is CpMode.DISABLED:
            raise UnsupportedOperation(CP_REFUSED)
        key = (group.name, name)
        if key in self._destroyed:
            raise DistributedObjectDestroyed(f"AtomicValue[{name}] is already destroyed!")
        return key

    def get(self, group: RaftGroupId, name: str) -> int:
        return self._values.get(self._key(group, name), 0)

    def add_and_get(self, group: RaftGroupId, name: str, delta: int) -> int:
        key = self._key(group, name)
        value = self._values[key] = _wrap(self._values.get(key, 0) + delta)
        return value

    def get_and_add(self, group: RaftGroupId, name: str, delta: int) -> int:
        key = self._key(group, name)
        old = self._values.get(key, 0)
        self._values[key] = _wrap(old + delta)
        return old

    def get_and_set(self, group: RaftGroupId, name: str, value: int) -> int:
        key = self._key(group, name)
        old = self._values.get(key, 0)
        self._values[key] = _wrap(value)
        return old

    def compare_and_set(self, group: RaftGroupId, name: str, expected: int, updated: int) -> bool:
        key = self._key(group, name)
        if self._values.get(key, 0) != expected:
            return False
        self._values[key] = _wrap(updated)
        return True

    def apply_function(self, group: RaftGroupId, name: str, function: bytes) -> None:
        """``apply`` / ``alter`` carry a serialized Java ``IFunction``, which a Python member cannot run."""
        self._key(group, name)
        raise refuse_java_function(
            function,
            f"AtomicLong[{name}]: apply/alter need a Java IFunction, which the embedded member cannot execute; "
            "use compare_and_set in a loop instead",
        )

    def destroy(self, group: RaftGroupId, service_name: str, name: str) -> None:
        """``CPGroup.destroyCPObject``: drop the value and refuse every later use of the name."""
        if service_name != ATOMIC_LONG_SERVICE:
            raise UnsupportedOperation(
                f"destroying CP object {name!r} of service {service_name!r} is not supported; "
                f"the embedded member serves only {ATOMIC_LONG_SERVICE!r}"
            )
        key = self._key(group, name)
        self._values.pop(key, None)
        self._destroyed.add(key)
