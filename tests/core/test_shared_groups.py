"""Shared groups (queue semantics, KIP-932 style): acquisition, ack/nack/reject, timeouts, delivery counts, dead
letters, more members than lanes. Against the real client over TCP (embedded member or a real Hazelcast)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator

import pytest

from meteor_spark.consumer.shared_groups import SharedRecord
from meteor_spark.consumer.shared_subscriber import SharedSubscriber
from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.errors import ConfigError, DeserializationError, FencedError, FormatError
from meteor_spark.format.corrupt import (
    HEADER_DELIVERY_COUNT,
    HEADER_ERROR,
    HEADER_SOURCE_GROUP,
    HEADER_SOURCE_LANE,
    HEADER_SOURCE_OFFSET,
    HEADER_SOURCE_STREAM,
)
from meteor_spark.format.records import Record
from meteor_spark.grid.client import Grid
from meteor_spark.grid.streams import StreamConfig, StreamInfo, open_stream
from meteor_spark.groups.admin import shared_group_state
from meteor_spark.producer.publisher import Publisher
from meteor_spark.testing import wait_until


def _stream(grid: Grid, name: str, count: int, lanes: int = 2, per_item: int = 3) -> StreamInfo:
    info = open_stream(grid, StreamConfig(name, lanes=lanes, capacity=1000))
    with Publisher(grid, name, max_batch_records=per_item) as publisher:
        publisher.publish_many([Record(f"r{i}".encode(), lane=i % lanes) for i in range(count)]).result(30)
    return info


@pytest.fixture
def members(grid: Grid) -> Iterator[list[SharedSubscriber]]:
    made: list[SharedSubscriber] = []
    yield made
    for member in made:
        member.close()


def _member(grid: Grid, stream: str, members: list[SharedSubscriber], **options: object) -> SharedSubscriber:
    member = SharedSubscriber(grid, stream, group="q", **options)  # type: ignore[arg-type]
    members.append(member)
    return member


def _values(records: object) -> list[str]:
    return [r.value.decode() for r in records]  # type: ignore[attr-defined]


def _poll(member: SharedSubscriber, timeout_s: float = 10.0) -> list[SharedRecord]:
    batch = wait_until(lambda: member.poll(50), timeout_s, message=f"records for {member.member_id}")
    assert all(isinstance(r, SharedRecord) for r in batch)
    return list(batch)  # type: ignore[arg-type]


def _dead_letters(grid: Grid, name: str, count: int) -> list[Record]:
    got: list[Record] = []
    with Subscriber(grid, name, initial_offset_scheme="earliest") as reader:
        wait_until(lambda: got.extend(reader.poll(50)) or len(got) >= count, 10, message=f"{count} dead letters")
        assert len(reader.poll(100)) == 0
    return got


def test_more_members_than_lanes_all_get_work_and_every_record_is_acked_once(
    grid: Grid, unique_name: str, members: list[SharedSubscriber]
) -> None:
    info = _stream(grid, unique_name, 60)
    group = [_member(grid, unique_name, members, max_poll_records=4, member_id=f"m{i}") for i in range(4)]
    acked: Counter[str] = Counter()
    got_work: Counter[str] = Counter()

    def round_robin() -> bool:
        for member in group:
            batch = member.poll(20)
            if batch:
                got_work[member.member_id] += len(batch)
                member.ack(batch)
                acked.update(_values(batch))
        return sum(acked.values()) >= 60

    wait_until(round_robin, 30, message="60 records acknowledged")
    assert sorted(acked) == sorted(f"r{i}" for i in range(60)) and set(acked.values()) == {1}
    assert sorted(got_work) == ["m0", "m1", "m2", "m3"]  # four members on two lanes all got records
    assert all(len(member.poll(0)) == 0 for member in group)
    states = shared_group_state(grid, info, "q")
    assert [(s.start == s.next, s.acquired_ranges, s.available_ranges) for s in states] == [(True, 0, 0)] * 2


def test_nack_redelivers_at_once_with_delivery_count_two(
    grid: Grid, unique_name: str, members: list[SharedSubscriber]
) -> None:
    _stream(grid, unique_name, 3, lanes=1)
    first = _member(grid, unique_name, members, acquisition_timeout_ms=600_000)
    second = _member(grid, unique_name, members, acquisition_timeout_ms=600_000)
    batch = _poll(first)
    assert _values(batch) == ["r0", "r1", "r2"] and {r.delivery_count for r in batch} == {1}
    assert len(second.poll(0)) == 0  # acquired by the first member
    first.nack(batch[1:])
    again = _poll(second, 2)  # no timeout involved: released records are available at once
    assert _values(again) == ["r1", "r2"] and {r.delivery_count for r in again} == {2}
    first.ack(batch[0])
    second.ack(again)
    assert len(first.poll(0)) == 0 and len(second.poll(0)) == 0
    assert (first.acked_records, first.released_records, second.acked_records) == (1, 2, 2)


def test_an_unacknowledged_acquisition_times_out_and_its_late_ack_is_refused(
    grid: Grid, unique_name: str, members: list[SharedSubscriber]
) -> None:
    info = _stream(grid, unique_name, 4, lanes=1, per_item=2)
    slow = _member(grid, unique_name, members, acquisition_timeout_ms=300, member_id="slow")
    other = _member(grid, unique_name, members, acquisition_timeout_ms=300, member_id="other")
    taken = _poll(slow)
    assert _values(taken) == ["r0", "r1", "r2", "r3"]
    again = _poll(other, 10)  # after the 300 ms acquisition timeout, as the other member observes it
    assert _values(again) == ["r0", "r1", "r2", "r3"] and {r.delivery_count for r in again} == {2}
    with pytest.raises(FencedError, match="no longer holds them"):
        slow.ack(taken)
    assert slow.refused_records == 4 and slow.held() == 0
    other.ack(again)  # the one acknowledgement that counts
    (state,) = shared_group_state(grid, info, "q")
    assert state.start == state.next and state.acquired_ranges == 0
    with pytest.raises(ConfigError, match="not held by member 'other'"):
        other.ack(again)  # acknowledged already: refused locally, nothing written


def test_an_acquisition_timed_out_but_not_taken_can_still_be_acknowledged(
    grid: Grid, unique_name: str, members: list[SharedSubscriber]
) -> None:
    _stream(grid, unique_name, 2, lanes=1)
    member = _member(grid, unique_name, members, acquisition_timeout_ms=100)
    batch = _poll(member)
    member.ack(batch)  # nobody looked at the lane after the timeout: the acquisition is still the stored one
    assert member.acked_records == 2


def test_max_deliveries_sends_a_record_to_the_dead_letter_stream_with_its_headers(
    grid: Grid, unique_name: str, members: list[SharedSubscriber]
) -> None:
    info = _stream(grid, unique_name, 2, lanes=1, per_item=2)
    dlq = unique_name + "-dlq"
    member = _member(grid, unique_name, members, max_deliveries=2, dead_letter_stream=dlq)
    first = _poll(member)
    assert _values(first) == ["r0", "r1"] and [r.delivery_count for r in first] == [1, 1]
    member.ack(first[0])
    member.nack(first[1])
    second = _poll(member)
    assert _values(second) == ["r1"] and second[0].delivery_count == 2
    member.nack(second)
    assert len(member.poll(200)) == 0  # r1 was delivered twice: archived instead of a third delivery
    assert member.dead_lettered_records == 1
    (letter,) = _dead_letters(grid, dlq, 1)
    headers = dict(letter.headers)
    assert letter.value == b"r1"
    assert headers[HEADER_SOURCE_STREAM] == info.name.encode() and headers[HEADER_SOURCE_LANE] == b"0"
    assert headers[HEADER_SOURCE_OFFSET] == str(first[1].offset).encode()
    assert headers[HEADER_SOURCE_GROUP] == b"q" and headers[HEADER_DELIVERY_COUNT] == b"2"
    assert b"max_deliveries=2" in headers[HEADER_ERROR]
    (state,) = shared_group_state(grid, info, "q")
    assert state.start == state.next  # archived counts as settled: the start moved past it


def test_a_lock_that_expires_at_the_last_delivery_dead_letters_the_record_instead_of_redelivering_it(
    grid: Grid, unique_name: str, members: list[SharedSubscriber]
) -> None:
    _stream(grid, unique_name, 2, lanes=1, per_item=2)
    dlq = unique_name + "-dlq"
    dead = _member(
        grid,
        unique_name,
        members,
        max_deliveries=1,
        acquisition_timeout_ms=300,
        dead_letter_stream=dlq,
        member_id="dead",
    )
    other = _member(
        grid,
        unique_name,
        members,
        max_deliveries=1,
        acquisition_timeout_ms=300,
        dead_letter_stream=dlq,
        member_id="other",
    )
    assert [r.delivery_count for r in _poll(dead)] == [1, 1]  # and never settled: its process is gone
    redelivered: list[Record] = []
    wait_until(
        lambda: redelivered.extend(other.poll(50)) or other.dead_lettered_records == 2,
        10,
        message="the expired records archived by the other member",
    )
    assert redelivered == []
    letters = _dead_letters(grid, dlq, 2)
    assert sorted(_values(letters)) == ["r0", "r1"]
    assert {dict(r.headers)[HEADER_DELIVERY_COUNT] for r in letters} == {b"1"}


def test_reject_dead_letters_at_once(grid: Grid, unique_name: str, members: list[SharedSubscriber]) -> None:
    _stream(grid, unique_name, 3, lanes=1)
    dlq = unique_name + "-dlq"
    member = _member(grid, unique_name, members, dead_letter_stream=dlq)
    batch = _poll(member)
    member.reject(batch[1])
    member.ack([batch[0], batch[2]])
    (letter,) = _dead_letters(grid, dlq, 1)
    assert letter.value == b"r1" and b"rejected" in dict(letter.headers)[HEADER_ERROR]
    assert len(member.poll(100)) == 0
    assert member.rejected_records == 1


def test_close_releases_what_was_not_settled(grid: Grid, unique_name: str, members: list[SharedSubscriber]) -> None:
    _stream(grid, unique_name, 3, lanes=1)
    first = _member(grid, unique_name, members, acquisition_timeout_ms=600_000)
    batch = _poll(first)
    first.ack(batch[0])
    first.close()
    second = _member(grid, unique_name, members, acquisition_timeout_ms=600_000)
    again = _poll(second, 2)
    assert _values(again) == ["r1", "r2"] and {r.delivery_count for r in again} == {2}


def test_shared_options_are_checked(grid: Grid, unique_name: str, members: list[SharedSubscriber]) -> None:
    _stream(grid, unique_name, 1, lanes=1)
    with pytest.raises(ConfigError, match="SharedSubscriber needs a group"):
        SharedSubscriber(grid, unique_name)
    with pytest.raises(ConfigError, match="max_deliveries=3 needs a dead_letter_stream"):
        SharedSubscriber(grid, unique_name, group="q", max_deliveries=3)
    with pytest.raises(ConfigError, match=r"not supported by a shared group member \(SharedSubscriber\): lease_ms"):
        SharedSubscriber(grid, unique_name, group="q", lease_ms=1000)
    with pytest.raises(ConfigError, match="is the stream being read"):
        SharedSubscriber(grid, unique_name, group="q", dead_letter_stream=unique_name)
    with pytest.raises(ConfigError, match="acquisition_timeout_ms must be an integer"):
        SharedSubscriber(grid, unique_name, group="q", acquisition_timeout_ms=0)
    member = _member(grid, unique_name, members)
    with pytest.raises(ConfigError, match="reject needs a dead_letter_stream"):
        member.reject(_poll(member))
    with pytest.raises(ConfigError, match="not held"):
        member.ack(Record(b"x", offset=99 << 16, lane=0, stream=unique_name))
    with pytest.raises(ConfigError, match="max_deliveries: only for shared groups; use SharedSubscriber"):
        Subscriber(grid, unique_name, group="q", max_deliveries=3)
    with Subscriber(grid, unique_name) as plain:
        assert not isinstance(plain, SharedSubscriber)  # the default is untouched


def test_a_shared_member_is_a_shared_subscriber_and_isinstance_says_so(grid: Grid, unique_name: str) -> None:
    """``SharedSubscriber`` is its own type (no positions, records settled one by one): ``isinstance`` tells the
    truth for both spellings, and the older ``Subscriber(shared=True)`` still works with a ``DeprecationWarning``."""
    _stream(grid, unique_name, 1, lanes=1)
    with SharedSubscriber(grid, unique_name, group="q") as member:
        assert isinstance(member, SharedSubscriber) and not isinstance(member, Subscriber)
        assert not hasattr(member, "confirm") and not hasattr(member, "seek")
    with pytest.warns(DeprecationWarning, match=r"construct it as SharedSubscriber\(grid, stream, group=\.\.\."):
        older = Subscriber(grid, unique_name, group="q", shared=True)
    try:
        assert type(older) is SharedSubscriber and not isinstance(older, Subscriber)
        assert [r.value for r in _poll(older)] == [b"r0"]
    finally:
        older.close()
    with Subscriber(grid, unique_name, group="g") as exclusive:
        assert isinstance(exclusive, Subscriber) and not isinstance(exclusive, SharedSubscriber)


def test_records_overwritten_before_they_were_settled_are_data_loss_not_a_silent_skip(
    grid: Grid, unique_name: str, members: list[SharedSubscriber]
) -> None:
    from meteor_spark.errors import DataLossError

    open_stream(grid, StreamConfig(unique_name, lanes=1, capacity=4))
    with Publisher(grid, unique_name, max_batch_records=1) as publisher:
        publisher.publish(b"first")
        holder = _member(grid, unique_name, members, acquisition_timeout_ms=600_000)
        taken = _poll(holder)
        for n in range(8):  # the ring (4 items) overwrites the held record's item
            publisher.publish(f"later-{n}".encode())
    holder.nack(taken)
    other = _member(grid, unique_name, members)
    with pytest.raises(DataLossError, match="no longer available"):
        other.poll(100)


def test_one_member_with_a_backlog_on_every_lane_takes_turns_over_the_lanes(
    grid: Grid, unique_name: str, members: list[SharedSubscriber]
) -> None:
    _stream(grid, unique_name, 40)  # 20 records per lane: more than one poll's worth on each
    member = _member(grid, unique_name, members, max_poll_records=5)
    lanes = []
    for _ in range(4):
        batch = _poll(member)
        lanes.append({r.lane for r in batch})
        member.ack(batch)
    assert lanes in ([{0}, {1}, {0}, {1}], [{1}, {0}, {1}, {0}])  # no lane waits for the other to drain


def test_a_group_position_past_the_lanes_end_is_an_error_and_deleting_the_stream_forgets_the_group(
    grid: Grid, unique_name: str, members: list[SharedSubscriber]
) -> None:
    from meteor_spark.errors import OffsetOutOfRangeError
    from meteor_spark.format.offsets import first_offset_of
    from meteor_spark.groups.admin import delete_stream
    from meteor_spark.groups.shared_state import SHARE_MAP, LaneShare
    from meteor_spark.groups.store import lane_key

    info = _stream(grid, unique_name, 4, lanes=1, per_item=1)
    # As left by a stream deleted and re-created behind the tools' back: the group stands past the lane's end.
    grid.map(SHARE_MAP).put(lane_key(unique_name, "q", 0), LaneShare.initial(first_offset_of(50)).encode())
    member = _member(grid, unique_name, members)
    with pytest.raises(OffsetOutOfRangeError, match="where shared group 'q' stands"):
        member.poll(100)  # never a silent wait that passes over the records written below the group's position
    member.close()
    assert delete_stream(grid, unique_name)
    assert [s.start for s in shared_group_state(grid, info, "q")] == [None]  # the group's entry went with it
    _stream(grid, unique_name, 2, lanes=1)
    again = _member(grid, unique_name, members)
    assert _values(_poll(again)) == ["r0", "r1"]


def test_lock_duration_delivery_limit_and_dead_letter_stream_are_group_settings(
    grid: Grid, unique_name: str, members: list[SharedSubscriber]
) -> None:
    """The first member stores the group's settings; later members use them, and one asking for other values is
    refused naming both."""
    _stream(grid, unique_name, 2, lanes=1)
    dead = f"{unique_name}-dead"
    first = _member(grid, unique_name, members, acquisition_timeout_ms=300, dead_letter_stream=dead)
    later = _member(grid, unique_name, members)
    assert (later.acquisition_timeout_ms, later.max_deliveries, later.dead_letter_stream) == (300, 5, dead)
    assert later.settings == first.settings
    same = _member(grid, unique_name, members, acquisition_timeout_ms=300, max_deliveries=5, dead_letter_stream=dead)
    assert same.settings == first.settings
    with pytest.raises(ConfigError, match=r"acquisition_timeout_ms=30000 \(the group has 300\)"):
        _member(grid, unique_name, members, acquisition_timeout_ms=30_000)
    with pytest.raises(ConfigError, match=r"max_deliveries=3 \(the group has 5\).*forget_groups"):
        _member(grid, unique_name, members, max_deliveries=3, dead_letter_stream=dead)


def test_a_dead_members_records_return_after_the_groups_lock_time(
    grid: Grid, unique_name: str, members: list[SharedSubscriber]
) -> None:
    """The member that dies holding records set a 500 ms lock; the survivor gives no lock duration (its own
    default would be 30 s): the records come back after the group's 500 ms."""
    _stream(grid, unique_name, 3, lanes=1)
    doomed = _member(grid, unique_name, members, acquisition_timeout_ms=500, member_id="doomed")
    survivor = _member(grid, unique_name, members, member_id="survivor")
    taken = _poll(doomed)
    assert _values(taken) == ["r0", "r1", "r2"]
    died = time.monotonic()  # the member stops here: it never settles or releases what it holds
    again = _poll(survivor, 10)
    took = time.monotonic() - died
    print(f"records of the dead member redelivered after {took:.2f} s (group lock 0.5 s)")
    assert _values(again) == ["r0", "r1", "r2"] and {r.delivery_count for r in again} == {2}
    assert 0.4 <= took < 5
    survivor.ack(again)


def test_a_holder_renews_the_lock_of_a_slow_record(
    grid: Grid, unique_name: str, members: list[SharedSubscriber]
) -> None:
    """Kafka's RENEW (KIP-1222): renewed before its lock ends, a record stays with its holder for as long as it
    keeps renewing; the other member never gets it, and the holder's ack is accepted."""
    _stream(grid, unique_name, 2, lanes=1)
    slow = _member(grid, unique_name, members, acquisition_timeout_ms=400, member_id="slow")
    other = _member(grid, unique_name, members, member_id="other")
    batch = _poll(slow)
    until = time.monotonic() + 1.6
    while time.monotonic() < until:  # four lock durations
        slow.renew(batch)
        assert len(other.poll(150)) == 0
    slow.ack(batch)
    assert slow.renewed_records >= 8 and slow.acked_records == 2
    assert len(other.poll(600)) == 0
    # A lock that ended and was taken cannot be renewed: refused, nothing written.
    _stream(grid, unique_name, 1, lanes=1)
    late = _poll(slow)
    again = _poll(other, 10)
    assert _values(again) == _values(late)
    with pytest.raises(FencedError, match="renew refused for 1 record"):
        slow.renew(late)
    other.ack(again)


def _with_corrupt_item(grid: Grid, name: str) -> StreamInfo:
    """One lane: an item of two good records, an undecodable item, an item of one good record."""
    info = open_stream(grid, StreamConfig(name, lanes=1, capacity=100))
    ring = grid.ring(info.ring_names[0])
    with Publisher(grid, name) as publisher:
        publisher.publish_many([b"r0", b"r1"]).result(10)
        ring.add(b"XXXX not a meteor item")
        publisher.publish(b"r2")
    return info


def test_an_undecodable_item_stops_the_lane_only_after_the_records_before_it(
    grid: Grid, unique_name: str, members: list[SharedSubscriber]
) -> None:
    """on_corrupt=error (the default): the good records before the item are handed out, then FormatError."""
    _with_corrupt_item(grid, unique_name)
    member = _member(grid, unique_name, members)
    batch = _poll(member)
    assert _values(batch) == ["r0", "r1"]
    member.ack(batch)
    with pytest.raises(FormatError, match="sequence 1"):
        member.poll(0)


@pytest.mark.parametrize("mode", ["skip", "dead_letter"])
def test_an_undecodable_item_is_passed_over_for_the_whole_group(
    grid: Grid, unique_name: str, members: list[SharedSubscriber], mode: str
) -> None:
    """on_corrupt skip or dead_letter: the item is acquired like any other, dead-lettered (dead_letter), marked done
    for the group and counted once; the lane is never blocked."""
    info = _with_corrupt_item(grid, unique_name)
    dead = f"{unique_name}-dead" if mode == "dead_letter" else None
    first = _member(grid, unique_name, members, on_corrupt=mode, dead_letter_stream=dead)
    second = _member(grid, unique_name, members, on_corrupt=mode)
    got: list[str] = []

    def both() -> bool:
        for member in (first, second):
            batch = member.poll(20)
            got.extend(_values(batch))
            member.ack(batch)
        return len(got) >= 3

    wait_until(both, 10, message="the three good records")
    assert sorted(got) == ["r0", "r1", "r2"]
    counted = first.refusals.corrupt_items + second.refusals.corrupt_items
    print(f"on_corrupt={mode}: delivered {len(got)} good records, {counted} undecodable item passed over")
    assert counted == 1
    (state,) = shared_group_state(grid, info, "q")
    assert state.start == state.next
    if dead is not None:
        (letter,) = _dead_letters(grid, dead, 1)
        assert letter.value == b"XXXX not a meteor item"
        assert dict(letter.headers)[HEADER_SOURCE_STREAM] == unique_name.encode()


def test_deserializers_and_on_corrupt_for_shared_members(
    grid: Grid, unique_name: str, members: list[SharedSubscriber]
) -> None:
    """A record the value deserializer refuses: released with on_corrupt=error (DeserializationError when nothing
    before it is handed out), passed over and dead-lettered with dead_letter; the others arrive deserialized."""
    open_stream(grid, StreamConfig(unique_name, lanes=1, capacity=100))
    with Publisher(grid, unique_name, max_batch_records=1, linger_ms=0) as publisher:
        for value in (b'{"n": 1}', b"not json", b'{"n": 3}'):
            publisher.publish(value)
    strict = Subscriber(grid, unique_name, group="strict", shared=True, value_deserializer="json")
    assert isinstance(strict, SharedSubscriber)
    members.append(strict)
    batch = _poll(strict)
    assert [r.value for r in batch] == [{"n": 1}] and batch[0].delivery_count == 1
    strict.ack(batch)
    with pytest.raises(DeserializationError, match="value_deserializer failed on the record at offset"):
        strict.poll(0)
    assert strict.held() == 0  # released, delivered again (delivery count 2) to whoever polls
    dead = f"{unique_name}-dead"
    lenient = Subscriber(
        grid,
        unique_name,
        group="lenient",
        shared=True,
        value_deserializer="json",
        on_corrupt="dead_letter",
        dead_letter_stream=dead,
    )
    assert isinstance(lenient, SharedSubscriber)
    members.append(lenient)
    got: list[object] = []
    wait_until(lambda: got.extend(r.value for r in lenient.poll(20)) or len(got) >= 2, 10, message="2 records")
    assert got == [{"n": 1}, {"n": 3}]
    assert lenient.refusals.undecodable_records == 1 and lenient.held() == 2
    (letter,) = _dead_letters(grid, dead, 1)
    assert letter.value == b"not json"


def test_records_handed_over_survive_close_and_are_settled_by_token_from_another_member(
    grid: Grid, unique_name: str, members: list[SharedSubscriber]
) -> None:
    from meteor_spark.groups.shared_state import DONE

    _stream(grid, unique_name, 12)
    first = _member(grid, unique_name, members, max_poll_records=6)
    records = _poll(first)
    spans = first.hand_over(records)
    assert [(lane, offset) for lane, offset, _, _, _ in spans] == [(r.lane, r.offset) for r in records]
    first.close()  # handed over: not released
    second = _member(grid, unique_name, members)
    rest = _poll(second)
    assert {r.value for r in rest}.isdisjoint({r.value for r in records}) and len(rest) == 12 - len(records)
    second.ack(rest)
    for lane in sorted({s[0] for s in spans}):
        assert second.settle_spans(lane, [(f, e, t) for ln, f, e, _, t in spans if ln == lane], DONE) == []
        again = second.settle_spans(lane, [(f, e, t) for ln, f, e, _, t in spans if ln == lane], DONE)
        assert again  # settled already: refused, nothing written
    assert len(second.poll(100)) == 0  # everything done
