"""The ring read and append paths' private couplings to hazelcast-python-client (compat.py's twin, apart for its
size).

``Ringbuffer.read_many`` of the public API costs a parked read three futures and their locks (the cached capacity
as an ``ImmediateFuture``, a continuation, the invocation's own), a chained callback, a ``ReadResult`` and a
serializer call per item. ``read_many_async`` below sends the same request (``ringbuffer_read_many_codec``, no
filter) on the ring's partition through the client's invocation service, so routing, retries, timeouts and errors
are the client's own, and decodes the answer once, on the reactor thread: byte-array items are sliced out of their
``Data`` in one copy, into ``bytes`` (``read_items_as_bytes`` has the public reads do the same), any other item
goes through the client's serializer as before; with ``views`` (a reader that only decodes the items and lets
them go, the Spark executor's) a byte-array item is a ``memoryview`` of its frame instead, not copied at all. The
answer is read straight off its frames (``_walk``: no ``Data`` per item, none of the codec's dozen calls per
answer) once a ring's first answer, read both ways, agreed with the codec. The request is encoded once per ring and
copied per read with its start sequence and counts patched in. The one-record round trip (``meteor bench
pubsub``'s one hop) pays it per hop.

It skips only the client-side check that ``max_count`` is at most the ring's capacity: the caller clamps the count
to the capacity it read (``LaneState.read_count``), and a member refuses a larger count anyway.

``Ringbuffer.add_all`` of the public API serializes each item through an output stream (a ``Data`` per item, after
``Ring.add_all_async`` copied it into a ``bytearray``), then copies it again into the request. ``add_all_async``
below writes each byte item once, straight into a copy of the ring's encoded request, framed as the client's
``ByteArraySerializer`` and ``ringbuffer_add_all_codec`` would frame it (not retryable, as upstream: a resent append
would store the items twice), and sends it the same way. Each ring's first append compares that framing with the
client's own encoding of a sample item and uses the public path for good where they differ (another serialization
config); anything but ``bytes`` / ``bytearray`` items, an empty or too large call take the public path too.

Every invocation's future (``hazelcast.future.Future``) makes an ``_Event`` on a ``threading.Condition``, whose
``__init__`` raises and catches three ``AttributeError`` on the plain lock it is given, and whose ``set`` runs
``notify_all`` in Python; a round trip of one record makes at least two (the append, the parked read).
``fix_future_event`` gives the client an event of the same behaviour on bare locks (``_LightEvent``).

Importing this module imports no ``hazelcast``: each function imports what it touches. Its coupling is checked
with the others (``compat.COUPLINGS``, ``tests/test_compat.py``).
"""

from __future__ import annotations

import inspect
import logging
import struct
import threading
from collections.abc import Callable
from typing import Any, Literal, TypeVar, cast

from meteor_spark.compat_frames import check_frame_reader, written_for

T = TypeVar("T")

logger = logging.getLogger(__name__)

#: hazelcast-python-client versions the read path was written for (and checked against: ``check_read_path``).
READ_WRITTEN_FOR = ((5, 7), (5, 8))

#: The request's start sequence, min count and max count, as ``ringbuffer_read_many_codec`` lays them out.
_COUNTS = struct.Struct("<qii")

#: One item's frame header (length, flags) and its ``Data`` header (partition hash 0, the byte-array type id).
_ITEM_FRAME = struct.Struct("<iH")
_ITEM_DATA = struct.Struct(">ii")
_BYTE_ARRAY_TYPE = -12
_POLICY = struct.Struct("<i")


def read_many_async(
    proxy: Any,
    start: int,
    min_count: int,
    max_count: int,
    make: Callable[[list[Any], list[int], int], T],
    *,
    views: bool = False,
) -> Any:
    """Start ``read_many(start, min_count, max_count)`` on the ring ``proxy`` (a client ``Ringbuffer``); the
    future's value is ``make(items, sequences, next_sequence)``, built on the reactor thread as the answer arrives.
    ``views``: byte-array items as memoryviews of the answer's frames (see the module's notes). Errors are the
    client's own (the caller translates them)."""
    key = "_meteor_view_path" if views else "_meteor_read_path"
    path = proxy.__dict__.get(key)
    if path is None:
        path = proxy.__dict__.setdefault(key, _ReadPath(proxy, views))
    return path.read(start, min_count, max_count, make)


class _ReadPath:
    """One ring's read request, encoded once (name, no filter) and copied per read with its three numbers
    patched in, and the decoder of its answers."""

    __slots__ = ("_answers", "_invocation", "_invoke", "_message", "_numbers_at", "_partition", "_template")

    def __init__(self, proxy: Any, views: bool = False) -> None:
        from hazelcast.invocation import Invocation
        from hazelcast.protocol.client_message import OutboundMessage
        from hazelcast.protocol.codec import ringbuffer_read_many_codec as codec

        self._template = bytes(codec.encode_request(proxy.name, 0, 0, 0, None).buf)
        self._numbers_at = codec._REQUEST_START_SEQUENCE_OFFSET
        self._answers = read_answers(proxy, views=views)
        self._invocation = Invocation
        self._message = OutboundMessage
        self._invoke = proxy._invocation_service.invoke
        self._partition = proxy._partition_id

    def read(self, start: int, min_count: int, max_count: int, make: Callable[[list[Any], list[int], int], T]) -> Any:
        buf = bytearray(self._template)
        _COUNTS.pack_into(buf, self._numbers_at, start, min_count, max_count)
        answers = self._answers

        def handler(message: Any) -> T:
            return make(*answers.read(message))

        invocation = self._invocation(
            self._message(buf, True, True), partition_id=self._partition, response_handler=handler
        )
        self._invoke(invocation)
        return invocation.future


def read_answers(proxy: Any, *, views: bool = False) -> ReadAnswers:
    """The ring ``proxy``'s reader of ``read_many`` answers, made at its first use (both clients' parked reads);
    ``views``: the one whose byte-array items are memoryviews of their frames."""
    key = "_meteor_view_answers" if views else "_meteor_read_answers"
    made = proxy.__dict__.get(key)
    if made is None:
        made = proxy.__dict__.setdefault(key, ReadAnswers(proxy, views))
    return cast(ReadAnswers, made)


class ReadAnswers:
    """Reads one ring's ``read_many`` answers: its first through the client's codec and also off the frames
    (``_walk``), which takes over for the later ones when both read the same (``frames_match``), else the codec
    keeps them. Items are decoded as ``_decoders`` does (``views``: a byte array as a memoryview of its frame)."""

    __slots__ = ("_codec", "_decode_buffer", "frames_match")

    def __init__(self, proxy: Any, views: bool = False) -> None:
        from hazelcast.protocol.codec import ringbuffer_read_many_codec as codec

        self._codec = codec
        _, from_buffer, view_of_buffer = _decoders(proxy)
        self._decode_buffer = view_of_buffer if views else from_buffer
        self.frames_match: bool | None = None  # None: no answer seen yet

    def read(self, message: Any) -> tuple[list[Any], list[int], int]:
        """An answer's items, their sequences and the next sequence."""
        if self.frames_match:
            items, sequences, next_seq = _walk(message, self._decode_buffer)
        else:
            items, sequences, next_seq = self._through_codec(message)
        if sequences is None:  # a member that does not send them: the items follow each other from the first
            first = next_seq - len(items)
            sequences = list(range(first, first + len(items)))
        return items, sequences, next_seq

    def _through_codec(self, message: Any) -> tuple[list[Any], list[int] | None, int]:
        response = self._codec.decode_response(message)
        decode = self._decode_buffer  # of each Data's buffer, as _walk decodes them (a view or a copy)
        answer = ([decode(data.buffer) for data in response["items"]], response["item_seqs"], response["next_seq"])
        if self.frames_match is None:
            try:
                self.frames_match = _walk(message, self._decode_buffer) == answer
            except Exception:  # any surprise in the frames: the codec keeps reading them
                self.frames_match = False
            if not self.frames_match:
                logger.warning("ring read answers are not laid out as expected; reading them through the codec")
        return answer


#: A read_many answer's initial frame: the next sequence after the read count (``ringbuffer_read_many_codec``).
_NEXT_SEQ = struct.Struct("<q")
_END_FLAG, _NULL_FLAG = 1 << 11, 1 << 10


def _walk(message: Any, decode: Callable[[Any], Any]) -> tuple[list[Any], list[int] | None, int]:
    """A read_many answer (items, sequences or None, next sequence) read straight off its frames: the initial frame,
    the item list (a begin frame, one frame per item's ``Data``, an end frame), the nullable sequence array, as
    ``ringbuffer_read_many_codec.decode_response`` reads them, without its ``Data`` per item and its codec calls."""
    initial = message.start_frame
    next_seq = _NEXT_SEQ.unpack_from(initial.buf, _NEXT_SEQ_AT)[0]
    frame = initial.next.next  # past the list's begin frame
    items = []
    while not frame.flags & _END_FLAG:
        items.append(decode(frame.buf))
        frame = frame.next
    frame = frame.next
    if frame.flags & _NULL_FLAG:
        return items, None, next_seq
    buf = frame.buf
    return items, list(struct.unpack_from(f"<{len(buf) // 8}q", buf)), next_seq


#: Where ``_NEXT_SEQ`` lies in the initial frame (``check_read_path`` checks it against the codec's offset).
_NEXT_SEQ_AT = 17


def add_path_of(proxy: Any, invocation: Any = None) -> _AddPath:
    """The ring ``proxy``'s append path, made at its first use (``invocation``: see ``_AddPath``)."""
    path = proxy.__dict__.get("_meteor_add_path")
    if path is None:
        path = proxy.__dict__.setdefault("_meteor_add_path", _AddPath(proxy, invocation))
    return cast(_AddPath, path)


def add_all_async(proxy: Any, items: Any, overflow_policy: int) -> Any:
    """Start ``add_all(items, overflow_policy)`` on the ring ``proxy``; the future's value is the sequence of the last
    item (-1 when the ``FAIL`` policy refused them). Errors are the client's own (the caller translates them)."""
    path = add_path_of(proxy)
    if path.takes(items):
        return path.add_all(items, overflow_policy)
    return proxy.add_all([bytearray(item) for item in items], overflow_policy)


_BYTE_TYPES = (bytes, bytearray)


class _AddPath:
    """One ring's add_all request up to its item list, encoded once, and how an item is framed in it."""

    __slots__ = (
        "_decode",
        "_end",
        "_invocation",
        "_invoke",
        "_length",
        "_message",
        "_partition",
        "_policy_at",
        "_template",
        "framing_matches",
        "max_items",
    )

    def __init__(self, proxy: Any, invocation: Any = None) -> None:
        """``invocation``: the client's ``Invocation`` class (None: the threaded client's; the asyncio client passes
        its own, whose future is an ``asyncio.Future``)."""
        from hazelcast.protocol.client_message import OutboundMessage
        from hazelcast.protocol.codec import ringbuffer_add_all_codec as codec
        from hazelcast.proxy.ringbuffer import MAX_BATCH_SIZE

        if invocation is None:
            from hazelcast.invocation import Invocation as invocation

        big = proxy._context.serialization_service._is_big_endian
        self._length = struct.Struct(">i" if big else "<i")
        encoded = bytes(codec.encode_request(proxy.name, [], 0).buf)
        self._template, self._end = encoded[: -_ITEM_FRAME.size], encoded[-_ITEM_FRAME.size :]  # the list's end
        self._policy_at = codec._REQUEST_OVERFLOW_POLICY_OFFSET
        self._decode = codec.decode_response
        self._invocation = invocation
        self._message = OutboundMessage
        self._invoke = proxy._invocation_service.invoke
        self._partition = proxy._partition_id
        self.max_items = MAX_BATCH_SIZE + 1
        sample = bytearray(b"meteor")
        expected = bytes(codec.encode_request(proxy.name, [proxy._to_data(sample)], 0).buf)
        self.framing_matches = self._encode([sample], 0) == expected

    def _encode(self, items: Any, overflow_policy: int) -> bytearray:
        buf = bytearray(self._template)
        _POLICY.pack_into(buf, self._policy_at, overflow_policy)
        frame, data, length = _ITEM_FRAME.pack, _ITEM_DATA.pack, self._length.pack
        for item in items:
            buf += frame(_ITEM_FRAME.size + 12 + len(item), 0)
            buf += data(0, _BYTE_ARRAY_TYPE)
            buf += length(len(item))
            buf += item
        buf += self._end
        return buf

    def takes(self, items: Any) -> bool:
        """Whether ``add_all`` frames these items as the client would (else the public path takes them)."""
        return self.framing_matches and 0 < len(items) < self.max_items and all(type(i) in _BYTE_TYPES for i in items)

    def add_all(self, items: Any, overflow_policy: int) -> Any:
        message = self._message(self._encode(items, overflow_policy), False, True)  # not retryable, as upstream
        invocation = self._invocation(message, partition_id=self._partition, response_handler=self._decode)
        self._invoke(invocation)
        return invocation.future


def read_items_as_bytes(proxy: Any) -> None:
    """Have the ring ``proxy``'s public reads (``Ringbuffer.read_many``, which deserializes through the proxy's
    ``_to_object``) decode byte-array items as ``read_many_async`` does: into ``bytes``, in one copy, instead of the
    client's zero-filled ``bytearray`` filled through two more copies. Set once on the proxy object the client keeps
    for the ring's name, so every reader of the ring through this client shares it."""
    _decoders(proxy)


_Decoders = tuple[Callable[[Any], Any], Callable[[Any], Any], Callable[[Any], Any]]


def _decoders(proxy: Any) -> _Decoders:
    """The ring item decoders of ``proxy``'s client, of a ``Data``, of a ``Data``'s buffer (``_walk``'s items) and
    of a buffer into a view, made once per proxy, the first installed as its ``_to_object``: a byte array (what
    meteor stores) is sliced out in one copy, into ``bytes`` (by the third: a ``memoryview`` of the buffer, no
    copy); anything else (another type, a null array, a length that does not match the buffer) goes through the
    client's own serializer."""
    made = proxy.__dict__.get("_meteor_decoders")
    if made is not None:
        return cast(_Decoders, made)
    from hazelcast.serialization.data import DATA_OFFSET, TYPE_OFFSET, Data
    from hazelcast.serialization.serialization_const import CONSTANT_TYPE_BYTE_ARRAY

    to_object = proxy._to_object
    order: Literal["big", "little"] = "big" if proxy._context.serialization_service._is_big_endian else "little"
    length_at, items_at = DATA_OFFSET, DATA_OFFSET + 4
    byte_array = CONSTANT_TYPE_BYTE_ARRAY.to_bytes(4, "big", signed=True)

    def is_byte_array(buffer: Any) -> bool:
        if buffer[TYPE_OFFSET:DATA_OFFSET] != byte_array:
            return False
        # not a null array (the serializer's None), and laid out as expected
        return int.from_bytes(buffer[length_at:items_at], order, signed=True) == len(buffer) - items_at

    def from_buffer(buffer: Any) -> Any:
        if not is_byte_array(buffer):
            return to_object(Data(buffer))
        return buffer[items_at:] if type(buffer) is bytes else bytes(memoryview(buffer)[items_at:])

    def view_of_buffer(buffer: Any) -> Any:
        if not is_byte_array(buffer):
            return to_object(Data(buffer))
        return memoryview(buffer)[items_at:]

    def decode(data: Any) -> Any:
        return from_buffer(data.buffer)

    made = proxy.__dict__.setdefault("_meteor_decoders", (decode, from_buffer, view_of_buffer))
    proxy._to_object = made[0]
    return cast(_Decoders, made)


#: hazelcast-python-client versions the future's event was written for (``check_future_event``).
EVENT_WRITTEN_FOR = ((5, 7), (5, 8))


class _LightEvent:
    """``hazelcast.future._Event`` on bare locks: ``condition`` is the mutex ``Future.add_done_callback`` holds
    while it looks at the flag (all it uses it for), and a waiter lock, made by the first ``wait`` that finds the
    flag clear and held until ``set`` releases it, blocks the waiters (each one releases it again for the next)."""

    __slots__ = ("_flag", "_waiter", "condition")

    def __init__(self) -> None:
        self.condition = threading.Lock()
        self._flag = False
        self._waiter: Any = None

    def set(self) -> None:
        with self.condition:
            self._flag = True
            waiter = self._waiter
        if waiter is not None:
            waiter.release()

    def is_set(self) -> bool:
        return self._flag

    def wait(self) -> bool:
        with self.condition:
            if self._flag:
                return True
            waiter = self._waiter
            if waiter is None:
                waiter = self._waiter = threading.Lock()
                waiter.acquire()
        waiter.acquire()  # until set() releases it
        waiter.release()  # and for the next waiter
        return True


def fix_future_event() -> bool:
    """Have the client's futures use ``_LightEvent`` (the versions it was written for only; see the module docs);
    returns whether it is applied."""
    from hazelcast import future

    if getattr(future, "_Event", None) is _LightEvent:
        return True
    if not written_for(EVENT_WRITTEN_FOR):
        return False  # another version may have reshaped Future: its own event stays
    try:
        check_future_event()
    except AssertionError as exc:
        logger.warning("hazelcast-python-client's Future changed (%s); keeping its own event", exc)
        return False
    module: Any = future
    module._Event = _LightEvent
    return True


def check_future_event() -> None:
    """``Future`` still uses its ``_Event`` only as ``_LightEvent`` provides it (``compat.COUPLINGS``)."""
    from hazelcast import future

    original: Any = vars(future)["_Event"]
    if original is not _LightEvent:  # once applied, the original is gone: its checks ran before
        assert list(inspect.signature(original.__init__).parameters) == ["self"], "_Event() takes arguments now"
        assert {"set", "is_set", "wait"} <= set(vars(original)), "_Event lost set / is_set / wait"
        assert list(inspect.signature(original.wait).parameters) == ["self"], "_Event.wait takes a timeout now"
    source = inspect.getsource(future.Future)
    assert "self._event = _Event()" in source, "Future no longer makes its event as `_Event()`"
    uses = {line.strip() for line in source.splitlines() if "_event" in line and "self._event = _Event()" not in line}
    expected = {"self._event.set()", "self._event.wait()", "return self._event.is_set()", "with self._event.condition:"}
    assert uses <= expected, f"Future uses its event in new ways: {sorted(uses - expected)}"


def _check_walk(codec: Any, decode: str) -> None:
    """``_walk`` reads the frames ``decode_response`` (source ``decode``) reads, in its order (its first answer per
    ring is also compared with the codec's at run time)."""
    from hazelcast.protocol import client_message

    assert codec._RESPONSE_NEXT_SEQ_OFFSET == _NEXT_SEQ_AT, "read_many's answer moved its next sequence"
    assert (client_message._END_DATA_STRUCTURE_FLAG, client_message._IS_NULL_FLAG) == (_END_FLAG, _NULL_FLAG), (
        "the protocol's end and null frame flags changed"
    )
    steps = [
        "initial_frame = msg.next_frame()",
        "ListMultiFrameCodec.decode(msg, DataCodec.decode)",
        "CodecUtil.decode_nullable(msg, LongArrayCodec.decode)",
    ]
    at = [decode.find(step) for step in steps]
    assert -1 not in at and at == sorted(at), "read_many's answer is no longer initial frame, item list, sequences"
    assert {"start_frame"} <= set(client_message.InboundMessage.__slots__), "InboundMessage lost start_frame"
    assert {"buf", "flags", "next"} <= set(client_message.Frame.__slots__), "Frame lost buf / flags / next"


def check_read_many_request(codec: Any) -> None:
    """``read_many``'s request still takes the parameters both clients' parked reads pass (each encodes it)."""
    assert list(inspect.signature(codec.encode_request).parameters) == [
        "name",
        "start_sequence",
        "min_count",
        "max_count",
        "filter",
    ], "ringbuffer_read_many_codec.encode_request changed its parameters"


def check_read_path() -> None:
    """The private details ``read_many_async`` and ``add_all_async`` rely on are still there (``compat.COUPLINGS``;
    the append path also compares its framing with the client's encoding at run time), and those of the frame reader
    their answers come through (``compat_frames``)."""
    from hazelcast.invocation import Invocation
    from hazelcast.protocol.codec import ringbuffer_read_many_codec as codec
    from hazelcast.proxy.base import PartitionSpecificProxy
    from hazelcast.proxy.ringbuffer import Ringbuffer
    from hazelcast.serialization import data, serialization_const, serializer
    from hazelcast.serialization.service import SerializationServiceV1

    assert "response_handler" in inspect.signature(Invocation.__init__).parameters, "Invocation() lost response_handler"
    check_read_many_request(codec)
    assert "OutboundMessage(buf, True, True)" in inspect.getsource(codec.encode_request), (
        "read_many's request is no longer a retryable message with data: the template's copy would differ"
    )
    laid_out = (codec._REQUEST_MIN_COUNT_OFFSET, codec._REQUEST_MAX_COUNT_OFFSET, codec._REQUEST_INITIAL_FRAME_SIZE)
    at = codec._REQUEST_START_SEQUENCE_OFFSET
    assert laid_out == (at + 8, at + 12, at + 16), "read_many's fixed fields moved: the request template patches them"
    assert _COUNTS.pack(1, 2, 3) == bytes(codec.encode_request("r", 1, 2, 3, None).buf[at : at + 16]), (
        "read_many's start sequence / min count / max count are no longer little-endian long, int, int"
    )
    decode = inspect.getsource(codec.decode_response)
    for key in ('"items"', '"item_seqs"', '"next_seq"'):
        assert key in decode, f"ringbuffer_read_many_codec.decode_response no longer gives {key}"
    _check_walk(codec, decode)
    proxy_source = inspect.getsource(PartitionSpecificProxy)
    assert "self._partition_id" in proxy_source and "self._invocation_service.invoke" in proxy_source, (
        "PartitionSpecificProxy no longer invokes on self._partition_id through self._invocation_service"
    )
    assert issubclass(Ringbuffer, PartitionSpecificProxy), "Ringbuffer is no longer a PartitionSpecificProxy"
    assert "self._to_object" in inspect.getsource(Ringbuffer), "Ringbuffer no longer has _to_object"
    assert 'deserialize_list_in_place(response["items"], self._to_object)' in inspect.getsource(Ringbuffer.read_many), (
        "Ringbuffer.read_many no longer deserializes its items through the proxy's `_to_object`"
    )
    assert "self._is_big_endian" in inspect.getsource(SerializationServiceV1.__init__), "no _is_big_endian"
    assert (data.TYPE_OFFSET, data.DATA_OFFSET) == (4, 8), "the Data header moved"
    assert serialization_const.CONSTANT_TYPE_BYTE_ARRAY == -12, "the byte-array type id changed"
    from hazelcast.protocol.codec import ringbuffer_add_all_codec as add_codec
    from hazelcast.proxy import ringbuffer

    add = inspect.getsource(add_codec.encode_request)
    assert "OutboundMessage(buf, False, True)" in add and "ListMultiFrameCodec.encode(buf, value_list" in add, (
        "add_all's request changed shape (its item list, or it became retryable): the append path copies it"
    )
    assert isinstance(add_codec._REQUEST_OVERFLOW_POLICY_OFFSET, int), "add_all's overflow policy offset is gone"
    assert isinstance(ringbuffer.MAX_BATCH_SIZE, int), "hazelcast.proxy.ringbuffer.MAX_BATCH_SIZE is gone"
    reader = inspect.getsource(serializer.ByteArraySerializer.read)
    assert "read_byte_array" in reader, "ByteArraySerializer no longer reads a length-prefixed byte array"

    check_frame_reader()
