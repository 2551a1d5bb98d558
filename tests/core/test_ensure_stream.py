"""``ensure_stream``: create, or compare the stored configuration and refuse / warn / apply, on the grid under test
(the embedded member, and a real Hazelcast member in the real-member tier)."""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Any

import pytest

from meteor_spark import EnsureResult, Publisher, StreamConfig, StreamConfigConflictError, ensure_stream
from meteor_spark.errors import ArgumentTypeError, ConfigError, GridOperationError
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.ensure import CHANGEABLE_FIELDS, FIXED_REASONS, StreamDifference
from meteor_spark.grid.streams import LAYOUT_FIELDS, STREAMS_MAP, open_stream, parse_metadata, ring_name


def _stored(grid: Grid, name: str) -> StreamConfig:
    text = grid.map(STREAMS_MAP).get(name)
    assert text is not None
    return parse_metadata(name, text).config


def test_absent_stream_is_created_then_found_unchanged(grid: Grid, unique_name: str) -> None:
    config = StreamConfig(unique_name, lanes=2, capacity=500, dedup_window_ms=60_000, region="eu")
    created = ensure_stream(grid, config)
    assert (created.outcome, created.created, created.changed, created.differences) == ("created", True, True, ())
    assert created.info.config == config == _stored(grid, unique_name)
    with Publisher(grid, unique_name) as pub:  # the rings are configured: records go in
        assert pub.publish(b"x") >= 0

    again = ensure_stream(grid, config, on_difference="error")
    assert (again.outcome, again.changed, again.differences) == ("unchanged", False, ())
    assert again.info.created_at_ms == created.info.created_at_ms


def test_error_refuses_and_lists_every_difference(grid: Grid, unique_name: str) -> None:
    ensure_stream(grid, StreamConfig(unique_name, capacity=500))
    asked = StreamConfig(unique_name, capacity=800, linger_ms=5.0, region="us")
    with pytest.raises(StreamConfigConflictError) as refused:
        ensure_stream(grid, asked)  # "error" is the default
    message = str(refused.value)
    assert "3 setting(s)" in message and "Nothing was changed" in message
    for fragment in ("capacity: 800 asked, 500 stored", "linger_ms: 5.0 asked, 0.0 stored", "region: 'us' asked"):
        assert fragment in message
    assert [(d.field, d.fate) for d in refused.value.differences] == [
        ("capacity", "refused"),
        ("linger_ms", "refused"),
        ("region", "refused"),
    ]
    assert _stored(grid, unique_name) == StreamConfig(unique_name, capacity=500)


def test_warn_logs_each_difference_and_keeps_the_stored_configuration(
    grid: Grid, unique_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    stored = StreamConfig(unique_name, lanes=2, compression="none")
    ensure_stream(grid, stored)
    with caplog.at_level(logging.WARNING, logger="meteor_spark.grid.ensure"):
        warned = ensure_stream(grid, StreamConfig(unique_name, lanes=3, dedup_window_ms=1000), on_difference="warn")
    assert warned.outcome == "warned" and not warned.changed
    assert [(d.field, d.stored, d.asked, d.fate) for d in warned.differences] == [
        ("lanes", 2, 3, "kept"),
        ("compression", "none", "lz4", "kept"),
        ("dedup_window_ms", 0, 1000, "kept"),
    ]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 3 and all("the stored value is kept" in w for w in warnings)
    assert warned.info.config == stored == _stored(grid, unique_name)


def test_apply_changes_the_stored_settings_for_parties_that_open_it_afterwards(grid: Grid, unique_name: str) -> None:
    first = ensure_stream(grid, StreamConfig(unique_name, lanes=2))
    asked = StreamConfig(
        unique_name,
        lanes=2,
        compression="none",
        compression_threshold=10,
        max_batch_records=50,
        max_batch_bytes=4096,
        linger_ms=2.5,
        dedup_window_ms=30_000,
        region="eu-west",
        value_format="avro",
    )
    applied = ensure_stream(grid, asked, on_difference="apply")
    assert applied.outcome == "applied" and applied.changed
    assert {d.field for d in applied.differences} == set(CHANGEABLE_FIELDS)
    assert all(d.fate == "applied" and d.changeable for d in applied.differences)
    assert _stored(grid, unique_name) == asked == applied.info.config
    assert applied.info.created_at_ms == first.info.created_at_ms
    # opened by name: the new defaults (now a typed stream without a schema: raw bytes, named)
    with Publisher(grid, unique_name, value_serializer="bytes") as pub:
        assert (pub.info.config.compression, pub.info.config.linger_ms) == ("none", 2.5)
    assert ensure_stream(grid, asked, on_difference="apply").outcome == "unchanged"


def test_open_stream_refuses_another_dedup_window_or_region_and_points_at_ensure(grid: Grid, unique_name: str) -> None:
    ensure_stream(grid, StreamConfig(unique_name, dedup_window_ms=10_000, region="eu"))
    for other in ({"dedup_window_ms": 10_000}, {"region": "eu"}, {}):
        with pytest.raises(StreamConfigConflictError, match="on_difference='apply'"):
            open_stream(grid, StreamConfig(unique_name, **other))
    agreeing = open_stream(grid, StreamConfig(unique_name, dedup_window_ms=10_000, region="eu", linger_ms=7.0))
    assert agreeing.config.linger_ms == 7.0  # the batching fields stay the party's own
    assert open_stream(grid, unique_name).config.dedup_window_ms == 10_000


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"lanes": 3}, "CRC-32"),
        ({"capacity": 999}, "InvalidConfigurationException"),
        ({"backup_count": 2}, "InvalidConfigurationException"),
        ({"async_backup_count": 1}, "InvalidConfigurationException"),
        ({"ttl_s": 60}, "InvalidConfigurationException"),
        ({"ephemeral": True}, "delivery contract"),
    ],
)
def test_apply_refuses_what_cannot_change_with_the_reason_and_writes_nothing(
    grid: Grid, unique_name: str, change: dict[str, Any], reason: str
) -> None:
    stored = StreamConfig(unique_name, lanes=2, capacity=500)
    ensure_stream(grid, stored)
    asked = dataclasses.replace(stored, linger_ms=9.0, **change)
    with pytest.raises(StreamConfigConflictError) as refused:
        ensure_stream(grid, asked, on_difference="apply")
    (field,) = change
    by_field = {d.field: d for d in refused.value.differences}
    assert by_field[field].fate == "refused" and reason in by_field[field].reason
    assert f"{field}: " in str(refused.value) and reason in str(refused.value)
    assert by_field["linger_ms"].fate == "kept" and "nothing was written" in by_field["linger_ms"].reason
    assert "new stream name" in str(refused.value)
    assert _stored(grid, unique_name) == stored


def test_the_ring_reason_is_what_the_member_answers(grid: Grid, unique_name: str) -> None:
    """The refusal's reason for the ring settings, checked against the grid under test: a second, different
    configuration for an existing ring name is refused (InvalidConfiguration, code 32); the same one is accepted."""
    ensure_stream(grid, StreamConfig(unique_name, capacity=500))
    ring = ring_name(unique_name, 0)
    grid.add_ring_config(ring, capacity=500, backups=1, async_backups=0, ttl_s=0)
    for other in ({"capacity": 600}, {"backups": 2}, {"ttl_s": 5}):
        settings = {"capacity": 500, "backups": 1, "async_backups": 0, "ttl_s": 0, **other}
        with pytest.raises(GridOperationError) as refused:
            grid.add_ring_config(ring, **settings)
        assert refused.value.code == 32 and "InvalidConfigurationException" in str(refused.value)
    assert set(FIXED_REASONS) == set(LAYOUT_FIELDS)


def test_concurrent_applies_never_lose_one(grid: Grid, grid_settings: GridSettings, unique_name: str) -> None:
    """Each ensure changes linger_ms from what it read to its own value by compare-and-set: the changes form one
    chain from the first value to the last, no two ensures report changing the same stored value. Three clients
    (three connections), so the races are the member's, not one client's."""
    ensure_stream(grid, StreamConfig(unique_name))
    values = [float(v) for v in range(1, 9)]
    start = threading.Barrier(len(values))
    results: dict[float, EnsureResult] = {}
    with Grid(grid_settings) as second, Grid(grid_settings) as third:
        clients = (grid, second, third)

        def run(index: int, linger: float) -> None:
            start.wait(timeout=30)
            config = StreamConfig(unique_name, linger_ms=linger)
            results[linger] = ensure_stream(clients[index % len(clients)], config, on_difference="apply")

        threads = [threading.Thread(target=run, args=(i, v)) for i, v in enumerate(values)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    assert sorted(results) == values and all(r.outcome == "applied" for r in results.values())
    changed_from = {r.differences[0].stored: linger for linger, r in results.items()}
    assert len(changed_from) == len(values), changed_from  # each stored value was replaced at most once
    value, chain = 0.0, 0
    while value in changed_from:
        value, chain = changed_from[value], chain + 1
    assert chain == len(values) and _stored(grid, unique_name).linger_ms == value
    print(f"\n{len(values)} concurrent applies: one chain of {chain} changes, final linger_ms={value}")


def test_concurrent_creates_make_one_stream(grid: Grid, unique_name: str) -> None:
    config = StreamConfig(unique_name, lanes=3)
    start = threading.Barrier(4)
    outcomes: list[str] = []

    def run() -> None:
        start.wait(timeout=30)
        outcomes.append(ensure_stream(grid, config).outcome)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(outcomes) == ["created", "unchanged", "unchanged", "unchanged"]


def test_wrong_calls_are_refused_clearly(grid: Grid, unique_name: str) -> None:
    with pytest.raises(ConfigError, match="on_difference must be one of 'error', 'warn', 'apply', got 'force'"):
        ensure_stream(grid, StreamConfig(unique_name), on_difference="force")  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError, match="needs a StreamConfig"):
        ensure_stream(grid, unique_name)  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError, match="grid must be"):
        ensure_stream(object(), StreamConfig(unique_name))  # type: ignore[arg-type]


def test_a_difference_describes_itself() -> None:
    difference = StreamDifference("capacity", 500, 800, "refused", "cannot change: rings")
    assert difference.describe() == "capacity: 800 asked, 500 stored -> refused (cannot change: rings)"
    assert not difference.changeable and StreamDifference("region", "", "eu", "applied").changeable
