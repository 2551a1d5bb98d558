"""The edge paths of loss in the core: skipping lost items, positions past a lane's end, corrupt items, errors after
good records, and history served below the ring's head (real client over TCP)."""

from __future__ import annotations

import pytest

from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.errors import (
    ConfigError,
    DataLossError,
    FencedError,
    FormatError,
    OffsetOutOfRangeError,
    UnsupportedFormatVersionError,
)
from meteor_spark.format.corrupt import (
    HEADER_ERROR,
    HEADER_SOURCE_LANE,
    HEADER_SOURCE_OFFSET,
    HEADER_SOURCE_SEQUENCE,
    HEADER_SOURCE_STREAM,
)
from meteor_spark.format.item_encoding import encode_batch_v0
from meteor_spark.format.item_header import FORMAT_VERSION
from meteor_spark.format.offsets import first_offset_of, make_offset
from meteor_spark.format.records import Record, encode_batch
from meteor_spark.grid.client import Grid
from meteor_spark.grid.reading import count_records, oldest_sequence, read_range
from meteor_spark.grid.streams import StreamConfig, StreamInfo, lane_bounds, open_stream
from meteor_spark.groups.admin import lag_report, seek_group
from meteor_spark.testing import wait_until

FOREIGN = b"not a meteor batch"


def _values(sub: Subscriber, count: int, timeout_s: float = 15.0) -> list[bytes]:
    got: list[bytes] = []
    wait_until(
        lambda: got.extend(r.value for r in sub.poll(50)) or len(got) >= count, timeout_s, message=f"{count} records"
    )
    return got


def _drain(sub: Subscriber, polls: int) -> list[bytes]:
    """Poll a fixed number of times (each returns at once when nothing is left)."""
    return [r.value for _ in range(polls) for r in sub.poll(20)]


def _one_record_items(grid: Grid, info: StreamInfo, count: int, lane: int = 0) -> None:
    ring = grid.ring(info.ring_names[lane])
    ring.add_all([encode_batch([f"r{i}".encode()], producer_id=1, producer_seq=i) for i in range(count)])


def _figures(name: str, **figures: object) -> None:
    """The fault tier's one-line summary (visible with ``-s``, and in the captured output of a failure)."""
    print(f"[fault] {name}: " + ", ".join(f"{key}={value}" for key, value in figures.items()), flush=True)


def _v2_item() -> bytes:
    item = bytearray(encode_batch([b"from the future"], producer_id=1, producer_seq=0))
    item[4] = FORMAT_VERSION + 1
    return bytes(item)


# ---------------------------------------------------------------------------------------------------- skip mode


def test_skip_moves_straight_to_the_oldest_item_and_counts_each_lost_item_once(grid: Grid, unique_name: str) -> None:
    info = open_stream(grid, StreamConfig(unique_name, capacity=10))
    _one_record_items(grid, info, 100)
    with Subscriber(grid, info.name, initial_offset_scheme="earliest", skip_data_loss=True) as sub:
        sub.seek(0)
        assert _values(sub, 10) == [f"r{i}".encode() for i in range(90, 100)]
        assert _drain(sub, 20) == []  # many more polls: nothing, and nothing counted again
        assert sub.skipped_items == 90
        assert sub.skips == [(0, 0, first_offset_of(90))]
        assert sub.metrics()["skipped_items"] == 90


def test_a_grouped_skip_is_confirmed_so_a_restarted_member_does_not_count_it_again(
    grid: Grid, unique_name: str
) -> None:
    info = open_stream(grid, StreamConfig(unique_name, capacity=10))
    _one_record_items(grid, info, 30)
    seek_group(grid, info, "g", {0: 0})
    with Subscriber(grid, info.name, group="g", skip_data_loss=True, lease_ms=1000) as sub:
        assert _values(sub, 10) == [f"r{i}".encode() for i in range(20, 30)]
        assert sub.skipped_items == 20
        sub.confirm()
    with Subscriber(grid, info.name, group="g", skip_data_loss=True, lease_ms=1000) as again:
        assert _drain(again, 5) == [] and again.skipped_items == 0


def test_without_skip_the_position_stays_and_the_error_repeats(grid: Grid, unique_name: str) -> None:
    info = open_stream(grid, StreamConfig(unique_name, capacity=10))
    _one_record_items(grid, info, 100)
    with Subscriber(grid, info.name) as sub:
        sub.seek(0)
        for _ in range(3):
            with pytest.raises(DataLossError) as lost:
                _values(sub, 1)
            assert (lost.value.requested, lost.value.oldest_available) == (0, first_offset_of(90))
            assert "overwritten in the ring, or damaged on disk and quarantined" in str(lost.value)
        assert sub.position() == 0
        sub.seek(first_offset_of(95))
        assert _values(sub, 5) == [f"r{i}".encode() for i in range(95, 100)]


# ---------------------------------------------------------------------------------------------------- past the end


def test_a_group_offset_past_a_truncated_lanes_end_is_an_error_not_a_silent_skip(grid: Grid, unique_name: str) -> None:
    info = open_stream(grid, StreamConfig(unique_name, capacity=1000))
    _one_record_items(grid, info, 600)
    seek_group(grid, info, "g", {0: first_offset_of(600)})
    grid.ring(info.ring_names[0]).destroy()  # the lane starts again at 0, like a grid restarted without persistence
    _one_record_items(grid, info, 353)
    with Subscriber(grid, info.name, group="g", lease_ms=1000) as sub:
        for _ in range(2):  # and again: the lane stays stopped until the application decides
            with pytest.raises(OffsetOutOfRangeError) as past:
                _values(sub, 1, timeout_s=10)
            error = past.value
            assert (error.stream, error.lane, error.position, error.oldest, error.end) == (
                unique_name,
                0,
                first_offset_of(600),
                0,
                first_offset_of(353),
            )
            assert "confirmed offset of group 'g'" in str(error)
        _one_record_items(grid, info, 50)  # new records do not make the gap silently disappear
        with pytest.raises(OffsetOutOfRangeError):
            _values(sub, 1, timeout_s=10)
        sub.seek(first_offset_of(353))
        assert len(_values(sub, 50)) == 50
        sub.confirm()
    report = {entry.lane: entry for entry in lag_report(grid, info, "g", count_records=True)}
    assert report[0].past_end is False and report[0].records == 0


def test_lag_report_marks_an_offset_past_the_end(grid: Grid, unique_name: str) -> None:
    info = open_stream(grid, StreamConfig(unique_name, capacity=100))
    _one_record_items(grid, info, 20)
    seek_group(grid, info, "g", {0: first_offset_of(20)})
    grid.ring(info.ring_names[0]).destroy()
    _one_record_items(grid, info, 5)
    [entry] = lag_report(grid, info, "g", count_records=True)
    assert (entry.past_end, entry.confirmed, entry.next_sequence, entry.items, entry.records) == (
        True,
        first_offset_of(20),
        5,
        None,
        None,
    )


def test_a_subscriber_parked_past_the_end_of_a_recreated_lane_gets_an_error(grid: Grid, unique_name: str) -> None:
    info = open_stream(grid, StreamConfig(unique_name, capacity=100))
    _one_record_items(grid, info, 10)
    with Subscriber(grid, info.name, initial_offset_scheme="latest") as sub:
        assert _drain(sub, 2) == []  # a read is now parked at sequence 10
        grid.ring(info.ring_names[0]).destroy()
        _one_record_items(grid, info, 3)
        with pytest.raises(OffsetOutOfRangeError) as past:
            _values(sub, 1)
        assert (past.value.position, past.value.end) == (first_offset_of(10), first_offset_of(3))


# ---------------------------------------------------------------------------------------------------- corrupt items


@pytest.fixture
def with_foreign_item(grid: Grid, unique_name: str) -> StreamInfo:
    """Lane 0: good item "a", a foreign item, good item "b" (sequences 0, 1, 2)."""
    info = open_stream(grid, StreamConfig(unique_name))
    ring = grid.ring(info.ring_names[0])
    ring.add(encode_batch([b"a"], producer_id=1, producer_seq=0))
    ring.add(FOREIGN)
    ring.add(encode_batch([b"b"], producer_id=1, producer_seq=1))
    return info


@pytest.mark.fault
def test_corrupt_item_default_is_an_error_that_keeps_the_position(grid: Grid, with_foreign_item: StreamInfo) -> None:
    with Subscriber(grid, with_foreign_item.name, initial_offset_scheme="earliest") as sub:
        delivered = [r.value for r in sub.poll(5000)]
        assert delivered == [b"a"]  # the good record before the bad item comes first
        raised = 0
        for _ in range(3):
            with pytest.raises(FormatError, match=rf"stream '{with_foreign_item.name}' lane 0 sequence 1"):
                sub.poll(100)
            raised += 1
            assert sub.position() == first_offset_of(1)  # AT the bad item: nothing passed over
        assert sub.corrupt_items == 0
        sub.seek(first_offset_of(2))
        delivered += _values(sub, 1)
        assert delivered == [b"a", b"b"]
        _figures(
            "corrupt item, on_corrupt=error", errors_raised=raised, delivered=len(delivered), lost=2 - len(delivered)
        )


@pytest.mark.fault
def test_corrupt_item_skip_passes_over_it_and_counts_it_once(grid: Grid, with_foreign_item: StreamInfo) -> None:
    info = with_foreign_item
    with Subscriber(
        grid, info.name, group="g", initial_offset_scheme="earliest", on_corrupt="skip", lease_ms=1000
    ) as sub:
        assert _values(sub, 2) == [b"a", b"b"]
        assert _drain(sub, 10) == []
        assert (sub.corrupt_items, sub.corrupt, sub.metrics()["corrupt_items"]) == (1, [(0, 1)], 1)
        sub.confirm()
        _figures("corrupt item, on_corrupt=skip", delivered=sub.delivered_records, corrupt_counted=sub.corrupt_items)
    with Subscriber(grid, info.name, group="g", on_corrupt="skip", lease_ms=1000) as again:
        assert _drain(again, 5) == [] and again.corrupt_items == 0


def test_corrupt_item_as_the_last_item_is_passed_over_and_confirmed(grid: Grid, unique_name: str) -> None:
    info = open_stream(grid, StreamConfig(unique_name))
    ring = grid.ring(info.ring_names[0])
    ring.add(encode_batch([b"a"], producer_id=1, producer_seq=0))
    ring.add(FOREIGN)
    with Subscriber(grid, info.name, group="g", on_corrupt="skip", lease_ms=1000) as sub:
        assert _values(sub, 1) == [b"a"]
        wait_until(lambda: not sub.poll(20) and sub.corrupt_items == 1, 10, message="the bad item passed over")
        assert sub.position() == first_offset_of(2)
        sub.confirm()
        assert sub.member.confirmed(0) == first_offset_of(2)


@pytest.mark.fault
def test_corrupt_item_dead_letter_publishes_the_raw_item_before_moving_on(
    grid: Grid, with_foreign_item: StreamInfo
) -> None:
    info = with_foreign_item
    dead = f"{info.name}-dlq"
    with Subscriber(grid, info.name, initial_offset_scheme="earliest", dead_letter_stream=dead) as sub:
        assert sub.corrupt_policy.mode == "dead_letter"
        delivered = _values(sub, 2)
        assert delivered == [b"a", b"b"]
        assert sub.corrupt_items == 1
    with Subscriber(grid, dead, initial_offset_scheme="earliest") as letters:
        got: list[Record] = []
        wait_until(lambda: got.extend(letters.poll(50)) or got, 10, message="the dead letter")
        assert [r for _ in range(3) for r in letters.poll(20)] == []
    [record] = got
    headers = dict(record.headers)
    assert record.value == FOREIGN
    assert headers[HEADER_SOURCE_STREAM] == info.name.encode()
    assert headers[HEADER_SOURCE_LANE] == b"0"
    assert headers[HEADER_SOURCE_SEQUENCE] == b"1"
    assert headers[HEADER_SOURCE_OFFSET] == str(first_offset_of(1)).encode()
    assert b"lane 0 sequence 1" in headers[HEADER_ERROR]
    _figures(
        "corrupt item, dead_letter_stream",
        delivered=len(delivered),
        dead_letters=len(got),
        lost=3 - len(delivered) - len(got),
    )


def test_corrupt_item_settings_are_checked_at_creation(grid: Grid, with_foreign_item: StreamInfo) -> None:
    name = with_foreign_item.name
    with pytest.raises(ConfigError, match="on_corrupt must be one of error, skip, dead_letter"):
        Subscriber(grid, name, on_corrupt="ignore")
    with pytest.raises(ConfigError, match="needs dead_letter_stream"):
        Subscriber(grid, name, on_corrupt="dead_letter")
    with pytest.raises(ConfigError, match="is the stream being read"):
        Subscriber(grid, name, dead_letter_stream=name)


def test_a_newer_format_version_is_a_corrupt_item_too(grid: Grid, unique_name: str) -> None:
    info = open_stream(grid, StreamConfig(unique_name))
    ring = grid.ring(info.ring_names[0])
    ring.add(_v2_item())
    ring.add(encode_batch([b"after"], producer_id=1, producer_seq=0))
    with (
        Subscriber(grid, info.name, initial_offset_scheme="earliest") as strict,
        pytest.raises(UnsupportedFormatVersionError, match="sequence 0"),
    ):
        _values(strict, 1)
    with Subscriber(grid, info.name, initial_offset_scheme="earliest", on_corrupt="skip") as lenient:
        assert _values(lenient, 1) == [b"after"] and lenient.corrupt == [(0, 0)]


@pytest.mark.fault
def test_a_receiver_with_skip_gets_past_a_corrupt_item_without_errors(
    grid: Grid, with_foreign_item: StreamInfo
) -> None:
    seen: list[bytes] = []
    errors: list[BaseException] = []
    with Subscriber(grid, with_foreign_item.name, initial_offset_scheme="earliest", on_corrupt="skip") as sub:
        receiver = sub.attach_receiver(lambda r: seen.append(r.value), 50, on_error=lambda e, _r: errors.append(e))
        wait_until(lambda: len(seen) >= 2, 10, message="both good records")
        receiver.close()
    assert seen == [b"a", b"b"] and errors == [] and receiver.errors == 0


def test_counting_records_survives_a_corrupt_item(grid: Grid, with_foreign_item: StreamInfo) -> None:
    info = with_foreign_item
    assert count_records(grid, info, 0, 0, 3) == 2
    seek_group(grid, info, "g", {0: 0})
    [entry] = lag_report(grid, info, "g", count_records=True)
    assert (entry.items, entry.records, entry.corrupt_items) == (3, 2, 1)


# -------------------------------------------------------------------------------------------- errors after good records


def test_a_poll_returns_the_good_records_before_an_error_and_the_next_poll_raises(grid: Grid, unique_name: str) -> None:
    info = open_stream(grid, StreamConfig(unique_name))
    ring = grid.ring(info.ring_names[0])
    ring.add_all(
        [
            encode_batch([b"v1-a"], producer_id=1, producer_seq=0),
            encode_batch_v0([b"v0-a", b"v0-b"]),
            encode_batch([b"v1-b"], producer_id=1, producer_seq=1),
            _v2_item(),
        ]
    )
    with Subscriber(grid, info.name, initial_offset_scheme="earliest") as sub:
        first = sub.poll(5000)
        assert [r.value for r in first] == [b"v1-a", b"v0-a", b"v0-b", b"v1-b"]
        with pytest.raises(UnsupportedFormatVersionError, match="sequence 3"):
            sub.poll(100)
        assert sub.position() == first_offset_of(3)


# ---------------------------------------------------------------------------------------------------- history


def test_on_a_plain_grid_earliest_is_the_ring_head(grid: Grid, unique_name: str) -> None:
    info = open_stream(grid, StreamConfig(unique_name, capacity=3))
    _one_record_items(grid, info, 10)
    assert oldest_sequence(grid, info, 0) == lane_bounds(grid, info)[0][0] == 7
    with Subscriber(grid, info.name, initial_offset_scheme="earliest") as sub:
        assert _values(sub, 3) == [b"r7", b"r8", b"r9"] and sub.skipped_items == 0


@pytest.mark.embedded_only
def test_with_a_persistent_member_earliest_is_the_oldest_record_it_can_serve(
    persistent_grid: Grid, unique_name: str
) -> None:
    grid = persistent_grid
    info = open_stream(grid, StreamConfig(unique_name, capacity=3))
    _one_record_items(grid, info, 10)
    everything = [f"r{i}".encode() for i in range(10)]
    assert lane_bounds(grid, info)[0] == (7, 10) and oldest_sequence(grid, info, 0) == 0
    with Subscriber(grid, info.name, initial_offset_scheme="earliest") as ungrouped:
        assert _values(ungrouped, 10) == everything and ungrouped.skipped_items == 0
    with Subscriber(grid, info.name, group="fresh", initial_offset_scheme="earliest", lease_ms=1000) as grouped:
        assert _values(grouped, 10) == everything
    seek_group(grid, info, "late", {0: make_offset(2, 0)})  # below the head, served from disk: not lost
    [entry] = lag_report(grid, info, "late", count_records=True)
    assert (entry.lost_items, entry.items, entry.records) == (0, 8, 8)
    assert [s for _, seqs in read_range(grid, info, 0, 0, 10) for s in seqs] == list(range(10))


# ---------------------------------------------------------------------------------------------------- fencing


def test_records_read_before_a_lane_was_lost_are_never_confirmed(grid: Grid, unique_name: str) -> None:
    info = open_stream(grid, StreamConfig(unique_name))
    _one_record_items(grid, info, 3)
    sub = Subscriber(grid, info.name, group="g", initial_offset_scheme="earliest", lease_ms=300)
    try:
        assert len(_values(sub, 3)) == 3
        assert sub.member is not None
        sub.member._stop.set()  # the renewal thread stops, as in a process frozen past its lease
        with Subscriber(grid, info.name, group="g", lease_ms=300) as usurper:
            assert _values(usurper, 3) and usurper.member.assignment()
            usurper.confirm()
            confirmed = usurper.member.confirmed(0)
            with pytest.raises(FencedError):
                sub.confirm()
            assert usurper.member.confirmed(0) == confirmed
    finally:
        sub.close()
