"""``meteor schemas register|list|show|check``: a typed stream's schema versions from the command line, an
incompatible schema refused naming the field."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

Meteor = Callable[..., Any]


def _write(path: Path, *fields: dict[str, object]) -> str:
    path.write_text(json.dumps({"type": "record", "name": "Order", "fields": list(fields)}))
    return str(path)


def test_register_list_show_and_check(meteor: Meteor, unique_name: str, tmp_path: Path) -> None:
    v1 = _write(tmp_path / "v1.avsc", {"name": "id", "type": "long"})
    v2 = _write(tmp_path / "v2.avsc", {"name": "id", "type": "long"}, {"name": "note", "type": "string", "default": ""})
    bad = _write(tmp_path / "bad.avsc", {"name": "id", "type": "string"})
    first = meteor("schemas", "register", unique_name, v1, "--compatibility", "full")
    assert first.code == 0 and f"stream {unique_name}: schema version 1" in first.out
    assert "schema version 1" in meteor("schemas", "register", unique_name, v1).out  # idempotent
    assert meteor("schemas", "check", unique_name, v2).out.strip() == f"stream {unique_name}: compatible"
    assert "schema version 2" in meteor("schemas", "register", unique_name, v2).out
    listing = meteor("schemas", "list")
    row = next(line for line in listing.out.splitlines() if unique_name in line)
    assert row.split()[1:4] == ["full", "2", "2"]
    shown = meteor("schemas", "show", unique_name, "--version", "1")
    assert "version 1 of 2 (full)" in shown.out and "Spark value type: struct<`id`: bigint>" in shown.out
    as_json = json.loads(meteor("schemas", "show", unique_name, "--json").out)
    assert as_json["version"] == 2 and as_json["schema"]["fields"][1]["name"] == "note"
    checked = meteor("schemas", "check", unique_name, bad)
    assert checked.code == 1 and "incompatible: backward: id: type 'long' cannot be read as 'string'" in checked.err
    meteor("schemas", "register", unique_name, bad).assert_user_error("id: type 'long' cannot be read as 'string'")
    meteor("schemas", "show", f"{unique_name}-none").assert_user_error("has no schema")
    meteor("schemas", "register", unique_name, str(tmp_path / "missing.avsc")).assert_user_error("cannot read")


def test_publish_and_tail_a_typed_stream(meteor: Meteor, unique_name: str, tmp_path: Path) -> None:
    schema = _write(tmp_path / "v1.avsc", {"name": "id", "type": "long"}, {"name": "who", "type": "string"})
    assert meteor("schemas", "register", unique_name, schema).code == 0
    assert meteor("streams", "create", unique_name, "--value-format", "avro").code == 0
    lines = tmp_path / "in.jsonl"
    lines.write_text('{"id": 1, "who": "ada"}\n{"id": "x", "who": "bob"}\n{"id": 3, "who": "cy"}\n')
    published = meteor("publish", unique_name, str(lines))
    assert "in.jsonl:2: " in published.err and "field 'Order.id' got 'x'" in published.err, published
    tailed = meteor("tail", unique_name, "--from", "earliest", "--max", "2", "--json")
    assert [json.loads(line)["value"] for line in tailed.out.splitlines()] == [
        {"id": 1, "who": "ada"},
        {"id": 3, "who": "cy"},
    ]
