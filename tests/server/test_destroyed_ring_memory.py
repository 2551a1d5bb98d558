"""A destroyed ring's items are let go of at once, whatever still refers to the ring object.

A read parked on a ring (``RequestContext.answer_when``) is a callback that re-registers itself. Written as a closure
naming itself it was a reference cycle holding the ring, which outlived the read (answered with an error when the
ring is destroyed, or dropped when its connection closes) until the cyclic garbage collector's next full collection.
A member moving large items and few objects runs one rarely: rounds of (write, read, delete the stream) kept every
round's items, +95 MB of RSS a round. The rounds below run with the collector off, so they see whatever a cycle
keeps; they are driven through the member's dispatcher with recording connections (what the TCP shell runs per
connection)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from meteor_spark.server.engine import Engine, EngineConfig, ManualClock
from meteor_spark.server.engine.fsync import Syncer
from meteor_spark.server.engine.persistence import attach
from meteor_spark.server.engine.ring_store import RingStore
from meteor_spark.server.engine.ringbuffer import SERVICE_NAME, ReadManyState, Ringbuffer, RingConfig, RingService
from meteor_spark.server.errors import DistributedObjectDestroyed
from meteor_spark.server.handlers.registry import MemberSettings, dispatch
from meteor_spark.server.protocol import message_codec
from meteor_spark.server.protocol import messages as m
from meteor_spark.server.protocol.errors import ERROR_RESPONSE
from tests.server.recording import RecordingConnection, endpoint, request

pytestmark = pytest.mark.embedded_only

ITEM = b"x" * 10_240
ITEMS_PER_ROUND = 100  # 1 MB a round
ROUNDS = 8


@pytest.fixture
def collector_off() -> Iterator[None]:
    """The cyclic collector off for the test, so that what a reference cycle keeps stays visible to it."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
        gc.collect()


def _item_bytes_held_by_ring_objects() -> int:
    """Bytes of items held by every ring object alive, reachable or not (a cycle not yet collected included)."""
    return sum(obj.item_bytes() for obj in gc.get_objects() if type(obj) is Ringbuffer)


def _round(engine: Engine, member: MemberSettings, name: str, close_reader: bool) -> RecordingConnection:
    """Write a round's items, park a read past them, then end the read: by destroying the ring (the read is
    answered with an error) or by closing the reader's connection first and destroying the ring after."""
    writer, reader = RecordingConnection(), RecordingConnection()
    reader_endpoint = endpoint(reader)
    values = [ITEM] * ITEMS_PER_ROUND
    dispatch(
        engine,
        member,
        endpoint(writer),
        request(m.RINGBUFFER_ADD_ALL, 1, name=name, value_list=values, overflow_policy=0),
    )
    read = request(
        m.RINGBUFFER_READ_MANY, 2, name=name, start_sequence=ITEMS_PER_ROUND, min_count=1, max_count=10, filter=None
    )
    dispatch(engine, member, reader_endpoint, read)
    assert reader.responses == []  # parked past the tail
    if close_reader:
        reader.closed = True
        reader_endpoint.run_close_hooks()
    engine.proxies.destroy(SERVICE_NAME, name)
    return reader


def test_rounds_of_write_park_destroy_retain_no_items(collector_off: None) -> None:
    engine = Engine(clock=ManualClock())
    member = MemberSettings(host="127.0.0.1", port=5701)
    errors = 0
    for index in range(ROUNDS):
        reader = _round(engine, member, f"lane-{index}", close_reader=index % 2 == 1)
        if not reader.closed:
            assert len(reader.responses) == 1
            (holder,) = message_codec.decode_response(ERROR_RESPONSE, reader.responses[0])["error_holders"]
            assert "DistributedObjectDestroyed" in holder.class_name
            errors += 1
    assert errors == ROUNDS // 2
    assert engine.rings.rings == {}
    # Before the ring let go of its items on destroy, every round's parked read kept 1 MB here (8 MB after 8 rounds).
    assert _item_bytes_held_by_ring_objects() == 0


def test_a_destroyed_ring_is_empty_and_still_answers_as_destroyed() -> None:
    service = RingService(ManualClock().monotonic_ms, lambda key: None)
    ring = service.get("r")
    ring.add_all([ITEM] * 5)
    assert service.destroy("r")
    assert ring.item_bytes() == 0 and ring.size() == 0
    assert ring.tail_sequence() == 4 and ring.head_sequence() == 5  # sequences are not reused meanwhile
    with pytest.raises(DistributedObjectDestroyed):
        RingService.check_not_destroyed(ring)
    fresh = service.get("r")  # the next use creates it again, empty
    assert fresh is not ring and fresh.size() == 0 and fresh.tail_sequence() == -1


def test_a_destroyed_persistent_ring_drops_its_log_index(tmp_path: Path) -> None:
    syncer = Syncer("never", 100)
    service = RingService(ManualClock().monotonic_ms, lambda key: None, store_factory=_store_in(tmp_path, syncer))
    ring = service.get("r")
    ring.add_all([ITEM] * 50)
    store = ring.store
    assert isinstance(store, RingStore) and store.load(49) == ITEM
    assert service.destroy("r")
    assert len(store._offsets) == 0  # the index of a log that no longer exists
    assert not (tmp_path / "r.log").exists()
    syncer.close()


def _store_in(directory: Path, syncer: Syncer) -> Any:
    def factory(name: str, config: RingConfig) -> RingStore:
        return RingStore(directory / f"{name}.log", syncer)

    return factory


def test_a_persistent_member_keeps_no_log_of_destroyed_rings(tmp_path: Path) -> None:
    engine = Engine(EngineConfig(data_dir=str(tmp_path), fsync="never"), clock=ManualClock())
    persistence = attach(engine)
    try:
        kept = engine.rings.get("kept")
        kept.add(ITEM)
        for index in range(ROUNDS):
            engine.rings.get(f"lane-{index}").add_all([ITEM] * 3)
            engine.proxies.destroy(SERVICE_NAME, f"lane-{index}")
        # Only the live ring's log is open; before, every destroyed ring's store stayed (one entry per stream ever
        # created and deleted, each with its index).
        assert persistence.open_ring_logs() == ["kept"]
        assert [path.name for path in (tmp_path / "rings").iterdir() if path.suffix == ".log"] == ["kept.log"]
    finally:
        persistence.close()


def test_an_ended_parked_read_leaves_no_cycle(collector_off: None) -> None:
    engine = Engine(clock=ManualClock())
    member = MemberSettings(host="127.0.0.1", port=5701)
    for index in range(ROUNDS):
        _round(engine, member, f"lane-{index}", close_reader=index % 2 == 1)
    assert [obj for obj in gc.get_objects() if type(obj) in (Ringbuffer, ReadManyState)] == []
