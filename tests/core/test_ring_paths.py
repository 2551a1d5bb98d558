"""``meteor_spark.compat_ring``'s paths answer exactly what the public client paths do: ``Ring.read_batch_async`` (the
subscriber's parked read) the same items of every kind, sequences and next sequence (answers read off their frames
once the first one read so agreed with the codec, else through the codec), and a parked read completed by an add;
``Ring.add_all_async`` appends byte items the public ``add_all`` reads back unchanged, falls back to it for other
items (real client over TCP, both grids)."""

from __future__ import annotations

from typing import Any, cast

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
        assert list(result(ring.read_batch_async(0, 1, 2), "read").items) == [b"meteor", b""]
        # The first answer was read both ways and agreed: the later ones were read off the frames directly.
        assert ring._proxy._meteor_read_answers.frames_match is True
    finally:
        ring.destroy()


def test_answers_read_through_the_codec_when_the_frames_are_not_as_expected(grid: Grid, unique_name: str) -> None:
    ring = grid.ring(unique_name)
    try:
        ring.add_all([b"one", b"two"])
        ring._proxy.add(7)
        result(ring.read_batch_async(0, 1, 1), "first read")
        ring._proxy._meteor_read_answers.frames_match = False  # as if the first answer had been laid out otherwise
        batch = result(ring.read_batch_async(0, 1, 10), "read through the codec")
        assert (list(batch.items), list(batch.sequences), batch.next_sequence) == ([b"one", b"two", 7], [0, 1, 2], 3)
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
        assert list(batch.items) == [b"first"] and type(batch.items[0]) is bytes
        assert (list(batch.sequences), batch.next_sequence) == ([0], 1)
    finally:
        ring.destroy()


def test_appended_byte_items_read_back_unchanged_through_the_public_path(grid: Grid, unique_name: str) -> None:
    ring = grid.ring(unique_name)
    try:
        items: list[Any] = [b"one", bytearray(b"two"), b"", bytes(range(256)) * 300]
        assert result(ring.add_all_async(items), "add_all") == 3
        assert ring._proxy._meteor_add_path.framing_matches  # the client's own encoding of a sample item agreed
        assert result(ring.add_all_async([cast(Any, memoryview(b"view"))]), "add_all of a view (public path)") == 4
        public = ring._proxy.read_many(0, 5, 10).result()
        assert [bytes(item) for item in public] == [b"one", b"two", b"", bytes(range(256)) * 300, b"view"]
    finally:
        ring.destroy()


def test_a_client_whose_framing_differs_appends_through_the_public_path(grid: Grid, unique_name: str) -> None:
    ring = grid.ring(unique_name)
    try:
        ring.add_all_async([b"first"]).result()
        ring._proxy._meteor_add_path.framing_matches = False  # as if another serialization config were in force
        assert result(ring.add_all_async([b"second"]), "add_all (public path)") == 1
        assert [bytes(item) for item in ring._proxy.read_many(0, 2, 2).result()] == [b"first", b"second"]
    finally:
        ring.destroy()


def test_view_reads_give_the_public_paths_items_as_views_of_the_answer(grid: Grid, unique_name: str) -> None:
    """``Ring.read_views_async`` (the Spark executor's reads): byte items as memoryviews holding the same bytes,
    other items decoded by the client's serializer, sequences and next sequence as the public path gives them."""
    ring = grid.ring(unique_name)
    try:
        ring.add_all([b"meteor", b"", bytes(range(256)) * 40])
        ring._proxy.add(7)
        for start, count in ((0, 10), (1, 2), (3, 1), (0, 10)):
            views = result(ring.read_views_async(start, 1, count), "read_views_async")
            public = ring.read_many(start, 1, count)
            assert [bytes(i) if isinstance(i, memoryview) else i for i in views.items] == list(public.items)
            assert [type(i) for i in views.items] == [memoryview if type(i) is bytes else type(i) for i in public.items]
            assert list(views.sequences) == list(public.sequences)
            assert views.next_sequence == public.next_sequence
        # The byte reads of the ring are untouched: still bytes.
        assert all(type(i) is bytes for i in result(ring.read_batch_async(0, 1, 3), "read").items)
    finally:
        ring.destroy()
