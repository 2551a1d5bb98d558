"""Codecs declared once as data: a ``MessageSpec`` per message, from which both directions are derived.

A spec lists a message's request parameters, response parameters and events in the order of the protocol
definitions (``hazelcast-client-protocol/protocol-definitions/*.yaml``). On the wire all fixed-size parameters come
first, packed into the initial frame in declaration order, then every variable-size parameter as one or more frames
in declaration order; ``MessageSpec`` derives that layout, and ``decode_request`` / ``encode_response`` /
``encode_event`` / ``encode_request`` / ``decode_response`` are generic over it.

The type codecs (``STRING``, ``DATA``, ``list_of(...)``, custom structs such as ``ADDRESS``...) are written here from
the protocol documentation; the member never imports ``hazelcast`` so that the official client's codecs stay an
independent check in the tests.

Python values: ``String`` -> ``str``; ``Data`` and ``byte[]`` -> ``bytes`` (raw serialized form, never
deserialized); ``UUID`` -> ``uuid.UUID``; lists -> ``list``; entry lists -> ``list[tuple[K, V]]``; maps ->
``dict``; custom structs -> the frozen dataclasses below, or the engine's own value for the structs that are
engine values too (``RaftGroupId``, ``SimpleEntryView``: one class each, so handlers pass them through); nullable ->
``None``.
"""

from __future__ import annotations

import struct
import uuid as uuid_module
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from meteor_spark.server.engine.atomics import RaftGroupId
from meteor_spark.server.engine.map_types import SimpleEntryView
from meteor_spark.server.errors import ProtocolError
from meteor_spark.server.protocol.frames import (
    BEGIN_DATA_STRUCTURE,
    END_DATA_STRUCTURE,
    IS_EVENT,
    IS_FINAL,
    IS_NULL,
    REQUEST_FIXED_OFFSET,
    RESPONSE_FIXED_OFFSET,
    UNFRAGMENTED,
    Frame,
    Message,
    encode_frames,
)

OutFrame = tuple[int, bytes | bytearray | memoryview]

_EMPTY = b""
_BEGIN: OutFrame = (BEGIN_DATA_STRUCTURE, _EMPTY)
_END: OutFrame = (END_DATA_STRUCTURE, _EMPTY)
_NULL: OutFrame = (IS_NULL, _EMPTY)


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

    def __str__(self) -> str:
        return self.name


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


class _Bytes(VarType):
    """``Data`` (a serialized object, kept as raw bytes) and ``byte[]`` share one frame layout."""

    def __init__(self, name: str) -> None:
        self.name = name

    def encode(self, out: list[OutFrame], value: bytes) -> None:
        out.append((0, value))

    def decode(self, cursor: FrameCursor) -> bytes:
        return cursor.next().content


class _FixedList(VarType):
    """A list of fixed-size items packed in one frame (``LongArray``, ``List_Long``, ``List_UUID``...)."""

    def __init__(self, name: str, item: FixedType) -> None:
        self.name = name
        self.item = item
        self._struct = struct.Struct("<" + item.fmt)

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


class _FixedBlock:
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


class StructType(VarType):
    """A custom struct (``Address``, ``MemberInfo``, ``ErrorHolder``...): BEGIN, [a frame with the fixed fields],
    the var fields, END. Decoded into ``cls``; encoded from any object with attributes (or a mapping) named like the
    fields."""

    def __init__(self, name: str, cls: type, params: Sequence[Param]) -> None:
        self.name = name
        self.cls = cls
        self.params = tuple(params)
        self.fixed = _FixedBlock([param for param in self.params if param.is_fixed])
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


@dataclass(frozen=True)
class Address:
    host: str
    port: int


@dataclass(frozen=True)
class MemberVersion:
    major: int
    minor: int
    patch: int


@dataclass(frozen=True)
class EndpointQualifier:
    type: int  # 0 MEMBER, 1 CLIENT, 2 WAN, 3 REST, 4 MEMCACHE
    identifier: str | None


@dataclass(frozen=True)
class MemberInfo:
    address: Address
    uuid: uuid_module.UUID
    attributes: dict[str, str]
    lite_member: bool
    version: MemberVersion
    address_map: dict[EndpointQualifier, Address] = field(default_factory=dict)


@dataclass(frozen=True)
class DistributedObjectInfo:
    service_name: str
    name: str


@dataclass(frozen=True)
class StackTraceElement:
    class_name: str
    method_name: str
    file_name: str | None
    line_number: int


@dataclass(frozen=True)
class ErrorHolder:
    error_code: int
    class_name: str
    message: str | None
    stack_trace_elements: list[StackTraceElement] = field(default_factory=list)


@dataclass(frozen=True)
class FieldDescriptor:
    field_name: str
    kind: int


@dataclass(frozen=True)
class Schema:
    type_name: str
    fields: list[FieldDescriptor]


@dataclass(frozen=True)
class RingbufferStoreConfigHolder:
    class_name: str | None
    factory_class_name: str | None
    implementation: bytes | None
    factory_implementation: bytes | None
    properties: dict[str, str] | None
    enabled: bool


ADDRESS = StructType("Address", Address, [p("port", INT), p("host", STRING)])
MEMBER_VERSION = StructType("MemberVersion", MemberVersion, [p("major", BYTE), p("minor", BYTE), p("patch", BYTE)])
ENDPOINT_QUALIFIER = StructType(
    "EndpointQualifier", EndpointQualifier, [p("type", INT), p("identifier", nullable(STRING))]
)
MEMBER_INFO = StructType(
    "MemberInfo",
    MemberInfo,
    [
        p("address", ADDRESS),
        p("uuid", UUID),
        p("attributes", map_of(STRING, STRING)),
        p("lite_member", BOOLEAN),
        p("version", MEMBER_VERSION),
        p("address_map", map_of(ENDPOINT_QUALIFIER, ADDRESS), optional=True, default={}),
    ],
)
DISTRIBUTED_OBJECT_INFO = StructType(
    "DistributedObjectInfo", DistributedObjectInfo, [p("service_name", STRING), p("name", STRING)]
)
STACK_TRACE_ELEMENT = StructType(
    "StackTraceElement",
    StackTraceElement,
    [p("class_name", STRING), p("method_name", STRING), p("file_name", nullable(STRING)), p("line_number", INT)],
)
ERROR_HOLDER = StructType(
    "ErrorHolder",
    ErrorHolder,
    [
        p("error_code", INT),
        p("class_name", STRING),
        p("message", nullable(STRING)),
        p("stack_trace_elements", list_of(STACK_TRACE_ELEMENT)),
    ],
)
RAFT_GROUP_ID = StructType("RaftGroupId", RaftGroupId, [p("name", STRING), p("seed", LONG), p("id", LONG)])
SIMPLE_ENTRY_VIEW = StructType(
    "SimpleEntryView",
    SimpleEntryView,
    [
        p("key", DATA),
        p("value", DATA),
        p("cost", LONG),
        p("creation_time", LONG),
        p("expiration_time", LONG),
        p("hits", LONG),
        p("last_access_time", LONG),
        p("last_stored_time", LONG),
        p("last_update_time", LONG),
        p("version", LONG),
        p("ttl", LONG),
        p("max_idle", LONG),
    ],
)
FIELD_DESCRIPTOR = StructType("FieldDescriptor", FieldDescriptor, [p("field_name", STRING), p("kind", INT)])
SCHEMA = StructType("Schema", Schema, [p("type_name", STRING), p("fields", list_of(FIELD_DESCRIPTOR))])
RINGBUFFER_STORE_CONFIG_HOLDER = StructType(
    "RingbufferStoreConfigHolder",
    RingbufferStoreConfigHolder,
    [
        p("class_name", nullable(STRING)),
        p("factory_class_name", nullable(STRING)),
        p("implementation", nullable(DATA)),
        p("factory_implementation", nullable(DATA)),
        p("properties", nullable(map_of(STRING, STRING))),
        p("enabled", BOOLEAN),
    ],
)


# --------------------------------------------------------------------------------------------------------------------
# Messages


@dataclass(frozen=True, eq=False)
class EventSpec:
    """A server -> client event of a listener registration message."""

    name: str
    type_id: int
    params: tuple[Param, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "_fixed", _FixedBlock([param for param in self.params if param.is_fixed]))
        object.__setattr__(self, "_var", tuple(param for param in self.params if not param.is_fixed))


@dataclass(frozen=True, eq=False)
class MessageSpec:
    """One request/response message type, as in the protocol definitions.

    ``request`` and ``response`` list parameters in declaration order; the wire order (fixed first, then var) is
    derived. ``request_type`` is ``0xSSMM00``; the response is ``request_type + 1``; events are listed in ``events``.
    """

    name: str
    request_type: int
    request: tuple[Param, ...] = ()
    response: tuple[Param, ...] = ()
    events: tuple[EventSpec, ...] = ()
    doc: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "_req_fixed", _FixedBlock([x for x in self.request if x.is_fixed]))
        object.__setattr__(self, "_req_var", tuple(x for x in self.request if not x.is_fixed))
        object.__setattr__(self, "_resp_fixed", _FixedBlock([x for x in self.response if x.is_fixed]))
        object.__setattr__(self, "_resp_var", tuple(x for x in self.response if not x.is_fixed))

    @property
    def response_type(self) -> int:
        return self.request_type + 1

    def event(self, name: str) -> EventSpec:
        for event in self.events:
            if event.name == name:
                return event
        raise KeyError(f"{self.name} has no event {name!r}; it has {[e.name for e in self.events]}")


def message(
    name: str,
    request_type: int,
    request: Sequence[Param] = (),
    response: Sequence[Param] = (),
    events: Sequence[EventSpec] = (),
    doc: str = "",
) -> MessageSpec:
    return MessageSpec(name, request_type, tuple(request), tuple(response), tuple(events), doc)


def event(name: str, type_id: int, params: Sequence[Param]) -> EventSpec:
    return EventSpec(name, type_id, tuple(params))


def _decode_var(cursor: FrameCursor, params: Sequence[Param], into: dict[str, Any]) -> None:
    count = len(cursor.frames)
    for param in params:
        if cursor.index >= count:
            if not param.optional:
                raise ProtocolError(f"message ends before parameter {param.name!r} ({param.type})")
            into[param.name] = param.default
            continue
        into[param.name] = param.type.decode(cursor)  # type: ignore[union-attr]


#: An initial frame's frame header (length, flags) followed by the message header of each message kind.
_RESPONSE_INITIAL = struct.Struct("<iHiqB")  # type, correlation id, backup acks
_EVENT_INITIAL = struct.Struct("<iHiqi")  # type, correlation id, partition id (requests have the same layout)


def _encode(
    initial_header: struct.Struct,
    header: tuple[int, int, int],
    fixed: _FixedBlock,
    var: Sequence[Param],
    values: Mapping[str, Any],
    flags: int,
) -> list[bytes | bytearray | memoryview]:
    """Byte chunks of a message: the initial frame (frame header, message header and fixed parameters packed into one
    buffer), then the frames of the variable-size parameters."""
    size = initial_header.size + fixed.size
    initial = bytearray(size)
    initial_header.pack_into(initial, 0, size, flags if var else flags | IS_FINAL, *header)
    if fixed.params:
        try:
            fixed.pack_into(initial, initial_header.size, values)
        except KeyError as exc:
            raise ValueError(f"missing fixed parameter {exc.args[0]!r}") from None
    if not var:
        return [initial]
    out: list[OutFrame] = []
    for param in var:
        try:
            value = values[param.name]
        except KeyError:
            raise ValueError(f"missing parameter {param.name!r}") from None
        param.type.encode(out, value)  # type: ignore[union-attr]
    chunks: list[bytes | bytearray | memoryview] = [initial]
    chunks += encode_frames(out)
    return chunks


def _merge(values: Mapping[str, Any] | None, kw: dict[str, Any]) -> Mapping[str, Any]:
    if not kw:
        return values if values is not None else {}
    return {**values, **kw} if values else kw


def decode_request(spec: MessageSpec, msg: Message) -> dict[str, Any]:
    """The request parameters of ``msg`` by name.

    Raises:
        ProtocolError: the message does not match the spec (too short, missing frames, bad structure).
    """
    values: dict[str, Any] = {}
    frames = msg.frames
    spec._req_fixed.unpack(frames[0].content, REQUEST_FIXED_OFFSET, values)  # type: ignore[attr-defined]
    if spec._req_var:  # type: ignore[attr-defined]
        _decode_var(FrameCursor(frames), spec._req_var, values)  # type: ignore[attr-defined]
    return values


def encode_response(
    spec: MessageSpec, correlation_id: int, values: Mapping[str, Any] | None = None, **kw: Any
) -> list[bytes | bytearray | memoryview]:
    """Byte chunks of the response to ``correlation_id`` (backup acks always 0: one member has no backups).

    Values the spec does not declare are ignored (one handler may serve messages whose responses differ).
    """
    header = (spec.response_type, correlation_id, 0)
    return _encode(
        _RESPONSE_INITIAL,
        header,
        spec._resp_fixed,  # type: ignore[attr-defined]
        spec._resp_var,  # type: ignore[attr-defined]
        _merge(values, kw),
        UNFRAGMENTED,
    )


def encode_event(
    spec: EventSpec, correlation_id: int, values: Mapping[str, Any] | None = None, partition_id: int = -1, **kw: Any
) -> list[bytes | bytearray | memoryview]:
    """Byte chunks of an event for the listener registered by request ``correlation_id``."""
    header = (spec.type_id, correlation_id, partition_id)
    return _encode(
        _EVENT_INITIAL,
        header,
        spec._fixed,  # type: ignore[attr-defined]
        spec._var,  # type: ignore[attr-defined]
        _merge(values, kw),
        UNFRAGMENTED | IS_EVENT,
    )


def encode_request(
    spec: MessageSpec, correlation_id: int, values: Mapping[str, Any] | None = None, partition_id: int = -1, **kw: Any
) -> list[bytes | bytearray | memoryview]:
    """Byte chunks of a request (client side; used by tests, tools and the bench)."""
    header = (spec.request_type, correlation_id, partition_id)
    return _encode(
        _EVENT_INITIAL,
        header,
        spec._req_fixed,  # type: ignore[attr-defined]
        spec._req_var,  # type: ignore[attr-defined]
        _merge(values, kw),
        UNFRAGMENTED,
    )


def decode_response(spec: MessageSpec, msg: Message) -> dict[str, Any]:
    """The response parameters of ``msg`` by name (client side; tests, tools, bench)."""
    values: dict[str, Any] = {}
    spec._resp_fixed.unpack(msg.frames[0].content, RESPONSE_FIXED_OFFSET, values)  # type: ignore[attr-defined]
    if spec._resp_var:  # type: ignore[attr-defined]
        _decode_var(FrameCursor(msg.frames), spec._resp_var, values)  # type: ignore[attr-defined]
    return values
