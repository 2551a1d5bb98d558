"""``meteor groups``: per lane holder, epoch, lease expiry, confirmed offset and lag of a subscriber group."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.format.offsets import first_offset_of
from meteor_spark.format.records import Record, encode_batch
from meteor_spark.grid.client import Grid
from meteor_spark.grid.streams import StreamConfig, open_stream
from meteor_spark.groups.admin import seek_group
from meteor_spark.producer.publisher import Publisher
from meteor_spark.testing import wait_until

Meteor = Callable[..., Any]


def _rows(output: str) -> dict[int, list[str]]:
    rows = {}
    for line in output.splitlines():
        parts = line.split()
        if parts and parts[0].isdigit():
            rows[int(parts[0])] = parts
    return rows


def test_live_member_confirmed_offsets_and_lag(meteor: Meteor, grid: Grid, unique_name: str) -> None:
    with Publisher(grid, StreamConfig(unique_name, lanes=2)) as publisher:
        publisher.publish_many([Record(value=b"x", lane=n % 2) for n in range(10)]).result()
    group = "auditors"
    with Subscriber(grid, unique_name, group=group, initial_offset_scheme="earliest") as member:
        seen: list[Record] = []
        wait_until(lambda: seen.extend(member.poll(200)) or len(seen) >= 10, timeout_s=30, message="10 records")
        member.confirm(next(r for r in seen if r.lane == 0))  # lane 0: only its first record is done
        member.confirm(max((r for r in seen if r.lane == 1), key=lambda r: r.offset))  # lane 1: all done

        run = meteor("groups", unique_name, group)
        assert run.code == 0, run
        assert f"group {group!r} on stream {unique_name!r}" in run.out
        rows = _rows(run.out)
        assert sorted(rows) == [0, 1]
        assert rows[0][1] == member.member.member_id and rows[1][1] == member.member.member_id
        assert "4 records" in " ".join(rows[0]) and "(in " in " ".join(rows[0])  # 5 in lane 0, 1 confirmed; lease live
        assert "0 records" in " ".join(rows[1])

    after = meteor("groups", unique_name)  # without a group name: every group of the stream
    assert after.code == 0 and f"group {group!r}" in after.out
    assert all(row[1] == "(free)" for row in _rows(after.out).values())  # close() released the leases


def test_stream_without_groups_and_unknown_stream(meteor: Meteor, grid: Grid, unique_name: str) -> None:
    meteor("streams", "create", unique_name)
    run = meteor("groups", unique_name)
    assert run.code == 0 and "no group has read stream" in run.out
    meteor("groups", f"{unique_name}-missing").assert_user_error("does not exist")


def test_unknown_group_is_an_error_listing_the_streams_groups(meteor: Meteor, grid: Grid, unique_name: str) -> None:
    info = open_stream(grid, StreamConfig(unique_name, lanes=2))
    meteor("groups", unique_name, "nosuchgroup").assert_user_error(
        "'nosuchgroup'", f"no group has read stream {unique_name!r}"
    )
    seek_group(grid, info, "billing", {0: 0})
    seek_group(grid, info, "billing-eu", {1: 0})
    meteor("groups", unique_name, "biling").assert_user_error(
        "unknown group 'biling'", "did you mean 'billing'", "known groups: billing, billing-eu"
    )


def test_a_confirmed_offset_past_the_lanes_end_is_shown_not_a_crash(
    meteor: Meteor, grid: Grid, unique_name: str
) -> None:
    info = open_stream(grid, StreamConfig(unique_name, capacity=1000))
    ring = grid.ring(info.ring_names[0])
    ring.add_all([encode_batch([b"x"], producer_id=1, producer_seq=i) for i in range(600)])
    seek_group(grid, info, "g", {0: first_offset_of(600)})
    ring.destroy()  # the lane starts again at 0: the group's offset now lies past its end
    ring.add_all([encode_batch([b"x"], producer_id=1, producer_seq=i) for i in range(353)])
    run = meteor("groups", unique_name, "g")
    assert run.code == 0, run
    assert "invalid sequence range" not in run.out + run.err
    row = " ".join(_rows(run.out)[0])
    assert f"PAST END (lane ends at offset {first_offset_of(353)})" in row
    assert f"lane 0: the confirmed offset {first_offset_of(600)} is past the lane's end" in run.out


def test_corrupt_items_are_counted_apart(meteor: Meteor, grid: Grid, unique_name: str) -> None:
    info = open_stream(grid, StreamConfig(unique_name))
    ring = grid.ring(info.ring_names[0])
    ring.add_all([encode_batch([b"a", b"b"], producer_id=1, producer_seq=0), b"not a meteor batch"])
    seek_group(grid, info, "g", {0: 0})
    run = meteor("groups", unique_name, "g")
    assert run.code == 0, run
    assert "2 records + 1 corrupt item" in " ".join(_rows(run.out)[0])


def test_watch_refreshes_the_lag_until_the_count(meteor: Meteor, grid: Grid, unique_name: str) -> None:
    with Publisher(grid, StreamConfig(unique_name, lanes=1)) as publisher:
        publisher.publish_many([Record(value=b"x") for _ in range(5)]).result()
    group = "watchers"
    with Subscriber(grid, unique_name, group=group, initial_offset_scheme="earliest") as member:
        seen: list[Record] = []
        wait_until(lambda: seen.extend(member.poll(200)) or len(seen) >= 5, timeout_s=30, message="5 records")
        member.confirm(seen[1])  # records 0 and 1 done: 3 behind

        run = meteor("groups", unique_name, group, "--watch", "--interval", "0.05", "--count", "3")
        assert run.code == 0, run
        assert run.out.count(f"group {group!r} on stream {unique_name!r}") == 3
        assert run.out.count("(every 0.05 s; Ctrl-C stops)") == 3
        assert run.out.count("3 records") == 3


def test_watch_flags_are_checked(meteor: Meteor, grid: Grid, unique_name: str) -> None:
    with Publisher(grid, StreamConfig(unique_name, lanes=1)):
        pass
    meteor("groups", unique_name, "--count", "2").assert_user_error("--watch")
    meteor("groups", unique_name, "--watch", "--interval", "0").assert_user_error("--interval", "0")
    meteor("groups", unique_name, "--watch", "--count", "0").assert_user_error("--count", "0")


def _confirmed(grid: Grid, stream: str, group: str) -> dict[int, int | None]:
    from meteor_spark.groups.admin import group_state

    return {state.lane: state.confirmed for state in group_state(grid, open_stream(grid, stream, create=False), group)}


def test_seek_moves_a_stopped_groups_offsets_and_its_members_resume_there(
    meteor: Meteor, grid: Grid, unique_name: str
) -> None:
    base = 1_700_000_000_000
    with Publisher(grid, StreamConfig(unique_name, lanes=2)) as publisher:
        publisher.publish_many(
            [Record(value=str(n).encode(), lane=n % 2, timestamp_ms=base + 1000 * n) for n in range(10)]
        ).result()
    group = "replayers"
    with Subscriber(grid, unique_name, group=group, initial_offset_scheme="earliest") as member:
        seen: list[Record] = []
        wait_until(lambda: seen.extend(member.poll(200)) or len(seen) >= 10, timeout_s=30, message="10 records")
        for lane in (0, 1):
            member.confirm(max((r for r in seen if r.lane == lane), key=lambda r: r.offset))
        offsets = {(r.lane, r.value): r.offset for r in seen}
        # A member holds the lanes: the seek is refused and changes nothing.
        held = meteor("groups", unique_name, group, "--seek", "earliest")
        held.assert_user_error("holds it", "close the group's members first")
    done = _confirmed(grid, unique_name, group)

    dry = meteor("groups", unique_name, group, "--seek", "earliest", "--dry-run")
    assert dry.code == 0 and "would move 2 lane(s)" in dry.out, dry
    assert _confirmed(grid, unique_name, group) == done

    run = meteor("groups", unique_name, group, "--seek", "earliest")
    assert run.code == 0 and "moved 2 lane(s)" in run.out, run
    assert _confirmed(grid, unique_name, group) == {0: offsets[(0, b"0")], 1: offsets[(1, b"1")]}
    with Subscriber(grid, unique_name, group=group) as again:
        replayed: list[Record] = []
        wait_until(lambda: replayed.extend(again.poll(200)) or len(replayed) >= 10, timeout_s=30, message="replay")
        assert sorted(r.value for r in replayed) == sorted(str(n).encode() for n in range(10))

    # By time: the first record at or after base + 6 s is record 6 on lane 0 and record 7 on lane 1.
    timed = meteor("groups", unique_name, group, "--seek-time", str(base + 6000))
    assert timed.code == 0, timed
    assert _confirmed(grid, unique_name, group) == {0: offsets[(0, b"6")], 1: offsets[(1, b"7")]}

    # One lane to its end, one lane to an offset.
    latest = meteor("groups", unique_name, group, "--seek", "latest", "--lane", "0")
    assert latest.code == 0 and "moved 1 lane(s)" in latest.out, latest
    lane_end = first_offset_of(grid.ring(open_stream(grid, unique_name, create=False).ring_names[0]).tail() + 1)
    assert _confirmed(grid, unique_name, group)[0] == lane_end
    exact = meteor("groups", unique_name, group, "--seek", str(offsets[(1, b"3")]), "--lane", "1")
    assert exact.code == 0, exact
    assert _confirmed(grid, unique_name, group)[1] == offsets[(1, b"3")]


def test_seek_arguments_are_checked(meteor: Meteor, grid: Grid, unique_name: str) -> None:
    info = open_stream(grid, StreamConfig(unique_name, lanes=2))
    seek_group(grid, info, "g", {0: 0, 1: 0})
    meteor("groups", unique_name, "--seek", "earliest").assert_user_error("--seek needs the group")
    meteor("groups", unique_name, "g", "--seek", "soon").assert_user_error("--seek 'soon'", "earliest, latest")
    meteor("groups", unique_name, "g", "--seek", "5").assert_user_error("--lane N")
    meteor("groups", unique_name, "g", "--lane", "0").assert_user_error("--lane and --dry-run go with --seek")
    meteor("groups", unique_name, "g", "--seek", "earliest", "--lane", "7").assert_user_error("lane 7", "0..1")
    meteor("groups", unique_name, "g", "--seek", "latest", "--seek-time", "1h").assert_user_error("exclude")
    meteor("groups", unique_name, "g", "--seek-time", "yesterday").assert_user_error("--seek-time 'yesterday'")
    meteor("groups", unique_name, "g", "--seek", str(first_offset_of(5)), "--lane", "0").assert_user_error("past")
    assert _confirmed(grid, unique_name, "g") == {0: 0, 1: 0}
