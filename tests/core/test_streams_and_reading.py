"""Stream metadata in the grid, lane bounds and exact range reads (real client over TCP)."""

from __future__ import annotations

from typing import Any

import pytest

from meteor_spark.errors import (
    ConfigError,
    DataLossError,
    GridError,
    OffsetOutOfRangeError,
    StreamConfigConflictError,
    StreamNotFoundError,
)
from meteor_spark.format.records import decode_batch
from meteor_spark.grid.client import Grid
from meteor_spark.grid.reading import read_range
from meteor_spark.grid.streams import (
    STREAMS_MAP,
    StreamConfig,
    lane_bounds,
    open_stream,
)
from meteor_spark.groups.admin import delete_stream, list_streams
from meteor_spark.producer.publisher import Publisher
from meteor_spark.testing import wait_until


def test_open_creates_once_then_opens_by_name(grid: Grid, unique_name: str) -> None:
    config = StreamConfig(unique_name, lanes=3, capacity=50, linger_ms=1.5)
    created = open_stream(grid, config)
    assert created.config == config
    assert created.ring_names == tuple(f"meteor.stream::{unique_name}.{i}" for i in range(3))
    by_name = open_stream(grid, unique_name)
    assert by_name.config == config
    assert by_name.created_at_ms == created.created_at_ms
    assert unique_name in [info.name for info in list_streams(grid)]
    assert grid.map(STREAMS_MAP).get(unique_name) is not None


def test_conflicting_layout_is_an_error_naming_the_fields(grid: Grid, unique_name: str) -> None:
    open_stream(grid, StreamConfig(unique_name, lanes=2, capacity=100))
    with pytest.raises(StreamConfigConflictError, match=r"lanes: 4 asked, 2 stored; capacity: 5 asked, 100 stored"):
        open_stream(grid, StreamConfig(unique_name, lanes=4, capacity=5))
    # Batching settings are the publisher's own business: no conflict, and the caller keeps its values.
    info = open_stream(grid, StreamConfig(unique_name, lanes=2, capacity=100, linger_ms=7))
    assert info.config.linger_ms == 7


def test_unknown_stream_by_name_is_not_found(grid: Grid, unique_name: str) -> None:
    with pytest.raises(StreamNotFoundError, match=unique_name):
        open_stream(grid, unique_name)
    with pytest.raises(StreamNotFoundError):
        open_stream(grid, StreamConfig(unique_name), create=False)


def test_ring_capacity_follows_the_stream_config(grid: Grid, unique_name: str) -> None:
    info = open_stream(grid, StreamConfig(unique_name, capacity=7))
    assert grid.ring(info.ring_names[0]).capacity() == 7


def test_delete_removes_metadata_and_lanes(grid: Grid, unique_name: str) -> None:
    info = open_stream(grid, StreamConfig(unique_name, lanes=2))
    with Publisher(grid, unique_name) as pub:
        pub.publish(b"x")
    assert delete_stream(grid, unique_name) is True
    assert delete_stream(grid, unique_name) is False
    with pytest.raises(StreamNotFoundError):
        open_stream(grid, unique_name)
    assert grid.ring(info.ring_names[0]).tail() == -1


def test_recreated_stream_does_not_inherit_group_offsets(grid: Grid, unique_name: str) -> None:
    from meteor_spark.groups.admin import group_state
    from meteor_spark.groups.exclusive import GroupMember

    info = open_stream(grid, StreamConfig(unique_name, lanes=1))
    with Publisher(grid, unique_name) as pub:
        offset = pub.publish(b"x")
    with GroupMember(grid, info, "g", lease_ms=600) as member:
        wait_until(lambda: 0 in member.assignment(), message="lane 0 assigned")
        member.confirm(0, offset + 1)
    assert [state.confirmed for state in group_state(grid, info, "g")] == [offset + 1]

    assert delete_stream(grid, unique_name) is True
    recreated = open_stream(grid, StreamConfig(unique_name, lanes=1))
    assert [state.confirmed for state in group_state(grid, recreated, "g")] == [None]


def test_lane_bounds_and_exact_range_reads(grid: Grid, unique_name: str) -> None:
    info = open_stream(grid, StreamConfig(unique_name, lanes=2, capacity=100))
    with Publisher(grid, info.config) as pub:
        for i in range(10):
            pub.publish(f"r{i}".encode())  # one ring item each, keyless -> sticky lane
    bounds = lane_bounds(grid, info)
    assert sum(end - head for head, end in bounds.values()) == 10
    lane = max(bounds, key=lambda lane: bounds[lane][1])
    head, end = bounds[lane]
    chunks = list(read_range(grid, info, lane, head + 1, end - 1, max_items_per_call=2))
    assert all(len(items) <= 2 for items, _ in chunks)
    sequences = [s for _, seqs in chunks for s in seqs]
    assert sequences == list(range(head + 1, end - 1))
    values = [
        decode_batch(item, stream=info.name, lane=lane, sequence=seq).values()[0]
        for items, seqs in chunks
        for item, seq in zip(items, seqs, strict=True)
    ]
    assert len(values) == len(sequences)
    assert list(read_range(grid, info, lane, end, end)) == []
    with pytest.raises(OffsetOutOfRangeError) as past:
        list(read_range(grid, info, lane, end, end + 3))
    assert (past.value.lane, past.value.position, past.value.end, past.value.unit) == (lane, end + 3, end, "sequence")
    assert past.value.oldest == head and f"valid sequences are {head} to {end}" in str(past.value)
    with pytest.raises(OffsetOutOfRangeError):  # starting inside, reaching past the end
        list(read_range(grid, info, lane, end - 1, end + 1))
    with pytest.raises(ConfigError, match=r"lane 9 does not exist in stream .*lanes are 0\.\.1"):
        read_range(grid, info, 9, 0, 1)


def test_range_over_overwritten_items_is_data_loss_or_counted_skip(grid: Grid, unique_name: str) -> None:
    info = open_stream(grid, StreamConfig(unique_name, capacity=3))
    with Publisher(grid, info.config) as pub:
        for i in range(8):
            pub.publish(f"r{i}".encode())
    assert lane_bounds(grid, info)[0] == (5, 8)
    with pytest.raises(DataLossError) as info_error:
        list(read_range(grid, info, 0, 2, 8))
    error = info_error.value
    assert (error.stream, error.lane, error.requested, error.oldest_available) == (unique_name, 0, 2, 5)
    assert "sequence 2" in str(error) and "failOnDataLoss" in str(error)
    reader = read_range(grid, info, 0, 2, 8, skip_data_loss=True)
    assert [s for _, seqs in reader for s in seqs] == [5, 6, 7]
    assert reader.skipped_items == 3
    wholly_lost = read_range(grid, info, 0, 0, 4, skip_data_loss=True)
    assert list(wholly_lost) == [] and wholly_lost.skipped_items == 4


def test_a_deleted_stream_is_never_listed_with_its_lanes_destroyed(
    grid: Grid, unique_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader listing streams sees a stream whole or gone: its metadata goes before its rings (a destroyed ring
    reads as empty, so a listed stream with destroyed lanes looks like positions past the end)."""
    info = open_stream(grid, StreamConfig(unique_name, lanes=2))
    listed_at_destroy: list[bool] = []
    original_ring = grid.ring

    def ring(name: str) -> Any:
        handle = original_ring(name)
        destroy = handle.destroy
        monkeypatch.setattr(
            handle, "destroy", lambda: (listed_at_destroy.append(unique_name in _names(grid)), destroy())
        )
        return handle

    monkeypatch.setattr(grid, "ring", ring)
    assert delete_stream(grid, info.name)
    assert listed_at_destroy == [False, False]


def test_a_delete_that_fails_half_way_can_be_done_again(
    grid: Grid, unique_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    info = open_stream(grid, StreamConfig(unique_name))
    original_ring = grid.ring

    def failing(name: str) -> Any:
        handle = original_ring(name)
        monkeypatch.setattr(handle, "destroy", lambda: (_ for _ in ()).throw(GridError("member gone")))
        return handle

    monkeypatch.setattr(grid, "ring", failing)
    with pytest.raises(GridError, match="member gone"):
        delete_stream(grid, info.name)
    monkeypatch.undo()
    assert unique_name in _names(grid)
    assert delete_stream(grid, info.name)
    assert unique_name not in _names(grid)


def _names(grid: Grid) -> list[str]:
    return [info.name for info in list_streams(grid)]
