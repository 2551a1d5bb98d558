"""Damaged logs (fault tier): bytes flipped at the start, middle and end of a ring log and of the map log.

A member process with ``fsync=always`` acknowledges N writes from the real client over TCP, is SIGKILLed, one byte of
its log is flipped, and it restarts. Every intact record must still be served (counted), the damaged one is reported
as lost (``DataLossError`` on the client) and its bytes kept in a quarantine file, the ring's sequence does not go
backwards, and the member's log says truthfully what happened (no "torn tail ... never acknowledged").
"""

from __future__ import annotations

from pathlib import Path

import pytest

from meteor_spark.errors import DataLossError
from meteor_spark.grid.client import Grid
from meteor_spark.grid.reading import read_range
from meteor_spark.grid.streams import StreamConfig, open_stream
from meteor_spark.server.member import EmbeddedGrid

pytestmark = [pytest.mark.fault, pytest.mark.embedded_only]

ITEMS = 300
ITEM_SIZE = 100


def _item(i: int) -> bytes:
    return f"item-{i:05d}-".encode().ljust(ITEM_SIZE, b".")


def _flip(path: Path, offset: int, record_size: int = 1) -> bytes:
    """Flip one byte; the bytes of the ``record_size``-byte record holding it, as they are on disk now."""
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))
    start = offset - offset % record_size
    return bytes(data[start : start + record_size])


def _member(data_dir: Path) -> EmbeddedGrid:
    return EmbeddedGrid(process=True, data_dir=data_dir, fsync="always")


def _grid(member: EmbeddedGrid) -> Grid:
    return Grid.connect(member.address, cluster_name=member.cluster_name, connect_timeout_s=10)


@pytest.mark.parametrize("where", ["start", "middle", "end"])
def test_damaged_ring_log_keeps_every_intact_item(tmp_path: Path, where: str) -> None:
    data_dir = tmp_path / "data"
    member = _member(data_dir).start()
    try:
        with _grid(member) as grid:
            info = open_stream(grid, StreamConfig("orders", capacity=ITEMS * 2, backup_count=0))
            ring = grid.ring(info.ring_names[0])
            for i in range(ITEMS):
                assert ring.add(_item(i)) == i  # acknowledged after its fsync
        member.kill()
        ring_log = next((data_dir / "rings").glob("meteor.stream*orders*.log"))
        record = ring_log.stat().st_size // ITEMS  # length | crc | sequence | the item as Hazelcast Data
        assert record * ITEMS == ring_log.stat().st_size
        damaged_index = {"start": 0, "middle": ITEMS // 2, "end": ITEMS - 1}[where]
        damaged_bytes = _flip(ring_log, damaged_index * record + 30, record)

        member.start()
        with _grid(member) as grid:
            info = open_stream(grid, "orders", create=False)
            with pytest.raises(DataLossError):
                for _ in read_range(grid, info, 0, 0, ITEMS):
                    pass
            reader = read_range(grid, info, 0, 0, ITEMS, skip_data_loss=True)
            kept = {
                sequence: item for items, sequences in reader for item, sequence in zip(items, sequences, strict=True)
            }
            ring = grid.ring(info.ring_names[0])
            new_sequence = ring.add(b"after the restart")
        log_text = Path(member.log_path or "").read_text()
    finally:
        member.stop()

    expected = {i: _item(i) for i in range(ITEMS) if i != damaged_index}
    assert {s: bytes(v) for s, v in kept.items()} == expected
    assert reader.skipped_items == 1
    assert new_sequence == ITEMS  # above the old tail (ITEMS - 1), even when the tail itself was damaged
    quarantine = list(ring_log.parent.glob(ring_log.name + ".quarantine-*"))
    assert len(quarantine) == 1 and quarantine[0].read_bytes() == damaged_bytes
    assert f"ring sequences {damaged_index}..{damaged_index}" in log_text
    assert "may have been acknowledged" in log_text
    assert "torn" not in log_text and "never acknowledged" not in log_text
    print(
        f"damaged ring log ({where}): {len(kept)} of {ITEMS} acknowledged items kept, "
        f"{reader.skipped_items} quarantined, next sequence {new_sequence}"
    )


@pytest.mark.parametrize("where", ["start", "middle", "end"])
def test_damaged_map_log_keeps_every_intact_entry(tmp_path: Path, where: str) -> None:
    data_dir = tmp_path / "data"
    member = _member(data_dir).start()
    try:
        with _grid(member) as grid:
            entries = grid.map("settings")
            for i in range(ITEMS):
                entries.set(f"key-{i:05d}", f"value-{i:05d}")
        member.kill()
        map_log = data_dir / "maps.log"
        size = map_log.stat().st_size
        offset = {"start": 20, "middle": size // 2, "end": size - 1}[where]
        _flip(map_log, offset)
        member.start()
        with _grid(member) as grid:
            kept = grid.map("settings").entries()
        log_text = Path(member.log_path or "").read_text()
    finally:
        member.stop()

    assert len(kept) == ITEMS - 1
    assert all(kept[key] == "value-" + key[4:] for key in kept)
    assert len(list(data_dir.glob("maps.log.quarantine-*"))) == 1
    assert "may have been acknowledged" in log_text
    assert "torn" not in log_text and "never acknowledged" not in log_text
    print(
        f"damaged map log ({where}): {len(kept)} of {ITEMS} acknowledged entries kept, {ITEMS - len(kept)} quarantined"
    )
