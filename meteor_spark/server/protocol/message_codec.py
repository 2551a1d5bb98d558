"""Messages declared once as data: a ``MessageSpec`` per message, from which both directions are derived.

A spec lists a message's request parameters, response parameters and events in the order of the protocol
definitions (``hazelcast-client-protocol/protocol-definitions/*.yaml``). On the wire all fixed-size parameters come
first, packed into the initial frame in declaration order, then every variable-size parameter as one or more frames
in declaration order; ``MessageSpec`` derives that layout, and ``decode_request`` / ``encode_response`` /
``encode_event`` / ``encode_request`` / ``decode_response`` are generic over it. The types of the parameters are in
``codecs``; the message tables in ``messages`` / ``messages_data``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from meteor_spark.server.errors import ProtocolError
from meteor_spark.server.protocol.codecs import FixedBlock, FrameCursor, OutFrame, Param, bytes_content
from meteor_spark.server.protocol.frames import (
    HEADER_SIZE,
    IS_EVENT,
    IS_FINAL,
    REQUEST_FIXED_OFFSET,
    RESPONSE_FIXED_OFFSET,
    UNFRAGMENTED,
    Frame,
    Message,
    encode_frames,
)


@dataclass(frozen=True, eq=False)
class EventSpec:
    """A server -> client event of a listener registration message."""

    name: str
    type_id: int
    params: tuple[Param, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "_fixed", FixedBlock([param for param in self.params if param.is_fixed]))
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
        object.__setattr__(self, "_req_fixed", FixedBlock([x for x in self.request if x.is_fixed]))
        object.__setattr__(self, "_req_var", tuple(x for x in self.request if not x.is_fixed))
        object.__setattr__(self, "_resp_fixed", FixedBlock([x for x in self.response if x.is_fixed]))
        object.__setattr__(self, "_resp_var", tuple(x for x in self.response if not x.is_fixed))
        request_reader = _frames_reader(self._req_fixed, self._req_var, REQUEST_FIXED_OFFSET)  # type: ignore[attr-defined]
        response_writer = _frames_writer(_RESPONSE_INITIAL, self._resp_fixed, self._resp_var, UNFRAGMENTED)  # type: ignore[attr-defined]
        object.__setattr__(self, "_read_request", request_reader)
        object.__setattr__(self, "_read_bytes", _bytes_reader(self._req_fixed, self._req_var, REQUEST_FIXED_OFFSET))  # type: ignore[attr-defined]
        object.__setattr__(self, "_write_response", response_writer)

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


FramesReader = Callable[[list[Frame]], dict[str, Any] | None]
BytesReader = Callable[[bytes, int], tuple[dict[str, Any], int] | None]
ChunksWriter = Callable[[tuple[int, int, int], Mapping[str, Any]], list[bytes | bytearray | memoryview]]


def _frames_reader(fixed: FixedBlock, var: Sequence[Param], offset: int) -> FramesReader | None:
    """A decoder compiled from a message's parameters when each variable one is a single frame (``String``,
    ``Data``, nullable ones: most requests), else None.

    It reads the fixed parameters with one ``struct`` call and each variable one straight from its frame: no cursor,
    no call per parameter type. It returns None, and the caller takes the general path, for a message that is
    shorter than the declaration (an older peer omitting optional parameters), so the result is always the same.
    """
    readers = [param.type.frame_reader() for param in var]  # type: ignore[union-attr]
    if not fixed.plain or any(reader is None for reader in readers) or any(param.optional for param in var):
        return None
    fixed_names = tuple(param.name for param in fixed.params)
    unpack_from = fixed.struct.unpack_from
    least = offset + fixed.size
    plan = tuple(zip(range(1, len(var) + 1), (param.name for param in var), readers, strict=True))
    count = len(var) + 1

    def read(frames: list[Frame]) -> dict[str, Any] | None:
        content = frames[0].content
        if len(content) < least or len(frames) < count:
            return None
        values = dict(zip(fixed_names, unpack_from(content, offset), strict=True))
        for index, name, reader in plan:
            values[name] = reader(frames[index])  # type: ignore[misc]
        return values

    return read


def _bytes_reader(fixed: FixedBlock, var: Sequence[Param], offset: int) -> BytesReader | None:
    """A decoder compiled for the same messages as ``_frames_reader`` and those with a ``List<Data>`` parameter
    (``Ringbuffer.addAll``), reading the request that starts at ``start`` of the bytes it arrived in straight from
    them, with no ``Frame`` or ``Message`` objects between: its values and the offset after it (more requests of a
    client that sends several at once may follow).

    It walks the frame headers itself and returns None, so that the caller cuts the bytes into frames and takes the
    general path, for anything but one whole unfragmented message of the declared shape: bytes missing, a frame
    shorter than its header, a final flag before the last parameter or none on it, more or fewer frames than
    declared, a list not laid out as clients send it. The general path then decides (and reports malformed input)
    as before.
    """
    readers = [param.type.content_reader() for param in var]  # type: ignore[union-attr]
    spans = [param.type.span_reader() for param in var]  # type: ignore[union-attr]
    readable = all(reader is not None or span is not None for reader, span in zip(readers, spans, strict=True))
    if not fixed.plain or not readable or any(param.optional for param in var):
        return None
    fixed_names = tuple(param.name for param in fixed.params)
    unpack_from = fixed.struct.unpack_from
    frame_header = _FRAME_HEADER.unpack_from
    least = HEADER_SIZE + offset + fixed.size
    fixed_at = HEADER_SIZE + offset
    first_flags = UNFRAGMENTED | (0 if var else IS_FINAL)
    finals = [0] * (len(var) - 1) + [IS_FINAL] if var else []
    # A Data parameter is its frame's content as it is: no call at all (None in the plan).
    calls = [None if reader is bytes_content else reader for reader in readers]
    plan = tuple(zip((param.name for param in var), calls, finals, spans, strict=True))
    header = HEADER_SIZE

    def read(data: bytes, start: int) -> tuple[dict[str, Any], int] | None:
        end = len(data)
        if end - start < least:
            return None
        length, flags = frame_header(data, start)
        if length < least or length > end - start or flags & _WHOLE_FLAGS != first_flags:
            return None
        # The struct yields exactly one value per fixed parameter: zip needs no strictness check.
        values = dict(zip(fixed_names, unpack_from(data, start + fixed_at), strict=False))
        pos = start + length
        for name, reader, final, span in plan:
            if span is not None:  # a value of several frames
                spanned = span(data, pos, final)
                if spanned is None:
                    return None
                values[name], pos = spanned
                continue
            if end - pos < header:
                return None
            length, flags = frame_header(data, pos)
            after = pos + length
            if length < header or after > end or flags & IS_FINAL != final:
                return None
            content = data[pos + header : after]
            values[name] = content if reader is None else reader(flags, content)
            pos = after
        return values, pos

    return read


def _frames_writer(
    initial_header: struct.Struct, fixed: FixedBlock, var: Sequence[Param], flags: int
) -> ChunksWriter | None:
    """An encoder compiled from a message's parameters when they are fixed ones and at most one single-frame
    variable one (a ``Data`` or nullable ``Data`` response: most responses), else None.

    Frame header, message header, fixed parameters and the variable parameter's frame header are packed by one
    ``struct`` call into one chunk, followed by the value's bytes themselves (never copied).
    """
    if not fixed.plain:
        return None
    if len(var) > 1:
        return _chunks_writer(initial_header, fixed, var, flags)
    names = tuple(param.name for param in fixed.params)
    initial_size = initial_header.size + fixed.size
    if not var:
        whole = struct.Struct(initial_header.format + fixed.struct.format[1:])

        def write_fixed(
            header: tuple[int, int, int], values: Mapping[str, Any]
        ) -> list[bytes | bytearray | memoryview]:
            try:
                return [whole.pack(initial_size, flags | IS_FINAL, *header, *[values[name] for name in names])]
            except KeyError as exc:
                raise ValueError(f"missing fixed parameter {exc.args[0]!r}") from None

        return write_fixed
    frame_writer = var[0].type.frame_writer()  # type: ignore[union-attr]
    if frame_writer is None:
        return _chunks_writer(initial_header, fixed, var, flags)
    var_name = var[0].name
    head = struct.Struct(initial_header.format + fixed.struct.format[1:] + "iH")
    if not names:  # one variable parameter alone (``Map.get``, ``Map.put``): no list of fixed values to build
        pack = head.pack

        def write_one(header: tuple[int, int, int], values: Mapping[str, Any]) -> list[bytes | bytearray | memoryview]:
            try:
                frame_flags, content = frame_writer(values[var_name])
            except KeyError as exc:
                raise ValueError(f"missing parameter {exc.args[0]!r}") from None
            first = pack(initial_size, flags, *header, len(content) + HEADER_SIZE, frame_flags | IS_FINAL)
            return [first, content] if content else [first]

        return write_one

    def write(header: tuple[int, int, int], values: Mapping[str, Any]) -> list[bytes | bytearray | memoryview]:
        try:
            frame_flags, content = frame_writer(values[var_name])
            fixed_values = [values[name] for name in names]
        except KeyError as exc:
            raise ValueError(f"missing parameter {exc.args[0]!r}") from None
        first = head.pack(
            initial_size, flags, *header, *fixed_values, len(content) + HEADER_SIZE, frame_flags | IS_FINAL
        )
        return [first, content] if content else [first]

    return write


def _chunks_writer(
    initial_header: struct.Struct, fixed: FixedBlock, var: Sequence[Param], flags: int
) -> ChunksWriter | None:
    """An encoder compiled from a message's parameters when each variable one can write its own chunks (single
    frames, lists of ``Data``: a ``read_many`` answer), else None: the initial frame packed by one ``struct`` call,
    then each parameter's frame headers and contents appended straight to the chunks (no list of frames between)."""
    writers = [param.type.chunk_writer() for param in var]  # type: ignore[union-attr]
    if not var or any(writer is None for writer in writers):
        return None
    names = tuple(param.name for param in fixed.params)
    initial_size = initial_header.size + fixed.size
    initial = struct.Struct(initial_header.format + fixed.struct.format[1:])
    plan = tuple(zip((param.name for param in var), writers, [0] * (len(var) - 1) + [IS_FINAL], strict=True))

    def write(header: tuple[int, int, int], values: Mapping[str, Any]) -> list[bytes | bytearray | memoryview]:
        try:
            chunks: list[bytes | bytearray | memoryview] = [
                initial.pack(initial_size, flags, *header, *[values[name] for name in names])
            ]
            for name, writer, last_flags in plan:
                writer(chunks, values[name], last_flags)  # type: ignore[misc]
        except KeyError as exc:
            raise ValueError(f"missing parameter {exc.args[0]!r}") from None
        return chunks

    return write


def _decode_var(cursor: FrameCursor, params: Sequence[Param], into: dict[str, Any]) -> None:
    count = len(cursor.frames)
    for param in params:
        if cursor.index >= count:
            if not param.optional:
                raise ProtocolError(f"message ends before parameter {param.name!r} ({param.type})")
            into[param.name] = param.default
            continue
        into[param.name] = param.type.decode(cursor)  # type: ignore[union-attr]


_FRAME_HEADER = struct.Struct("<iH")
#: The flags of a request's initial frame that ``_bytes_reader`` checks: unfragmented, and final when it is the only
#: frame.
_WHOLE_FLAGS = UNFRAGMENTED | IS_FINAL

#: An initial frame's frame header (length, flags) followed by the message header of each message kind.
_RESPONSE_INITIAL = struct.Struct("<iHiqB")  # type, correlation id, backup acks
_EVENT_INITIAL = struct.Struct("<iHiqi")  # type, correlation id, partition id (requests have the same layout)


def _encode(
    initial_header: struct.Struct,
    header: tuple[int, int, int],
    fixed: FixedBlock,
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
    frames = msg.frames
    read = spec._read_request  # type: ignore[attr-defined]
    if read is not None:
        fast = read(frames)
        if fast is not None:
            return fast
    return decode_request_generic(spec, frames)


def decode_request_generic(spec: MessageSpec, frames: list[Frame]) -> dict[str, Any]:
    """``decode_request`` without the compiled decoder: every message's general path (and the tests' reference)."""
    values: dict[str, Any] = {}
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
    header = (spec.request_type + 1, correlation_id, 0)
    write = spec._write_response  # type: ignore[attr-defined]
    if write is not None:
        return write(header, values if values is not None and not kw else _merge(values, kw))
    return encode_response_generic(spec, correlation_id, _merge(values, kw))


def encode_response_generic(
    spec: MessageSpec, correlation_id: int, values: Mapping[str, Any]
) -> list[bytes | bytearray | memoryview]:
    """``encode_response`` without the compiled encoder: every message's general path (and the tests' reference)."""
    header = (spec.response_type, correlation_id, 0)
    return _encode(
        _RESPONSE_INITIAL,
        header,
        spec._resp_fixed,  # type: ignore[attr-defined]
        spec._resp_var,  # type: ignore[attr-defined]
        values,
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
