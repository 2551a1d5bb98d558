"""An executor's lane range read with several reads in flight gives exactly what ``read_range`` gives: the same
items in order, and the same data loss, skipping and out-of-range answers (no Spark session: the reads alone)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

import pytest
from spark_helpers import make_stream, put_items

from meteor_spark.errors import DataLossError, OffsetOutOfRangeError
from meteor_spark.format.records import Record
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.reading import read_range
from meteor_spark.spark.read_ahead import READS_IN_FLIGHT, read_ahead


def _items(count: int) -> list[list[Record]]:
    return [[Record(b"v%d-%d" % (i, j)) for j in range(2)] for i in range(count)]


def _flat(
    reads: Iterable[tuple[list[bytes | memoryview], list[int]]] | Iterable[tuple[list[bytes], list[int]]],
) -> tuple[list[bytes], list[int]]:
    """The items (as bytes: the read-ahead hands on views of the grid's answers) and sequences of ``reads``."""
    items: list[bytes] = []
    sequences: list[int] = []
    for got, seqs in reads:
        items += [bytes(item) for item in got]
        sequences += seqs
    return items, sequences


def test_read_ahead_gives_read_ranges_items_in_order(grid: Grid, unique_name: str) -> None:
    info = make_stream(grid, unique_name)
    put_items(grid, info, 0, _items(3 * READS_IN_FLIGHT * 4 + 1))
    end = 3 * READS_IN_FLIGHT * 4 + 1
    for start, stop in ((0, end), (5, end - 2), (7, 8), (4, 4)):
        ahead = _flat(read_ahead(grid, info, 0, start, stop, items_per_read=4, skip_data_loss=False))
        plain = _flat(read_range(grid, info, 0, start, stop, max_items_per_call=4))
        assert ahead == plain
        assert ahead[1] == list(range(start, stop))


def test_lost_items_are_refused_or_skipped_as_read_range_does(grid: Grid, unique_name: str) -> None:
    """A ring of 5 items holding sequences 7..11: the read-ahead's windows come back short, and the rest of the
    range is read as ``read_range`` reads it."""
    info = make_stream(grid, unique_name, capacity=5)
    put_items(grid, info, 0, _items(12))
    with pytest.raises(DataLossError):
        list(read_ahead(grid, info, 0, 0, 12, items_per_read=3, skip_data_loss=False))
    _, sequences = _flat(read_ahead(grid, info, 0, 0, 12, items_per_read=3, skip_data_loss=True))
    assert sequences == list(range(7, 12))


def test_a_range_past_the_lanes_end_hands_on_what_is_there_then_fails(grid: Grid, unique_name: str) -> None:
    info = make_stream(grid, unique_name)
    put_items(grid, info, 0, _items(6))
    got: list[int] = []
    with pytest.raises(OffsetOutOfRangeError):
        for _, sequences in read_ahead(grid, info, 0, 2, 12, items_per_read=2, skip_data_loss=False):
            got += sequences
    assert got == [2, 3, 4, 5]


def test_executor_clients_read_their_sockets_with_a_large_buffer(grid_settings: GridSettings) -> None:
    """The executors' grid clients (``clients.grid_for``) read up to ``RECEIVE_BUFFER_BYTES`` a call, from sockets
    whose receive buffer was raised (as far as the kernel allows) above the client's default 128,000 bytes."""
    import socket

    from meteor_spark.spark import clients

    settings = replace(grid_settings, connect_timeout_s=grid_settings.connect_timeout_s + 1)  # a client of its own
    try:
        connections = list(clients.grid_for(settings).client._connection_manager.active_connections.values())
        assert connections
        for connection in connections:
            assert connection.receive_buffer_size == clients.RECEIVE_BUFFER_BYTES
            assert connection.socket.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) > 2 * 128_000
    finally:
        clients.forget(settings)
