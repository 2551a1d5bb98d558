"""Grouped subscribers (Meteor's checklist 6.1 and PubSubTest grouped, corrected): the subscriber side of groups.

Leases, epochs and balancing themselves are tested in ``test_groups*.py``.
"""

from __future__ import annotations

import pytest

from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.errors import ConfigError, FencedError, GroupError
from meteor_spark.format.offsets import first_offset_of, make_offset
from meteor_spark.format.records import Record
from meteor_spark.grid.client import Grid
from meteor_spark.grid.streams import StreamConfig
from meteor_spark.groups.balancing import balance
from meteor_spark.producer.publisher import Publisher
from meteor_spark.testing import wait_until

LEASE_MS = 1500


def _poll_values(sub: Subscriber, count: int, timeout_s: float = 10.0) -> list[bytes]:
    got: list[bytes] = []
    wait_until(
        lambda: got.extend(r.value for r in sub.poll(50)) or len(got) >= count, timeout_s, message=f"{count} records"
    )
    return got


def _publish(grid: Grid, config: StreamConfig, *values: bytes) -> list[int]:
    with Publisher(grid, config) as pub:
        return [pub.publish(v) for v in values]


def test_empty_stream_confirm_without_reads_is_a_no_op(grid: Grid, unique_name: str) -> None:
    with Subscriber(grid, StreamConfig(unique_name), group="g", lease_ms=LEASE_MS) as sub:
        assert len(sub.poll(20)) == 0
        assert sub.is_assigned()
        sub.confirm()
        with pytest.raises(ConfigError, match="was not delivered"):
            sub.confirm(0)
        with pytest.raises(ConfigError, match="invalid"):
            sub.confirm(-1)


def test_confirm_then_the_next_member_resumes_after_it(grid: Grid, unique_name: str) -> None:
    config = StreamConfig(unique_name)
    _publish(grid, config, b"h0", b"h1", b"h2", b"h3")
    first = Subscriber(grid, config, group="g", lease_ms=LEASE_MS)
    batch = first.poll(5000)
    assert [r.value for r in batch] == [b"h0", b"h1", b"h2", b"h3"]
    first.confirm(batch[1])  # h0 and h1 done
    assert first.member.confirmed(0) == first_offset_of(2)
    first.close()
    with Subscriber(grid, config, group="g", lease_ms=LEASE_MS) as second:
        assert _poll_values(second, 2) == [b"h2", b"h3"]
        second.confirm()
        assert second.member.confirmed(0) == first_offset_of(4)


def test_only_one_member_of_a_group_receives(grid: Grid, unique_name: str) -> None:
    config = StreamConfig(unique_name)
    subs = [Subscriber(grid, config, group="g", lease_ms=LEASE_MS) for _ in range(3)]
    try:
        # The lane moves (promptly) while later members join; once it is with its target holder it stays there.
        target = balance([sub.member.member_id for sub in subs], 1)
        wait_until(
            lambda: all(set(sub.member.assignment()) == target[sub.member.member_id] for sub in subs),
            message="the lane with the group's target holder",
        )
        offsets = _publish(grid, config, *[str(i).encode() for i in range(5)])
        assert len(offsets) == 5
        received: dict[int, list[bytes]] = {i: [] for i in range(3)}

        def all_in() -> bool:
            for i, sub in enumerate(subs):
                received[i].extend(r.value for r in sub.poll(20))
            return sum(len(v) for v in received.values()) >= 5

        wait_until(all_in, message="5 records in the group")
        assert sorted(len(v) for v in received.values()) == [0, 0, 5]
        assert [v for v in received.values() if v] == [[str(i).encode() for i in range(5)]]
        assert sum(sub.is_assigned() for sub in subs) == 1
    finally:
        for sub in subs:
            sub.close()


def test_initial_offset_schemes_grouped(grid: Grid, unique_name: str) -> None:
    config = StreamConfig(unique_name)
    _publish(grid, config, b"h0", b"h1")
    with Subscriber(grid, config, group="early", initial_offset_scheme="earliest", lease_ms=LEASE_MS) as early:
        assert _poll_values(early, 2) == [b"h0", b"h1"]
    with Subscriber(grid, config, group="auto", lease_ms=LEASE_MS) as auto:  # AUTO = EARLIEST when grouped
        assert _poll_values(auto, 2) == [b"h0", b"h1"]
        auto.confirm()
    with Subscriber(grid, config, group="late", initial_offset_scheme="latest", lease_ms=LEASE_MS) as late:
        assert len(late.poll(50)) == 0
    with pytest.raises(GroupError, match="no confirmed offset"):
        Subscriber(grid, config, group="never", initial_offset_scheme="none", lease_ms=LEASE_MS)
    # NONE works for a group with a stored offset (the original always threw)
    _publish(grid, config, b"h2")
    with Subscriber(grid, config, group="auto", initial_offset_scheme="none", lease_ms=LEASE_MS) as resumed:
        assert _poll_values(resumed, 1) == [b"h2"]


def test_two_groups_read_independently(grid: Grid, unique_name: str) -> None:
    config = StreamConfig(unique_name)
    with (
        Subscriber(grid, config, group="a", lease_ms=LEASE_MS) as a,
        Subscriber(grid, config, group="b", lease_ms=LEASE_MS) as b,
    ):
        _publish(grid, config, b"x", b"y")
        assert _poll_values(a, 2) == [b"x", b"y"]
        assert _poll_values(b, 2) == [b"x", b"y"]


def test_deactivate_hands_over_and_reactivate_resumes_at_the_confirmed_offset(grid: Grid, unique_name: str) -> None:
    config = StreamConfig(unique_name)
    s0 = Subscriber(grid, config, group="g", lease_ms=LEASE_MS)
    s1 = Subscriber(grid, config, group="g", lease_ms=LEASE_MS)
    try:
        holder, standby = (s0, s1) if s0.is_assigned() else (s1, s0)
        assert not standby.is_assigned()
        _publish(grid, config, b"h0", b"h1", b"h2", b"h3")
        batch = holder.poll(5000)
        assert [r.value for r in batch][:2] == [b"h0", b"h1"]
        holder.confirm(batch[1])
        holder.deactivate()
        assert not holder.is_assigned() and len(holder.poll(20)) == 0
        assert _poll_values(standby, 2) == [b"h2", b"h3"]  # resumes after the confirmed h1
        standby.confirm(make_offset(2, 0))  # h2 done
        standby.deactivate()
        holder.reactivate()
        assert _poll_values(holder, 1) == [b"h3"]
    finally:
        s0.close()
        s1.close()


def test_group_seek_moves_the_group_offset_backwards(grid: Grid, unique_name: str) -> None:
    config = StreamConfig(unique_name)
    offsets = _publish(grid, config, b"h0", b"h1", b"h2")
    with Subscriber(grid, config, group="g", lease_ms=LEASE_MS) as sub:
        assert _poll_values(sub, 3) == [b"h0", b"h1", b"h2"]
        sub.confirm()
        sub.seek(offsets[1])
        assert sub.member.confirmed(0) == offsets[1]
        assert _poll_values(sub, 2) == [b"h1", b"h2"]


def test_a_deposed_member_cannot_confirm_and_stops_delivering(grid: Grid, unique_name: str) -> None:
    config = StreamConfig(unique_name)
    _publish(grid, config, b"h0")
    old = Subscriber(grid, config, group="g", lease_ms=LEASE_MS)
    try:
        assert _poll_values(old, 1) == [b"h0"]
        record = Record(b"h0", offset=0, lane=0)
        member = old.member
        member._stop.set()  # its renewals stop, as in a long GC pause or a hung process
        member._thread.join()
        with Subscriber(grid, config, group="g", lease_ms=LEASE_MS) as new:
            assert _poll_values(new, 1, timeout_s=5 * LEASE_MS / 1000) == [b"h0"]
            new.confirm()
            with pytest.raises(FencedError):
                old.confirm(record)
            _publish(grid, config, b"h1")
            assert _poll_values(new, 1) == [b"h1"]
            assert len(old.poll(100)) == 0  # the lease is re-validated before delivering
            assert new.member.confirmed(0) == first_offset_of(1)
    finally:
        old.close()
