"""``meteor tail``: from earliest / latest / an offset, as a group, pretty or JSON, and its stop conditions."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import pytest

from meteor_spark.format.offsets import first_offset_of
from meteor_spark.format.records import Record, encode_batch
from meteor_spark.grid.client import Grid
from meteor_spark.grid.streams import StreamConfig, lane_bounds, open_stream
from meteor_spark.groups.admin import group_state
from meteor_spark.producer.publisher import Publisher

Meteor = Callable[..., Any]


@pytest.fixture
def stream(grid: Grid, unique_name: str) -> str:
    """A two-lane stream holding 20 records in both lanes: keys user-1..user-4 (lanes 0, 0, 0, 1), values v0..v19."""
    with Publisher(grid, StreamConfig(unique_name, lanes=2)) as publisher:
        publisher.publish_many(
            [
                Record(value=f"v{n}".encode(), key=f"user-{n % 4 + 1}".encode(), timestamp_ms=1_700_000_000_000 + n)
                for n in range(20)
            ]
        ).result()
    return unique_name


def values(run: Any) -> list[str]:
    return [json.loads(line)["value"] for line in run.out.splitlines()]


def test_from_earliest_as_json(meteor: Meteor, stream: str) -> None:
    run = meteor("tail", stream, "--from", "earliest", "--json", "--max", "20")
    assert run.code == 0, run
    documents = [json.loads(line) for line in run.out.splitlines()]
    assert sorted(d["value"] for d in documents) == sorted(f"v{n}" for n in range(20))
    first = documents[0]
    assert set(first) == {"stream", "lane", "offset", "timestamp", "key", "value"}
    assert first["stream"] == stream and first["timestamp"].startswith("2023-11-14T22:13:20.")
    assert {d["lane"] for d in documents} == {0, 1}
    for lane in (0, 1):  # per lane, offsets increase and order is publish order
        lane_docs = [d for d in documents if d["lane"] == lane]
        assert [d["offset"] for d in lane_docs] == sorted(d["offset"] for d in lane_docs)
        assert [int(d["value"][1:]) for d in lane_docs] == sorted(int(d["value"][1:]) for d in lane_docs)


def test_pretty_output_and_binary_values(meteor: Meteor, grid: Grid, unique_name: str) -> None:
    with Publisher(grid, StreamConfig(unique_name)) as publisher:
        publisher.publish(Record(value=b"\xff\x00binary", key=b"k"))
        publisher.publish(Record(value=b"text"))
    run = meteor("tail", unique_name, "--from", "earliest", "--max", "2")
    assert run.code == 0, run
    lines = run.out.splitlines()
    assert lines[0].startswith("0:0  ") and "key=k  0xff0062696e617279" in lines[0]
    assert lines[1].endswith("  text")
    as_json = meteor("tail", unique_name, "--from", "earliest", "--max", "1", "--json")
    assert json.loads(as_json.out)["value_base64"] == "/wBiaW5hcnk="


def test_from_latest_sees_only_new_records_and_timeout_stops(meteor: Meteor, grid: Grid, stream: str) -> None:
    def publish_later() -> None:
        with Publisher(grid, stream) as publisher:
            publisher.publish(Record(value=b"new", key=b"k1"))

    timer = threading.Timer(1.0, publish_later)
    timer.start()
    try:
        run = meteor("tail", stream, "--json", "--timeout", "3")
    finally:
        timer.join()
    assert run.code == 0, run
    assert values(run) == ["new"]


def test_timeout_without_records_says_so(meteor: Meteor, stream: str) -> None:
    run = meteor("tail", stream, "--from", "latest", "--timeout", "0.5")
    assert run.code == 0 and run.out == ""
    assert "no record arrived" in run.err


def test_from_an_offset_on_one_lane(meteor: Meteor, stream: str) -> None:
    listing = meteor("tail", stream, "--from", "earliest", "--json", "--max", "20")
    everything = [json.loads(line) for line in listing.out.splitlines()]
    lane1 = [d for d in everything if d["lane"] == 1]
    start = lane1[2]["offset"]
    run = meteor("tail", stream, "--from", str(start), "--lane", "1", "--json", "--max", str(len(lane1) - 2))
    assert run.code == 0, run
    assert values(run) == [d["value"] for d in lane1[2:]]


def test_as_a_group_confirms_what_it_printed(meteor: Meteor, grid: Grid, stream: str, unique_name: str) -> None:
    group = f"g-{unique_name[-8:]}"
    first = meteor("tail", stream, "--group", group, "--json", "--max", "20")
    assert first.code == 0, first
    assert len(values(first)) == 20
    info = open_stream(grid, stream, create=False)
    confirmed = {s.lane: s.confirmed for s in group_state(grid, info, group)}
    lane_ends = {lane: first_offset_of(end) for lane, (_head, end) in lane_bounds(grid, info).items()}
    assert confirmed == lane_ends  # "the next record to read" is the end of each lane
    # The group resumes after what it confirmed: nothing left to print.
    again = meteor("tail", stream, "--group", group, "--json", "--timeout", "1.5")
    assert again.code == 0 and again.out == ""


def test_mistakes(meteor: Meteor, stream: str) -> None:
    missing = f"{stream}-missing"
    meteor("tail", missing).assert_user_error(f"stream {missing!r} does not exist")
    meteor("tail", stream, "--from", "12345").assert_user_error("offsets are per lane", "add --lane N")
    meteor("tail", stream, "--from", "soon").assert_user_error("expected earliest, latest or an offset")
    meteor("tail", stream, "--lane", "5").assert_user_error("--lane 5", "lanes 0..1")
    meteor("tail", stream, "--lane", "0", "--group", "g").assert_user_error("exclude each other")
    meteor("tail", stream, "--max", "0").assert_user_error("--max must be at least 1")


def test_a_corrupt_item_stops_tail_unless_told_to_skip_or_dead_letter(
    meteor: Meteor, grid: Grid, unique_name: str
) -> None:
    info = open_stream(grid, StreamConfig(unique_name))
    ring = grid.ring(info.ring_names[0])
    ring.add_all(
        [
            encode_batch([b"a"], producer_id=1, producer_seq=0),
            b"not a meteor batch",
            encode_batch([b"b"], producer_id=1, producer_seq=1),
        ]
    )
    stopped = meteor("tail", unique_name, "--from", "earliest", "--json", "--max", "2", "--timeout", "5")
    stopped.assert_user_error(f"stream {unique_name!r} lane 0 sequence 1")
    assert values(stopped) == ["a"]  # what came before the bad item was printed first
    skipped = meteor("tail", unique_name, "--from", "earliest", "--json", "--max", "2", "--on-corrupt", "skip")
    assert skipped.code == 0 and values(skipped) == ["a", "b"], skipped
    dead = f"{unique_name}-dlq"
    lettered = meteor("tail", unique_name, "--from", "earliest", "--json", "--max", "2", "--dead-letter-stream", dead)
    assert lettered.code == 0 and values(lettered) == ["a", "b"], lettered
    letters = meteor("tail", dead, "--from", "earliest", "--json", "--max", "1")
    assert values(letters) == ["not a meteor batch"]
    meteor("tail", unique_name, "--on-corrupt", "dead_letter").assert_user_error(
        "--on-corrupt=dead_letter needs --dead-letter-stream"
    )


def test_an_offset_past_the_end_is_an_error_naming_the_valid_range(meteor: Meteor, stream: str, grid: Grid) -> None:
    end = lane_bounds(grid, open_stream(grid, stream))[0][1]
    meteor("tail", stream, "--lane", "0", "--from", str(first_offset_of(end + 5))).assert_user_error(
        f"stream {stream!r} lane 0: offset {first_offset_of(end + 5)} is past the end of the lane",
        f"valid offsets are 0 to {first_offset_of(end)}",
    )


def test_since_starts_every_lane_at_the_first_record_at_or_after_the_time(meteor: Meteor, stream: str) -> None:
    # One record per 1 ms from 1_700_000_000_000 (2023-11-14T22:13:20Z), values v0..v19 over two lanes.
    for since in ("1700000000015", "2023-11-14T22:13:20.015Z", "2023-11-14T22:13:20.015"):
        run = meteor("tail", stream, "--since", since, "--json", "--max", "5", "--timeout", "1")
        assert run.code == 0, run
        assert sorted(values(run)) == [f"v{n}" for n in range(15, 20)], since
    one_lane = meteor("tail", stream, "--since", "1700000000015", "--lane", "1", "--json", "--timeout", "0.5")
    assert values(one_lane) == ["v15", "v19"]  # user-4 (lane 1) holds v3, v7, v11, v15, v19
    # Everything is older than ten minutes ago: every lane starts at its end, so nothing is printed.
    recent = meteor("tail", stream, "--since", "10m", "--json", "--timeout", "0.5")
    assert recent.code == 0 and values(recent) == []


def test_since_parsing_and_errors(meteor: Meteor, stream: str) -> None:
    from meteor_spark.cli.tail_cmd import parse_since

    now = 1_800_000_000_000
    assert parse_since("90s", now_ms=now) == now - 90_000
    assert parse_since("2h", now_ms=now) == now - 7_200_000
    assert parse_since("1d", now_ms=now) == now - 86_400_000
    assert parse_since("1700000000000") == 1_700_000_000_000
    assert parse_since("2023-11-14T23:13:20+01:00") == 1_700_000_000_000
    meteor("tail", stream, "--since", "yesterday").assert_user_error("--since 'yesterday'", "ISO-8601")
    meteor("tail", stream, "--since", "1969-12-31T00:00:00Z").assert_user_error("before 1970")
    meteor("tail", stream, "--since", "10m", "--from", "earliest").assert_user_error("--since excludes --from")
    meteor("tail", stream, "--since", "10m", "--group", "g").assert_user_error("--since excludes")
