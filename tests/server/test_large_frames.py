"""Big frames over real TCP: a 32 MiB ring item goes in and comes back whole through the official client."""

from __future__ import annotations

import os

from meteor_spark.grid.client import Grid


def test_a_32_mib_item_goes_in_and_comes_back_whole(grid: Grid, unique_name: str) -> None:
    ring = grid.ring(unique_name)
    big = os.urandom(32 * 1024 * 1024)
    try:
        assert ring.add_all([b"small", big, b"after"]) == 2
        batch = ring.read_many(0, 3, 3)
        assert [len(item) for item in batch.items] == [5, len(big), 5]
        assert bytes(batch.items[1]) == big
        assert [bytes(batch.items[0]), bytes(batch.items[2])] == [b"small", b"after"]
    finally:
        ring.destroy()
