"""Options, offsets, partition planning and rate limiting of format("meteor"): plain Python, no Spark session."""

from __future__ import annotations

import json
import pickle
import re
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import ReadMaxBytes

from meteor_spark.errors import ConfigError
from meteor_spark.format.arrow_columns import (
    ARROW_SCHEMA,
    ARROW_SCHEMA_WITH_HEADERS,
    ARROW_SCHEMA_WITH_HEADERS_MAP,
    HEADERS_MAP_TYPE,
    headers_to_map,
)
from meteor_spark.grid.client import GridSettings
from meteor_spark.spark.datasource import (
    SOURCE_SCHEMA,
    SOURCE_SCHEMA_WITH_HEADERS,
    SOURCE_SCHEMA_WITH_HEADERS_MAP,
    MeteorDataSource,
)
from meteor_spark.spark.executor import LaneRange, LaneRanges
from meteor_spark.spark.option_values import parse_duration_ms
from meteor_spark.spark.options import (
    OPTION_TABLE,
    OffsetSpec,
    SinkOptions,
    SourceOptions,
    describe_options,
)
from meteor_spark.spark.planning import (
    AUTO_SPLIT_MIN_ITEMS,
    ITEMS_PER_GROUPED_TASK,
    byte_limit,
    plan_partitions,
    plan_tasks,
    rate_limit,
)
from meteor_spark.spark.reader import MeteorStreamReader
from meteor_spark.spark.source_offset import SparkOffset


def test_defaults_follow_kafka() -> None:
    stream = SourceOptions.parse({"stream": "orders"})
    batch = SourceOptions.parse({"stream": "orders"}, batch=True)
    assert stream.streams == ("orders",)
    assert stream.starting.spec is OffsetSpec.LATEST
    assert batch.starting.spec is OffsetSpec.EARLIEST
    assert batch.ending.spec is OffsetSpec.LATEST
    assert stream.fail_on_data_loss is True
    assert stream.include_headers is False
    assert stream.max_trigger_delay_ms == 15 * 60 * 1000
    assert stream.grid == GridSettings()


def test_keys_are_case_insensitive_and_typed() -> None:
    options = SourceOptions.parse(
        {
            "STREAM": "a, b",
            "maxoffsetspertrigger": "10",
            "MinOffsetsPerTrigger": "2",
            "maxTriggerDelay": "30s",
            "minPartitions": "4",
            "maxPartitions": "8",
            "maxOffsetsPerPartition": "100",
            "failOnDataLoss": "false",
            "includeHeaders": "TRUE",
            "group": "billing",
            "groupLeaseMs": "2000",
            "hazelcast.members": "10.0.0.1:5701,10.0.0.2:5701",
            "hazelcast.clusterName": "prod",
        }
    )
    assert options.streams == ("a", "b")
    assert (options.max_offsets_per_trigger, options.min_offsets_per_trigger) == (10, 2)
    assert options.max_trigger_delay_ms == 30_000
    assert (options.min_partitions, options.max_partitions, options.max_offsets_per_partition) == (4, 8, 100)
    assert options.fail_on_data_loss is False and options.include_headers is True
    assert options.group == "billing" and options.group_lease_ms == 2000
    assert options.grid.members == ("10.0.0.1:5701", "10.0.0.2:5701")
    assert options.grid.cluster_name == "prod"


def test_path_from_load_is_the_stream() -> None:
    assert SourceOptions.parse({"path": "orders"}).streams == ("orders",)
    with pytest.raises(ConfigError, match="disagree"):
        SourceOptions.parse({"path": "orders", "stream": "other"})


def test_unknown_option_suggests_the_closest_name() -> None:
    with pytest.raises(
        ConfigError, match=r"unknown read option 'maxoffsetpertrigger'.*did you mean 'maxOffsetsPerTrigger'"
    ):
        SourceOptions.parse({"stream": "s", "maxOffsetPerTrigger": "5"})
    with pytest.raises(ConfigError, match="maxOffsetsPerPartition"):
        SourceOptions.parse({"stream": "s", "maxRecordsPerPartition": "5"})
    with pytest.raises(ConfigError, match=re.escape("hazelcast.clusterName")):
        SourceOptions.parse({"stream": "s", "hazelcast.clustername2": "x"})
    with pytest.raises(ConfigError, match="unknown write option 'startingoffsets'"):
        SinkOptions.parse({"stream": "s", "startingOffsets": "earliest"})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "option 'stream' is required"),
        ({"stream": "a,,b"}, "empty stream name"),
        ({"stream": "a,a"}, "names a stream twice"),
        ({"stream": "s", "maxOffsetsPerTrigger": "0"}, r"'maxOffsetsPerTrigger': expected a whole number > 0, got '0'"),
        ({"stream": "s", "maxOffsetsPerTrigger": "ten"}, "got 'ten'"),
        ({"stream": "s", "failOnDataLoss": "maybe"}, r"'failOnDataLoss': expected true or false, got 'maybe'"),
        ({"stream": "s", "maxTriggerDelay": "soon"}, "expected a duration like 15m"),
        ({"stream": "s", "startingOffsets": "oldest"}, r"expected earliest, latest, group or per-lane JSON"),
        ({"stream": "s", "startingOffsets": "{bad"}, "not valid JSON"),
        ({"stream": "s", "startingOffsets": '{"s": {"x": 1}}'}, "lane 'x' is not a lane number"),
        ({"stream": "s", "startingOffsets": '{"s": {"0": -3}}'}, "expected a ring sequence >= 0"),
        ({"stream": "s", "startingOffsets": '{"t": {"0": 1}}'}, "that option 'stream' does not read"),
        ({"stream": "s", "startingOffsets": "group"}, "needs option 'group'"),
        ({"stream": "s", "endingOffsets": "latest"}, "applies to batch reads only"),
        ({"stream": "s", "minOffsetsPerTrigger": "9", "maxOffsetsPerTrigger": "3"}, "larger than maxOffsetsPerTrigger"),
        ({"stream": "s", "group": " "}, "option 'group' is empty"),
        ({"stream": "s", "groupLeaseMs": "3000"}, r"option 'groupLeaseMs' needs option 'group'"),
        ({"stream": "s", "groupMemberId": "m"}, r"option 'groupMemberId' needs option 'group'"),
        ({"stream": "s", "group": "g", "groupMemberId": ""}, r"option 'groupMemberId' is empty"),
        ({"stream": "s", "group": "g", "groupMemberId": "  "}, r"option 'groupMemberId' is empty"),
        ({"stream": "no such stream"}, r"option 'stream': stream name 'no such stream' is not valid"),
        ({"stream": "ok,@meteor"}, r"option 'stream': stream name '@meteor' is not valid"),
        ({"stream": "s", "onCorrupt": "ignore"}, r"onCorrupt must be one of error, skip, dead_letter, got 'ignore'"),
        ({"stream": "s", "onCorrupt": "dead_letter"}, r"onCorrupt=dead_letter needs deadLetterStream"),
        (
            {"stream": "s", "onCorrupt": "skip", "deadLetterStream": "d"},
            r"deadLetterStream='d' goes with "
            r"onCorrupt=dead_letter",
        ),
        ({"stream": "s", "deadLetterStream": "bad name"}, r"option 'deadLetterStream': stream name 'bad name'"),
        ({"stream": "s", "deadLetterStream": "s"}, r"deadLetterStream 's' is also a stream this query reads"),
        (
            {"stream": "s", "minPartitions": "4", "maxPartitions": "2"},
            r"minPartitions \(4\) is larger than maxPartitions \(2\)",
        ),
    ],
)
def test_invalid_stream_options_name_option_value_and_fix(options: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SourceOptions.parse(options)


def test_streaming_only_options_are_rejected_by_batch_reads() -> None:
    with pytest.raises(ConfigError, match="'maxOffsetsPerTrigger' applies to streaming reads only"):
        SourceOptions.parse({"stream": "s", "maxOffsetsPerTrigger": "5"}, batch=True)
    parsed = SourceOptions.parse({"stream": "s", "endingOffsets": '{"s": {"0": 7, "1": -1}}'}, batch=True)
    assert parsed.ending.lanes == {"s": {0: 7, 1: -1}}


def test_sink_options() -> None:
    sink = SinkOptions.parse({"path": "out", "checkpointLocation": "/tmp/cp"})
    assert sink.stream == "out" and sink.sink_id == "/tmp/cp" and sink.create_stream
    assert SinkOptions.parse({"sinkId": "mine", "checkpointlocation": "/tmp/cp"}).sink_id == "mine"
    assert SinkOptions.parse({}).stream is None
    with pytest.raises(ConfigError, match="a writer takes one default stream"):
        SinkOptions.parse({"stream": "a,b"})


def test_conf_file_then_hazelcast_options(tmp_path) -> None:
    conf = tmp_path / "meteor.toml"
    conf.write_text('[hazelcast]\nmembers = ["10.1.1.1:5701"]\nclusterName = "fromfile"\n')
    options = SourceOptions.parse({"stream": "s", "conf": str(conf), "hazelcast.clusterName": "override"})
    assert options.grid.members == ("10.1.1.1:5701",)
    assert options.grid.cluster_name == "override"


def test_durations() -> None:
    assert [parse_duration_ms("d", v) for v in ("15m", "30s", "500ms", "1h", "250", "1.5s")] == [
        900_000,
        30_000,
        500,
        3_600_000,
        250,
        1500,
    ]


def test_option_table_covers_every_accepted_option() -> None:
    names = {row[0] for row in describe_options()}
    assert len(names) == len(OPTION_TABLE)
    # Every documented name parses (somewhere); every row is filled in.
    for name, applies_to, kind, default, meaning in describe_options():
        assert applies_to and kind and default and meaning, name
    for doc in OPTION_TABLE:
        if doc.name.startswith("hazelcast.") or doc.name == "conf":
            continue
        value = {
            "includeHeaders": "true",
            "failOnDataLoss": "true",
            "createStream": "true",
            "maxTriggerDelay": "1m",
            "startingOffsets": "earliest",
            "endingOffsets": "latest",
            "stream": "s",
            "group": "g",
            "groupMemberId": "m",
            "sinkId": "x",
            "onCorrupt": "skip",
            "deadLetterStream": "dlq",
            "headersAsMap": "true",
            "streamPattern": "s-.*",
            "startingOffsetsByTimestamp": '{"s": {"0": 3}}',
            "endingOffsetsByTimestamp": '{"s": {"0": 3}}',
            "startingOffsetsByTimestampStrategy": "latest",
            "isolation": "read_committed",
            "transactional": "true",
            "keyLanes": "false",
            "shared": "true",
            "groupOffsets": "auto",
        }.get(doc.name, "3")
        if "read" in doc.applies_to:
            batch = doc.applies_to.strip() == "read (batch)" or None
            grouped = {"group": "g"} if doc.name in ("groupLeaseMs", "groupMemberId") else {}
            if doc.name == "startingOffsetsByTimestampStrategy":
                grouped = {"startingTimestamp": "3"}
            if doc.name in ("shared", "maxRecordsPerTrigger", "acquisitionTimeoutMs", "maxDeliveries"):
                grouped = {"group": "g", "shared": "true", "deadLetterStream": "dlq"}
            needed = {"headersAsMap": {"includeHeaders": "true"}}.get(doc.name, {})
            base = {} if doc.name == "streamPattern" else {"stream": "s"}
            SourceOptions.parse({**base, doc.name: value, **grouped, **needed}, batch=batch)
        else:
            SinkOptions.parse({doc.name: value})


def test_corrupt_item_policy_is_parsed_once_into_the_options() -> None:
    assert SourceOptions.parse({"stream": "s"}).corrupt.mode == "error"
    assert SourceOptions.parse({"stream": "s", "onCorrupt": "SKIP"}, batch=True).corrupt.mode == "skip"
    dead = SourceOptions.parse({"stream": "s", "deadLetterStream": "dlq"}).corrupt
    assert (dead.mode, dead.dead_letter_stream) == ("dead_letter", "dlq")


def test_spark_offset_carries_skip_counts_under_a_key_no_stream_can_have() -> None:
    plain = SparkOffset.from_json({"s": {"0": 5}})  # a checkpoint from before the bookkeeping existed
    assert plain.skipped_items == 0 and plain.batch_items is None and plain.dumps() == '{"s": {"0": 5}}'
    counted = SparkOffset.of({"s": {0: 100, 1: 3}}, {("s", 0): 90, ("s", 1): 0}, batch_items=10)
    assert counted.to_json() == {"s": {"0": 100, "1": 3}, "@meteor": {"items": 10, "skipped": {"s": {"0": 90}}}}
    again = SparkOffset.from_json(json.loads(counted.dumps()))
    assert again == counted and again.dumps() == counted.dumps()
    assert again.positions == (("s", 0, 100), ("s", 1, 3)) and again.skipped_dict() == {("s", 0): 90}
    assert list(again.lanes()) == [("s", 0), ("s", 1)] and again.streams() == ("s",)
    with pytest.raises(ConfigError, match="not a meteor offset"):
        SparkOffset.from_json({"s": {"0": 1}, "@meteor": {"skipped": {"s": {"0": -1}}}})


def test_lag_of_a_first_batch_estimates_records_from_the_items_it_read() -> None:
    from meteor_spark.spark.lag import lag_from_progress

    first = {
        "batchId": 0,
        "sources": [
            {
                "startOffset": None,
                "endOffset": json.dumps({"s": {"0": 2}, "@meteor": {"items": 2}}),
                "latestOffset": json.dumps({"s": {"0": 6}}),
                "numInputRows": 8,
            }
        ],
    }
    report = lag_from_progress(first)
    assert report.records_per_item == 4.0 and report.records_behind_estimate == 16.0
    assert [(lane.stream, lane.lane) for lane in report.lanes] == [("s", 0)]
    skipping = {
        "batchId": 3,
        "sources": [
            {
                "startOffset": json.dumps({"s": {"0": 0}}),
                "endOffset": json.dumps({"s": {"0": 95}, "@meteor": {"skipped": {"s": {"0": 90}}}}),
                "latestOffset": json.dumps({"s": {"0": 100}}),
                "numInputRows": 5,
            }
        ],
    }
    report = lag_from_progress(skipping)
    assert report.records_per_item == 1.0 and report.items_behind == 5  # the 90 lost items were never read


def test_spark_offset_json_is_canonical() -> None:
    a = SparkOffset.of({"b": {10: 5, 2: 1}, "a": {0: 3}})
    b = SparkOffset.from_json({"a": {"0": 3}, "b": {"2": 1, "10": 5}})
    assert a == b
    assert a.dumps() == '{"a": {"0": 3}, "b": {"2": 1, "10": 5}}'
    assert SparkOffset.from_json(a.dumps()) == a
    assert a.get("b", 10) == 5 and a.get("b", 3) is None
    assert SparkOffset.of({"s": {0: 2}}).total_items_to(SparkOffset.of({"s": {0: 7, 1: 3}})) == 8
    with pytest.raises(ConfigError, match="not a meteor offset"):
        SparkOffset.from_json({"seq": 5})


def test_plan_partitions_splits_deterministically() -> None:
    ranges = [("s", 0, 0, 10), ("s", 1, 5, 6), ("s", 2, 3, 3)]
    assert plan_partitions(ranges, min_partitions=None, max_items_per_partition=None) == [
        ("s", 0, 0, 10),
        ("s", 1, 5, 6),
    ]
    assert plan_partitions(ranges, min_partitions=None, max_items_per_partition=4) == [
        ("s", 0, 0, 4),
        ("s", 0, 4, 8),
        ("s", 0, 8, 10),
        ("s", 1, 5, 6),
    ]
    four = plan_partitions(ranges, min_partitions=4, max_items_per_partition=None)
    assert len(four) == 4
    assert sum(hi - lo for _, _, lo, hi in four) == 11
    assert four == plan_partitions(ranges, min_partitions=4, max_items_per_partition=None)
    # A range of one item cannot be split further: fewer partitions than asked, never empty ones.
    assert plan_partitions([("s", 0, 0, 1)], min_partitions=8, max_items_per_partition=None) == [("s", 0, 0, 1)]
    # Parts are equal to within one item (not halves of halves), and a split floor is respected.
    assert plan_partitions([("s", 0, 0, 2000)], min_partitions=3, max_items_per_partition=None) == [
        ("s", 0, 0, 666),
        ("s", 0, 666, 1333),
        ("s", 0, 1333, 2000),
    ]
    assert plan_partitions([("s", 0, 0, 100)], min_partitions=2, max_items_per_partition=None, min_piece_items=64) == [
        ("s", 0, 0, 100)
    ]


def _tasks(ranges: list[tuple[str, int, int, int]], **options: Any) -> list[tuple[tuple[str, int, int, int], ...]]:
    settings: dict[str, Any] = {
        "min_partitions": None,
        "max_partitions": None,
        "max_items_per_partition": None,
        "cpus": 2,
    }
    settings.update(options)
    return plan_tasks(ranges, **settings)


def test_plan_tasks_splits_one_busy_lane_over_the_cores_but_not_a_small_batch() -> None:
    assert _tasks([("s", 0, 0, 2000)]) == [(("s", 0, 0, 1000),), (("s", 0, 1000, 2000),)]
    assert _tasks([("s", 0, 0, 2000)], cpus=4) == [
        (("s", 0, 0, 500),),
        (("s", 0, 500, 1000),),
        (("s", 0, 1000, 1500),),
        (("s", 0, 1500, 2000),),
    ]
    # Without minPartitions a range is split only into pieces of >= AUTO_SPLIT_MIN_ITEMS items.
    assert _tasks([("s", 0, 0, AUTO_SPLIT_MIN_ITEMS * 2 - 1)]) == [(("s", 0, 0, AUTO_SPLIT_MIN_ITEMS * 2 - 1),)]
    # An explicit minPartitions splits down to single items.
    assert _tasks([("s", 0, 0, 3)], min_partitions=3) == [(("s", 0, 0, 1),), (("s", 0, 1, 2),), (("s", 0, 2, 3),)]


def test_plan_tasks_groups_lanes_into_balanced_tasks_deterministically() -> None:
    four = [("s", lane, 0, 551 if lane == 0 else 550) for lane in range(4)]
    tasks = _tasks(four)
    assert tasks == [(("s", 0, 0, 551), ("s", 3, 0, 550)), (("s", 1, 0, 550), ("s", 2, 0, 550))]
    assert tasks == _tasks(list(reversed(four)))  # replays plan the same tasks whatever the input order
    # Every item is read exactly once.
    assert sorted(p for task in tasks for p in task) == sorted(four)
    # Large ranges keep a task each (one per ITEMS_PER_GROUPED_TASK items at least, a multiple of the cores).
    wide = [("s", lane, 0, ITEMS_PER_GROUPED_TASK) for lane in range(6)]
    assert len(_tasks(wide)) == 6
    # maxPartitions caps grouping; adjacent pieces of one lane that end up together are merged.
    assert _tasks(four, max_partitions=1) == [tuple(sorted(four))]
    assert _tasks([("s", 0, 0, 2000)], max_partitions=1) == [(("s", 0, 0, 2000),)]
    # maxOffsetsPerPartition bounds a task's items even when that means more tasks.
    capped = _tasks(four, max_items_per_partition=600)
    assert len(capped) == 4 and all(sum(hi - lo for _, _, lo, hi in task) <= 600 for task in capped)
    # A stream with many small lanes: as many tasks as cores, not one per lane.
    trickle = [("s", lane, 10, 12) for lane in range(64)]
    assert len(_tasks(trickle)) == 2
    assert sorted(p for task in _tasks(trickle) for p in task) == sorted(trickle)


def test_rate_limit_is_proportional_and_never_starves_a_lane() -> None:
    start = {("s", 0): 0, ("s", 1): 0, ("s", 2): 0}
    latest = {("s", 0): 90, ("s", 1): 9, ("s", 2): 1}
    ends = rate_limit(start, latest, 10)
    assert ends == {("s", 0): 9, ("s", 1): 1, ("s", 2): 1}
    assert rate_limit(start, latest, 1000) == latest


def test_schemas_match_spark_exactly() -> None:
    assert to_arrow_schema(SOURCE_SCHEMA, timezone="UTC") == ARROW_SCHEMA
    assert to_arrow_schema(SOURCE_SCHEMA_WITH_HEADERS, timezone="UTC") == ARROW_SCHEMA_WITH_HEADERS
    source = MeteorDataSource({"stream": "s", "includeHeaders": "true"})
    assert source.schema() == SOURCE_SCHEMA_WITH_HEADERS


def test_reader_and_partitions_pickle_without_connections() -> None:
    options = SourceOptions.parse({"stream": "s"})
    reader = MeteorStreamReader(options, SOURCE_SCHEMA)
    reader._state = object()  # type: ignore[assignment]  # stands in for live connections
    copy = pickle.loads(pickle.dumps(reader))
    assert copy._state is None and copy.options == options
    partition = LaneRange("s", 0, 1, 5, options.grid, None)
    assert pickle.loads(pickle.dumps(partition)) == partition
    task = LaneRanges((partition, LaneRange("s", 1, 0, 2, options.grid, None)))
    assert pickle.loads(pickle.dumps(task)) == task and task.items == 6
    assert isinstance(pa.schema([]), pa.Schema)


def test_docs_option_table_is_in_sync() -> None:
    from meteor_spark.cli.docs import REGENERATE, options_table, page

    assert options_table() in page("options").read_text(encoding="utf-8"), (
        f"docs/spark.md's option table differs from OPTION_TABLE; regenerate it with `{REGENERATE}`"
    )


def test_stream_pattern_is_a_full_match_and_excludes_stream() -> None:
    options = SourceOptions.parse({"streamPattern": r"orders-\d+"})
    assert options.streams == ()
    assert options.matches("orders-12")
    assert not options.matches("orders-12x")  # full match, like Kafka's subscribePattern
    assert not options.matches("xorders-1")
    with pytest.raises(ConfigError, match=r"'streamPattern'.*not a valid regular expression"):
        SourceOptions.parse({"streamPattern": "orders-("})
    with pytest.raises(ConfigError, match=r"'stream'.*'streamPattern' exclude each other"):
        SourceOptions.parse({"stream": "a", "streamPattern": "a.*"})
    with pytest.raises(ConfigError, match="'streamPattern' is empty"):
        SourceOptions.parse({"streamPattern": " "})
    with pytest.raises(ConfigError, match=r"streamPattern 'o-.*' does not match"):
        SourceOptions.parse({"streamPattern": "o-.*", "startingOffsets": '{"x": {"0": 1}}'})
    with pytest.raises(ConfigError, match="deadLetterStream 'o-dlq' is also a stream this query reads"):
        SourceOptions.parse({"streamPattern": "o-.*", "deadLetterStream": "o-dlq"})
    assert pickle.loads(pickle.dumps(options)) == options


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1024", 1024),
        ("64m", 64 << 20),
        ("1g", 1 << 30),
        ("512k", 512 << 10),
        ("1.5k", 1536),
        ("64MiB", 64 << 20),
        ("2 MB", 2 << 20),
        ("10b", 10),
    ],
)
def test_byte_limits_accept_units(text: str, expected: int) -> None:
    options = SourceOptions.parse({"stream": "s", "maxBytesPerTrigger": text, "maxBytesPerLanePerTrigger": text})
    assert options.max_bytes_per_trigger == expected
    assert options.max_bytes_per_lane_per_trigger == expected


@pytest.mark.parametrize("name", ["maxBytesPerTrigger", "maxBytesPerLanePerTrigger"])
@pytest.mark.parametrize("text", ["0", "-5", "lots", "12q", "", "0.1b"])
def test_bad_byte_limits_are_rejected_with_the_option_named(name: str, text: str) -> None:
    with pytest.raises(ConfigError, match=f"option '{name}'"):
        SourceOptions.parse({"stream": "s", name: text})


def test_byte_limits_are_for_streaming_reads() -> None:
    with pytest.raises(ConfigError, match="'maxBytesPerTrigger' applies to streaming reads only"):
        SourceOptions.parse({"stream": "s", "maxBytesPerTrigger": "1m"}, batch=True)
    reader = MeteorStreamReader(SourceOptions.parse({"stream": "s", "maxBytesPerLanePerTrigger": "1m"}), SOURCE_SCHEMA)
    assert reader.getDefaultReadLimit() == ReadMaxBytes(1 << 20)


def test_headers_as_map_needs_include_headers_and_sets_the_schema() -> None:
    with pytest.raises(ConfigError, match=r"'headersAsMap'.*includeHeaders=true"):
        SourceOptions.parse({"stream": "s", "headersAsMap": "true"})
    with pytest.raises(ConfigError, match="option 'headersAsMap': expected true or false"):
        SourceOptions.parse({"stream": "s", "includeHeaders": "true", "headersAsMap": "maybe"})
    source = MeteorDataSource({"stream": "s", "includeHeaders": "true", "headersAsMap": "true"})
    assert source.schema() == SOURCE_SCHEMA_WITH_HEADERS_MAP
    assert to_arrow_schema(SOURCE_SCHEMA_WITH_HEADERS_MAP, timezone="UTC") == ARROW_SCHEMA_WITH_HEADERS_MAP


def test_headers_to_map_keeps_the_last_value_of_a_repeated_key() -> None:
    values = [b"a", b"b", b"c", b"d"]
    headers = [[("k", b"1"), ("j", b"2"), ("k", b"3")], [], [("x", b"")], [("k", b"4"), ("k", b"5")]]
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array(values, pa.binary()),
            pa.array(
                [[{"key": k, "value": v} for k, v in row] for row in headers],
                ARROW_SCHEMA_WITH_HEADERS.field("headers").type,
            ),
        ],
        names=["value", "headers"],
    )
    as_map = headers_to_map(batch)
    assert as_map.schema.field("headers").type == HEADERS_MAP_TYPE
    assert as_map.column("headers").to_pylist() == [[("j", b"2"), ("k", b"3")], [], [("x", b"")], [("k", b"5")]]
    assert as_map.column("value").to_pylist() == values
    no_duplicates = headers_to_map(batch.slice(1, 2))
    assert no_duplicates.column("headers").to_pylist() == [[], [("x", b"")]]


def test_byte_limit_splits_by_bytes_with_at_least_one_item_per_lane() -> None:
    start = {("s", 0): 0, ("s", 1): 10, ("s", 2): 0}
    latest = {("s", 0): 100, ("s", 1): 20, ("s", 2): 0}
    sizes = {("s", 0): 1000.0, ("s", 1): 100_000.0}
    # per lane: 10 KB per lane -> lane 0 admits 10 items of 1 KB, lane 1 one item of 100 KB (never stalls)
    assert byte_limit(start, latest, sizes, max_bytes=None, max_lane_bytes=10_000) == {
        ("s", 0): 10,
        ("s", 1): 11,
        ("s", 2): 0,
    }
    # over all lanes: 100 KB of a 1.1 MB backlog, split by bytes: lane 0 (100 KB) gets ~9 KB, lane 1 ~91 KB
    assert byte_limit(start, latest, sizes, max_bytes=100_000, max_lane_bytes=None) == {
        ("s", 0): 9,
        ("s", 1): 10 + 1,
        ("s", 2): 0,
    }
    # enough budget: everything
    assert byte_limit(start, latest, sizes, max_bytes=10**9, max_lane_bytes=None) == latest
    # a lane without an estimate is not limited
    assert byte_limit(start, latest, {}, max_bytes=1, max_lane_bytes=1) == latest
