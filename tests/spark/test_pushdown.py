"""Filter pushdown of the batch reader against the real grid and a real local[2] Spark.

A 4-lane stream of 400 records, 10 keys routed to their lanes by ``lane_for_key``, timestamps rising by 1 ms,
5 records per ring item. Every ``where`` is read with ``spark.sql.python.filterPushdown.enabled`` on and off: the
rows must be equal, and the reader's planning (the same code Spark's pushdown worker runs, in this process)
must read fewer ring items.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from pyspark.sql.datasource import EqualTo, Filter, GreaterThan, GreaterThanOrEqual, In, LessThan
from pyspark.testing import assertDataFrameEqual
from spark_helpers import grid_options, make_stream, put_items

from meteor_spark.errors import ConfigError
from meteor_spark.format.offsets import make_offset
from meteor_spark.format.partitioning import lane_for_key
from meteor_spark.format.records import Record
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.spark.batch_reader import MeteorBatchReader, MeteorPushdownReader
from meteor_spark.spark.datasource import SOURCE_SCHEMA, MeteorDataSource
from meteor_spark.spark.options import SourceOptions
from meteor_spark.spark.pushdown import select

pytestmark = [pytest.mark.spark, pytest.mark.slow]

PUSHDOWN = "spark.sql.python.filterPushdown.enabled"
T = 1_700_000_000_000
RECORDS = 400
PER_ITEM = 5


def _ts(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


@pytest.fixture
def stream(grid: Grid, unique_name: str) -> str:
    info = make_stream(grid, unique_name, lanes=4)
    by_lane: dict[int, list[Record]] = {}
    for i in range(RECORDS):
        key = f"k{i % 10}".encode()
        by_lane.setdefault(lane_for_key(key, 4), []).append(Record(b"v%d" % i, key=key, timestamp_ms=T + i))
    for lane, records in by_lane.items():
        put_items(grid, info, lane, [records[i : i + PER_ITEM] for i in range(0, len(records), PER_ITEM)])
    return unique_name


@pytest.fixture
def pushdown_conf(spark: Any) -> Iterator[None]:
    before = spark.conf.get(PUSHDOWN)
    yield
    spark.conf.set(PUSHDOWN, before)


def _rows(spark: Any, settings: GridSettings, stream: str, where: str, *, pushdown: bool) -> list[Any]:
    spark.conf.set(PUSHDOWN, str(pushdown).lower())
    df = spark.read.format("meteor").options(**grid_options(settings)).option("stream", stream).load()
    return df.where(where).collect()


def _planned(settings: GridSettings, stream: str, filters: list[Filter] | None) -> int:
    options = SourceOptions.parse({**grid_options(settings), "stream": stream}, batch=True)
    reader = MeteorPushdownReader(options, SOURCE_SCHEMA)
    if filters is not None:
        list(reader.pushFilters(filters))
    reader.partitions()
    assert reader.planned_items is not None
    return reader.planned_items


def _where_cases() -> list[tuple[str, list[Filter]]]:
    k3_lane = lane_for_key(b"k3", 4)
    since = _ts(T + 360)
    return [
        (f"timestamp >= '{since.isoformat()}'", [GreaterThanOrEqual(("timestamp",), since)]),
        ("lane IN (1, 2)", [In(("lane",), (1, 2))]),
        ("key = CAST('k3' AS BINARY)", [EqualTo(("key",), b"k3")]),
        (
            f"offset >= {make_offset(3, 0)} AND offset < {make_offset(6, 0)}",
            [
                GreaterThanOrEqual(("offset",), make_offset(3, 0)),
                LessThan(("offset",), make_offset(6, 0)),
            ],
        ),
        (
            f"timestamp > '{_ts(T + 200).isoformat()}' AND lane = {k3_lane} AND key = CAST('k3' AS BINARY)",
            [GreaterThan(("timestamp",), _ts(T + 200)), EqualTo(("lane",), k3_lane), EqualTo(("key",), b"k3")],
        ),
    ]


@pytest.mark.parametrize(("where", "filters"), _where_cases(), ids=["timestamp", "lanes", "key", "offsets", "all"])
def test_pushed_filters_return_the_same_rows_and_read_fewer_items(
    spark: Any, grid_settings: GridSettings, stream: str, pushdown_conf: None, where: str, filters: list[Filter]
) -> None:
    pushed = _rows(spark, grid_settings, stream, where, pushdown=True)
    unpushed = _rows(spark, grid_settings, stream, where, pushdown=False)
    assert pushed, where
    assertDataFrameEqual(pushed, unpushed)
    every, narrowed = _planned(grid_settings, stream, None), _planned(grid_settings, stream, filters)
    print(f"\n{where}: {len(pushed)} rows; ring items read {narrowed} of {every} with pushdown")
    assert every == RECORDS // PER_ITEM
    assert narrowed < every


def test_the_timestamp_bound_reads_only_the_items_from_its_first_record(
    grid_settings: GridSettings, stream: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The last 10 % of 400 records (1 ms apart, 5 per item) over 4 lanes: each lane starts at the item holding its
    # first record at or after T + 360, so at most one extra item per lane is read.
    with caplog.at_level(logging.INFO, logger="meteor_spark.spark.batch_reader"):
        narrowed = _planned(grid_settings, stream, [GreaterThanOrEqual(("timestamp",), _ts(T + 360))])
    assert 40 // PER_ITEM <= narrowed <= 40 // PER_ITEM + 4
    assert "filter pushdown: narrowing (re-checked by Spark) timestamp >= " in caplog.text
    assert f"planned {narrowed} ring items" in caplog.text


@pytest.mark.parametrize(
    "where",
    ["lane = 99", f"timestamp >= '{_ts(T + 10 * RECORDS).isoformat()}'", "offset < 0", "lane IN (1) AND lane = 2"],
)
def test_an_empty_selection_is_an_empty_dataframe(
    spark: Any, grid_settings: GridSettings, stream: str, pushdown_conf: None, where: str
) -> None:
    assert _rows(spark, grid_settings, stream, where, pushdown=True) == []


def test_reads_work_with_the_conf_off_and_pushdown_is_offered_only_to_the_pushdown_worker(
    spark: Any, grid_settings: GridSettings, stream: str, pushdown_conf: None
) -> None:
    # A reader class overriding pushFilters would fail this read (DATA_SOURCE_PUSHDOWN_DISABLED).
    assert len(_rows(spark, grid_settings, stream, "lane = 1", pushdown=False)) > 0
    source = MeteorDataSource({**grid_options(grid_settings), "stream": stream})
    assert type(source.reader(SOURCE_SCHEMA)) is MeteorBatchReader


def test_what_each_filter_selects() -> None:
    since = _ts(T)
    filters: list[Filter] = [
        In(("lane",), (0, 1, 2)),
        EqualTo(("lane",), 1),
        EqualTo(("key",), b"a"),
        GreaterThanOrEqual(("timestamp",), since),
        LessThan(("timestamp",), since),
        GreaterThan(("offset",), make_offset(2, 5)),
        LessThan(("offset",), make_offset(9, 0)),
        EqualTo(("value",), b"x"),
    ]
    selection, remaining = select(filters)
    assert selection.lanes == frozenset({1}) and selection.keys == frozenset({b"a"}) and selection.since_ms == T
    # lane and key are exact (pushed); the rest narrows ranges or is unused, and Spark re-checks it.
    assert remaining == filters[3:]
    assert selection.offset_range(0, 100) == (2, 9)
    low, high = selection.offset_range(20, 100)
    assert low == high  # nothing left to read
    assert selection.lanes_of(4, key_lanes=True) == ([1] if lane_for_key(b"a", 4) == 1 else [])
    assert selection.lanes_of(4, key_lanes=False) == [1]


def test_pushed_lane_filter_leaves_sparks_own_filter(
    spark: Any, grid_settings: GridSettings, stream: str, pushdown_conf: None, capsys: pytest.CaptureFixture[str]
) -> None:
    plans = {}
    for pushdown in (True, False):
        spark.conf.set(PUSHDOWN, str(pushdown).lower())
        df = spark.read.format("meteor").options(**grid_options(grid_settings)).option("stream", stream).load()
        df.where("lane = 1 AND timestamp >= '2000-01-01'").explain()
        plans[pushdown] = capsys.readouterr().out
    # Exact filters (lane) are Spark's no more; timestamp bounds only narrow the read, and Spark re-checks them.
    lane_equals = re.compile(r"lane#\d+ = 1\b")
    assert not lane_equals.search(plans[True]) and "timestamp#" in plans[True]
    assert lane_equals.search(plans[False])


def test_key_lanes_is_a_batch_option() -> None:
    assert not SourceOptions.parse({"stream": "s", "keyLanes": "false"}, batch=True).key_lanes
    with pytest.raises(ConfigError, match="'keyLanes' applies to batch reads only"):
        SourceOptions.parse({"stream": "s", "keyLanes": "false"}, batch=False)


def test_key_lanes_false_finds_keyed_records_published_to_other_lanes(
    spark: Any, grid: Grid, grid_settings: GridSettings, unique_name: str, pushdown_conf: None
) -> None:
    info = make_stream(grid, unique_name, lanes=4)
    home = lane_for_key(b"k", 4)
    put_items(grid, info, home, [[Record(b"routed", key=b"k")]])
    put_items(grid, info, (home + 1) % 4, [[Record(b"elsewhere", key=b"k")]])
    spark.conf.set(PUSHDOWN, "true")
    for key_lanes, expected in (("true", ["routed"]), ("false", ["elsewhere", "routed"])):
        df = (
            spark.read.format("meteor")
            .options(**grid_options(grid_settings))
            .option("stream", unique_name)
            .option("keyLanes", key_lanes)
            .load()
            .where("key = CAST('k' AS BINARY)")
        )
        assert sorted(row.value.decode() for row in df.collect()) == expected
