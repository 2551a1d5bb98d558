"""A write answers the long polls it satisfies at once, inside the write (right after its own response): not on
the event loop's next turn.

Driven through the member's dispatcher with recording connections (what the TCP shell runs per connection), so
"at once" is exact: the parked read's response is sent before ``dispatch`` of the write returns.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from meteor_spark.server.engine import Engine, ManualClock
from meteor_spark.server.handlers.registry import MemberSettings, dispatch
from meteor_spark.server.protocol import message_codec
from meteor_spark.server.protocol import messages as m
from meteor_spark.server.protocol.errors import ERROR_RESPONSE
from tests.server.recording import RecordingConnection, endpoint, request

pytestmark = pytest.mark.embedded_only


def _park_a_read_then_write(reader: RecordingConnection) -> tuple[RecordingConnection, Engine]:
    engine = Engine(clock=ManualClock())
    member = MemberSettings(host="127.0.0.1", port=5701)
    writer = RecordingConnection()
    read = request(m.RINGBUFFER_READ_MANY, 1, name="r", start_sequence=0, min_count=1, max_count=10, filter=None)
    dispatch(engine, member, endpoint(reader), read)
    assert reader.responses == []  # parked: nothing to read yet
    add = request(m.RINGBUFFER_ADD_ALL, 2, name="r", value_list=[b"item-0", b"item-1"], overflow_policy=0)
    dispatch(engine, member, endpoint(writer), add)
    return writer, engine


def test_a_write_answers_a_parked_read_before_its_own_dispatch_returns() -> None:
    async def run() -> None:
        reader = RecordingConnection()
        writer, _ = _park_a_read_then_write(reader)
        assert len(reader.responses) == 1  # answered inside the write, no event-loop turn in between
        answer = message_codec.decode_response(m.RINGBUFFER_READ_MANY, reader.responses[0])
        assert [bytes(item) for item in answer["items"]] == [b"item-0", b"item-1"] and answer["next_seq"] == 2
        assert message_codec.decode_response(m.RINGBUFFER_ADD_ALL, writer.responses[0])["response"] == 1
        for _ in range(5):
            await asyncio.sleep(0)  # the parked task resumes and ends ...
        assert all(task.done() for task in reader.tasks)
        assert len(reader.responses) == 1  # ... without answering a second time

    asyncio.run(run())


class LoggedConnection(RecordingConnection):
    """Records, in ``log`` shared with other connections, the name of each connection as it sends."""

    def __init__(self, name: str, log: list[str]) -> None:
        super().__init__()
        self.name, self.log = name, log

    def send(self, chunks: list[Any]) -> None:
        self.log.append(self.name)
        super().send(chunks)


def test_a_write_is_answered_before_the_parked_reads_it_wakes() -> None:
    """As Hazelcast, which runs the operations a write unparks after the write's response is sent: the writer
    learns first that its write is done (its next one finds nothing outstanding), then the readers are answered,
    still inside the write's dispatch."""

    async def run() -> None:
        engine = Engine(clock=ManualClock())
        member = MemberSettings(host="127.0.0.1", port=5701)
        log: list[str] = []
        readers = [LoggedConnection(f"reader-{n}", log) for n in range(2)]
        writer = LoggedConnection("writer", log)
        for n, reader in enumerate(readers):
            read = request(
                m.RINGBUFFER_READ_MANY, n, name="r", start_sequence=0, min_count=1, max_count=10, filter=None
            )
            dispatch(engine, member, endpoint(reader), read)
        add = request(m.RINGBUFFER_ADD_ALL, 9, name="r", value_list=[b"item-0"], overflow_policy=0)
        dispatch(engine, member, endpoint(writer), add)
        assert log == ["writer", "reader-0", "reader-1"]
        assert engine.waiters._callbacks == {}

    asyncio.run(run())


def test_a_congested_reader_is_answered_by_its_task_once_it_reads_again() -> None:
    async def run() -> None:
        reader = RecordingConnection(congested=True)
        _park_a_read_then_write(reader)
        assert reader.responses == []  # not piled up in the member while the client does not read
        for _ in range(5):
            await asyncio.sleep(0)
        assert len(reader.responses) == 1
        answer = message_codec.decode_response(m.RINGBUFFER_READ_MANY, reader.responses[0])
        assert [bytes(item) for item in answer["items"]] == [b"item-0", b"item-1"]

    asyncio.run(run())


def test_a_parked_read_stays_parked_until_enough_items_then_its_registration_is_gone() -> None:
    async def run() -> None:
        engine = Engine(clock=ManualClock())
        member = MemberSettings(host="127.0.0.1", port=5701)
        reader, writer = RecordingConnection(), RecordingConnection()
        read = request(m.RINGBUFFER_READ_MANY, 1, name="r", start_sequence=0, min_count=3, max_count=10, filter=None)
        dispatch(engine, member, endpoint(reader), read)
        for count, item in enumerate((b"a", b"b", b"c"), start=1):
            dispatch(
                engine,
                member,
                endpoint(writer),
                request(m.RINGBUFFER_ADD, count + 1, name="r", value=item, overflow_policy=0),
            )
            assert len(reader.responses) == (1 if count == 3 else 0)
        answer = message_codec.decode_response(m.RINGBUFFER_READ_MANY, reader.responses[0])
        assert [bytes(item) for item in answer["items"]] == [b"a", b"b", b"c"]
        assert engine.waiters._callbacks == {}  # nothing left registered once answered
        assert reader.tasks == []  # no task, no coroutine: a callback answered it

    asyncio.run(run())


def test_a_closed_connection_takes_its_parked_read_with_it() -> None:
    async def run() -> None:
        engine = Engine(clock=ManualClock())
        reader = RecordingConnection()
        reading = endpoint(reader)
        read = request(m.RINGBUFFER_READ_MANY, 1, name="r", start_sequence=0, min_count=1, max_count=10, filter=None)
        dispatch(engine, MemberSettings(host="127.0.0.1", port=5701), reading, read)
        assert engine.waiters._callbacks != {}
        reader.closed = True
        reading.run_close_hooks()
        assert engine.waiters._callbacks == {}

    asyncio.run(run())


def test_a_ring_destroyed_under_a_parked_read_answers_it_with_the_error() -> None:
    async def run() -> None:
        engine = Engine(clock=ManualClock())
        reader = RecordingConnection()
        read = request(m.RINGBUFFER_READ_MANY, 1, name="r", start_sequence=0, min_count=1, max_count=10, filter=None)
        dispatch(engine, MemberSettings(host="127.0.0.1", port=5701), endpoint(reader), read)
        engine.rings.destroy("r")
        assert len(reader.responses) == 1
        (holder,) = message_codec.decode_response(ERROR_RESPONSE, reader.responses[0])["error_holders"]
        assert "DistributedObjectDestroyed" in holder.class_name

    asyncio.run(run())
