"""Dead letters by distance: a group's ``dead_letter_after=N`` moves a record that fell more than ``N`` records
behind the most recently consumed one of its lane to the group's dead-letter stream (with its headers), and the
lane moves on; for shared groups (a poison record retried, or held back by a delayed nack) and exclusive groups (a
record nacked too far behind); bad settings are clear errors."""

from __future__ import annotations

import pytest

from meteor_spark.consumer.shared_subscriber import SharedSubscriber
from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.errors import ConfigError
from meteor_spark.format.corrupt import HEADER_ERROR, HEADER_SOURCE_GROUP, HEADER_SOURCE_OFFSET
from meteor_spark.format.records import Record
from meteor_spark.grid.client import Grid
from meteor_spark.grid.streams import StreamConfig, open_stream
from meteor_spark.groups.admin import forget_groups
from meteor_spark.groups.exclusive_settings import exclusive_settings_key
from meteor_spark.groups.redelivery import distance_floor, records_between
from meteor_spark.groups.shared_state import SHARE_MAP, LaneShare, settings_key
from meteor_spark.groups.store import OFFSETS_MAP, lane_key, read_offset
from meteor_spark.producer.publisher import Publisher
from meteor_spark.testing import wait_until

DISTANCE = 5


def _entry(grid: Grid, name: str, key: str) -> str:
    """The text of an entry the test expects in map ``name``."""
    text = grid.map(name).get(key)
    assert text is not None, f"no entry {key} in map {name}"
    return text


def _stream(grid: Grid, name: str, count: int) -> str:
    """A one-lane stream of ``count`` records ``r<i>``, each with a header ``h: <i>``, two records per ring item."""
    info = open_stream(grid, StreamConfig(name, lanes=1, capacity=1000))
    with Publisher(grid, info.name, max_batch_records=2) as publisher:
        publisher.publish_many(
            [Record(f"r{i}".encode(), lane=0, headers=(("h", str(i).encode()),)) for i in range(count)]
        ).result(30)
    return info.name


def _letters(grid: Grid, dlq: str, count: int) -> list[Record]:
    with Subscriber(grid, dlq, initial_offset_scheme="earliest") as reader:
        out: list[Record] = []
        wait_until(lambda: out.extend(reader.poll(100)) or len(out) >= count, timeout_s=30, message="dead letters")
        return out


def test_distance_arithmetic() -> None:
    counts = {0: 2, 1: 2, 2: 3}.__getitem__
    # records r0 r1 | r2 r3 | r4 r5 r6, next = first offset of item 3
    high = 3 << 16
    assert records_between(0, high, counts) == 7
    assert records_between(1 << 16 | 1, high, counts) == 4
    assert records_between(2 << 16, 2 << 16 | 2, counts) == 2
    # at most 2 records behind r6: r4 (r5 and r6 after it) is the lowest
    assert distance_floor(0, high, 2, counts) == 2 << 16
    assert distance_floor(0, high, 3, counts) == 1 << 16 | 1
    assert distance_floor(0, high, 100, counts) == 0
    assert distance_floor(0, 2 << 16 | 2, 1, counts) == 2 << 16  # r4 r5 acquired of item 2


def test_shared_poison_retried_again_and_again_is_dead_lettered_by_distance(grid: Grid, unique_name: str) -> None:
    stream = _stream(grid, unique_name, 20)
    dlq = unique_name + "-dlq"
    with SharedSubscriber(
        grid,
        stream,
        group="a",
        initial_offset_scheme="earliest",
        max_poll_records=2,
        dead_letter_stream=dlq,
        dead_letter_after=DISTANCE,
        max_deliveries=1000,  # the delivery limit stays out of the way: the distance ends the poison
    ) as member:
        acked: list[str] = []
        deliveries_of_poison = 0

        def step() -> bool:
            nonlocal deliveries_of_poison
            batch = list(member.poll(100))
            poison = [r for r in batch if r.value == b"r1"]
            deliveries_of_poison += len(poison)
            member.nack(poison)  # r1 always fails: released at once, and back in the next poll
            good = [r for r in batch if r.value != b"r1"]
            member.ack(good)
            acked.extend(r.value.decode() for r in good)
            return len(acked) >= 19

        wait_until(step, timeout_s=60, message="every other record acknowledged")
        figures = member.metrics()
    print(f"shared: poison r1 delivered {deliveries_of_poison} times, then more than {DISTANCE} records behind")
    assert sorted(acked, key=lambda v: int(v[1:])) == [f"r{i}" for i in range(20) if i != 1]
    # each poll hands r1 out with one fresh record: at its 7th delivery r1 is 5 records behind (r2..r6), at the
    # next acquisition 6, more than dead_letter_after
    assert deliveries_of_poison == DISTANCE + 2
    assert figures["distance_dead_letters"] == 1 and figures["dead_lettered_records"] == 1
    (letter,) = _letters(grid, dlq, 1)
    headers = dict(letter.headers)
    assert letter.value == b"r1" and headers["h"] == b"1" and headers[HEADER_SOURCE_GROUP] == b"a"
    assert b"dead_letter_after=5" in headers[HEADER_ERROR]
    share = LaneShare.decode(_entry(grid, SHARE_MAP, lane_key(stream, "a", 0)), "entry")
    assert share.spans == () and share.start == share.next  # the lane moved on: nothing held back


def test_shared_poison_held_back_by_a_delay_is_dead_lettered_by_distance(grid: Grid, unique_name: str) -> None:
    stream = _stream(grid, unique_name, 12)
    dlq = unique_name + "-dlq"
    with SharedSubscriber(
        grid,
        stream,
        group="a",
        initial_offset_scheme="earliest",
        max_poll_records=1,
        dead_letter_stream=dlq,
        dead_letter_after=DISTANCE,
    ) as member:
        first = list(member.poll(5000))
        assert [r.value for r in first] == [b"r0"]
        member.nack(first, delay_ms=600_000)  # held back for ten minutes: without the distance, for good
        acked: list[str] = []

        def step() -> bool:
            batch = list(member.poll(100))
            member.ack(batch)
            acked.extend(r.value.decode() for r in batch)
            return len(acked) >= 11

        wait_until(step, timeout_s=60, message="the records after the held one")
        assert member.metrics()["distance_dead_letters"] == 1
    assert "r0" not in acked
    (letter,) = _letters(grid, dlq, 1)
    assert letter.value == b"r0" and dict(letter.headers)["h"] == b"0"


def test_exclusive_record_nacked_too_far_behind_is_dead_lettered_and_the_lane_moves_on(
    grid: Grid, unique_name: str
) -> None:
    stream = _stream(grid, unique_name, 20)
    dlq = unique_name + "-dlq"
    with Subscriber(
        grid, stream, group="a", initial_offset_scheme="earliest", dead_letter_stream=dlq, dead_letter_after=DISTANCE
    ) as member:
        wait_until(member.is_assigned, timeout_s=30)
        batch: list[Record] = []
        wait_until(lambda: batch.extend(member.poll(100)) or len(batch) >= 20, timeout_s=30)
        # r2 failed, the rest of the batch was processed: r2 is 17 records behind r19
        member.nack(batch[2], delay_ms=60_000)
        stored = read_offset(grid.map(OFFSETS_MAP), stream, "a", 0)
        assert stored is not None and stored.offset == batch[3].offset and stored.not_before_ms == 0
        again: list[Record] = []
        wait_until(lambda: again.extend(member.poll(100)) or len(again) >= 17, timeout_s=30, message="r3..r19")
        assert [r.value for r in again] == [f"r{i}".encode() for i in range(3, 20)]
        # r16 is near enough (3 records behind r19): rewound to with the delay, not dead-lettered
        member.nack(again[13], delay_ms=1)
        stored = read_offset(grid.map(OFFSETS_MAP), stream, "a", 0)
        assert stored is not None and stored.offset == again[13].offset
        assert member.metrics()["dead_lettered_records"] == 1
    (letter,) = _letters(grid, dlq, 1)
    headers = dict(letter.headers)
    assert letter.value == b"r2" and headers["h"] == b"2" and headers[HEADER_SOURCE_GROUP] == b"a"
    assert headers[HEADER_SOURCE_OFFSET] == str(batch[2].offset).encode()
    assert b"dead_letter_after=5" in headers[HEADER_ERROR]


def test_exclusive_settings_belong_to_the_group(grid: Grid, unique_name: str) -> None:
    stream = _stream(grid, unique_name, 2)
    dlq = unique_name + "-dlq"
    with Subscriber(grid, stream, group="a", dead_letter_stream=dlq, dead_letter_after=DISTANCE) as first:
        assert first.dead_letter_after == DISTANCE
    with Subscriber(grid, stream, group="a") as later:  # gives none: uses the group's
        assert later.dead_letter_after == DISTANCE and later.group_dead_letter_stream == dlq
    with pytest.raises(ConfigError, match="dead_letter_after=5 with dead_letter_stream"):
        Subscriber(grid, stream, group="a", dead_letter_stream=dlq, dead_letter_after=DISTANCE + 1)
    assert grid.map(OFFSETS_MAP).get(exclusive_settings_key(stream, "a")) is not None
    forget_groups(grid, stream, "a")
    assert grid.map(OFFSETS_MAP).get(exclusive_settings_key(stream, "a")) is None


def test_shared_settings_store_the_distance(grid: Grid, unique_name: str) -> None:
    stream = _stream(grid, unique_name, 2)
    dlq = unique_name + "-dlq"
    with SharedSubscriber(grid, stream, group="a", dead_letter_stream=dlq, dead_letter_after=DISTANCE):
        pass
    assert b"dead_letter_after" in _entry(grid, SHARE_MAP, settings_key(stream, "a")).encode()
    with SharedSubscriber(grid, stream, group="a") as later:
        assert later.dead_letter_after == DISTANCE
    with pytest.raises(ConfigError, match="dead_letter_after"):
        SharedSubscriber(grid, stream, group="a", dead_letter_stream=dlq, dead_letter_after=DISTANCE + 1)


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "5"])
def test_bad_distances_are_clear_errors(grid: Grid, unique_name: str, value: object) -> None:
    stream = _stream(grid, unique_name, 1)
    dlq = unique_name + "-dlq"
    with pytest.raises(ConfigError, match="dead_letter_after must be an integer"):
        SharedSubscriber(grid, stream, group="a", dead_letter_stream=dlq, dead_letter_after=value)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="dead_letter_after must be an integer"):
        Subscriber(grid, stream, group="a", dead_letter_stream=dlq, dead_letter_after=value)  # type: ignore[arg-type]


def test_a_distance_needs_a_dead_letter_stream_and_a_group(grid: Grid, unique_name: str) -> None:
    stream = _stream(grid, unique_name, 1)
    with pytest.raises(ConfigError, match="needs a dead_letter_stream"):
        SharedSubscriber(grid, stream, group="a", dead_letter_after=DISTANCE)
    with pytest.raises(ConfigError, match="needs a dead_letter_stream"):
        Subscriber(grid, stream, group="a", dead_letter_after=DISTANCE)
    with pytest.raises(ConfigError, match="needs a group"):
        Subscriber(grid, stream, dead_letter_stream=unique_name + "-dlq", dead_letter_after=DISTANCE)
    assert grid.map(SHARE_MAP).get(settings_key(stream, "a")) is None  # nothing stored
    assert grid.map(OFFSETS_MAP).get(exclusive_settings_key(stream, "a")) is None
