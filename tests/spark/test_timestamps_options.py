"""Parsing of the positions-by-time options (plain Python, no Spark session)."""

from __future__ import annotations

import json

import pytest

from meteor_spark.errors import ConfigError
from meteor_spark.spark.options import SourceOptions, TimePosition, TimestampStrategy


def _parse(batch: bool | None = True, **options: str) -> SourceOptions:
    return SourceOptions.parse({"stream": "a,b", **options}, batch=batch)


def test_times_parse_into_time_positions() -> None:
    every = _parse(startingTimestamp="1700000000000", endingTimestamp=" 1700000001000 ")
    assert every.starting_time == TimePosition("startingTimestamp", every_lane_ms=1_700_000_000_000)
    assert every.ending_time == TimePosition("endingTimestamp", every_lane_ms=1_700_000_001_000)
    assert every.timestamp_strategy is TimestampStrategy.ERROR
    per_lane = _parse(
        batch=False,
        startingOffsetsByTimestamp=json.dumps({"a": {"0": 5, "1": 6}, "b": {"0": 7}}),
        startingOffsetsByTimestampStrategy="LATEST",
    )
    assert per_lane.starting_time is not None and per_lane.starting_time.lanes == {"a": {0: 5, 1: 6}, "b": {0: 7}}
    assert per_lane.starting_time.ms_for("a", 1) == 6
    assert per_lane.timestamp_strategy is TimestampStrategy.LATEST
    with pytest.raises(
        ConfigError,
        match=r"startingOffsetsByTimestamp has no time for stream 'b' lane 1 "
        r"\(given lanes: 0\)",
    ):
        per_lane.starting_time.ms_for("b", 1)
    assert _parse().starting_time is None and _parse().ending_time is None


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"startingTimestamp": "-1"},
            r"option 'startingTimestamp': expected a time in ms since the epoch \(a whole "
            r"number >= 0\), got '-1'",
        ),
        ({"startingTimestamp": "soon"}, r"option 'startingTimestamp': expected a time in ms.*got 'soon'"),
        ({"endingTimestamp": "1.5"}, r"option 'endingTimestamp': expected a time in ms.*got '1.5'"),
        (
            {"startingOffsetsByTimestamp": '{"a": {"0": -5}}'},
            r"option 'startingOffsetsByTimestamp': stream 'a' lane 0: expected a time in ms.*got -5",
        ),
        ({"startingOffsetsByTimestamp": '{"a": {"0": 1.5}}'}, r"stream 'a' lane 0: expected a time.*got 1.5"),
        ({"startingOffsetsByTimestamp": '{"a": {"x": 1}}'}, r"lane 'x' is not a lane number"),
        ({"startingOffsetsByTimestamp": '{"a": 1}'}, r"stream 'a' must map lane numbers to times"),
        ({"startingOffsetsByTimestamp": "{oops"}, r"option 'startingOffsetsByTimestamp': not valid JSON"),
        (
            {"startingOffsetsByTimestamp": '{"c": {"0": 1}}'},
            r"startingOffsetsByTimestamp names stream\(s\) 'c' that option 'stream' does not read",
        ),
        ({"endingOffsetsByTimestamp": '{"c": {"0": 1}}'}, r"endingOffsetsByTimestamp names stream\(s\) 'c'"),
        (
            {"startingTimestamp": "1", "startingOffsetsByTimestamp": '{"a": {"0": 1}}'},
            r"options 'startingTimestamp' and 'startingOffsetsByTimestamp' both say where the read starts",
        ),
        (
            {"startingTimestamp": "1", "startingOffsets": "earliest"},
            r"options 'startingTimestamp' and 'startingOffsets' both say where the read starts.*Kafka's source would "
            r"silently take 'startingTimestamp'",
        ),
        (
            {"endingTimestamp": "1", "endingOffsets": "latest"},
            r"options 'endingTimestamp' and 'endingOffsets' both say where the read ends",
        ),
        (
            {"startingTimestamp": "1", "startingOffsetsByTimestampStrategy": "maybe"},
            r"option 'startingOffsetsByTimestampStrategy': expected error or latest, got 'maybe'",
        ),
        (
            {"startingOffsetsByTimestampStrategy": "latest"},
            r"option 'startingOffsetsByTimestampStrategy' needs startingTimestamp or startingOffsetsByTimestamp",
        ),
        ({"startingTimestmp": "1"}, r"did you mean 'startingTimestamp'"),
    ],
)
def test_bad_values_are_rejected_naming_the_option(options: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _parse(True, **options)


@pytest.mark.parametrize("name", ["endingTimestamp", "endingOffsetsByTimestamp"])
def test_ending_times_are_for_batch_reads_only(name: str) -> None:
    value = "5" if name == "endingTimestamp" else '{"a": {"0": 5}}'
    with pytest.raises(ConfigError, match=rf"option '{name}' applies to batch reads only"):
        _parse(batch=False, **{name: value})
    assert _parse(batch=None, **{name: value}).ending_time is not None  # not known yet at load(): checked later
