"""Typed streams on the asyncio clients: the threaded Avro codecs (``meteor_spark.grid.typed_values``) fed with the
stream's schema registry entry read ahead, awaited.

``AvroSerializer`` and ``AvroDeserializer`` read the registry synchronously (``schemas.get_subject``: one map get
of ``meteor.schemas``). Rather than copying them, the asyncio clients await that one read first and hand them a
``SchemaView`` as their grid, which answers from what was read. So the setting's meaning (``"avro"``,
``AvroValues(version=..., into=...)``, no setting on a ``value_format="avro"`` stream), the checks, the header
(``meteor.schema``), the projection onto the reader's version and the errors are the threaded ones.

A subscriber meets versions registered after it started: the deserializer asks the view for the entry when a
record carries a version it does not know; the view notes it, and the subscriber, finding records refused, awaits
``SchemaView.catch_up`` (the entry read again) and decodes them once more. So a new version costs one registry read,
when its first record arrives, and is never refused for being new, as with the threaded reader.
"""

from __future__ import annotations

from typing import Any, cast

from meteor_spark.format.serializers import Deserializer, Serializer
from meteor_spark.grid.aio_client import AsyncGrid
from meteor_spark.grid.client import Grid
from meteor_spark.grid.schemas import SCHEMAS_MAP
from meteor_spark.grid.streams import StreamInfo
from meteor_spark.grid.typed_values import (
    AvroDeserializer,
    value_codec_setting,
    value_deserializer_for,
    value_serializer_for,
)

__all__ = ["SchemaView", "typed_deserializer", "typed_serializer"]


class SchemaView:
    """One stream's ``meteor.schemas`` entry as last read (``refresh``), answering the synchronous
    ``grid.map(SCHEMAS_MAP).get(stream)`` of the threaded codecs.

    A deserializer asks (``get``) only when a record carries a version it does not know; the view cannot read the
    grid then, so it notes the question and ``catch_up`` answers it on the loop: the entry read again, the codec told
    to look again, and the caller decodes those records once more."""

    def __init__(self, grid: AsyncGrid, stream: str) -> None:
        self._grid = grid
        self.stream = stream
        self._entry: str | None = None
        self._asked = False
        self._codec: AvroDeserializer | None = None

    async def refresh(self) -> None:
        """Read the stream's registry entry again."""
        registry = await self._grid.map(SCHEMAS_MAP)
        self._entry = await registry.get(self.stream)
        self._asked = False

    def watch(self, codec: AvroDeserializer) -> None:
        """``codec`` reads this view; its questions from now on are the ones ``catch_up`` answers."""
        self._codec = codec
        self._asked = False

    async def catch_up(self) -> bool:
        """True when the codec asked for a version the view did not hold since its last read: the entry has been
        read again and the codec looks again at its next record (decode the refused records again)."""
        if not self._asked:
            return False
        await self.refresh()
        if self._codec is not None:
            self._codec.forget_misses()
        return True

    def map(self, name: str) -> SchemaView:
        if name != SCHEMAS_MAP:
            raise AssertionError(f"a SchemaView answers for {SCHEMAS_MAP!r} only, not {name!r}")
        return self

    def get(self, key: str) -> str | None:
        if key != self.stream:
            raise AssertionError(f"a SchemaView holds stream {self.stream!r}'s entry, not {key!r}'s")
        self._asked = True
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
    """``value_deserializer_for`` on an ``AsyncGrid``: a typed stream's Avro deserializer and the ``SchemaView`` it
    reads (``catch_up`` after a poll's records were refused); ``(codec, None)`` for an untyped setting."""
    typed = value_codec_setting(setting, info)
    if typed is None:
        return value_deserializer_for(cast(Grid, None), info, setting), None
    view = SchemaView(grid, info.name)
    await view.refresh()
    codec = AvroDeserializer(cast(Grid, view), info.name, typed)
    view.watch(codec)
    return codec, view
