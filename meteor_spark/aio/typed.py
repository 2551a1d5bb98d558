"""Typed streams on the asyncio clients: the threaded Avro codecs (``meteor_spark.grid.typed_values``) fed with the
stream's schema registry entry read ahead, awaited.

``AvroSerializer`` and ``AvroDeserializer`` read the registry synchronously (``schemas.get_subject``: one map get
of ``meteor.schemas``). Rather than copying them, the asyncio clients await that one read first and hand them a
``SchemaView`` as their grid, which answers from what was read. So the setting's meaning (``"avro"``,
``AvroValues(version=..., into=...)``, no setting on a ``value_format="avro"`` stream), the checks, the header
(``meteor.schema``), the projection onto the reader's version and the errors are the threaded ones.

A subscriber meets versions registered after it started: ``refresh_if_due`` reads the entry again, at most once
per ``typed_values.REFRESH_MS``, before the records of a poll are decoded, and the deserializer looks a version it
has not seen up in the view at most once per ``REFRESH_MS`` too (its own rule). A record written with a version
registered within about that time of being read may therefore be refused as unknown and settled by
``on_corrupt``, as a threaded reader may within its one-second window.
"""

from __future__ import annotations

import time
from typing import Any, cast

from meteor_spark.format.serializers import Deserializer, Serializer
from meteor_spark.grid.aio_client import AsyncGrid
from meteor_spark.grid.client import Grid
from meteor_spark.grid.schemas import SCHEMAS_MAP
from meteor_spark.grid.streams import StreamInfo
from meteor_spark.grid.typed_values import (
    REFRESH_MS,
    value_codec_setting,
    value_deserializer_for,
    value_serializer_for,
)

__all__ = ["SchemaView", "typed_deserializer", "typed_serializer"]


class SchemaView:
    """One stream's ``meteor.schemas`` entry as last read (``refresh``), answering the synchronous
    ``grid.map(SCHEMAS_MAP).get(stream)`` of the threaded codecs."""

    def __init__(self, grid: AsyncGrid, stream: str) -> None:
        self._grid = grid
        self.stream = stream
        self._entry: str | None = None
        self._read_at = 0.0

    async def refresh(self) -> None:
        """Read the stream's registry entry again."""
        registry = await self._grid.map(SCHEMAS_MAP)
        self._entry = await registry.get(self.stream)
        self._read_at = time.monotonic()

    async def refresh_if_due(self) -> None:
        """``refresh`` when the entry was read more than ``REFRESH_MS`` ago (a version registered since)."""
        if time.monotonic() - self._read_at >= REFRESH_MS / 1000:
            await self.refresh()

    def map(self, name: str) -> SchemaView:
        if name != SCHEMAS_MAP:
            raise AssertionError(f"a SchemaView answers for {SCHEMAS_MAP!r} only, not {name!r}")
        return self

    def get(self, key: str) -> str | None:
        if key != self.stream:
            raise AssertionError(f"a SchemaView holds stream {self.stream!r}'s entry, not {key!r}'s")
        return self._entry


async def typed_serializer(grid: AsyncGrid, info: StreamInfo, setting: Any) -> Serializer | None:
    """``value_serializer_for`` on an ``AsyncGrid``: a typed stream's Avro serializer (its version's schema and
    ``record_header``) with the registry entry read first, else the built-in or callable ``setting`` names."""
    if value_codec_setting(setting, info) is None:
        return value_serializer_for(cast(Grid, None), info, setting)
    view = SchemaView(grid, info.name)
    await view.refresh()
    return value_serializer_for(cast(Grid, view), info, setting)


async def typed_deserializer(
    grid: AsyncGrid, info: StreamInfo, setting: Any
) -> tuple[Deserializer | None, SchemaView | None]:
    """``value_deserializer_for`` on an ``AsyncGrid``, and the ``SchemaView`` a typed stream's deserializer reads
    (to ``refresh_if_due`` before each poll's records are decoded); ``(codec, None)`` for an untyped setting."""
    if value_codec_setting(setting, info) is None:
        return value_deserializer_for(cast(Grid, None), info, setting), None
    view = SchemaView(grid, info.name)
    await view.refresh()
    return value_deserializer_for(cast(Grid, view), info, setting), view
