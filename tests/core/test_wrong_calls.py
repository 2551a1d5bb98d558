"""Every wrong argument at the public API is a ConfigError (or its ArgumentTypeError) naming it.

Each case is one wrong call a user can make: publishing, subscribing, stream and grid configuration, Spark options
(parsed as Spark hands them to the data source) and the command line. A case passes only when the call raises a
``ConfigError`` whose message names the argument; another exception type is a traceback the user did not deserve,
and a call that returns is a silent acceptance. The totals are printed at the end of the module.
"""

from __future__ import annotations

import contextlib
import io
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pytest

from meteor_spark.cli.main import main
from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.errors import ConfigError
from meteor_spark.format.records import Record
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.streams import StreamConfig
from meteor_spark.producer.publisher import Publisher
from meteor_spark.spark.options import SinkOptions, SourceOptions

TALLY: Counter[str] = Counter()


@dataclass
class Context:
    grid: Grid
    settings: GridSettings
    stream: str
    pub: Publisher
    sub: Subscriber


Call = Callable[[Context], object]


def _record(**fields: Any) -> Callable[[Context], object]:
    return lambda c: c.pub.publish(Record(b"v", **fields), timeout_s=10)


def _publisher(**kwargs: Any) -> Call:
    return lambda c: Publisher(c.grid, c.stream, **kwargs).close()


def _subscriber(**kwargs: Any) -> Call:
    return lambda c: Subscriber(c.grid, c.stream, **kwargs).close()


def _source(**options: str) -> Call:
    return lambda c: SourceOptions.parse({"stream": c.stream, **options}, batch=True)


def _sink(**options: str) -> Call:
    return lambda c: SinkOptions.parse({"stream": c.stream, "checkpointLocation": "/tmp/x", **options})


def _cli(*argv: str) -> Call:
    """A command line: its error must be one line on stderr (no traceback) naming the mistake, exit code 1."""

    def run(c: Context) -> object:
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            code = main(
                [
                    "--members",
                    c.settings.members[0],
                    "--cluster-name",
                    c.settings.cluster_name,
                    "--connect-timeout",
                    "5",
                    *[a.replace("STREAM", c.stream) for a in argv],
                ]
            )
        text = stderr.getvalue()
        if code == 0:
            return code  # accepted
        assert "Traceback" not in text, text
        raise ConfigError(text)

    return run


#: label -> (the wrong call, a word its error must name)
CASES: dict[str, tuple[Call, str]] = {
    # publisher construction
    "Publisher(None, ...)": (lambda c: Publisher(None, c.stream), "grid"),  # type: ignore[arg-type]
    "Publisher(grid, None)": (lambda c: Publisher(c.grid, None), "stream"),  # type: ignore[arg-type]
    "Publisher(grid, 42)": (lambda c: Publisher(c.grid, 42), "stream"),  # type: ignore[arg-type]
    "non-UTF-8 stream name": (lambda c: Publisher(c.grid, "a\udcff"), "stream name"),
    "empty stream name": (lambda c: Publisher(c.grid, ""), "stream name"),
    "stream name with a newline": (lambda c: Publisher(c.grid, c.stream + "\n"), "stream name"),
    "stream name with a space": (lambda c: Publisher(c.grid, "bad name"), "stream name"),
    "linger_ms=-1": (_publisher(linger_ms=-1), "linger_ms"),
    "linger_ms='5'": (_publisher(linger_ms="5"), "linger_ms"),
    "linger_ms=inf": (_publisher(linger_ms=float("inf")), "linger_ms"),
    "max_batch_records=0": (_publisher(max_batch_records=0), "max_batch_records"),
    "max_batch_records=70000": (_publisher(max_batch_records=70_000), "max_batch_records"),
    "max_batch_bytes=0": (_publisher(max_batch_bytes=0), "max_batch_bytes"),
    "max_buffered_records=0": (_publisher(max_buffered_records=0), "max_buffered_records"),
    "max_block_ms=-1": (_publisher(max_block_ms=-1), "max_block_ms"),
    "max_items_per_call=1000": (_publisher(max_items_per_call=1000), "max_items_per_call"),
    "max_call_bytes=0": (_publisher(max_call_bytes=0), "max_call_bytes"),
    "compression='zip'": (_publisher(compression="zip"), "compression"),
    "compression_threshold=-1": (_publisher(compression_threshold=-1), "compression_threshold"),
    "idempotent='yes'": (_publisher(idempotent="yes"), "idempotent"),
    "delivery_timeout_ms=0": (_publisher(delivery_timeout_ms=0), "delivery_timeout_ms"),
    "value_serializer='yaml'": (_publisher(value_serializer="yaml"), "value_serializer"),
    "key_serializer=42": (_publisher(key_serializer=42), "key_serializer"),
    "metrics='prometheus'": (_publisher(metrics="prometheus"), "metrics"),
    "transactional='no'": (_publisher(transactional="no"), "transactional"),
    # publish, publish_async
    "publish(None)": (lambda c: c.pub.publish(None), "NoneType"),
    "publish(42)": (lambda c: c.pub.publish(42), "int"),
    "Record value str": (lambda c: c.pub.publish(Record("text")), "value"),  # type: ignore[arg-type]
    "Record key str": (_record(key="k"), "key"),
    "Record headers of str values": (_record(headers=(("a", "b"),)), "headers"),
    "Record headers of one element": (_record(headers=(("a",),)), "headers"),
    "timestamp_ms=2**70": (_record(timestamp_ms=2**70), "timestamp_ms"),
    "timestamp_ms=-1": (_record(timestamp_ms=-1), "timestamp_ms"),
    "timestamp_ms=1.5": (_record(timestamp_ms=1.5), "timestamp_ms"),
    "timestamp_ms='now'": (_record(timestamp_ms="now"), "timestamp_ms"),
    "lane=-2": (_record(lane=-2), "lane"),
    "lane=99 of 2": (_record(lane=99), "lane"),
    "lane='0'": (_record(lane="0"), "lane"),
    "lane=True": (_record(lane=True), "lane"),
    "publish timeout_s=-1": (lambda c: c.pub.publish(b"v", timeout_s=-1), "timeout_s"),
    "publish timeout_s=inf": (lambda c: c.pub.publish(b"v", timeout_s=float("inf")), "timeout_s"),
    "publish timeout_s='1'": (lambda c: c.pub.publish(b"v", timeout_s="1"), "timeout_s"),  # type: ignore[arg-type]
    "publish_async(object())": (lambda c: c.pub.publish_async(object()), "object"),
    "publish_async callback='x'": (lambda c: c.pub.publish_async(b"v", callback="x"), "callback"),  # type: ignore[arg-type]
    # publish_many, publish_arrow, flush, close
    "publish_many('abc')": (lambda c: c.pub.publish_many("abc"), "publish_many"),
    "publish_many(b'abc')": (lambda c: c.pub.publish_many(b"abc"), "publish_many"),
    "publish_many(Record)": (lambda c: c.pub.publish_many(Record(b"x")), "publish_many"),  # type: ignore[arg-type]
    "publish_many(5)": (lambda c: c.pub.publish_many(5), "publish_many"),  # type: ignore[arg-type]
    "publish_many([b'ok', 5])": (lambda c: c.pub.publish_many([b"ok", 5]), "int"),
    "publish_many lane=-2": (lambda c: c.pub.publish_many([Record(b"x", lane=-2)]), "lane"),
    "publish_many timestamp_ms=-5": (lambda c: c.pub.publish_many([Record(b"x", timestamp_ms=-5)]), "timestamp"),
    "publish_arrow without value": (lambda c: c.pub.publish_arrow(pa.table({"x": [1]})), "value"),
    "publish_arrow('abc')": (lambda c: c.pub.publish_arrow("abc"), "publish_arrow"),
    "publish_arrow int values": (lambda c: c.pub.publish_arrow(pa.table({"value": [1, 2]})), "value"),
    "publish_arrow lane 99": (lambda c: c.pub.publish_arrow(pa.table({"value": [b"a"], "lane": [99]})), "lane"),
    "flush(-1)": (lambda c: c.pub.flush(-1), "timeout_s"),
    "close(nan)": (lambda c: c.pub.close(float("nan")), "timeout_s"),
    # subscriber construction
    "Subscriber(None, ...)": (lambda c: Subscriber(None, c.stream), "grid"),  # type: ignore[arg-type]
    "Subscriber non-UTF-8 stream": (lambda c: Subscriber(c.grid, "a\udcff"), "stream name"),
    "group=''": (_subscriber(group=""), "group"),
    "non-UTF-8 group": (_subscriber(group="g\udcff"), "group"),
    "group=5": (_subscriber(group=5), "group"),
    "initial_offset_scheme='first'": (_subscriber(initial_offset_scheme="first"), "initial_offset_scheme"),
    "max_poll_records=0": (_subscriber(max_poll_records=0), "max_poll_records"),
    "max_items_per_read=5000": (_subscriber(max_items_per_read=5000), "max_items_per_read"),
    "max_bytes_per_read=0": (_subscriber(max_bytes_per_read=0), "max_bytes_per_read"),
    "lease_ms=0": (_subscriber(group="g", lease_ms=0), "lease_ms"),
    "on_corrupt='ignore'": (_subscriber(on_corrupt="ignore"), "on_corrupt"),
    "dead_letter_stream = the stream read": (
        lambda c: Subscriber(c.grid, c.stream, on_corrupt="dead_letter", dead_letter_stream=c.stream).close(),
        "dead_letter_stream",
    ),
    "value_deserializer='yaml'": (_subscriber(value_deserializer="yaml"), "value_deserializer"),
    "auto_confirm_interval_ms without a group": (_subscriber(auto_confirm_interval_ms=100), "group"),
    "isolation='serializable'": (_subscriber(isolation="serializable"), "isolation"),
    "skip_data_loss='yes'": (_subscriber(skip_data_loss="yes"), "skip_data_loss"),
    "member_id=''": (_subscriber(group="g", member_id=""), "member_id"),
    # subscriber calls
    "poll(-1)": (lambda c: c.sub.poll(-1), "timeout_ms"),
    "poll(inf)": (lambda c: c.sub.poll(float("inf")), "timeout_ms"),
    "poll(nan)": (lambda c: c.sub.poll(float("nan")), "timeout_ms"),
    "poll('10')": (lambda c: c.sub.poll("10"), "timeout_ms"),  # type: ignore[arg-type]
    "seek(-1)": (lambda c: c.sub.seek(-1, lane=0), "offset"),
    "seek('5')": (lambda c: c.sub.seek("5", lane=0), "offset"),  # type: ignore[arg-type]
    "seek lane=7": (lambda c: c.sub.seek(0, lane=7), "lane"),
    "seek lane=-1": (lambda c: c.sub.seek(0, lane=-1), "lane"),
    "seek without a lane on 2 lanes": (lambda c: c.sub.seek(0), "lane"),
    "seek_to_timestamp(-5)": (lambda c: c.sub.seek_to_timestamp(-5), "ts_ms"),
    # stream and grid configuration
    "StreamConfig('')": (lambda c: StreamConfig(""), "stream name"),
    "StreamConfig(5)": (lambda c: StreamConfig(5), "stream"),  # type: ignore[arg-type]
    "lanes=0": (lambda c: StreamConfig("x", lanes=0), "lanes"),
    "lanes=10**6": (lambda c: StreamConfig("x", lanes=10**6), "lanes"),
    "capacity=0": (lambda c: StreamConfig("x", capacity=0), "capacity"),
    "backup_count=7": (lambda c: StreamConfig("x", backup_count=7), "backup_count"),
    "ttl_s=-1": (lambda c: StreamConfig("x", ttl_s=-1), "ttl_s"),
    "StreamConfig compression='gzip'": (lambda c: StreamConfig("x", compression="gzip"), "compression"),
    "StreamConfig linger_ms=inf": (lambda c: StreamConfig("x", linger_ms=float("inf")), "linger_ms"),
    "from_dict unknown key": (lambda c: StreamConfig.from_dict({"name": "x", "lanez": 2}), "lanez"),
    "GridSettings(members=())": (lambda c: GridSettings(members=()), "members"),
    "GridSettings(cluster_name='')": (lambda c: GridSettings(cluster_name=""), "clusterName"),
    "GridSettings(connect_timeout_s=0)": (lambda c: GridSettings(connect_timeout_s=0), "connectTimeout"),
    "hazelcast.smartRouting=maybe": (
        lambda c: GridSettings.from_options({"hazelcast.smartRouting": "maybe"}),
        "smartRouting",
    ),
    "hazelcast.members=nohost": (lambda c: GridSettings.from_options({"hazelcast.members": "nohost"}), "members"),
    # Spark options, as Spark hands them to the data source
    "source without a stream": (lambda c: SourceOptions.parse({}, batch=True), "stream"),
    "startingOffsets=first": (_source(startingOffsets="first"), "startingOffsets"),
    "maxOffsetsPerTrigger=0": (
        lambda c: SourceOptions.parse({"stream": c.stream, "maxOffsetsPerTrigger": "0"}, batch=False),
        "maxOffsetsPerTrigger",
    ),
    "failOnDataLoss=maybe": (_source(failOnDataLoss="maybe"), "failOnDataLoss"),
    "isolation=x": (_source(isolation="x"), "isolation"),
    "startingTimestamp=-1": (_source(startingTimestamp="-1"), "startingTimestamp"),
    "startingOffset (typo)": (_source(startingOffset="earliest"), "startingOffset"),
    "source stream non-UTF-8": (lambda c: SourceOptions.parse({"stream": "a\udcff"}, batch=True), "stream"),
    "transactionTimeoutMs=0": (_sink(transactionTimeoutMs="0"), "transactionTimeoutMs"),
    "sweepIntervalMs=0": (_sink(sweepIntervalMs="0"), "sweepIntervalMs"),
    "transactional=maybe": (_sink(transactional="maybe"), "transactional"),
    "sink stream non-UTF-8": (
        lambda c: SinkOptions.parse({"stream": "a\udcff", "checkpointLocation": "/tmp/x"}),
        "stream",
    ),
    # the command line
    "meteor publish (no stream)": (_cli("publish"), "stream"),
    "meteor tail --from abc": (_cli("tail", "STREAM", "--from", "abc"), "--from"),
    "meteor tail --group ''": (_cli("tail", "STREAM", "--group", ""), "group"),
    "meteor publish --lane -2": (_cli("publish", "STREAM", "/dev/null", "--lane", "-2"), "lane"),
    "meteor --connect-timeout 0": (_cli("--connect-timeout", "0", "streams", "list"), "connect"),
    "meteor streams create 'bad name'": (_cli("streams", "create", "bad name"), "stream name"),
    "meteor grid start --port 70000": (_cli("grid", "start", "--port", "70000"), "port"),
    "meteor tail of a non-UTF-8 name": (_cli("tail", "a\udcff"), "stream name"),
}


@pytest.fixture(scope="module")
def context(grid: Grid, grid_settings: GridSettings) -> Iterator[Context]:
    name = "wrong-calls"
    pub = Publisher(grid, StreamConfig(name, lanes=2))
    sub = Subscriber(grid, name)
    yield Context(grid, grid_settings, name, pub, sub)
    sub.close()
    pub.close()
    print(
        f"\n{sum(TALLY.values())} wrong calls: {TALLY['refused']} refused with a ConfigError naming the argument, "
        f"{TALLY['traceback']} tracebacks (foreign exception types), {TALLY['accepted']} silent acceptances, "
        f"{TALLY['unnamed']} errors not naming the argument"
    )


def test_there_are_at_least_88_wrong_calls() -> None:
    assert len(CASES) >= 88


@pytest.mark.parametrize("label", list(CASES))
def test_a_wrong_call_is_a_config_error_naming_it(context: Context, label: str) -> None:
    call, named = CASES[label]
    try:
        call(context)
    except ConfigError as exc:
        if named.lower() not in str(exc).lower():
            TALLY["unnamed"] += 1
            pytest.fail(f"{label}: the error does not name {named!r}: {exc}")
        TALLY["refused"] += 1
        return
    except Exception as exc:
        TALLY["traceback"] += 1
        pytest.fail(f"{label}: {type(exc).__name__} instead of a ConfigError: {exc}")
    TALLY["accepted"] += 1
    pytest.fail(f"{label}: accepted silently")
