"""Robustness: random and mutated frames never crash or hang the member, and other clients keep working.

Part 1 pushes >= 100,000 frames through the frame reader and the dispatcher of an in-process engine (what the TCP
shell runs for every connection): only ProtocolError (which closes that one connection) may escape; every handler
failure must already have become an error response. Part 2 sends mutated traffic over real sockets to a member
process while a well-behaved client keeps using it.
"""

from __future__ import annotations

import asyncio
import random
import socket
import struct
import time
from typing import Any

import pytest

from meteor_spark.server.engine import Engine, ManualClock
from meteor_spark.server.errors import ProtocolError
from meteor_spark.server.handlers import supported_messages
from meteor_spark.server.handlers.registry import Endpoint, MemberSettings, dispatch
from meteor_spark.server.protocol import codecs as c
from meteor_spark.server.protocol import message_codec, structs
from meteor_spark.server.protocol.frames import PREAMBLE, FrameReader, iter_frames
from meteor_spark.server.protocol.struct_type import StructType

pytestmark = pytest.mark.embedded_only

SPECS = [entry.spec for entry in supported_messages()]


def sample(rng: random.Random, type_: Any) -> Any:
    """A random but well-typed value (small numbers, so that valid-looking requests stay cheap)."""
    if isinstance(type_, c.FixedType):
        return {
            "byte": rng.randrange(-3, 4),
            "boolean": rng.random() < 0.5,
            "int": rng.choice([-1, 0, 1, 2, 5, 999, 1000, rng.randrange(-(2**31), 2**31)]),
            "long": rng.choice([-1, 0, 1, 3, 10, 1 << 40, rng.randrange(-(2**63), 2**63)]),
            "UUID": None if rng.random() < 0.1 else c.uuid_module.UUID(int=rng.getrandbits(128)),
            "float": rng.random(),
            "double": rng.random(),
        }[type_.name]
    if type_ is c.STRING:
        return rng.choice(
            ["r", "m", "meteor.stream::x.0", "", "dev", "hz:impl:ringbufferService", "hz:impl:mapService"]
        )
    if type_ in (c.DATA, c.BYTE_ARRAY):
        return bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 24)))
    if isinstance(type_, c._FixedList):
        return [sample(rng, type_.item) for _ in range(rng.randrange(0, 3))]
    if type_ is c.ENTRY_LIST_UUID_LIST_INTEGER:
        return [(sample(rng, c.UUID) or c.uuid_module.uuid4(), [1, 2])]
    if type_ is c.ENTRY_LIST_UUID_LONG:
        return [(c.uuid_module.uuid4(), 1)]
    if isinstance(type_, c._Nullable):
        return None if rng.random() < 0.3 else sample(rng, type_.inner)
    if isinstance(type_, c._ListMultiFrame):
        return [sample(rng, type_.item) for _ in range(rng.randrange(0, 3))]
    if isinstance(type_, c._EntryList):
        pairs = [(sample(rng, type_.key), sample(rng, type_.value)) for _ in range(rng.randrange(0, 3))]
        if type_.as_dict:
            try:
                return dict(pairs)
            except TypeError:
                return {}
        return pairs
    if type_ is structs.FIELD_DESCRIPTOR:
        return structs.FieldDescriptor("f", 8)
    if isinstance(type_, StructType):
        return type_.cls(**{param.name: sample(rng, param.type) for param in type_.params})
    raise AssertionError(type_)


def valid_request(rng: random.Random, correlation_id: int) -> bytes:
    spec = rng.choice(SPECS)
    values = {param.name: sample(rng, param.type) for param in spec.request}
    if "timeout" in values:  # keep lock/try waits short: a fuzzed 2**62 ms wait would only be cancelled at close
        values["timeout"] = rng.choice([0, 1, -1])
    return b"".join(
        bytes(x)
        for x in message_codec.encode_request(spec, correlation_id, values, partition_id=rng.randrange(-1, 271))
    )


def mutate(rng: random.Random, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randrange(1, 4)):
        kind = rng.randrange(6)
        if kind == 0 and buf:  # flip random bytes
            for _ in range(rng.randrange(1, 5)):
                buf[rng.randrange(len(buf))] = rng.getrandbits(8)
        elif kind == 1 and len(buf) > 6:  # truncate
            del buf[rng.randrange(6, len(buf)) :]
        elif kind == 2 and len(buf) >= 6:  # change the first frame's flags
            struct.pack_into("<H", buf, 4, rng.getrandbits(16))
        elif kind == 3 and len(buf) >= 10:  # another message type
            struct.pack_into("<i", buf, 6, rng.choice([s.request_type for s in SPECS] + [rng.getrandbits(31)]))
        elif kind == 4:  # insert garbage
            pos = rng.randrange(len(buf) + 1)
            buf[pos:pos] = bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 16)))
        elif kind == 5 and len(buf) >= 4:  # a frame length that lies (small enough not to wait for megabytes)
            struct.pack_into("<i", buf, 0, rng.randrange(-10, 200))
    return bytes(buf)


class FakeConnection:
    def __init__(self) -> None:
        self.closed = False
        self.congested = False
        self.sent = 0
        self.tasks: list[asyncio.Task[Any]] = []

    def send(self, chunks: list[Any]) -> None:
        self.sent += sum(len(x) for x in chunks)

    def close(self, reason: str) -> None:
        self.closed = True

    def track(self, task: asyncio.Task[Any]) -> None:
        self.tasks.append(task)

    async def writable(self) -> None:
        return None


@pytest.mark.timeout(120)
def test_100k_random_and_mutated_frames_through_decoder_and_dispatcher() -> None:
    rng = random.Random(20240601)
    engine = Engine(clock=ManualClock())
    member = MemberSettings(host="127.0.0.1", port=5701)

    async def run() -> tuple[int, int, int]:
        frames = protocol_errors = responses = 0
        connection = FakeConnection()
        endpoint = Endpoint(connection, "fuzz")
        endpoint.authenticated = True
        reader = FrameReader(expect_preamble=False)
        deadline = time.monotonic() + 90
        while frames < 100_000:
            assert time.monotonic() < deadline, "fuzzing is too slow: something hangs"
            choice = rng.random()
            if choice < 0.1:
                data = bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 64)))
                frames += 1
            else:
                valid = valid_request(rng, frames)
                frames += sum(1 for _ in iter_frames(valid))
                data = valid if choice < 0.2 else mutate(rng, valid)
            try:
                for message in reader.feed(data):
                    dispatch(engine, member, endpoint, message)
                stuck = reader.buffered > 0 and rng.random() < 0.5
            except ProtocolError:
                protocol_errors += 1
                stuck = True
            if stuck:
                # The shell closes a connection on a protocol error (and a client that sent half a frame may
                # disconnect): start a fresh one, cancelling what the old one left waiting.
                for task in connection.tasks:
                    task.cancel()
                responses += connection.sent > 0
                connection = FakeConnection()
                endpoint = Endpoint(connection, "fuzz")
                endpoint.authenticated = True
                reader = FrameReader(expect_preamble=False)
            if frames % 64 == 0:
                await asyncio.sleep(0)  # let parked handlers and timers run
        for task in connection.tasks:
            task.cancel()
        await asyncio.sleep(0)
        return frames, protocol_errors, responses

    frames, protocol_errors, responded = asyncio.run(run())
    print(f"{frames} frames, {protocol_errors} protocol errors, {responded} closed connections had answers")
    assert frames >= 100_000
    assert protocol_errors > 1000, "mutations should often be malformed"


@pytest.mark.timeout(120)
def test_garbage_over_tcp_does_not_disturb_a_well_behaved_client() -> None:
    from meteor_spark.grid.client import Grid, GridSettings
    from meteor_spark.server import EmbeddedGrid

    rng = random.Random(99)
    with EmbeddedGrid(process=True) as member:
        host, port = member.address.rsplit(":", 1)
        with Grid(GridSettings(members=(member.address,))) as grid:
            ring = grid.ring("fuzz-good")
            sent = 0
            for round_ in range(100):
                with socket.create_connection((host, int(port)), timeout=5) as sock:
                    if rng.random() < 0.8:
                        sock.sendall(PREAMBLE)
                    payload = b"".join(
                        mutate(rng, valid_request(rng, i)) if rng.random() < 0.9 else valid_request(rng, i)
                        for i in range(rng.randrange(1, 60))
                    )
                    try:
                        sock.sendall(payload)
                        sock.shutdown(socket.SHUT_WR)
                        sock.settimeout(2)
                        while sock.recv(65536):
                            pass
                    except OSError:
                        pass  # the member closed a connection that sent garbage: expected
                    sent += len(payload)
                assert ring.add(f"good-{round_}".encode()) == round_
            assert member.running
            assert ring.size() == 100
            assert sent > 50_000
