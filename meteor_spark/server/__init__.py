"""The embedded grid: a single-process member that speaks the Hazelcast client protocol.

Layers (dependencies point down): ``member`` / ``__main__`` (ways to run it) -> ``tcp`` (socket shell) ->
``handlers`` (one coroutine per message type, via a registry) -> ``protocol`` (frames, codecs declared as data, the
message table, error encoding) and ``engine`` (data-structure semantics, no sockets). Imports neither ``hazelcast``
nor ``pyspark``.
"""

from __future__ import annotations

from meteor_spark.server.engine.map_types import MapConfig
from meteor_spark.server.engine.ringbuffer import RingConfig
from meteor_spark.server.member import EmbeddedGrid, MemberOptions

__all__ = ["EmbeddedGrid", "MapConfig", "MemberOptions", "RingConfig"]
