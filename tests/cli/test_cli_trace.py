"""``meteor trace``: where a record is, which groups confirmed past it, its deliveries in a shared group, whether it
was dead-lettered; by offset and by key."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from meteor_spark.consumer.shared_subscriber import SharedSubscriber
from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.format.offsets import make_offset
from meteor_spark.format.partitioning import lane_for_key
from meteor_spark.format.records import Record
from meteor_spark.grid.client import Grid
from meteor_spark.grid.streams import StreamConfig
from meteor_spark.producer.publisher import Publisher
from meteor_spark.testing import wait_until

Meteor = Callable[..., Any]


def test_a_record_is_traced_through_groups_and_its_dead_letter(meteor: Meteor, grid: Grid, unique_name: str) -> None:
    dlq = f"{unique_name}-dlq"
    with Publisher(grid, StreamConfig(unique_name, lanes=1), max_batch_records=1) as publisher:
        publisher.publish_many([Record(f"r{n}".encode(), key=f"k{n % 2}".encode()) for n in range(4)]).result()
    with Subscriber(grid, unique_name, group="audit", initial_offset_scheme="earliest") as audit:
        batch = wait_until(lambda: audit.poll(50), 10, message="records")
        audit.confirm(batch[0])  # past r0 only
    with Subscriber(grid, unique_name, group="work", shared=True, dead_letter_stream=dlq, max_poll_records=2) as work:
        assert isinstance(work, SharedSubscriber)
        held = wait_until(lambda: work.poll(50), 10, message="two records")
        work.reject(held[0])  # r0: dead-lettered
        # r1 stays acquired by this member while the traces run
        run = meteor("trace", unique_name, "--offset", str(make_offset(0, 0)), "--json")
        assert run.code == 0, run
        document = json.loads(run.out)
        r0 = document["records"][0]
        assert r0["status"] == "in ring" and r0["record"]["value"] == "r0" and r0["sequence"] == 0
        groups = {g["group"]: g for g in r0["groups"]}
        assert groups["audit"]["kind"] == "exclusive" and groups["audit"]["state"] == "confirmed"
        assert groups["work"]["kind"] == "shared" and groups["work"]["state"] == "done"
        (letter,) = r0["dead_letters"]
        assert letter["stream"] == dlq and letter["group"] == "work" and "reject" in letter["error"]
        assert [s["stream"] for s in document["dead_letter_streams"]] == [dlq]

        r1 = json.loads(meteor("trace", unique_name, "--offset", str(make_offset(1, 0)), "--json").out)["records"][0]
        groups = {g["group"]: g for g in r1["groups"]}
        assert groups["audit"]["state"] == "pending" and groups["work"]["state"] == "acquired"
        assert groups["work"]["deliveries"] == 1 and r1["dead_letters"] == []
        human = meteor("trace", unique_name, "--offset", str(make_offset(0, 0)))
        assert "ring item 0, record 0; in ring" in human.out and f"dead-lettered to {dlq!r}" in human.out
        assert "by group 'work' after 1 deliveries" in human.out and "looked through" in human.out


def test_a_key_is_traced_to_its_lane_and_most_recent_records(meteor: Meteor, grid: Grid, unique_name: str) -> None:
    with Publisher(grid, StreamConfig(unique_name, lanes=4), max_batch_records=3) as publisher:
        publisher.publish_many([Record(f"v{n}".encode(), key=f"user-{n % 5}".encode()) for n in range(50)]).result()
    run = meteor("trace", unique_name, "--key", "user-3", "--limit", "3", "--json")
    assert run.code == 0, run
    document = json.loads(run.out)
    assert document["lane"] == lane_for_key(b"user-3", 4)
    values = [r["record"]["value"] for r in document["records"]]
    assert values == ["v48", "v43", "v38"]  # the most recent first
    assert all(r["groups"] == [] and r["dead_letters"] == [] for r in document["records"])
    human = meteor("trace", unique_name, "--key", "user-3", "--limit", "2")
    assert f"lane {lane_for_key(b'user-3', 4)}; 2 most recent record(s)" in human.out
    assert "no group reads this stream" in human.out and "dead-letter streams looked through: none" in human.out
    nothing = json.loads(meteor("trace", unique_name, "--key", "nobody", "--json").out)
    assert nothing["records"] == []


def test_bad_input_is_one_line_naming_it(meteor: Meteor, grid: Grid, unique_name: str) -> None:
    with Publisher(grid, StreamConfig(unique_name, lanes=2, capacity=2), max_batch_records=1) as publisher:
        publisher.publish_many([Record(f"v{n}".encode(), lane=0) for n in range(4)]).result()
    meteor("trace", f"{unique_name}-nope", "--offset", "0").assert_user_error(f"{unique_name}-nope", "does not exist")
    meteor("trace", unique_name, "--offset", "0").assert_user_error("give --lane")
    meteor("trace", unique_name, "--offset", str(make_offset(9, 0)), "--lane", "0").assert_user_error(
        f"no record at offset {make_offset(9, 0)}"
    )
    past_item = str(make_offset(3, 1))  # the newest item holds one record
    meteor("trace", unique_name, "--offset", past_item, "--lane", "0").assert_user_error("holds 1 record(s)")
    meteor("trace", unique_name, "--offset", "0", "--lane", "7").assert_user_error("lane")
    meteor("trace", unique_name, "--key", "k", "--lane", "0").assert_user_error("--lane goes with --offset")
    overwritten = json.loads(meteor("trace", unique_name, "--offset", "0", "--lane", "0", "--json").out)
    assert overwritten["records"][0]["status"] == "overwritten"
