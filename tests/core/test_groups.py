"""Subscriber groups: leases, epochs, fencing, balancing, initial offsets (real client, real TCP).

A member "dies" in two ways here: ``freeze`` stops its renewal thread while the object stays usable (a holder
frozen by a GC pause or cut off by a partition, which still believes it holds its lanes), and ``own_grid`` gives a
member its own client that the test shuts down (the process vanished from the grid's point of view). The real
process kill (SIGKILL) is in ``test_groups_process.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from meteor_spark.errors import (
    ConfigError,
    FencedError,
    FormatError,
    GroupError,
    NotAssignedError,
    OffsetOutOfRangeError,
)
from meteor_spark.format.offsets import InitialOffsetScheme, make_offset, resolve_initial, sequence_of
from meteor_spark.format.records import Record
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.streams import StreamConfig, StreamInfo, open_stream
from meteor_spark.groups.admin import (
    LaneLag,
    forget_groups,
    group_members,
    group_state,
    lag,
    lag_report,
    list_groups,
    seek_group,
)
from meteor_spark.groups.balancing import balance
from meteor_spark.groups.exclusive import GroupMember
from meteor_spark.groups.leases import ExpiryObserver, Lease
from meteor_spark.groups.store import LEASES_MAP, OFFSETS_MAP, Assignment, lane_key
from meteor_spark.producer.publisher import Publisher
from meteor_spark.testing import wait_until

LEASE_MS = 600  # short leases keep failover tests fast; renewals every 200 ms

MakeMember = Callable[..., GroupMember]
Connect = Callable[[], Grid]

# ---------------------------------------------------------------------------------------------------- pure parts

E, L, N, A = (
    InitialOffsetScheme.EARLIEST,
    InitialOffsetScheme.LATEST,
    InitialOffsetScheme.NONE,
    InitialOffsetScheme.AUTO,
)


@pytest.mark.parametrize(
    ("scheme", "grouped", "confirmed", "expected"),
    [
        # ungrouped: a stored offset does not exist for them (ignored); EARLIEST is the head, not literal 0
        (E, False, None, make_offset(5, 0)),
        (L, False, None, make_offset(9, 0)),
        (A, False, None, make_offset(9, 0)),
        (E, False, make_offset(7, 3), make_offset(5, 0)),
        # grouped without a stored offset
        (E, True, None, make_offset(5, 0)),
        (L, True, None, make_offset(9, 0)),
        (A, True, None, make_offset(5, 0)),
        # grouped with a stored offset: every scheme resumes there, NONE included (the original's bug)
        (E, True, make_offset(7, 3), make_offset(7, 3)),
        (L, True, make_offset(7, 3), make_offset(7, 3)),
        (N, True, make_offset(7, 3), make_offset(7, 3)),
        (A, True, make_offset(7, 3), make_offset(7, 3)),
        # a stored offset below head is returned as is: the reader reports the data loss
        (E, True, make_offset(2, 0), make_offset(2, 0)),
        ("latest", True, None, make_offset(9, 0)),
    ],
)
def test_resolve_initial_table(scheme: object, grouped: bool, confirmed: int | None, expected: int) -> None:
    assert resolve_initial(scheme, grouped, confirmed, head_seq=5, next_seq=9) == expected  # type: ignore[arg-type]


def test_resolve_initial_errors_name_the_lane_and_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"NONE needs a group \(lane 2\).*EARLIEST or LATEST"):
        resolve_initial(N, False, None, 0, 0, where="lane 2")
    with pytest.raises(GroupError, match=r"NONE \(lane 3\): the group has no confirmed offset"):
        resolve_initial(N, True, None, 0, 4, where="lane 3")
    with pytest.raises(ConfigError, match="'newest' is not a scheme"):
        resolve_initial("newest", True, None, 0, 0)
    with pytest.raises(ConfigError, match="head_seq=5, next_seq=4"):
        resolve_initial(E, True, None, 5, 4)


def test_resolve_initial_on_an_empty_lane_starts_at_its_end() -> None:
    assert resolve_initial(E, True, None, 3, 3) == resolve_initial(L, True, None, 3, 3) == make_offset(3, 0)


def test_balance_is_even_deterministic_and_order_independent() -> None:
    target = balance(["m-c", "m-a", "m-b"], 4)
    assert target == balance(["m-b", "m-c", "m-a"], 4)
    assert sorted(len(lanes) for lanes in target.values()) == [1, 1, 2]
    assert frozenset().union(*target.values()) == frozenset(range(4))
    assert sum(len(lanes) for lanes in target.values()) == 4  # disjoint
    more_members = balance([f"m{i}" for i in range(5)], 2)
    assert sorted(len(lanes) for lanes in more_members.values()) == [0, 0, 0, 1, 1]
    assert balance([], 4) == {}


def test_assignment_is_a_frozen_mapping_of_lane_to_epoch() -> None:
    assignment = Assignment.of({3: 9, 1: 4})
    assert dict(assignment) == {1: 4, 3: 9} and list(assignment) == [1, 3]
    assert assignment.lanes == frozenset({1, 3}) and 2 not in assignment
    assert assignment == Assignment.of({1: 4, 3: 9}) and hash(assignment) == hash(Assignment.of({3: 9, 1: 4}))
    assert len(Assignment()) == 0
    with pytest.raises(KeyError):
        assignment[2]


def test_lease_encoding_is_canonical_and_versioned() -> None:
    lease = Lease(epoch=3, holder="m1", beat=7, lease_ms=5000, renewed_ms=1)
    text = lease.encode()
    assert text == '{"beat":7,"epoch":3,"holder":"m1","lease_ms":5000,"renewed_ms":1,"v":1}'
    assert Lease.decode(text, "k") == lease
    assert Lease.decode(Lease(epoch=4, holder=None).encode(), "k").vacant
    with pytest.raises(FormatError, match="lease format 2, newer"):
        Lease.decode(text.replace('"v":1', '"v":2'), "k")
    with pytest.raises(FormatError, match="not a meteor lease"):
        Lease.decode("hello", "k")


def test_expiry_is_judged_by_unchanged_value_on_the_observers_clock() -> None:
    now = [100.0]
    observer = ExpiryObserver(clock=lambda: now[0])
    observer.see("k", "v1")
    now[0] += 0.5
    assert not observer.expired("k", "v1", lease_ms=600)
    now[0] += 0.2
    assert observer.expired("k", "v1", lease_ms=600)
    assert not observer.expired("k", "v2", lease_ms=600)  # a renewal restarts the count
    now[0] += 0.7
    assert observer.expired("k", "v2", lease_ms=600)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"want": "everything"}, r"unknown want value 'everything'.*known want values: all, balanced"),
        ({"lease_ms": 0}, r"lease_ms=0 is invalid"),
        ({"lease_ms": 1000, "renew_every_ms": 1000}, r"renew_every_ms=1000 is invalid.*renew_every_ms=333"),
        ({"member_id": ""}, r"member_id '' is not a member id"),
    ],
)
def test_member_options_are_checked(grid: Grid, stream4: StreamInfo, kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        GroupMember(grid, stream4, "g", **kwargs)


# ---------------------------------------------------------------------------------------------------- fixtures


@pytest.fixture
def stream4(grid: Grid, unique_name: str) -> StreamInfo:
    return open_stream(grid, StreamConfig(unique_name, lanes=4, capacity=100))


@pytest.fixture
def stream1(grid: Grid, unique_name: str) -> StreamInfo:
    return open_stream(grid, StreamConfig(unique_name + "-1", lanes=1, capacity=100))


@pytest.fixture
def members(grid: Grid) -> Iterator[MakeMember]:
    """Start members (default lease 600 ms); all are closed at the end of the test."""
    made: list[GroupMember] = []

    def make(info: StreamInfo, group: str, member_id: str, *, on: Grid | None = None, **kwargs: object) -> GroupMember:
        kwargs.setdefault("lease_ms", LEASE_MS)
        member = GroupMember(on or grid, info, group, member_id=member_id, **kwargs)  # type: ignore[arg-type]
        made.append(member)
        member.start()
        return member

    yield make
    for member in made:
        member.close()


@pytest.fixture
def own_grid(grid_settings: GridSettings) -> Iterator[Connect]:
    """Extra client connections (a member on its own connection can be cut off from the grid)."""
    clients: list[Grid] = []

    def connect() -> Grid:
        clients.append(Grid(grid_settings))
        return clients[-1]

    yield connect
    for client in clients:
        try:
            client.close()
        except Exception:  # already shut down by the test
            pass


def freeze(member: GroupMember) -> None:
    """Stop the member's renewal thread, leaving the object usable: a holder frozen by a GC pause or partition."""
    member._stop.set()  # simulating a crash of the thread is what this helper is for
    assert member._thread is not None
    member._thread.join(timeout=10)


def stored_lease(grid: Grid, info: StreamInfo, group: str, lane: int) -> Lease:
    text = grid.map(LEASES_MAP).get(lane_key(info.name, group, lane))
    assert text is not None, f"no lease stored for lane {lane}"
    return Lease.decode(text, "test")


def held(*members: GroupMember) -> list[list[int]]:
    return [sorted(m.assignment()) for m in members]


# ---------------------------------------------------------------------------------------------------- leases


def test_lease_is_renewed_while_alive_and_expires_by_elapsed_time(
    grid: Grid, stream1: StreamInfo, members: MakeMember
) -> None:
    a = members(stream1, "g", "a")
    epoch = a.assignment()[0]
    assert a.is_current(0) and stored_lease(grid, stream1, "g", 0).holder == "a"
    standby = members(stream1, "g", "b", want="all")
    assert standby.assignment() == Assignment()
    # Two full lease periods of renewals (every 200 ms) after the standby started: it had every chance to steal.
    start_beat = stored_lease(grid, stream1, "g", 0).beat
    wait_until(lambda: stored_lease(grid, stream1, "g", 0).beat >= start_beat + 6, 15, message="renewals")
    assert standby.assignment() == Assignment() and a.is_current(0)

    freeze(a)  # stops renewing
    wait_until(lambda: 0 in standby.assignment(), 15, message="takeover after the lease expired")
    assert standby.assignment()[0] == epoch + 1
    assert stored_lease(grid, stream1, "g", 0).holder == "b"
    assert not a.is_current(0)


def test_epoch_grows_on_every_change_of_holder_and_is_never_reused(
    grid: Grid, stream1: StreamInfo, members: MakeMember
) -> None:
    epochs = []
    for i in range(3):
        member = members(stream1, "g", f"m{i}")
        epochs.append(member.assignment()[0])
        member.close()
        assert stored_lease(grid, stream1, "g", 0).vacant  # released, the epoch is kept
    assert epochs == [epochs[0], epochs[0] + 1, epochs[0] + 2]
    # Even when the lease entry is gone, the epoch stored with the offsets keeps it from being reused.
    grid.map(LEASES_MAP).delete(lane_key(stream1.name, "g", 0))
    assert members(stream1, "g", "m9").assignment()[0] == epochs[-1] + 1


def test_deposed_holder_cannot_move_the_offset(grid: Grid, stream1: StreamInfo, members: MakeMember) -> None:
    a = members(stream1, "g", "a")
    a.confirm(0, make_offset(10, 0))
    standby = members(stream1, "g", "b", want="all")
    freeze(a)  # a still believes it holds lane 0
    wait_until(lambda: 0 in standby.assignment(), 15, message="takeover")
    assert 0 in a.assignment()  # its local view is stale ...
    with pytest.raises(FencedError, match=r"held the lane with epoch \d+, but the lane is held by 'b'"):
        a.confirm(0, make_offset(20, 0))  # ... and the grid refuses it
    with pytest.raises(FencedError):
        a.seek(0, make_offset(1, 0))
    assert standby.confirmed(0) == make_offset(10, 0)
    standby.confirm(0, make_offset(11, 0))
    assert a.confirmed(0) == make_offset(11, 0)


def test_confirm_never_moves_backwards_but_seek_does(stream4: StreamInfo, members: MakeMember) -> None:
    a = members(stream4, "g", "a")
    assert a.confirmed(2) is None
    a.confirm(2, make_offset(5, 3))
    a.confirm(2, make_offset(5, 1))  # a late, lower confirm is ignored
    assert a.confirmed(2) == make_offset(5, 3)
    a.seek(2, make_offset(1, 0))
    assert a.confirmed(2) == make_offset(1, 0)
    assert a.confirmed(1) is None  # lanes are independent
    with pytest.raises(ConfigError, match=r"confirm offset -1 on stream .* lane 2"):
        a.confirm(2, -1)
    with pytest.raises(ConfigError, match=r"lane 4 does not exist.*lanes 0\.\.3"):
        a.confirm(4, 0)


def test_confirm_of_a_lane_not_held_is_refused(stream4: StreamInfo, members: MakeMember) -> None:
    a = members(stream4, "g", "a")
    b = members(stream4, "g", "b")
    wait_until(lambda: len(b.assignment()) == 2, 15, message="b gets its half")
    lane = min(b.assignment())
    with pytest.raises(NotAssignedError, match=f"does not hold stream .* lane {lane}"):
        a.confirm(lane, 1)


# ---------------------------------------------------------------------------------------------------- balancing


def test_four_lanes_balanced_over_three_members_and_rebalanced_when_one_leaves(
    stream4: StreamInfo, members: MakeMember
) -> None:
    trio = [members(stream4, "g", name) for name in ("m-a", "m-b", "m-c")]

    def spread(group: list[GroupMember]) -> list[int]:
        return sorted(len(m.assignment()) for m in group)

    # The documented target: lane i goes to the (i mod n)-th of the sorted member ids.
    wait_until(lambda: held(*trio) == [[0, 3], [1], [2]], 15, message="2/1/1 by sorted member id")
    assert spread(trio) == [1, 1, 2]

    trio[1].close()
    duo = [trio[0], trio[2]]
    wait_until(lambda: held(*duo) == [[0, 2], [1, 3]], 15, message="2/2 after one left")


def test_rebalanced_when_a_member_dies(stream4: StreamInfo, members: MakeMember, own_grid: Connect) -> None:
    doomed_grid = own_grid()
    a = members(stream4, "g", "m-a")
    b = members(stream4, "g", "m-b", on=doomed_grid)
    c = members(stream4, "g", "m-c")
    wait_until(lambda: held(a, b, c) == [[0, 3], [1], [2]], 15, message="2/1/1")
    doomed_grid.close()  # b vanishes: no release, no more renewals
    wait_until(lambda: held(a, c) == [[0, 2], [1, 3]], 15, message="2/2 after b died")


def test_on_change_lets_the_owner_confirm_before_a_lane_is_given_up(stream4: StreamInfo, members: MakeMember) -> None:
    errors: list[BaseException] = []
    given_up: list[int] = []
    a_box: list[GroupMember] = []

    def on_change(assignment: Assignment) -> None:
        if not a_box:
            return
        for lane in sorted(set(a_box[0].assignment()) - set(assignment)):
            try:
                a_box[0].confirm(lane, make_offset(100 + lane, 0))  # still held while on_change runs
                given_up.append(lane)
            except BaseException as exc:  # recorded for the assertion
                errors.append(exc)

    a = members(stream4, "g", "m-a", on_change=on_change)
    a_box.append(a)
    assert sorted(a.assignment()) == [0, 1, 2, 3]
    b = members(stream4, "g", "m-b")
    wait_until(lambda: sorted(b.assignment()) == [1, 3], 15, message="b gets lanes 1 and 3")
    assert errors == [] and sorted(given_up) == [1, 3]
    assert [b.confirmed(lane) for lane in (1, 3)] == [make_offset(101, 0), make_offset(103, 0)]


def test_want_all_standby_takes_over_when_the_holder_closes(stream4: StreamInfo, members: MakeMember) -> None:
    first = members(stream4, "q", "query-1", want="all")
    assert sorted(first.assignment()) == [0, 1, 2, 3]
    first.confirm(1, make_offset(4, 2))
    standby = members(stream4, "q", "query-2", want="all")
    assert standby.assignment() == Assignment()
    first.close()
    wait_until(lambda: len(standby.assignment()) == 4, 15, message="standby holds every lane")
    assert standby.confirmed(1) == make_offset(4, 2)


def test_want_all_standby_takes_over_when_the_holder_dies(
    stream4: StreamInfo, members: MakeMember, own_grid: Connect
) -> None:
    doomed_grid = own_grid()
    first = members(stream4, "q", "query-1", want="all", on=doomed_grid)
    first.confirm(3, make_offset(9, 0))
    standby = members(stream4, "q", "query-2", want="all")
    doomed_grid.close()
    wait_until(lambda: len(standby.assignment()) == 4, 15, message="standby holds every lane")
    assert standby.confirmed(3) == make_offset(9, 0)


def test_a_restarted_member_with_the_same_id_takes_its_lanes_at_once(
    stream1: StreamInfo, members: MakeMember, own_grid: Connect
) -> None:
    doomed_grid = own_grid()
    first = members(stream1, "g", "worker-1", on=doomed_grid, lease_ms=60_000)
    epoch = first.assignment()[0]
    doomed_grid.close()
    again = members(stream1, "g", "worker-1", lease_ms=60_000)  # no waiting a minute for the old lease
    assert again.assignment()[0] == epoch + 1


def test_two_live_members_sharing_an_id_do_not_snatch_lanes_back_and_forth(
    grid: Grid, stream1: StreamInfo, members: MakeMember
) -> None:
    first = members(stream1, "g", "dup")
    second = members(stream1, "g", "dup")  # joins: takes the lane in its own name at once
    wait_until(lambda: first.assignment() == {}, 15, message="first notices it lost the lane")
    beat = stored_lease(grid, stream1, "g", 0).beat
    wait_until(lambda: stored_lease(grid, stream1, "g", 0).beat >= beat + 6, 15, message="two lease periods")
    assert first.assignment() == {} and 0 in second.assignment()


# ---------------------------------------------------------------------------------------------------- offsets


def test_initial_offset_is_resolved_once_and_kept_for_the_next_holder(stream1: StreamInfo, members: MakeMember) -> None:
    a = members(stream1, "g", "a")
    with pytest.raises(GroupError, match="no confirmed offset"):
        a.initial_offset(0, "none", head_seq=0, next_seq=7)
    assert a.initial_offset(0, "latest", head_seq=0, next_seq=7) == make_offset(7, 0)
    a.close()
    b = members(stream1, "g", "b")
    # LATEST is not resolved again (it would skip what arrived meanwhile), and NONE now works.
    assert b.initial_offset(0, "none", head_seq=0, next_seq=12) == make_offset(7, 0)


# ---------------------------------------------------------------------------------------------------- tools


def test_group_state_lists_holders_epochs_and_offsets(grid: Grid, stream4: StreamInfo, members: MakeMember) -> None:
    a = members(stream4, "billing", "m-a")
    a.confirm(2, make_offset(3, 1))
    states = group_state(grid, stream4, "billing")
    assert [s.lane for s in states] == [0, 1, 2, 3]
    assert all(s.holder == "m-a" and s.epoch == a.assignment()[s.lane] for s in states)
    assert all(s.lease_expires_ms is not None for s in states)
    assert [s.confirmed for s in states] == [None, None, make_offset(3, 1), None]
    assert [m.member for m in group_members(grid, stream4, "billing")] == ["m-a"]
    summaries = [g for g in list_groups(grid, stream4.name)]
    assert [(g.group, g.members, g.held_lanes, g.confirmed_lanes) for g in summaries] == [("billing", 1, 4, 1)]
    a.close()
    assert all(s.holder is None for s in group_state(grid, stream4, "billing"))
    assert group_members(grid, stream4, "billing") == []


def test_lag_is_computed_from_offsets(grid: Grid, stream4: StreamInfo, members: MakeMember) -> None:
    ring = grid.ring(stream4.ring_names[1])
    for i in range(6):
        ring.add(b"item %d" % i)  # lag counts ring items; their content does not matter
    a = members(stream4, "g", "a")
    a.confirm(1, make_offset(2, 0))
    a.confirm(0, make_offset(0, 0))
    assert lag(grid, stream4, "g") == {0: 0, 1: 4}


def test_lag_report_counts_records_from_the_items_not_an_average(
    grid: Grid, stream4: StreamInfo, members: MakeMember
) -> None:
    with Publisher(grid, stream4.name, max_batch_records=2) as publisher:
        offsets = publisher.publish_many([Record(b"r%d" % i, lane=1) for i in range(5)]).result(30)
    assert len({sequence_of(o) for o in offsets}) == 3  # items of 2, 2 and 1 records
    a = members(stream4, "g", "a")
    a.confirm(1, offsets[1])  # the first record was processed; the second is next
    a.confirm(2, 0)
    report = {entry.lane: entry for entry in lag_report(grid, stream4, "g", count_records=True)}
    assert report[1] == LaneLag(
        1, offsets[1], sequence_of(offsets[-1]) + 1, items=3, records=4, lost_items=0, stream=stream4.name
    )
    assert report[2] == LaneLag(2, 0, 0, items=0, records=0, lost_items=0, stream=stream4.name)
    assert report[0] == LaneLag(0, None, 0, items=None, stream=stream4.name)  # never confirmed: nothing to compare with
    assert lag_report(grid, stream4, "g", count_records=True, max_items=2)[1].records is None  # too many to read


def test_seek_group_from_a_tool_refuses_held_lanes(grid: Grid, stream4: StreamInfo, members: MakeMember) -> None:
    a = members(stream4, "g", "a")
    a.confirm(0, make_offset(8, 0))
    epoch = a.assignment()[0]
    with pytest.raises(GroupError, match="member 'a' holds it"):
        seek_group(grid, stream4, "g", {0: 0})
    a.close()
    with pytest.raises(
        OffsetOutOfRangeError, match=r"lane 1: offset 65536 is past the end of the lane; valid offsets are 0 to 0"
    ):
        seek_group(grid, stream4, "g", {1: make_offset(1, 0)})  # the lanes are empty: nothing was written there
    for lane in (0, 1):
        grid.ring(stream4.ring_names[lane]).add_all([b"not read"] * 2)
    seek_group(grid, stream4, "g", {0: make_offset(2, 0), 1: make_offset(1, 0)})
    b = members(stream4, "g", "b")
    assert (b.confirmed(0), b.confirmed(1)) == (make_offset(2, 0), make_offset(1, 0))
    assert b.assignment()[0] == epoch + 1


def test_forget_groups_removes_a_streams_group_state(grid: Grid, stream4: StreamInfo, members: MakeMember) -> None:
    a = members(stream4, "g", "a")
    a.confirm(0, 1)
    a.close()
    # 4 vacant leases + 4 fenced offsets entries + the group's membership generation (rewritten on join and leave)
    assert forget_groups(grid, stream4.name) == 9
    assert list_groups(grid, stream4.name) == []
    assert grid.map(OFFSETS_MAP).get(lane_key(stream4.name, "g", 0)) is None
