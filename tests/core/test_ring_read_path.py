"""``Ring.read_batch_async`` (``meteor_spark.compat_ring``, the subscriber's parked read) answers exactly what the
public ``read_many`` path does: the same items of every kind, sequences and next sequence, and a parked read
completed by an add (real client over TCP, both grids)."""

from __future__ import annotations

from meteor_spark.grid.client import Grid, ReadBatch, result, wait


def test_items_of_every_kind_read_as_the_public_path_reads_them(grid: Grid, unique_name: str) -> None:
    ring = grid.ring(unique_name)
    try:
        ring.add_all([b"meteor", b"", bytes(range(256)) * 40])
        ring._proxy.add("a foreign string")  # not a byte array: decoded by the client's serializer
        ring._proxy.add(7)
        for start, count in ((0, 10), (1, 2), (4, 1)):
            fast = result(ring.read_batch_async(start, 1, count), "read_batch_async")
            public = ring.read_many(start, 1, count)
            assert isinstance(fast, ReadBatch)
            assert list(fast.items) == list(public.items)
            assert [type(item) for item in fast.items] == [type(item) for item in public.items]
            assert list(fast.sequences) == list(public.sequences)
            assert fast.next_sequence == public.next_sequence
        assert list(result(ring.read_batch_async(0, 1, 2), "read").items) == [bytearray(b"meteor"), bytearray()]
    finally:
        ring.destroy()


def test_a_parked_read_is_completed_by_the_next_add(grid: Grid, unique_name: str) -> None:
    ring = grid.ring(unique_name)
    try:
        parked = ring.read_batch_async(0, 1, 10)
        assert not wait(parked, 0.05)  # nothing there yet: the read parks on the member
        ring.add(b"first")
        assert wait(parked, 10.0)
        batch = result(parked, "parked read")
        assert list(batch.items) == [b"first"] and isinstance(batch.items[0], bytearray)
        assert (list(batch.sequences), batch.next_sequence) == ([0], 1)
    finally:
        ring.destroy()
