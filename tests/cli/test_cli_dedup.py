"""The CLI's topics and message ids: ``streams create --dedup-window-ms``, ``publish --topic/--id/--id-field``
(a duplicate prints one line naming the id and the first offset, exit code 3) and ``tail`` showing both."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from meteor_spark.cli.publish_cmd import EXIT_DUPLICATE
from meteor_spark.grid.client import Grid
from meteor_spark.grid.streams import open_stream

Meteor = Callable[..., Any]


def test_publish_with_id_twice_refuses_the_second_in_one_line(
    meteor: Meteor, grid: Grid, unique_name: str, tmp_path: Path
) -> None:
    created = meteor("streams", "create", unique_name, "--lanes", "2", "--dedup-window-ms", "60000")
    assert created.code == 0 and "dedup window 60,000 ms" in created.out, created
    assert open_stream(grid, unique_name, create=False).config.dedup_window_ms == 60_000
    one = tmp_path / "one.json"
    one.write_text('{"order": 1}\n')

    first = meteor("publish", unique_name, str(one), "--topic", "orders.eu.created", "--id", "order-1")
    assert first.code == 0, first
    again = meteor("publish", unique_name, str(one), "--id", "order-1")
    assert again.code == EXIT_DUPLICATE, again
    lines = again.err.strip().splitlines()
    assert len(lines) == 1 and "'order-1'" in lines[0] and "at offset 0" in lines[0], again.err

    tail = meteor("tail", unique_name, "--from", "earliest", "--max", "1", "--json")
    shown = json.loads(tail.out.strip().splitlines()[0])
    assert (shown["topic"], shown["message_id"]) == ("orders.eu.created", "order-1")
    pretty = meteor("tail", unique_name, "--from", "earliest", "--max", "1")
    assert "topic=orders.eu.created id=order-1" in pretty.out


def test_id_field_refuses_only_the_duplicate_lines(meteor: Meteor, unique_name: str, tmp_path: Path) -> None:
    meteor("streams", "create", unique_name, "--dedup-window-ms", "60000")
    source = tmp_path / "orders.jsonl"
    source.write_text("".join(json.dumps({"n": n, "id": f"o{n % 3}"}) + "\n" for n in range(5)))
    run = meteor("publish", unique_name, str(source), "--id-field", "id")
    assert run.code == EXIT_DUPLICATE, run
    assert "published 3 record(s)" in run.out and "refused 2 duplicate" in run.out
    assert re.findall(r"orders\.jsonl:(\d+): duplicate: message id '(o\d)'", run.err) == [("4", "o0"), ("5", "o1")]


def test_id_with_more_than_one_record_or_a_bad_stream_setting_is_a_user_error(
    meteor: Meteor, unique_name: str, tmp_path: Path
) -> None:
    meteor("streams", "create", unique_name)
    two = tmp_path / "two.json"
    two.write_text("1\n2\n")
    meteor("publish", unique_name, str(two), "--id", "x").assert_user_error("--id 'x'", "line 2", "--id-field")
    meteor("streams", "create", unique_name + "-b", "--dedup-window-ms", "-5").assert_user_error("dedup_window_ms")
