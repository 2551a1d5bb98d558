"""FlakeIdGenerator: Java's ``FlakeIdGeneratorProxy.newIdBaseLocal``, so ids look and order like a real member's.

An id is ``timestamp(41 bits, ms since 2018-01-01Z) | sequence(6 bits) | node id(16 bits)``. A batch is a base and
an increment of ``1 << 16``; the generator never hands out the same (timestamp, sequence) twice, running ahead of the
clock when asked for more than 64 ids per millisecond, and tells the caller how long to wait when it ran more than
``allowed_future_ms`` ahead (Hazelcast makes the client wait that long before answering).
"""

from __future__ import annotations

from dataclasses import dataclass

from meteor_spark.server.engine.clock import Clock
from meteor_spark.server.errors import IllegalArgument, ServerError

EPOCH_START_MS = 1_514_764_800_000
BITS_TIMESTAMP = 41
BITS_SEQUENCE = 6
BITS_NODE_ID = 16
INCREMENT = 1 << BITS_NODE_ID
DEFAULT_ALLOWED_FUTURE_MS = 15_000
FIRST_MEMBER_NODE_ID = 1
"""A Hazelcast member's node id is its member-list join version, 1 for the first (here: only) member of a cluster."""


@dataclass(frozen=True)
class IdBatch:
    base: int
    increment: int
    batch_size: int
    wait_ms: int
    """How long Hazelcast would delay this answer because the generator ran ahead of the clock."""


class FlakeIds:
    """Every FlakeIdGenerator of the member. Not thread-safe."""

    def __init__(
        self, clock: Clock, node_id: int = FIRST_MEMBER_NODE_ID, allowed_future_ms: int = DEFAULT_ALLOWED_FUTURE_MS
    ) -> None:
        if not 0 <= node_id < 1 << BITS_NODE_ID:
            raise IllegalArgument(f"flake id node_id={node_id} is out of range; use 0..{(1 << BITS_NODE_ID) - 1}")
        self._clock = clock
        self._node_id = node_id
        self._allowed_future_ms = allowed_future_ms
        self._generated: dict[str, int] = {}

    def new_id_batch(self, name: str, batch_size: int) -> IdBatch:
        if batch_size <= 0:
            raise IllegalArgument(f"batchSize ({batch_size}) must be positive")
        now = self._clock.now_ms() - EPOCH_START_MS
        if not -(1 << BITS_TIMESTAMP) <= now < 1 << BITS_TIMESTAMP:
            raise ServerError("Current time out of allowed range")
        now <<= BITS_SEQUENCE
        base = max(now, self._generated.get(name, 0))
        self._generated[name] = base + batch_size
        wait_ms = max(0, ((base + batch_size - now) >> BITS_SEQUENCE) - self._allowed_future_ms)
        return IdBatch((base << BITS_NODE_ID) | self._node_id, INCREMENT, batch_size, wait_ms)
