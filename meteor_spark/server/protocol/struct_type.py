"""The machinery of the protocol's custom structs (``Address``, ``MemberInfo``, ``ErrorHolder``...): a
``StructType`` derives a struct's wire layout (BEGIN, a frame of fixed fields, the var fields, END) from its field
list; ``structs`` holds the table of the structs themselves."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from meteor_spark.server.errors import ProtocolError
from meteor_spark.server.protocol.codecs import (
    _BEGIN,
    _END,
    FixedBlock,
    FrameCursor,
    OutFrame,
    Param,
    VarType,
    _expect_begin,
)
from meteor_spark.server.protocol.frames import END_DATA_STRUCTURE


class StructType(VarType):
    """A custom struct (``Address``, ``MemberInfo``, ``ErrorHolder``...): BEGIN, [a frame with the fixed fields],
    the var fields, END. Decoded into ``cls``; encoded from any object with attributes (or a mapping) named like the
    fields."""

    def __init__(self, name: str, cls: type, params: Sequence[Param]) -> None:
        self.name = name
        self.cls = cls
        self.params = tuple(params)
        self.fixed = FixedBlock([param for param in self.params if param.is_fixed])
        self.var = tuple(param for param in self.params if not param.is_fixed)

    def encode(self, out: list[OutFrame], value: Any) -> None:
        values = _values_of(value, self.params)
        out.append(_BEGIN)
        if self.fixed.params:
            buffer = bytearray(self.fixed.size)
            self.fixed.pack_into(buffer, 0, values)
            out.append((0, buffer))
        for param in self.var:
            param.type.encode(out, values[param.name])  # type: ignore[union-attr]
        out.append(_END)

    def decode(self, cursor: FrameCursor) -> Any:
        _expect_begin(cursor, self.name)
        values: dict[str, Any] = {}
        if self.fixed.params:
            self.fixed.unpack(cursor.next().content, 0, values)
        for param in self.var:
            frame = cursor.peek()
            if frame is None or frame.flags & END_DATA_STRUCTURE:
                if not param.optional:
                    raise ProtocolError(f"{self.name} ends before its field {param.name!r}")
                values[param.name] = param.default
                continue
            values[param.name] = param.type.decode(cursor)  # type: ignore[union-attr]
        cursor.skip_to_end_frame()
        return self.cls(**values)


def _values_of(value: Any, params: Sequence[Param]) -> Mapping[str, Any]:
    if isinstance(value, Mapping):
        return value
    return {param.name: getattr(value, param.name) for param in params}
