"""The protocol's type codecs, declared once as data: how each parameter type travels in frames.

Fixed-size types (``INT``, ``LONG``, ``UUID``...) are packed into a message's initial frame; variable-size types
(``STRING``, ``DATA``, ``list_of(...)``, ``StructType``...) are one or more frames. ``Param`` names a typed parameter
of a message or struct; ``FixedBlock`` packs a run of fixed-size ones with one precompiled ``struct``. The structs
themselves are declared in ``structs``, the message layer (``MessageSpec``, encode / decode) in ``message_codec``.

The codecs are written here from the protocol documentation; the member never imports ``hazelcast`` so that the
official client's codecs stay an independent check in the tests.

Python values: ``String`` -> ``str``; ``Data`` and ``byte[]`` -> ``bytes`` (raw serialized form, never
deserialized); ``UUID`` -> ``uuid.UUID``; lists -> ``list``; entry lists -> ``list[tuple[K, V]]``; maps ->
``dict``; custom structs -> frozen dataclasses (``structs``), or the engine's own value for the structs that are
engine values too (``RaftGroupId``, ``SimpleEntryView``: one class each, so handlers pass them through); nullable ->
``None``.
"""

from __future__ import annotations

import operator
import struct
import uuid as uuid_module
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from meteor_spark.server.errors import ProtocolError
from meteor_spark.server.protocol.frames import (
    BEGIN_DATA_STRUCTURE,
    END_DATA_STRUCTURE,
    HEADER_SIZE,
    IS_NULL,
    Frame,
    read_data_list,
)

OutFrame = tuple[int, bytes | bytearray | memoryview]
ChunkWriter = Callable[[list[bytes | bytearray | memoryview], Any, int], None]
SpanReader = Callable[[bytes, int, int], tuple[Any, int] | None]
_FRAME_HEADER = struct.Struct("<iH")  # a frame's length (header included) and flags

_EMPTY = b""
_BEGIN: OutFrame = (BEGIN_DATA_STRUCTURE, _EMPTY)
_END: OutFrame = (END_DATA_STRUCTURE, _EMPTY)
_NULL: OutFrame = (IS_NULL, _EMPTY)
_CONTENT: Callable[[Frame], Any] = operator.attrgetter("content")


# --------------------------------------------------------------------------------------------------------------------
# Frame cursor


class FrameCursor:
    """Walks the frames of a message after its initial frame."""

    __slots__ = ("frames", "index")

    def __init__(self, frames: Sequence[Frame], index: int = 1) -> None:
        self.frames = frames
        self.index = index

    def next(self) -> Frame:
        try:
            frame = self.frames[self.index]
        except IndexError:
            raise ProtocolError(f"message ended after {len(self.frames)} frames; a parameter is missing") from None
        self.index += 1
        return frame

    def peek(self) -> Frame | None:
        return self.frames[self.index] if self.index < len(self.frames) else None

    def skip_to_end_frame(self) -> None:
        """Skip to and past the END frame of the current structure (skipping nested structures): forward
        compatibility, since newer peers may append fields to a struct."""
        depth = 1
        while depth:
            frame = self.next()
            if frame.flags & END_DATA_STRUCTURE:
                depth -= 1
            elif frame.flags & BEGIN_DATA_STRUCTURE:
                depth += 1


# --------------------------------------------------------------------------------------------------------------------
# Fixed-size types


@dataclass(frozen=True)
class FixedType:
    """A fixed-size type: packed into the initial frame (or a struct's fixed frame) at a known offset."""

    name: str
    fmt: str  # struct format characters, little-endian, no padding
    size: int

    def to_wire(self, value: Any) -> tuple[Any, ...]:
        if self.name == "UUID":
            if value is None:
                return (True, 0, 0)
            number = value.int
            return (False, number >> 64, number & 0xFFFFFFFFFFFFFFFF)
        return (value,)

    def from_wire(self, values: Sequence[Any], index: int) -> tuple[Any, int]:
        if self.name == "UUID":
            if values[index]:
                return None, index + 3
            return uuid_module.UUID(int=(values[index + 1] << 64) | values[index + 2]), index + 3
        return values[index], index + 1

    def __str__(self) -> str:
        return self.name


BYTE = FixedType("byte", "b", 1)
BOOLEAN = FixedType("boolean", "?", 1)
INT = FixedType("int", "i", 4)
LONG = FixedType("long", "q", 8)
UUID = FixedType("UUID", "?QQ", 17)
FLOAT = FixedType("float", "f", 4)
DOUBLE = FixedType("double", "d", 8)


# --------------------------------------------------------------------------------------------------------------------
# Variable-size types


class VarType:
    """A variable-size type: one or more frames after the initial frame."""

    name: str = "?"

    def encode(self, out: list[OutFrame], value: Any) -> None:
        raise NotImplementedError

    def decode(self, cursor: FrameCursor) -> Any:
        raise NotImplementedError

    def frame_reader(self) -> Callable[[Frame], Any] | None:
        """The value of one frame, for a type that is always exactly one frame (``String``, ``Data``, nullable ones);
        None for the others. The message layer compiles a message's decoder from these, so a request of such
        parameters is read without a cursor or a call per parameter type."""
        return None

    def frame_writer(self) -> Callable[[Any], tuple[int, bytes | bytearray | memoryview]] | None:
        """(flags, content) of the one frame a value travels in, for the same types; None for the others."""
        return None

    def content_reader(self) -> Callable[[int, bytes], Any] | None:
        """The value of one frame from its flags and content, for the same types as ``frame_reader``: a request
        that arrived whole in one read is decoded straight from the received bytes, without ``Frame`` objects."""
        return None

    def span_reader(self) -> SpanReader | None:
        """For a value of several frames, a reader of it straight from received bytes (``frames.read_data_list``'s
        signature); None when the type has only the general path."""
        return None

    def chunk_writer(self) -> ChunkWriter | None:
        """Appends a value's frames as wire chunks (frame headers packed, contents as they are), the last frame's
        flags or-ed with the third argument (``IS_FINAL`` for a message's last parameter); None for the types
        that only have the general path. The message layer compiles responses of such parameters from these."""
        frame_writer = self.frame_writer()
        if frame_writer is None:
            return None
        pack = _FRAME_HEADER.pack

        def write(chunks: list[bytes | bytearray | memoryview], value: Any, last_flags: int) -> None:
            flags, content = frame_writer(value)
            chunks.append(pack(len(content) + HEADER_SIZE, flags | last_flags))
            if content:
                chunks.append(content)

        return write

    def __str__(self) -> str:
        return self.name


def _utf8(frame: Frame) -> str:
    try:
        return str(frame.content, "utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"String parameter is not valid UTF-8 ({exc})") from None


def _utf8_content(flags: int, content: bytes) -> str:
    try:
        return str(content, "utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"String parameter is not valid UTF-8 ({exc})") from None


def bytes_content(flags: int, content: bytes) -> bytes:
    """A ``Data`` frame's value: its content (the compiled decoders recognise it and skip the call)."""
    return content


def _utf8_frame(value: str) -> tuple[int, bytes]:
    return 0, value.encode("utf-8")


def _bytes_frame(value: bytes | bytearray | memoryview) -> tuple[int, bytes | bytearray | memoryview]:
    return 0, value


class _String(VarType):
    name = "String"

    def encode(self, out: list[OutFrame], value: str) -> None:
        out.append((0, value.encode("utf-8")))

    def decode(self, cursor: FrameCursor) -> str:
        content = cursor.next().content
        try:
            return bytes(content).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProtocolError(f"String parameter is not valid UTF-8 ({exc})") from None

    def frame_reader(self) -> Callable[[Frame], Any] | None:
        return _utf8

    def content_reader(self) -> Callable[[int, bytes], Any] | None:
        return _utf8_content

    def frame_writer(self) -> Callable[[Any], tuple[int, bytes | bytearray | memoryview]] | None:
        return _utf8_frame


class _Bytes(VarType):
    """``Data`` (a serialized object, kept as raw bytes) and ``byte[]`` share one frame layout."""

    def __init__(self, name: str) -> None:
        self.name = name

    def encode(self, out: list[OutFrame], value: bytes) -> None:
        out.append((0, value))

    def decode(self, cursor: FrameCursor) -> bytes:
        return cursor.next().content

    def frame_reader(self) -> Callable[[Frame], Any] | None:
        return _CONTENT

    def content_reader(self) -> Callable[[int, bytes], Any] | None:
        return bytes_content

    def frame_writer(self) -> Callable[[Any], tuple[int, bytes | bytearray | memoryview]] | None:
        return _bytes_frame


class _FixedList(VarType):
    """A list of fixed-size items packed in one frame (``LongArray``, ``List_Long``, ``List_UUID``...)."""

    def __init__(self, name: str, item: FixedType) -> None:
        self.name = name
        self.item = item
        self._struct = struct.Struct("<" + item.fmt)

    def frame_writer(self) -> Callable[[Any], tuple[int, bytes | bytearray | memoryview]] | None:
        def write(value: Sequence[Any]) -> tuple[int, bytes | bytearray | memoryview]:
            out: list[OutFrame] = []
            self.encode(out, value)
            return out[0]

        return write

    def encode(self, out: list[OutFrame], value: Sequence[Any]) -> None:
        if self.item.name in ("long", "int") and value:
            out.append((0, struct.pack(f"<{len(value)}{self.item.fmt}", *value)))
            return
        parts = bytearray()
        for item in value:
            parts += self._struct.pack(*self.item.to_wire(item))
        out.append((0, bytes(parts)))

    def decode(self, cursor: FrameCursor) -> list[Any]:
        content = cursor.next().content
        size = self.item.size
        if len(content) % size:
            raise ProtocolError(f"{self.name} frame of {len(content)} bytes is not a multiple of {size}")
        count = len(content) // size
        if self.item.name in ("long", "int"):
            return list(struct.unpack_from(f"<{count}{self.item.fmt}", content, 0))
        result = []
        for index in range(count):
            raw = self._struct.unpack_from(content, index * size)
            result.append(self.item.from_wire(raw, 0)[0])
        return result


class _Nullable(VarType):
    def __init__(self, inner: VarType) -> None:
        self.inner = inner
        self.name = f"Nullable<{inner.name}>"

    def encode(self, out: list[OutFrame], value: Any) -> None:
        if value is None:
            out.append(_NULL)
        else:
            self.inner.encode(out, value)

    def decode(self, cursor: FrameCursor) -> Any:
        frame = cursor.peek()
        if frame is not None and frame.flags & IS_NULL:
            cursor.index += 1
            return None
        return self.inner.decode(cursor)

    def frame_reader(self) -> Callable[[Frame], Any] | None:
        inner = self.inner.frame_reader()
        if inner is None:
            return None

        def read(frame: Frame) -> Any:
            return None if frame.flags & IS_NULL else inner(frame)

        return read

    def content_reader(self) -> Callable[[int, bytes], Any] | None:
        inner = self.inner.content_reader()
        if inner is None:
            return None

        def read(flags: int, content: bytes) -> Any:
            return None if flags & IS_NULL else inner(flags, content)

        return read

    def frame_writer(self) -> Callable[[Any], tuple[int, bytes | bytearray | memoryview]] | None:
        inner = self.inner.frame_writer()
        if inner is None:
            return None
        if inner is _bytes_frame:  # nullable Data, the most common response: one call instead of two

            def write_bytes(value: Any) -> tuple[int, bytes | bytearray | memoryview]:
                return _NULL if value is None else (0, value)

            return write_bytes

        def write(value: Any) -> tuple[int, bytes | bytearray | memoryview]:
            return _NULL if value is None else inner(value)

        return write


class _ListMultiFrame(VarType):
    def __init__(self, item: VarType) -> None:
        self.item = item
        self.name = f"List<{item.name}>"

    def encode(self, out: list[OutFrame], value: Sequence[Any]) -> None:
        out.append(_BEGIN)
        item = self.item
        if isinstance(item, _Bytes):
            out.extend([(0, element) for element in value])
        else:
            for element in value:
                item.encode(out, element)
        out.append(_END)

    def span_reader(self) -> SpanReader | None:
        return read_data_list if isinstance(self.item, _Bytes) else None

    def chunk_writer(self) -> ChunkWriter | None:
        if not isinstance(self.item, _Bytes):
            return None
        pack = _FRAME_HEADER.pack
        begin = pack(HEADER_SIZE, BEGIN_DATA_STRUCTURE)

        def write(chunks: list[bytes | bytearray | memoryview], value: Sequence[Any], last_flags: int) -> None:
            chunks.append(begin)
            for element in value:  # a ring's items, in read_many answers: one header and the item itself each
                chunks.append(pack(len(element) + HEADER_SIZE, 0))
                if element:
                    chunks.append(element)
            chunks.append(pack(HEADER_SIZE, END_DATA_STRUCTURE | last_flags))

        return write

    def decode(self, cursor: FrameCursor) -> list[Any]:
        _expect_begin(cursor, self.name)
        result: list[Any] = []
        frames = cursor.frames
        if isinstance(self.item, _Bytes):
            start = cursor.index
            index = start
            count = len(frames)
            while index < count and not frames[index].flags & END_DATA_STRUCTURE:
                index += 1
            if index >= count:
                raise ProtocolError(f"{self.name} has no END frame")
            cursor.index = index + 1
            return [frame.content for frame in frames[start:index]]
        while True:
            frame = cursor.peek()
            if frame is None:
                raise ProtocolError(f"{self.name} has no END frame")
            if frame.flags & END_DATA_STRUCTURE:
                cursor.index += 1
                return result
            result.append(self.item.decode(cursor))


class _EntryList(VarType):
    """``EntryList<K,V>`` (list of pairs) or ``Map<K,V>`` (dict): BEGIN, k, v, k, v, ..., END."""

    def __init__(self, key: VarType, value: VarType, as_dict: bool) -> None:
        self.key = key
        self.value = value
        self.as_dict = as_dict
        self.name = f"{'Map' if as_dict else 'EntryList'}<{key.name},{value.name}>"

    def encode(self, out: list[OutFrame], value: Any) -> None:
        out.append(_BEGIN)
        pairs = value.items() if isinstance(value, Mapping) else value
        for key, item in pairs:
            self.key.encode(out, key)
            self.value.encode(out, item)
        out.append(_END)

    def decode(self, cursor: FrameCursor) -> Any:
        _expect_begin(cursor, self.name)
        pairs: list[tuple[Any, Any]] = []
        while True:
            frame = cursor.peek()
            if frame is None:
                raise ProtocolError(f"{self.name} has no END frame")
            if frame.flags & END_DATA_STRUCTURE:
                cursor.index += 1
                return dict(pairs) if self.as_dict else pairs
            key = self.key.decode(cursor)
            pairs.append((key, self.value.decode(cursor)))


class _EntryListUUIDListInteger(VarType):
    """Partition table: BEGIN, one ``List_Integer`` frame per member, END, then one ``List_UUID`` frame of keys."""

    name = "EntryList<UUID,List<Integer>>"

    def encode(self, out: list[OutFrame], value: Sequence[tuple[uuid_module.UUID, Sequence[int]]]) -> None:
        out.append(_BEGIN)
        for _, partitions in value:
            LIST_INTEGER.encode(out, partitions)
        out.append(_END)
        LIST_UUID.encode(out, [key for key, _ in value])

    def decode(self, cursor: FrameCursor) -> list[tuple[uuid_module.UUID, list[int]]]:
        values = list_of(LIST_INTEGER).decode(cursor)
        keys = LIST_UUID.decode(cursor)
        if len(keys) != len(values):
            raise ProtocolError(f"{self.name}: {len(keys)} keys for {len(values)} values")
        return list(zip(keys, values, strict=True))


class _EntryListUUIDLong(VarType):
    """One frame of (UUID, long) pairs."""

    name = "EntryList<UUID,Long>"
    _pair = struct.Struct("<?QQq")

    def encode(self, out: list[OutFrame], value: Sequence[tuple[uuid_module.UUID, int]]) -> None:
        parts = bytearray()
        for key, number in value:
            parts += self._pair.pack(*UUID.to_wire(key), number)
        out.append((0, bytes(parts)))

    def decode(self, cursor: FrameCursor) -> list[tuple[uuid_module.UUID | None, int]]:
        content = cursor.next().content
        size = self._pair.size
        if len(content) % size:
            raise ProtocolError(f"{self.name} frame of {len(content)} bytes is not a multiple of {size}")
        result = []
        for index in range(len(content) // size):
            raw = self._pair.unpack_from(content, index * size)
            result.append((UUID.from_wire(raw, 0)[0], raw[3]))
        return result


def _expect_begin(cursor: FrameCursor, what: str) -> None:
    frame = cursor.next()
    if not frame.flags & BEGIN_DATA_STRUCTURE:
        raise ProtocolError(f"{what} must start with a BEGIN frame; got flags 0x{frame.flags:04x}")


STRING: VarType = _String()
DATA: VarType = _Bytes("Data")
BYTE_ARRAY: VarType = _Bytes("byte[]")
LONG_ARRAY: VarType = _FixedList("LongArray", LONG)
LIST_LONG: VarType = _FixedList("List<Long>", LONG)
LIST_INTEGER: VarType = _FixedList("List<Integer>", INT)
LIST_UUID: VarType = _FixedList("List<UUID>", UUID)
SET_UUID: VarType = _FixedList("Set<UUID>", UUID)
ENTRY_LIST_UUID_LIST_INTEGER: VarType = _EntryListUUIDListInteger()
ENTRY_LIST_UUID_LONG: VarType = _EntryListUUIDLong()


def nullable(inner: VarType) -> VarType:
    return _Nullable(inner)


def list_of(item: VarType) -> VarType:
    return _ListMultiFrame(item)


def entry_list(key: VarType, value: VarType) -> VarType:
    return _EntryList(key, value, as_dict=False)


def map_of(key: VarType, value: VarType) -> VarType:
    return _EntryList(key, value, as_dict=True)


# --------------------------------------------------------------------------------------------------------------------
# Parameters and custom structs


@dataclass(frozen=True, eq=False)
class Param:
    """One parameter: its name (as the response/request dict key), type, and whether older peers may omit it.

    ``optional`` marks parameters added in later protocol versions: a decoder gives ``default`` when the peer did
    not send them (a shorter initial frame, or no more frames), as Hazelcast's own decoders do.
    """

    name: str
    type: FixedType | VarType
    optional: bool = False
    default: Any = None

    @property
    def is_fixed(self) -> bool:
        return isinstance(self.type, FixedType)


def p(name: str, type_: FixedType | VarType, *, optional: bool = False, default: Any = None) -> Param:
    return Param(name, type_, optional, default)


class FixedBlock:
    """The fixed-size parameters of a message or struct, packed with one precompiled ``struct``."""

    def __init__(self, params: Sequence[Param]) -> None:
        self.params = tuple(params)
        self.struct = struct.Struct("<" + "".join(param.type.fmt for param in self.params))  # type: ignore[union-attr]
        self.size = self.struct.size
        self.plain = all(param.type.name != "UUID" for param in self.params)

    def unpack(self, content: bytes, offset: int, into: dict[str, Any]) -> None:
        if len(content) - offset >= self.size:
            raw = self.struct.unpack_from(content, offset)
            if self.plain:
                for param, value in zip(self.params, raw, strict=True):
                    into[param.name] = value
                return
            index = 0
            for param in self.params:
                into[param.name], index = param.type.from_wire(raw, index)  # type: ignore[union-attr]
            return
        # A shorter frame: an older peer that does not know the trailing (optional) fields.
        for param in self.params:
            fixed = param.type
            assert isinstance(fixed, FixedType)
            if len(content) - offset < fixed.size:
                if not param.optional:
                    raise ProtocolError(
                        f"initial frame ends before fixed parameter {param.name!r} ({fixed.name}) at offset {offset}"
                    )
                into[param.name] = param.default
                continue
            raw = struct.unpack_from("<" + fixed.fmt, content, offset)
            into[param.name] = fixed.from_wire(raw, 0)[0]
            offset += fixed.size

    def pack_into(self, buffer: bytearray, offset: int, values: Mapping[str, Any]) -> None:
        if self.plain:
            self.struct.pack_into(buffer, offset, *[values[param.name] for param in self.params])
            return
        flat: list[Any] = []
        for param in self.params:
            flat.extend(param.type.to_wire(values[param.name]))  # type: ignore[union-attr]
        self.struct.pack_into(buffer, offset, *flat)
