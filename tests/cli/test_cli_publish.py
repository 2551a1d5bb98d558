"""``meteor publish``: JSON and raw lines from files and stdin, keys and event times, and line errors."""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from meteor_spark.format.partitioning import lane_for_key
from meteor_spark.format.records import Record, decode_batch
from meteor_spark.grid.client import Grid
from meteor_spark.grid.reading import read_range
from meteor_spark.grid.streams import StreamConfig, lane_bounds, open_stream

Meteor = Callable[..., Any]


def stored_records(grid: Grid, stream: str) -> list[Record]:
    """Every record the stream holds, lane by lane, read straight from the rings (independent of the CLI)."""
    info = open_stream(grid, stream, create=False)
    records: list[Record] = []
    for lane, (head, end) in lane_bounds(grid, info).items():
        for items, sequences in read_range(grid, info, lane, head, end):
            for item, sequence in zip(items, sequences, strict=True):
                records.extend(decode_batch(item, stream=stream, lane=lane, sequence=sequence))
    return records


@pytest.fixture
def stream(grid: Grid, unique_name: str) -> str:
    open_stream(grid, StreamConfig(unique_name, lanes=3), create=True)
    return unique_name


def test_json_lines_with_key_and_event_time(meteor: Meteor, grid: Grid, stream: str, tmp_path: Path) -> None:
    lines = [
        {"id": n, "user": {"name": f"u{n % 4}"}, "at": "2026-01-31T12:00:00.250Z" if n % 2 else 1_700_000_000_000 + n}
        for n in range(50)
    ]
    source = tmp_path / "events.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))

    run = meteor("publish", stream, str(source), "--key-field", "user.name", "--timestamp-field", "at")
    assert run.code == 0, run
    assert f"published 50 record(s) to {stream!r}" in run.out

    records = stored_records(grid, stream)
    by_id = {json.loads(r.value)["id"]: r for r in records}
    assert sorted(by_id) == list(range(50))
    for n, record in by_id.items():
        assert record.value == json.dumps(lines[n]).encode()  # the line exactly as written
        assert record.key == f"u{n % 4}".encode()
        assert record.lane == lane_for_key(record.key, 3)
        expected_ms = 1_769_860_800_250 if n % 2 else 1_700_000_000_000 + n
        assert record.timestamp_ms == expected_ms


def test_malformed_lines_are_reported_with_their_number_and_the_rest_is_published(
    meteor: Meteor, grid: Grid, stream: str, tmp_path: Path
) -> None:
    source = tmp_path / "mixed.jsonl"
    source.write_text(
        '{"id": 1, "k": "a"}\n'
        '{"id": 2, "k": "b"\n'  # line 2: broken JSON
        "\n"  # line 3: blank, skipped
        '{"id": 4}\n'  # line 4: no key field
        '{"id": 5, "k": {"x": 1}}\n'  # line 5: key is an object
        '{"id": 6, "k": "c"}\n'
    )
    run = meteor("publish", stream, str(source), "-k", "k")
    assert run.code == 1
    errors = run.err.strip().splitlines()
    assert errors[0].startswith(f"{source}:2: not valid JSON")
    assert errors[1] == f"{source}:4: has no field 'k' (--key-field); line not published"
    assert errors[2].startswith(f"{source}:5: field 'k' is a JSON dict")
    assert "3 line(s) could not be published" in errors[-1]
    assert "published 2 record(s)" in run.out and "skipped 1 blank line(s)" in run.out
    assert sorted(json.loads(r.value)["id"] for r in stored_records(grid, stream)) == [1, 6]


def test_raw_lines_from_stdin(meteor: Meteor, grid: Grid, stream: str, monkeypatch: pytest.MonkeyPatch) -> None:
    payload = b"first line\n\nnot { json\n\xff\xfe binary\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(payload)))
    run = meteor("publish", stream, "--format", "raw", "--lane", "2")
    assert run.code == 0, run
    records = stored_records(grid, stream)
    assert [r.value for r in records] == [b"first line", b"", b"not { json", b"\xff\xfe binary"]
    assert {r.lane for r in records} == {2}


def test_unknown_stream_and_create(meteor: Meteor, grid: Grid, unique_name: str, tmp_path: Path) -> None:
    source = tmp_path / "one.jsonl"
    source.write_text('{"a": 1}\n')
    meteor("publish", unique_name, str(source)).assert_user_error(f"stream {unique_name!r} does not exist", "--create")
    created = meteor("publish", unique_name, str(source), "--create")
    assert created.code == 0, created
    assert len(stored_records(grid, unique_name)) == 1


def test_input_and_flag_mistakes(meteor: Meteor, stream: str, tmp_path: Path) -> None:
    meteor("publish", stream, str(tmp_path / "missing.jsonl")).assert_user_error("cannot read input file")
    meteor("publish", stream, "-", "--format", "raw", "--key-field", "k").assert_user_error("need --format json")
    source = tmp_path / "one.jsonl"
    source.write_text('{"a": 1}\n')
    meteor("publish", stream, str(source), "--lane", "7").assert_user_error("--lane 7", "lanes 0..2")
    meteor("publish", stream, str(source), "--lane", "-1").assert_user_error("--lane -1", "lanes 0..2")
