"""Delayed redelivery: ``nack(records, delay_ms=...)`` on shared and exclusive group members.

A nacked record comes back no earlier than the delay (measured and printed), only the group that nacked is held
back (a second group and an ungrouped subscriber read the record meanwhile), the delay survives the nacking member
being SIGKILLed (the not-before instant is stored in the grid), and bad arguments are clear errors.
"""

from __future__ import annotations

import time

import pytest

from meteor_spark.consumer.shared_subscriber import SharedSubscriber
from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.errors import ConfigError, GroupError
from meteor_spark.format.offsets import first_offset_of
from meteor_spark.format.records import Record
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.streams import StreamConfig, open_stream
from meteor_spark.groups.exclusive import GroupMember
from meteor_spark.groups.redelivery import MAX_NACK_DELAY_MS
from meteor_spark.groups.shared_state import AVAILABLE, SHARE_MAP, LaneShare, Span
from meteor_spark.groups.store import OFFSETS_MAP, ConfirmedOffset, lane_key, read_offset
from meteor_spark.producer.publisher import Publisher
from meteor_spark.testing import wait_until
from tests.core.processes import Child

DELAY_MS = 1500


def _entry(grid: Grid, name: str, key: str) -> str:
    """The text of an entry the test expects in map ``name``."""
    text = grid.map(name).get(key)
    assert text is not None, f"no entry {key} in map {name}"
    return text


def _stream(grid: Grid, name: str, count: int, first: int = 0) -> str:
    info = open_stream(grid, StreamConfig(name, lanes=1, capacity=1000))
    with Publisher(grid, info.name) as publisher:
        publisher.publish_many([Record(f"r{i}".encode(), lane=0) for i in range(first, first + count)]).result(30)
    return info.name


def _publish(grid: Grid, stream: str, first: int, count: int) -> None:
    with Publisher(grid, stream) as publisher:
        publisher.publish_many([Record(f"r{i}".encode(), lane=0) for i in range(first, first + count)]).result(30)


def _values(records: object) -> list[str]:
    return [r.value.decode() for r in records]  # type: ignore[attr-defined]


def _read_all(reader: Subscriber | SharedSubscriber, count: int) -> list[str]:
    """Poll ``reader`` until it delivered ``count`` records (acknowledging a shared member's)."""
    got: list[str] = []

    def more() -> bool:
        batch = reader.poll(100)
        got.extend(_values(batch))
        if isinstance(reader, SharedSubscriber) and batch:
            reader.ack(batch)
        return len(got) >= count

    wait_until(more, timeout_s=30, message=f"{count} records")
    return got


def test_shared_nack_with_delay_comes_back_no_earlier_and_holds_only_that_record_of_that_group(
    grid: Grid, unique_name: str
) -> None:
    stream = _stream(grid, unique_name, 10)
    with (
        SharedSubscriber(grid, stream, group="a", initial_offset_scheme="earliest", max_poll_records=10) as member,
        SharedSubscriber(grid, stream, group="b", initial_offset_scheme="earliest") as other_group,
        Subscriber(grid, stream, initial_offset_scheme="earliest") as ungrouped,
    ):
        batch = list(member.poll(5000))
        assert _values(batch) == [f"r{i}" for i in range(10)]
        started = time.monotonic()
        member.nack(batch[0], delay_ms=DELAY_MS)
        member.ack(batch[1:])
        # the lane entry holds the instant: the other records of the lane flow to the group meanwhile
        share = LaneShare.decode(_entry(grid, SHARE_MAP, lane_key(stream, "a", 0)), "entry")
        assert [s.not_before > 0 for s in share.available()] == [True]
        _publish(grid, stream, 10, 5)
        flowing = _read_all(member, 5)
        assert flowing == [f"r{i}" for i in range(10, 15)]
        assert time.monotonic() - started < DELAY_MS / 1000, "the fresh records waited for the delayed one"
        # another group and an ungrouped subscriber read r0 while group a waits for it
        assert "r0" in _read_all(other_group, 15)
        assert "r0" in _read_all(ungrouped, 15)
        held_back = time.monotonic() - started
        assert held_back < DELAY_MS / 1000
        back: list[Record] = []
        wait_until(lambda: back.extend(member.poll(100)) or bool(back), timeout_s=30, message="r0 redelivered")
        measured = time.monotonic() - started
        print(f"shared group: nack delay {DELAY_MS} ms, redelivered after {measured * 1000:.0f} ms")
        assert _values(back) == ["r0"] and back[0].delivery_count == 2  # type: ignore[attr-defined]
        assert measured >= DELAY_MS / 1000
        member.ack(back)
        assert member.metrics()["delayed_records"] == 1
        assert member.metrics()["released_records"] == 1


def test_exclusive_nack_with_delay_rewinds_and_pauses_the_lane_for_that_group_only(
    grid: Grid, unique_name: str
) -> None:
    stream = _stream(grid, unique_name, 10)
    with (
        Subscriber(grid, stream, group="a", initial_offset_scheme="earliest") as member,
        Subscriber(grid, stream, group="b", initial_offset_scheme="earliest") as other_group,
        Subscriber(grid, stream, initial_offset_scheme="earliest") as ungrouped,
    ):
        wait_until(member.is_assigned, timeout_s=30)
        batch = _read_all(member, 10)
        assert batch == [f"r{i}" for i in range(10)]
        records = _records_of(grid, stream, 10)
        started = time.monotonic()
        member.nack(records[3], delay_ms=DELAY_MS)
        # the group's offset is at r3 (r0..r2 count as processed), with the pause stored beside it
        stored = read_offset(grid.map(OFFSETS_MAP), stream, "a", 0)
        assert stored is not None and stored.offset == records[3].offset
        # high: one past r9 (the first record of the next ring item when r9 ends its item)
        assert stored.not_before_ms > 0 and stored.high in (records[9].offset + 1, first_offset_of(1))
        # the other group and the ungrouped subscriber read on while group a is paused
        assert _read_all(other_group, 10)[3] == "r3"
        assert _read_all(ungrouped, 10)[3] == "r3"
        _publish(grid, stream, 10, 2)
        paused = list(member.poll(200))
        assert paused == [] or time.monotonic() - started >= DELAY_MS / 1000
        back: list[str] = []
        wait_until(lambda: back.extend(_values(member.poll(100))) or len(back) >= 9, timeout_s=30, message="r3..r11")
        measured = time.monotonic() - started
        print(f"exclusive group: nack delay {DELAY_MS} ms, lane read again after {measured * 1000:.0f} ms")
        assert back == [f"r{i}" for i in range(3, 12)]
        assert measured >= DELAY_MS / 1000
        member.confirm()
        stored = read_offset(grid.map(OFFSETS_MAP), stream, "a", 0)
        assert stored is not None and stored.not_before_ms == 0 and stored.high is None
        assert member.metrics()["delayed_records"] == 1


def _records_of(grid: Grid, stream: str, count: int) -> list[Record]:
    """The stream's first ``count`` records as a fresh ungrouped reader sees them (offsets, lane, stream)."""
    with Subscriber(grid, stream, initial_offset_scheme="earliest") as reader:
        out: list[Record] = []
        wait_until(lambda: out.extend(reader.poll(100)) or len(out) >= count, timeout_s=30)
        return out


def test_a_record_is_nacked_by_the_exclusive_group_member_that_delivered_it(grid: Grid, unique_name: str) -> None:
    stream = _stream(grid, unique_name, 3)
    with Subscriber(grid, stream, group="a", initial_offset_scheme="earliest", max_poll_records=2) as member:
        wait_until(member.is_assigned, timeout_s=30)
        batch = list(member.poll(5000))
        assert len(batch) == 2
        records = _records_of(grid, stream, 3)
        with pytest.raises(ConfigError, match="not all delivered"):
            member.nack(records[2])  # not delivered yet
        member.confirm()
        with pytest.raises(ConfigError, match="confirmed"):
            member.nack(batch[0])  # confirmed already
    with Subscriber(grid, stream, initial_offset_scheme="earliest") as ungrouped, pytest.raises(GroupError):
        ungrouped.nack(batch[0])


@pytest.mark.parametrize("delay", [-1, MAX_NACK_DELAY_MS + 1, 1.5, True, "10"])
def test_bad_delays_are_clear_errors_and_nothing_is_written(grid: Grid, unique_name: str, delay: object) -> None:
    stream = _stream(grid, unique_name, 2)
    with SharedSubscriber(grid, stream, group="a", initial_offset_scheme="earliest") as member:
        batch = member.poll(5000)
        with pytest.raises(ConfigError, match="delay_ms"):
            member.nack(batch, delay_ms=delay)  # type: ignore[arg-type]
        assert member.held() == 2
        member.ack(batch)
    with Subscriber(grid, stream, group="a", initial_offset_scheme="earliest") as grouped:
        wait_until(grouped.is_assigned, timeout_s=30)
        records = _read_all(grouped, 2)
        assert records == ["r0", "r1"]
        with pytest.raises(ConfigError, match="delay_ms"):
            grouped.nack(_records_of(grid, stream, 2), delay_ms=delay)  # type: ignore[arg-type]
        assert grouped.position(0) > 0


# A member that nacks r0 with a delay, says when (wall ms before the nack) and waits to be killed.
SHARED_NACKER = r"""
import sys, time
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.consumer.shared_subscriber import SharedSubscriber
address, cluster, stream, delay = sys.argv[1:5]
grid = Grid(GridSettings(members=(address,), cluster_name=cluster))
member = SharedSubscriber(grid, stream, group="g", initial_offset_scheme="earliest", acquisition_timeout_ms=1000)
batch = []
while not batch:
    batch = list(member.poll(100))
member.ack(batch[1:])
before = time.time_ns() // 1_000_000
member.nack(batch[0], delay_ms=int(delay))
print(before, flush=True)
time.sleep(600)
"""

# A grouped member that reads r0..r9, nacks r2 with a delay, says when and waits to be killed.
EXCLUSIVE_NACKER = r"""
import sys, time
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.consumer.subscriber import Subscriber
address, cluster, stream, delay = sys.argv[1:5]
grid = Grid(GridSettings(members=(address,), cluster_name=cluster))
member = Subscriber(grid, stream, group="g", initial_offset_scheme="earliest", lease_ms=1000, member_id="nacker")
batch = []
while len(batch) < 10:
    batch.extend(member.poll(100))
before = time.time_ns() // 1_000_000
member.nack(batch[2], delay_ms=int(delay))
print(before, flush=True)
time.sleep(600)
"""

KILL_DELAY_MS = 4000


@pytest.mark.fault
def test_a_shared_delay_survives_the_nacking_member_being_sigkilled(
    grid: Grid, grid_settings: GridSettings, unique_name: str, children: list[Child]
) -> None:
    stream = _stream(grid, unique_name, 5)
    child = Child(SHARED_NACKER, grid_settings.members[0], grid_settings.cluster_name, stream, str(KILL_DELAY_MS))
    children.append(child)
    nacked_at_ms = int(child.read_line(60))
    child.kill()
    killed_at_ms = time.time_ns() // 1_000_000
    with SharedSubscriber(grid, stream, group="g") as survivor:
        back: list[Record] = []
        wait_until(lambda: back.extend(survivor.poll(100)) or bool(back), timeout_s=60, message="r0 after the kill")
        back_ms = time.time_ns() // 1_000_000
        survivor.ack(back)
    print(
        f"shared: member SIGKILLed {killed_at_ms - nacked_at_ms} ms after its nack (delay {KILL_DELAY_MS} ms); "
        f"another member got r0 {back_ms - nacked_at_ms} ms after the nack; lost 0"
    )
    assert _values(back) == ["r0"]
    assert back_ms - nacked_at_ms >= KILL_DELAY_MS


@pytest.mark.fault
def test_an_exclusive_pause_survives_the_nacking_member_being_sigkilled(
    grid: Grid, grid_settings: GridSettings, unique_name: str, children: list[Child]
) -> None:
    stream = _stream(grid, unique_name, 10)
    child = Child(EXCLUSIVE_NACKER, grid_settings.members[0], grid_settings.cluster_name, stream, str(KILL_DELAY_MS))
    children.append(child)
    nacked_at_ms = int(child.read_line(60))
    child.kill()
    killed_at_ms = time.time_ns() // 1_000_000
    stored = ConfirmedOffset.decode(_entry(grid, OFFSETS_MAP, lane_key(stream, "g", 0)), "entry")
    assert stored.not_before_ms >= nacked_at_ms + KILL_DELAY_MS
    with Subscriber(grid, stream, group="g", lease_ms=1000) as survivor:
        back: list[str] = []
        wait_until(lambda: back.extend(_values(survivor.poll(100))) or len(back) >= 8, timeout_s=60, message="r2..r9")
        back_ms = time.time_ns() // 1_000_000
        survivor.confirm()
    print(
        f"exclusive: member SIGKILLed {killed_at_ms - nacked_at_ms} ms after its nack (delay {KILL_DELAY_MS} ms); "
        f"the next member read the lane again {back_ms - nacked_at_ms} ms after the nack, from r2; lost 0"
    )
    assert back == [f"r{i}" for i in range(2, 10)]
    assert back_ms - nacked_at_ms >= KILL_DELAY_MS


def test_the_pause_is_kept_when_another_member_fences_the_lane(grid: Grid, unique_name: str) -> None:
    """A member taking a lane over stamps its epoch on the offsets entry: the pause and high-water mark stay."""
    stream = _stream(grid, unique_name, 1)
    info = open_stream(grid, stream)
    key = lane_key(stream, "g", 0)
    offsets = grid.map(OFFSETS_MAP)
    offsets.put(key, ConfirmedOffset(0, 0, "gone", 0, None, 4_000_000_000_000, 70000).encode())
    with GroupMember(grid, info, "g") as member:
        wait_until(lambda: 0 in member.assignment(), timeout_s=30)
        assert member.hold_of(0) == (4_000_000_000_000, 70000)
        stored = ConfirmedOffset.decode(_entry(grid, OFFSETS_MAP, key), "entry")
        assert stored.epoch >= 1 and stored.not_before_ms == 4_000_000_000_000


def test_a_delayed_span_is_stored_merged_and_read_back() -> None:
    acquired = LaneShare.initial(0).acquire([], "t1", 4)
    released, refused = acquired.settle([(0, 2)], "t1", AVAILABLE, 1_000)
    assert refused == []
    assert [s.encode() for s in released.spans] == [[0, 2, "r", 1, 1_000], [2, 4, "a", 1, "t1"]]
    assert LaneShare.decode(released.encode(), "entry") == released
    # another instant does not merge with it; a plain release keeps the entry's older layout
    both, _ = released.settle([(2, 4)], "t1", AVAILABLE, 2_000)
    assert [s.not_before for s in both.spans] == [1_000, 2_000]
    assert [s.ready(1_500) for s in both.spans] == [True, False]
    plain, _ = acquired.settle([(0, 4)], "t1", AVAILABLE)
    assert plain.encode() == LaneShare(0, 4, (Span(0, 4, AVAILABLE, 1),)).encode()
    assert '"r",1]' in plain.encode()
