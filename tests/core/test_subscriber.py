"""Ungrouped subscriber, receiver and pub-sub (Meteor's checklist 6.2/6.3, corrected where the original was wrong)."""

from __future__ import annotations

import os
import threading

import pytest

from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.errors import (
    ConfigError,
    DataLossError,
    FormatError,
    GridError,
    GroupError,
    OffsetOutOfRangeError,
    PublisherClosedError,
)
from meteor_spark.format.offsets import InitialOffsetScheme, first_offset_of, make_offset
from meteor_spark.format.records import Record
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.streams import StreamConfig, open_stream
from meteor_spark.producer.publisher import Publisher
from meteor_spark.testing import wait_until


def _poll_values(sub: Subscriber, count: int, timeout_s: float = 10.0) -> list[bytes]:
    got: list[bytes] = []
    wait_until(
        lambda: got.extend(r.value for r in sub.poll(50)) or len(got) >= count, timeout_s, message=f"{count} records"
    )
    return got


def test_ungrouped_only_operations_and_empty_polls(grid: Grid, unique_name: str) -> None:
    with Subscriber(grid, StreamConfig(unique_name)) as sub:
        assert sub.is_assigned()
        assert len(sub.poll(0)) == 0 and len(sub.poll(20)) == 0
        for operation in (sub.confirm, sub.deactivate, sub.reactivate):
            with pytest.raises(GroupError, match="needs a subscriber group"):
                operation()


def test_records_arrive_in_order_and_the_next_poll_is_empty(grid: Grid, unique_name: str) -> None:
    config = StreamConfig(unique_name)
    with Subscriber(grid, config) as sub, Publisher(grid, config) as pub:
        pub.publish(b"h0")
        pub.publish_many([b"h1", b"h2"]).result(10)
        assert _poll_values(sub, 3) == [b"h0", b"h1", b"h2"]
        assert len(sub.poll(20)) == 0
        assert sub.position() == first_offset_of(2)
        assert sub.last_offset() == make_offset(1, 1)


def test_initial_offset_schemes_ungrouped(grid: Grid, unique_name: str) -> None:
    config = StreamConfig(unique_name, capacity=2)
    with Publisher(grid, config) as pub:
        for value in (b"gone", b"h1", b"h2"):
            pub.publish(value)  # capacity 2: "gone" is overwritten
    with Subscriber(grid, config, initial_offset_scheme="earliest") as earliest:
        # EARLIEST is the oldest record still held (Meteor's literal 0 would be a stale read here)
        assert _poll_values(earliest, 2) == [b"h1", b"h2"]
    for scheme in (InitialOffsetScheme.LATEST, InitialOffsetScheme.AUTO):
        with Subscriber(grid, config, initial_offset_scheme=scheme) as latest:
            assert len(latest.poll(20)) == 0
            with Publisher(grid, config) as pub:
                pub.publish(b"new")
            assert _poll_values(latest, 1) == [b"new"]
    with pytest.raises(ConfigError, match="NONE needs a group"):
        Subscriber(grid, config, initial_offset_scheme="none")


def test_seek(grid: Grid, unique_name: str) -> None:
    config = StreamConfig(unique_name)
    with Publisher(grid, config) as pub:
        offsets = [pub.publish(f"h{i}".encode()) for i in range(3)]
    with Subscriber(grid, config, initial_offset_scheme="earliest") as sub:
        sub.seek(offsets[1])
        assert _poll_values(sub, 2) == [b"h1", b"h2"]
        sub.seek(offsets[0])
        assert _poll_values(sub, 3) == [b"h0", b"h1", b"h2"]
        with pytest.raises(ConfigError, match="offset -5 is invalid"):
            sub.seek(-5)
        with pytest.raises(OffsetOutOfRangeError) as past:
            sub.seek(first_offset_of(10))
        assert (past.value.stream, past.value.lane, past.value.position) == (unique_name, 0, first_offset_of(10))
        assert (past.value.oldest, past.value.end) == (first_offset_of(0), first_offset_of(3))
        assert f"valid offsets are 0 to {first_offset_of(3)}" in str(past.value)
        sub.seek(first_offset_of(3))  # the end itself is a valid position: the next record to be written
        with pytest.raises(ConfigError, match=r"lane 7 does not exist in stream .*lanes are 0\.\.0"):
            sub.seek(0, lane=7)
    with (
        Subscriber(grid, StreamConfig(unique_name + "-multi", lanes=2)) as multi,
        pytest.raises(ConfigError, match="say which one"),
    ):
        multi.seek(0)


def test_seek_inside_an_item_and_max_poll_records(grid: Grid, unique_name: str) -> None:
    config = StreamConfig(unique_name)
    with Publisher(grid, config) as pub:
        offsets = pub.publish_many([f"r{i}".encode() for i in range(10)]).result(10)
    assert len({o >> 16 for o in offsets}) == 1  # one ring item
    with Subscriber(grid, config, initial_offset_scheme="earliest", max_poll_records=4) as sub:
        sub.seek(offsets[3])
        first = sub.poll(5000)
        assert [r.value for r in first] == [b"r3", b"r4", b"r5", b"r6"]
        assert [r.offset for r in first] == offsets[3:7]
        assert [r.value for r in sub.poll(5000)] == [b"r7", b"r8", b"r9"]


def test_overwritten_records_raise_data_loss_or_are_skipped_and_counted(grid: Grid, unique_name: str) -> None:
    config = StreamConfig(unique_name, capacity=2)
    strict = Subscriber(grid, config, initial_offset_scheme="earliest")
    lenient = Subscriber(grid, config, initial_offset_scheme="earliest", skip_data_loss=True)
    try:
        with Publisher(grid, config) as pub:
            for i in range(5):
                pub.publish(f"h{i}".encode())
        with pytest.raises(DataLossError) as error:
            strict.poll(1000)
        assert (error.value.lane, error.value.requested, error.value.oldest_available) == (0, 0, first_offset_of(3))
        with pytest.raises(DataLossError):
            strict.poll(1000)  # the position did not move: it keeps failing until the application seeks
        assert _poll_values(lenient, 2) == [b"h3", b"h4"]
        assert lenient.skipped_items == 3
        assert lenient.skips == [(0, 0, first_offset_of(3))]
    finally:
        strict.close()
        lenient.close()


def test_corrupt_item_names_stream_lane_and_sequence(grid: Grid, unique_name: str) -> None:
    info = open_stream(grid, StreamConfig(unique_name))
    with Subscriber(grid, info.config, initial_offset_scheme="earliest") as sub:
        with Publisher(grid, info.config) as pub:
            pub.publish(b"good")
        grid.ring(info.ring_names[0]).add(b"not a record batch")
        with pytest.raises(FormatError, match=rf"stream '{unique_name}' lane 0 sequence 1"):
            _poll_values(sub, 2)
        sub.seek(first_offset_of(2))  # the application decides to step over it
        with Publisher(grid, info.config) as pub:
            pub.publish(b"after")
        assert _poll_values(sub, 1) == [b"after"]


def test_several_subscribers_each_get_everything_in_order(grid: Grid, unique_name: str) -> None:
    config = StreamConfig(unique_name, lanes=2)
    subs = [Subscriber(grid, config) for _ in range(3)]
    try:
        with Publisher(grid, config) as pub:
            pub.publish_many([Record(str(i).encode(), key=b"one key") for i in range(500)]).result(10)
        for sub in subs:
            assert [int(v) for v in _poll_values(sub, 500)] == list(range(500))
    finally:
        for sub in subs:
            sub.close()


def test_receiver_delivers_survives_a_throwing_callback_and_stops_with_the_subscriber(
    grid: Grid, unique_name: str
) -> None:
    config = StreamConfig(unique_name)
    received: list[bytes] = []
    errors: list[tuple[BaseException, Record | None]] = []

    def handle(record: Record) -> None:
        if record.value == b"poison":
            raise ValueError("cannot handle poison")
        received.append(record.value)

    sub = Subscriber(grid, config)
    receiver = sub.attach_receiver(handle, poll_timeout_ms=20, on_error=lambda e, r: errors.append((e, r)))
    with pytest.raises(ConfigError, match="already has a receiver"):
        sub.attach_receiver(handle)
    with Publisher(grid, config) as pub:
        for value in (b"a", b"poison", b"b"):
            pub.publish(value)
    wait_until(lambda: received == [b"a", b"b"], message="records after the poison one")
    assert len(errors) == 1 and isinstance(errors[0][0], ValueError) and errors[0][1].value == b"poison"  # type: ignore[union-attr]
    assert receiver.errors == 1 and receiver.is_alive()
    sub.close()
    assert not receiver.is_alive()


def test_request_reply_round_trips_over_two_streams(grid: Grid, unique_name: str) -> None:
    requests, replies = StreamConfig(unique_name + "-req"), StreamConfig(unique_name + "-rep")
    with (
        Subscriber(grid, requests) as server_in,
        Publisher(grid, replies) as server_out,
        Subscriber(grid, replies) as client_in,
        Publisher(grid, requests) as client_out,
    ):
        server = server_in.attach_receiver(lambda r: server_out.publish_async(b"re:" + r.value), poll_timeout_ms=20)
        for i in range(50):
            client_out.publish_async(str(i).encode())
            (reply,) = _poll_values(client_in, 1)
            assert reply == f"re:{i}".encode()
        server.close()


def test_failed_writes_reach_futures_and_callbacks(grid_settings: GridSettings, unique_name: str) -> None:
    own = Grid(grid_settings)
    pub = Publisher(own, StreamConfig(unique_name), linger_ms=60_000)
    seen: list[BaseException | None] = []
    future = pub.publish_async(b"doomed", callback=lambda o, e: seen.append(e))
    own.close()  # the connection is gone before the record is sent
    done = threading.Event()
    future.add_done_callback(lambda _f: done.set())
    pub.flush(30)
    assert done.wait(10)
    assert isinstance(future.exception(), GridError)
    assert len(seen) == 1 and isinstance(seen[0], GridError)
    pub.close()
    with pytest.raises(PublisherClosedError):
        pub.publish_async(b"x")


def test_reads_are_sized_by_bytes_and_lose_nothing(grid: Grid, unique_name: str) -> None:
    values = [os.urandom(1000) for _ in range(1200)]  # 12 ring items of ~100 kB (incompressible)
    with Publisher(grid, StreamConfig(unique_name), max_batch_records=100) as pub:
        pub.publish_many(values).result(10)
    with pytest.raises(ConfigError, match="max_bytes_per_read"):
        Subscriber(grid, unique_name, max_bytes_per_read=0)
    sizes: list[int] = []
    got: list[bytes] = []
    with Subscriber(grid, unique_name, initial_offset_scheme="earliest", max_bytes_per_read=250_000) as sub:

        def poll() -> bool:
            batch = sub.poll(50)
            if batch:
                sizes.append(len(batch))
                got.extend(batch.values())
            return len(got) >= len(values)

        wait_until(poll, 10, message="all records")
    assert got == values
    # The first read asks for a few items (their size is unknown), later ones for ~250 kB: two 100 kB items.
    assert sizes[0] <= 400 and max(sizes[1:]) <= 200, sizes
