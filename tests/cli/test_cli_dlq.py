"""``meteor dlq list|show|redrive``: dead letters grouped, shown in full, and redriven to their source streams once
each, however often the redrive runs and wherever it is killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from meteor_spark.consumer.dead_letters import HEADER_REDRIVEN_FROM
from meteor_spark.consumer.redrive_state import REDRIVE_MAP
from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.format.corrupt import DEAD_LETTER_HEADERS
from meteor_spark.format.records import Record
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.streams import StreamConfig, lane_bounds, open_stream
from meteor_spark.producer.publisher import Publisher
from meteor_spark.testing import wait_until

Meteor = Callable[..., Any]

POISON = 100


def poison_batch(grid: Grid, source: str, dlq: str, *, poison: int = POISON, good: int = 50) -> None:
    """A two-lane stream with ``poison`` records a JSON reader refuses among ``good`` ones: a grouped subscriber
    with ``on_corrupt=dead_letter`` dead-letters every poison record to ``dlq``."""
    records = [
        Record(f"poison {n}".encode(), key=f"p{n}".encode(), headers=(("trace", f"t{n}".encode()),))
        for n in range(poison)
    ] + [Record(json.dumps({"n": n}).encode(), key=f"g{n}".encode()) for n in range(good)]
    with Publisher(grid, StreamConfig(source, lanes=2), max_batch_records=16) as publisher:
        publisher.publish_many(records).result()
    with Subscriber(
        grid,
        source,
        group="billing",
        value_deserializer="json",
        dead_letter_stream=dlq,
        initial_offset_scheme="earliest",
    ) as reader:
        seen = [0]

        def all_read() -> bool:
            seen[0] += len(reader.poll(100))
            return seen[0] >= good

        wait_until(all_read, 20, message="the good records")
    info = open_stream(grid, dlq, create=False)
    wait_until(lambda: _count(grid, info) >= poison, 10, message="the dead letters")


def _count(grid: Grid, info: Any) -> int:
    from meteor_spark.consumer.dead_letters import ScanReport, scan_dead_letters

    return sum(1 for _ in scan_dead_letters(grid, info, ScanReport()))


def redriven_records(grid: Grid, source: str, ends: dict[int, tuple[int, int]]) -> list[Record]:
    """Every record of ``source`` written after ``ends`` (lane bounds taken before the redrive)."""
    from meteor_spark.format.records import decode_batch
    from meteor_spark.grid.reading import read_range

    info = open_stream(grid, source, create=False)
    out: list[Record] = []
    for lane, (_, end_now) in lane_bounds(grid, info).items():
        for items, sequences in read_range(grid, info, lane, ends[lane][1], end_now):
            for raw, seq in zip(items, sequences, strict=True):
                out.extend(decode_batch(raw, stream=source, lane=lane, sequence=seq))
    return out


def test_a_poison_batch_redriven_twice_arrives_once(
    meteor: Meteor, grid: Grid, unique_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    source, dlq = unique_name, f"{unique_name}-dlq"
    poison_batch(grid, source, dlq)
    listing = meteor("dlq", "list", dlq, "--json")
    assert listing.code == 0, listing
    document = json.loads(listing.out)
    assert document["dead_letters"] == POISON and document["redriven"] == 0
    assert {row["source"] for row in document["by_source"]} == {source}
    assert sum(row["count"] for row in document["by_source"]) == POISON
    assert {row["lane"] for row in document["by_source"]} == {0, 1}
    assert len(document["by_error"]) >= 1 and all("value_deserializer" in r["error"] for r in document["by_error"])
    human = meteor("dlq", "list", dlq)
    assert f"{POISON} dead letter(s), 0 redriven" in human.out and "source offsets" in human.out

    before = lane_bounds(grid, open_stream(grid, source, create=False))
    first = meteor("dlq", "redrive", dlq, "--json")
    second = meteor("dlq", "redrive", dlq, "--json")
    assert first.code == 0 and second.code == 0, (first, second)
    one, two = json.loads(first.out), json.loads(second.out)
    arrived = redriven_records(grid, source, before)
    copies = Counter(dict(r.headers)[HEADER_REDRIVEN_FROM] for r in arrived)
    with capsys.disabled():
        print(
            f"\nredrive of {POISON} dead letters: first run sent {one['redriven']}, second run sent {two['redriven']} "
            f"({two['already_redriven']} skipped as done); arrived {len(arrived)}, distinct {len(copies)}, "
            f"duplicated {sum(n - 1 for n in copies.values())}"
        )
    assert one["redriven"] == POISON and two["redriven"] == 0 and two["already_redriven"] == POISON
    assert len(arrived) == POISON == len(copies)
    originals = {f"p{n}".encode(): (f"poison {n}".encode(), f"t{n}".encode()) for n in range(POISON)}
    for record in arrived:
        assert record.key is not None
        value, trace = originals[record.key]
        headers = dict(record.headers)
        assert record.value == value and headers["trace"] == trace
        assert not DEAD_LETTER_HEADERS & set(headers)
        assert record.message_id == "dlq:" + headers[HEADER_REDRIVEN_FROM].decode()
    assert {r.key for r in arrived} == set(originals)
    assert json.loads(meteor("dlq", "list", dlq, "--json").out)["redriven"] == POISON
    human = meteor("dlq", "redrive", dlq)
    assert "redrove 0" in human.out and f"{POISON} redriven before" in human.out


def test_filters_and_a_dry_run_send_only_what_they_name(meteor: Meteor, grid: Grid, unique_name: str) -> None:
    source, dlq = unique_name, f"{unique_name}-dlq"
    poison_batch(grid, source, dlq, poison=20, good=5)
    letters = [json.loads(line) for line in meteor("dlq", "show", dlq, "--limit", "100", "--json").out.splitlines()]
    assert len(letters) == 20 and all(d["source"]["stream"] == source for d in letters)
    before = lane_bounds(grid, open_stream(grid, source, create=False))

    dry = json.loads(meteor("dlq", "redrive", dlq, "--dry-run", "--json").out)
    assert dry["dry_run"] and dry["redriven"] == 20
    assert redriven_records(grid, source, before) == []

    lane0 = [d for d in letters if d["source"]["lane"] == 0]
    by_lane = json.loads(meteor("dlq", "redrive", dlq, "--source-lane", "0", "--json").out)
    assert by_lane["redriven"] == len(lane0) == by_lane["matched"]
    offsets = sorted(d["offset"] for d in letters if d["source"]["lane"] == 1)
    ranged = json.loads(
        meteor(
            "dlq", "redrive", dlq, "--from-offset", str(offsets[0]), "--to-offset", str(offsets[2] + 1), "--json"
        ).out
    )
    in_range = [d for d in letters if offsets[0] <= d["offset"] <= offsets[2]]
    assert ranged["matched"] == len(in_range) and ranged["already_redriven"] == len(in_range) - 3
    assert ranged["redriven"] == 3  # the lane-1 letters; lane 0's were redriven above
    nothing = json.loads(meteor("dlq", "redrive", dlq, "--error", "no such error text", "--json").out)
    assert nothing["matched"] == 0 and nothing["redriven"] == 0
    elsewhere = json.loads(meteor("dlq", "redrive", dlq, "--source", "another-stream", "--json").out)
    assert elsewhere["matched"] == 0
    rest = json.loads(meteor("dlq", "redrive", dlq, "--error", "VALUE_DESERIALIZER", "--json").out)
    assert rest["matched"] == 20 and rest["redriven"] + rest["already_redriven"] == 20
    arrived = redriven_records(grid, source, before)
    assert len(arrived) == 20 == len({dict(r.headers)[HEADER_REDRIVEN_FROM] for r in arrived})
    shown = meteor("dlq", "show", dlq, "--offset", str(letters[0]["offset"]), "--source-lane", "0")
    shown.assert_user_error("--offset names one dead letter")


def test_show_prints_a_dead_letter_in_full_and_bad_input_is_one_line(
    meteor: Meteor, grid: Grid, unique_name: str
) -> None:
    source, dlq = unique_name, f"{unique_name}-dlq"
    poison_batch(grid, source, dlq, poison=3, good=1)
    first = json.loads(meteor("dlq", "show", dlq, "--json", "--limit", "1").out)
    run = meteor("dlq", "show", dlq, "--offset", str(first["offset"]))
    assert run.code == 0, run
    assert f"source:     {source} lane {first['source']['lane']}" in run.out
    assert "value_deserializer" in run.out and "header:     trace=t" in run.out and "redriven:   no" in run.out
    assert first["value"].startswith("poison ") and first["key"].startswith("p") and not first["redriven"]
    meteor("dlq", "show", dlq, "--offset", "999999999").assert_user_error("no record at offset 999999999", dlq)
    meteor("dlq", "list", f"{dlq}-nope").assert_user_error(f"{dlq}-nope", "does not exist")
    meteor("dlq", "redrive", f"{dlq}-nope").assert_user_error(f"{dlq}-nope", "does not exist")
    meteor("dlq", "redrive", dlq, "--from-offset", "10", "--to-offset", "5").assert_user_error("--to-offset 5")
    meteor("dlq", "redrive", dlq, "--step", "0").assert_user_error("--step")
    meteor("dlq", "show", dlq, "--lane", "0").assert_user_error("--lane goes with --offset")


def test_an_empty_dead_letter_stream_is_an_empty_listing(meteor: Meteor, grid: Grid, unique_name: str) -> None:
    open_stream(grid, StreamConfig(unique_name))
    run = meteor("dlq", "list", unique_name)
    assert run.code == 0 and "0 dead letter(s), 0 redriven" in run.out, run
    assert json.loads(meteor("dlq", "list", unique_name, "--json").out)["dead_letters"] == 0
    redrive = json.loads(meteor("dlq", "redrive", unique_name, "--json").out)
    assert redrive["matched"] == 0 == redrive["redriven"]
    assert meteor("dlq", "show", unique_name).out.strip().endswith("no dead letter matches")


KILLS = 3


def _kill_mid_step(command: list[str], progress: Any, dlq: str, done_before: Any) -> tuple[bool, int]:
    """Run the redrive and SIGKILL it once a step is noted in progress after more letters were done than
    ``done_before``; returns whether it was killed (not finished first) and the letters of the step in flight."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:

        def a_new_step_open() -> bool:
            text = progress.get(dlq)
            if process.poll() is not None:
                return True
            if text is None:
                return False
            entry = json.loads(text)
            return "run" in entry and bool(entry["done"]) and entry["done"] != done_before

        wait_until(a_new_step_open, 60, interval_s=0.001, message="a redrive step in progress")
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
        process.wait(30)
    entry = json.loads(progress.get(dlq) or "{}")
    return process.returncode == -signal.SIGKILL, len(entry.get("run", {}).get("letters", []))


def test_a_redrive_killed_midway_then_rerun_delivers_each_once(
    grid: Grid, grid_settings: GridSettings, unique_name: str
) -> None:
    """SIGKILL the redrive three times, each as soon as a new step is noted in progress (its record may or may not
    have been sent), then run it to the end: each rerun settles the step left (what arrived is not sent again)."""
    source, dlq = unique_name, f"{unique_name}-dlq"
    poison_batch(grid, source, dlq)
    before = lane_bounds(grid, open_stream(grid, source, create=False))
    command = [
        sys.executable, "-m", "meteor_spark.cli", "dlq", "redrive", dlq, "--step", "1", "--json",
        "--members", ",".join(grid_settings.members), "--cluster-name", grid_settings.cluster_name,
    ]  # fmt: skip
    progress = grid.map(REDRIVE_MAP)
    kills = []
    for _ in range(KILLS):
        done_before = json.loads(progress.get(dlq) or '{"done": null}')["done"]
        killed, in_flight = _kill_mid_step(command, progress, dlq, done_before)
        kills.append((killed, in_flight, len(redriven_records(grid, source, before))))
    rerun = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert rerun.returncode == 0, rerun.stderr
    report = json.loads(rerun.stdout)
    arrived = redriven_records(grid, source, before)
    copies = Counter(dict(r.headers)[HEADER_REDRIVEN_FROM] for r in arrived)
    shown = "; ".join(
        f"kill {n + 1}: {'SIGKILLed' if killed else 'finished first'}, step in flight {flight}, in the source {sent}"
        for n, (killed, flight, sent) in enumerate(kills)
    )
    print(
        f"\nredrive killed midway: {shown}; last run: settled {report['recovered']} as arrived, "
        f"{report['resent']} not arrived, sent {report['redriven']}, skipped {report['already_redriven']}; "
        f"total arrived {len(arrived)} of {POISON}, duplicated {sum(n - 1 for n in copies.values())}, "
        f"lost {POISON - len(copies)}"
    )
    assert len(arrived) == POISON == len(copies)
    assert report["redriven"] + report["already_redriven"] == POISON
    assert sum(killed for killed, _, _ in kills) >= 1


def test_a_source_with_a_dedup_window_refuses_a_second_copy_even_without_progress(
    meteor: Meteor, grid: Grid, unique_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The redriven record's message id is the dead letter's position: with the progress entry gone (removed by
    hand), the source stream's deduplication window still refuses every second copy."""
    source, dlq = unique_name, f"{unique_name}-dlq"
    with Publisher(grid, StreamConfig(source, lanes=2, dedup_window_ms=600_000)) as publisher:
        publisher.publish_many([Record(f"poison {n}".encode(), key=f"p{n}".encode()) for n in range(10)]).result()
    with Subscriber(
        grid,
        source,
        group="billing",
        value_deserializer="json",
        dead_letter_stream=dlq,
        initial_offset_scheme="earliest",
    ) as reader:
        reader.poll(100)
    info = open_stream(grid, dlq, create=False)
    wait_until(lambda: _count(grid, info) >= 10, 10, message="the dead letters")
    before = lane_bounds(grid, open_stream(grid, source, create=False))
    first = json.loads(meteor("dlq", "redrive", dlq, "--json").out)
    grid.map(REDRIVE_MAP).remove(dlq)
    second = json.loads(meteor("dlq", "redrive", dlq, "--json").out)
    arrived = redriven_records(grid, source, before)
    with capsys.disabled():
        refused = second["refused_duplicates"]
        print(f"\ndedup source: first sent {first['redriven']}, second (progress removed) refused {refused}")
    assert first["redriven"] == 10 and second["redriven"] == 0 and second["refused_duplicates"] == 10
    assert len(arrived) == 10
    assert json.loads(meteor("dlq", "list", dlq, "--json").out)["redriven"] == 10


def test_a_shared_groups_rejects_redrive_by_error_text_without_group_headers(
    meteor: Meteor, grid: Grid, unique_name: str
) -> None:
    source, dlq = unique_name, f"{unique_name}-dlq"
    with Publisher(grid, StreamConfig(source, lanes=1)) as publisher:
        publisher.publish_many(
            [Record(f"job {n}".encode(), key=f"j{n}".encode(), topic="jobs.small") for n in range(6)]
        ).result()
    poison_batch(grid, f"{source}-json", dlq, poison=4, good=1)  # other dead letters in the same stream
    with Subscriber(grid, source, group="workers", shared=True, dead_letter_stream=dlq) as worker:
        got: list[Record] = []

        def all_six() -> bool:
            got.extend(worker.poll(50))
            return len(got) >= 6

        wait_until(all_six, 10, message="six jobs")
        worker.reject(got)  # type: ignore[attr-defined]
    listing = json.loads(meteor("dlq", "list", dlq, "--json").out)
    assert {(r["source"], r["group"], r["count"]) for r in listing["by_source"]} >= {(source, "workers", 6)}
    before = lane_bounds(grid, open_stream(grid, source, create=False))
    report = json.loads(meteor("dlq", "redrive", dlq, "--error", "rejected", "--json").out)
    assert report["matched"] == 6 and report["redriven"] == 6 and report["per_source"] == {source: 6}
    arrived = redriven_records(grid, source, before)
    assert sorted(r.value for r in arrived) == sorted(f"job {n}".encode() for n in range(6))
    assert all(r.topic == "jobs.small" and not DEAD_LETTER_HEADERS & set(dict(r.headers)) for r in arrived)
    rest = json.loads(meteor("dlq", "list", dlq, "--json").out)
    assert rest["redriven"] == 6 and rest["dead_letters"] == 10


def test_an_undecodable_item_is_listed_and_shown_but_never_redriven(
    meteor: Meteor, grid: Grid, unique_name: str
) -> None:
    source, dlq = unique_name, f"{unique_name}-dlq"
    info = open_stream(grid, StreamConfig(source))
    grid.ring(info.ring_names[0]).add(b"not a ring item")
    with Subscriber(grid, source, dead_letter_stream=dlq, initial_offset_scheme="earliest") as reader:
        wait_until(lambda: reader.poll(10) is not None and reader.corrupt_items == 1, 10, message="the item passed")
    (letter,) = [json.loads(line) for line in meteor("dlq", "show", dlq, "--json").out.splitlines()]
    assert letter["undecodable_item"] and letter["source"]["stream"] == source and letter["value"] == "not a ring item"
    report = json.loads(meteor("dlq", "redrive", dlq, "--json").out)
    assert report["matched"] == 1 and report["not_redrivable"] == 1 and report["redriven"] == 0
    assert "1 undecodable ring item(s) left" in meteor("dlq", "redrive", dlq).out
