"""``meteor groups``: per lane holder, epoch, lease expiry, confirmed offset and lag of a subscriber group."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from meteor_spark.admin import seek_group
from meteor_spark.grid import Grid
from meteor_spark.offsets import first_offset_of
from meteor_spark.publisher import Publisher
from meteor_spark.records import Record, encode_batch
from meteor_spark.streams import StreamConfig, open_stream
from meteor_spark.subscriber import Subscriber
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
