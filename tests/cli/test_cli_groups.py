"""``meteor groups``: per lane holder, epoch, lease expiry, confirmed offset and lag of a subscriber group."""

from __future__ import annotations

from typing import Any, Callable

from meteor_spark.grid import Grid
from meteor_spark.publisher import Publisher
from meteor_spark.records import Record
from meteor_spark.streams import StreamConfig
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
