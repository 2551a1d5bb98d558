"""Persistence: rings and maps survive restarts; torn tails are cut; history below a ring's head comes from disk.

The first tests drive the engine directly (no sockets); the last ones SIGKILL a member process under load from the
official client and check that every acknowledged write survived.
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hazelcast
import pytest

from meteor_spark.grid.client import GridSettings
from meteor_spark.server.engine import Engine, EngineConfig, ManualClock
from meteor_spark.server.engine.fsync import Syncer
from meteor_spark.server.engine.map_types import LockOwner
from meteor_spark.server.engine.ringbuffer import WOULD_BLOCK, ReadManyState, RingConfig
from meteor_spark.server.errors import InvalidConfiguration, StaleSequence
from meteor_spark.server.member import EmbeddedGrid
from meteor_spark.testing import wait_until

OWNER = LockOwner(None, 1)


def _open(data_dir: Path, fsync: str = "always", clock: ManualClock | None = None, capacity: int = 4) -> Engine:
    engine = Engine(
        EngineConfig(data_dir=str(data_dir), fsync=fsync),
        clock=clock,
        ring_configs=(RingConfig("r*", capacity=capacity),),
    )
    asyncio.run(engine.open())
    return engine


def _close(engine: Engine) -> None:
    asyncio.run(engine.close())


async def _committed(engine: Engine) -> None:
    assert engine.persistence is not None
    await engine.persistence.commit()


def test_rings_and_maps_survive_a_restart(tmp_path: Path) -> None:
    engine = _open(tmp_path)
    ring = engine.rings.get("r1")
    for i in range(10):
        ring.add(f"item-{i}".encode())
    engine.maps.put("m", b"k1", b"v1", OWNER)
    engine.maps.put("m", b"k2", b"v2", OWNER)
    engine.maps.put("m", b"k1", b"v1b", OWNER)
    engine.maps.remove("m", b"k2", OWNER)
    engine.maps.put("gone", b"k", b"v", OWNER)
    engine.maps.destroy("gone")
    asyncio.run(_committed(engine))
    _close(engine)

    engine = _open(tmp_path)
    ring = engine.rings.get("r1")
    assert (ring.head_sequence(), ring.tail_sequence()) == (6, 9)
    assert ring.read_one(9) == b"item-9"
    assert ring.add(b"item-10") == 10
    assert engine.maps.entry_set("m") == [(b"k1", b"v1b")]
    assert engine.maps.size("gone") == 0
    _close(engine)


def test_reads_below_head_come_from_disk(tmp_path: Path) -> None:
    engine = _open(tmp_path, capacity=3)
    ring = engine.rings.get("r-history")
    ring.add_all([f"i{i}".encode() for i in range(10)])
    assert ring.head_sequence() == 7
    assert ring.read_one(0) == b"i0"
    state = ReadManyState(2, 1, 5)
    assert ring.read_many(state)
    assert (state.items, state.sequences) == ([b"i2", b"i3", b"i4", b"i5", b"i6"], [2, 3, 4, 5, 6])
    _close(engine)
    engine = _open(tmp_path, capacity=3)
    ring = engine.rings.get("r-history")
    assert ring.read_one(1) == b"i1"
    assert ring.read_one(10) is WOULD_BLOCK
    _close(engine)


def test_torn_tail_is_truncated_never_served(tmp_path: Path) -> None:
    engine = _open(tmp_path)
    engine.rings.get("r-torn").add_all([b"a", b"b", b"c"])
    engine.maps.put("m", b"k", b"v", OWNER)
    _close(engine)
    ring_log = next((tmp_path / "rings").glob("r-torn*"))
    intact = ring_log.stat().st_size
    with open(ring_log, "ab") as f:
        f.write(b"\x40\x00\x00\x00\x12\x34")  # a header promising 64 bytes, then the crash
    map_log = tmp_path / "maps.log"
    map_intact = map_log.stat().st_size
    with open(map_log, "ab") as f:
        f.write(b"\x05\x00")

    engine = _open(tmp_path)
    ring = engine.rings.get("r-torn")
    assert ring.tail_sequence() == 2
    assert ring_log.stat().st_size == intact
    assert ring.add(b"d") == 3
    assert ring.read_one(3) == b"d"
    assert engine.maps.get("m", b"k") == b"v"
    assert map_log.stat().st_size <= map_intact
    _close(engine)


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def test_damaged_last_record_is_quarantined_and_its_sequence_never_reused(tmp_path: Path) -> None:
    engine = _open(tmp_path)
    engine.rings.get("r-crc").add_all([b"first", b"second"])
    _close(engine)
    ring_log = next((tmp_path / "rings").glob("r-crc*.log"))
    damaged = ring_log.read_bytes()[-(8 + 8 + len(b"second")) :]
    _flip(ring_log, ring_log.stat().st_size - 1)  # the last item's last byte: a complete record, bad CRC
    engine = _open(tmp_path)
    ring = engine.rings.get("r-crc")
    assert ring.tail_sequence() == 1  # sequence 1 may have been acknowledged: it is never handed out again
    assert ring.read_one(0) == b"first"
    with pytest.raises(StaleSequence):
        ring.read_one(1)
    assert ring.add(b"third") == 2
    quarantine = ring_log.with_name(ring_log.name + ".quarantine-1")
    assert quarantine.read_bytes()[:-1] == damaged[:-1]
    _close(engine)
    engine = _open(tmp_path)  # the high-water mark outlives the restart that wrote it
    ring = engine.rings.get("r-crc")
    assert ring.tail_sequence() == 2
    assert [ring.read_one(0), ring.read_one(2)] == [b"first", b"third"]
    _close(engine)


def test_damage_in_the_middle_keeps_every_intact_record(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    engine = _open(tmp_path, capacity=100)
    engine.rings.get("r-mid").add_all([f"item-{i:02d}".encode() for i in range(20)])
    _close(engine)
    ring_log = next((tmp_path / "rings").glob("r-mid*.log"))
    record = 8 + 8 + len(b"item-00")
    _flip(ring_log, 7 * record + 8 + 8 + 2)  # a byte of item 7
    _flip(ring_log, 12 * record + 1)  # the length field of item 12: resynchronised by scanning
    engine = _open(tmp_path, capacity=100)
    ring = engine.rings.get("r-mid")
    assert ring.tail_sequence() == 19
    state = ReadManyState(0, 0, 100)
    ring.read_many(state)
    assert state.sequences == list(range(0, 7))
    state = ReadManyState(7, 0, 100)  # a read that starts on a lost sequence starts at the next intact one
    ring.read_many(state)
    assert state.sequences[0] == 8
    assert ring.add(b"new") == 20
    assert len(list((tmp_path / "rings").glob("r-mid*.quarantine-*"))) == 2
    assert "torn" not in caplog.text and "never acknowledged" not in caplog.text
    assert "ring sequences 7..7" in caplog.text and "ring sequences 12..12" in caplog.text
    _close(engine)


def test_damaged_first_record_keeps_the_rest(tmp_path: Path) -> None:
    engine = _open(tmp_path, capacity=100)
    engine.rings.get("r-start").add_all([f"item-{i:02d}".encode() for i in range(5)])
    _close(engine)
    ring_log = next((tmp_path / "rings").glob("r-start*.log"))
    _flip(ring_log, 0)
    engine = _open(tmp_path, capacity=100)
    ring = engine.rings.get("r-start")
    assert ring.tail_sequence() == 4
    assert [ring.read_one(s) for s in range(1, 5)] == [f"item-{i:02d}".encode() for i in range(1, 5)]
    _close(engine)


def test_damaged_map_log_record_is_quarantined_not_truncated(tmp_path: Path) -> None:
    engine = _open(tmp_path)
    for i in range(10):
        engine.maps.put("m", f"k{i}".encode(), f"v{i}".encode(), OWNER)
    _close(engine)  # the map log is a compacted snapshot of 10 puts now
    map_log = tmp_path / "maps.log"
    size = map_log.stat().st_size
    _flip(map_log, size // 2)
    engine = _open(tmp_path)
    assert 9 <= engine.maps.size("m") < 10
    assert len(list(tmp_path.glob("maps.log.quarantine-*"))) == 1
    _close(engine)


def test_destroyed_ring_starts_over(tmp_path: Path) -> None:
    engine = _open(tmp_path)
    engine.rings.get("r-d").add(b"x")
    engine.rings.destroy("r-d")
    assert engine.rings.get("r-d").tail_sequence() == -1
    _close(engine)
    engine = _open(tmp_path)
    assert engine.rings.get("r-d").tail_sequence() == -1
    _close(engine)


def test_map_ttl_survives_restart(tmp_path: Path) -> None:
    clock = ManualClock()
    engine = _open(tmp_path, clock=clock)
    engine.maps.put("m", b"short", b"v", OWNER, ttl_ms=1000)
    engine.maps.put("m", b"long", b"v", OWNER, ttl_ms=100_000)
    engine.maps.put("m", b"forever", b"v", OWNER)
    _close(engine)
    clock.advance(2000)
    engine = _open(tmp_path, clock=clock)
    assert sorted(engine.maps.key_set("m")) == [b"forever", b"long"]
    clock.advance(98_000)
    assert sorted(engine.maps.key_set("m")) == [b"forever"]
    _close(engine)


def test_map_log_is_compacted_at_start(tmp_path: Path) -> None:
    engine = _open(tmp_path)
    for i in range(1000):
        engine.maps.put("m", b"k", str(i).encode(), OWNER)
    _close(engine)
    big = (tmp_path / "maps.log").stat().st_size
    engine = _open(tmp_path)
    assert engine.maps.get("m", b"k") == b"999"
    assert (tmp_path / "maps.log").stat().st_size < big / 100
    _close(engine)


def test_group_commit_shares_fsyncs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real_fsync = os.fsync
    started = threading.Event()
    release = threading.Event()

    def slow_fsync(fd: int) -> None:
        calls.append(fd)
        started.set()
        release.wait(10)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", slow_fsync)
    syncer = Syncer("always", 100)
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)

    async def scenario() -> None:
        os.write(fd, b"1")
        syncer.written(fd)
        first = asyncio.ensure_future(syncer.commit())
        await asyncio.sleep(0)
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 10)
        # While the first fsync runs, ten more writers arrive: they must share one further fsync.
        rest = []
        for _ in range(10):
            os.write(fd, b"x")
            syncer.written(fd)
            rest.append(asyncio.ensure_future(syncer.commit()))
        await asyncio.sleep(0)
        assert not first.done()
        release.set()
        await asyncio.wait_for(asyncio.gather(first, *rest), 10)

    asyncio.run(scenario())
    syncer.close()
    os.close(fd)
    assert len(calls) == 2


def test_interval_policy_fsyncs_on_its_own_every_interval(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    engine = Engine(EngineConfig(data_dir=str(tmp_path), fsync="interval", fsync_interval_ms=20))
    asyncio.run(engine.open())
    try:
        assert engine.persistence is not None and engine.persistence.syncer.interval_ms == 20
        ring = engine.rings.get("r")
        ring.add(b"x")  # nobody awaits a commit: the interval thread alone must make it durable
        log_fd = ring.store._fd  # type: ignore[union-attr]
        synced.clear()
        wait_until(lambda: log_fd in synced, timeout_s=10, message="the ring log fsynced by the 20 ms interval")
    finally:
        _close(engine)


def test_a_data_directory_has_one_member(tmp_path: Path) -> None:
    engine = _open(tmp_path)
    with pytest.raises(InvalidConfiguration, match="in use by another member"):
        _open(tmp_path)
    _close(engine)
    _close(_open(tmp_path))


def test_bad_fsync_settings_are_refused() -> None:
    with pytest.raises(InvalidConfiguration, match="fsync policy 'sometimes' is unknown"):
        EngineConfig(fsync="sometimes")
    with pytest.raises(
        InvalidConfiguration, match="fsync_interval_ms must be a positive number of milliseconds, got 0"
    ):
        EngineConfig(fsync_interval_ms=0)


# ---------------------------------------------------------------------------------------------- member process


@pytest.fixture
def member(tmp_path: Path) -> Iterator[EmbeddedGrid]:
    grid = EmbeddedGrid(process=True, data_dir=tmp_path / "data", fsync="always")
    grid.start()
    yield grid
    grid.stop()


def _client(grid: EmbeddedGrid) -> Any:
    settings = GridSettings(members=(grid.address,), cluster_name=grid.cluster_name, connect_timeout_s=10)
    return hazelcast.HazelcastClient(**settings.client_config())


KILLS = 3
WRITERS = 4


@pytest.mark.fault
@pytest.mark.embedded_only
def test_every_acknowledged_write_survives_sigkill(member: EmbeddedGrid) -> None:
    """SIGKILL a member (fsync=always) several times under concurrent acknowledged add_all load: nothing acknowledged
    is lost, sequences never repeat."""
    acked_items: dict[int, bytes] = {}
    acked_values: dict[str, int] = {}
    attempted: dict[str, int] = {}
    restarts: list[float] = []
    for round_ in range(KILLS):
        client = _client(member)
        ring = client.get_ringbuffer("stream").blocking()
        offsets = client.get_map("offsets").blocking()
        stop = threading.Event()

        def load(writer: int) -> None:
            i = 0
            try:
                while not stop.is_set():
                    batch = [bytearray(f"r{round_}-w{writer}-{i}-{j}".encode() * 20) for j in range(10)]
                    last = ring.add_all(batch)
                    for offset, payload in enumerate(batch):
                        acked_items[last - len(batch) + 1 + offset] = bytes(payload)
                    key = f"w{writer}"
                    attempted[key] = i
                    offsets.put(key, i)
                    acked_values[key] = i
                    i += 1
            except Exception:
                pass

        writers = [threading.Thread(target=load, args=(w,), daemon=True) for w in range(WRITERS)]
        for writer in writers:
            writer.start()
        target = len(acked_items) + 1000
        wait_until(lambda: len(acked_items) >= target, timeout_s=60, message="1000 more acknowledged ring writes")
        member.kill()
        stop.set()
        for writer in writers:
            writer.join(30)
        client.shutdown()
        assert not any(writer.is_alive() for writer in writers)
        started = time.monotonic()
        member.start()
        restarts.append(time.monotonic() - started)

    client = _client(member)
    try:
        ring = client.get_ringbuffer("stream").blocking()
        tail = ring.tail_sequence()
        assert tail >= max(acked_items)
        stored: dict[int, bytes] = {}
        sequence = 0
        while sequence <= tail:
            result = ring.read_many(sequence, 0, 500)
            for index in range(result.size):
                stored[result.get_sequence(index)] = bytes(result[index])
            sequence = result.next_sequence_to_read_from
        lost = [s for s, payload in acked_items.items() if stored.get(s) != payload]
        offsets = client.get_map("offsets").blocking()
        for key, value in acked_values.items():
            assert offsets.get(key) in (value, attempted[key]), key
    finally:
        client.shutdown()
    recovered = len(acked_items) - len(lost)
    print(
        f"SIGKILL x{KILLS} under {WRITERS} concurrent add_all writers (fsync=always): acknowledged {len(acked_items)}, "
        f"recovered {recovered}, lost {len(lost)}; restart seconds "
        + ", ".join(f"{seconds:.2f}" for seconds in restarts)
    )
    assert not lost


@pytest.mark.embedded_only
def test_history_below_head_is_read_from_disk_after_restart(tmp_path: Path) -> None:
    grid = EmbeddedGrid(
        process=True, data_dir=tmp_path, fsync="never", ring_configs=(RingConfig("small*", capacity=5),)
    )
    grid.start()
    try:
        client = _client(grid)
        ring = client.get_ringbuffer("small-ring").blocking()
        ring.add_all([bytearray(f"v{i}".encode()) for i in range(20)])
        client.shutdown()
        grid.restart()
        client = _client(grid)
        ring = client.get_ringbuffer("small-ring").blocking()
        assert (ring.head_sequence(), ring.tail_sequence()) == (15, 19)
        assert ring.read_one(0) == bytearray(b"v0")
        result = ring.read_many(3, 1, 4)
        assert [bytes(item) for item in result] == [b"v3", b"v4", b"v5", b"v6"]
        client.shutdown()
    finally:
        grid.stop()


def test_damaged_length_field_in_old_history_quarantines_exactly_that_record(tmp_path: Path) -> None:
    engine = _open(tmp_path, capacity=3)  # only the last 3 records are CRC-checked at start
    engine.rings.get("r-len").add_all([f"item-{i:02d}".encode() for i in range(20)])
    _close(engine)
    ring_log = next((tmp_path / "rings").glob("r-len*.log"))
    record = 8 + 8 + len(b"item-00")
    data = bytearray(ring_log.read_bytes())
    data[5 * record] -= 4  # item 5 claims to be 4 bytes shorter: the structure alone looks fine up to it
    ring_log.write_bytes(bytes(data))
    engine = _open(tmp_path, capacity=3)
    ring = engine.rings.get("r-len")
    assert ring.tail_sequence() == 19
    assert [ring.read_one(s) for s in (4, 6)] == [b"item-04", b"item-06"]
    with pytest.raises(StaleSequence):
        ring.read_one(5)
    quarantine = ring_log.with_name(ring_log.name + ".quarantine-1")
    assert len(quarantine.read_bytes()) == record
    _close(engine)


def test_random_damage_never_serves_wrong_bytes_nor_rewinds_a_ring(tmp_path: Path) -> None:
    """Random byte flips anywhere in a ring log and the map log: recovery never fails, every item served is the one
    written under that sequence, the tail never goes below the last written sequence, no map value is invented."""
    rng = random.Random(8)
    items = [f"item-{i:03d}-".encode() * rng.randint(1, 5) for i in range(60)]
    for trial in range(40):
        data_dir = tmp_path / f"trial-{trial}"
        engine = _open(data_dir, capacity=rng.choice([5, 100]))
        engine.rings.get("r-fuzz").add_all(items)
        for i in range(20):
            engine.maps.put("m", f"k{i}".encode(), f"v{i}".encode() * rng.randint(1, 4), OWNER)
        _close(engine)
        ring_log = next((data_dir / "rings").glob("r-fuzz*.log"))
        for path in (ring_log, data_dir / "maps.log"):
            data = bytearray(path.read_bytes())
            for _ in range(rng.randint(1, 3)):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
            path.write_bytes(bytes(data))
        engine = _open(data_dir, capacity=100)
        ring = engine.rings.get("r-fuzz")
        assert ring.tail_sequence() >= len(items) - 1
        served = 0
        for sequence in range(len(items)):
            try:
                item = ring.read_one(sequence)
            except StaleSequence:
                continue
            assert item == items[sequence]
            served += 1
        assert served >= len(items) - 6  # at most 3 flips, each costing at most its record (and a neighbour's length)
        for key, value in engine.maps.entry_set("m"):
            assert value.startswith(b"v" + key[1:])
        assert ring.add(b"next") == ring.tail_sequence()
        _close(engine)
