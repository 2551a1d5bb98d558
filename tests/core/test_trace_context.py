"""W3C trace context in record headers: a trace crosses publish -> consume, between processes.

The cross-process test runs a publisher process and a subscriber process, each with the OpenTelemetry SDK and an
in-memory exporter, and compares the spans they export: the consumer span's parent is the producer span, in the
same trace. The others check the API's no-op behaviour (no current span, no header), that a caller's
``traceparent`` wins, and that without OpenTelemetry installed nothing is added and nothing is imported.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from meteor_spark import Publisher, Record, StreamConfig, Subscriber
from meteor_spark.errors import ConfigError
from meteor_spark.format.trace_context import (
    MAX_LINKS,
    TRACEPARENT_HEADER,
    consume_span,
    extract,
    header_sql,
    traceparent,
)
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.testing import wait_until

#: What both child processes share: an SDK provider exporting to memory, and the spans as JSON.
_SDK = r"""
import json, sys
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from meteor_spark import Grid, GridSettings, Publisher, StreamConfig, Subscriber
from meteor_spark.testing import wait_until

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
members, cluster, stream = sys.argv[1:4]
grid = Grid(GridSettings(members=tuple(members.split(",")), cluster_name=cluster))

def spans():
    return [
        {
            "name": s.name,
            "kind": s.kind.name,
            "trace": format(s.context.trace_id, "032x"),
            "span": format(s.context.span_id, "016x"),
            "parent": None if s.parent is None else format(s.parent.span_id, "016x"),
            "links": [format(link.context.span_id, "016x") for link in s.links],
            "attributes": dict(s.attributes),
            "status": s.status.status_code.name,
            "events": [e.name for e in s.events],
        }
        for s in exporter.get_finished_spans()
    ]
"""

_PUBLISHER = (
    _SDK
    + r"""
from meteor_spark.errors import DuplicateMessageError
with Publisher(grid, StreamConfig(stream, lanes=1, dedup_window_ms=60_000)) as pub:
    with trace.get_tracer("shop").start_as_current_span("checkout"):
        pub.publish(b"one", message_id="order-1")
        pub.publish_many([b"two", b"three"]).result(30)
        try:
            pub.publish(b"again", message_id="order-1")
        except DuplicateMessageError:
            pass
grid.close()
print(json.dumps(spans()))
"""
)

_SUBSCRIBER = (
    _SDK
    + r"""
from meteor_spark.format.trace_context import consume_span, traceparent
records = []
with Subscriber(grid, stream, initial_offset_scheme="earliest") as sub:
    wait_until(lambda: records.extend(sub.poll(timeout_ms=100)) or len(records) >= 3, timeout_s=60)
grid.close()
one, *bulk = records
with consume_span(one):
    pass
with consume_span(bulk):
    pass
print(json.dumps({"spans": spans(), "traceparents": [traceparent(r) for r in records]}))
"""
)


def _run(script: str, settings: GridSettings, stream: str) -> Any:
    done = subprocess.run(
        [sys.executable, "-c", script, ",".join(settings.members), settings.cluster_name, stream],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _named(spans: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [s for s in spans if s["name"] == name]


def test_a_trace_crosses_from_a_publisher_process_to_a_subscriber_process(
    grid_settings: GridSettings, unique_name: str
) -> None:
    produced = _run(_PUBLISHER, grid_settings, unique_name)
    consumed = _run(_SUBSCRIBER, grid_settings, unique_name)
    print("publisher process spans:", json.dumps(produced))
    print("subscriber process spans:", json.dumps(consumed["spans"]))

    (checkout,) = _named(produced, "checkout")
    one, bulk, refused = _named(produced, f"{unique_name} publish")
    for span in (one, bulk, refused):
        assert (span["kind"], span["trace"], span["parent"]) == ("PRODUCER", checkout["trace"], checkout["span"])
        assert span["attributes"]["messaging.system"] == "meteor"
        assert span["attributes"]["messaging.destination.name"] == unique_name
        assert span["attributes"]["messaging.operation"] == "publish"
    assert one["attributes"]["messaging.message.id"] == "order-1" and one["status"] == "UNSET"
    assert bulk["attributes"]["messaging.batch.message_count"] == 2 and bulk["status"] == "UNSET"
    assert refused["status"] == "ERROR" and refused["events"] == ["exception"]  # the duplicate, refused

    # each record carries its producer span's context: 00-<trace id>-<span id>-<flags>
    assert [tp.split("-")[1:3] for tp in consumed["traceparents"]] == [
        [one["trace"], one["span"]],
        [bulk["trace"], bulk["span"]],
        [bulk["trace"], bulk["span"]],
    ]
    (process_one,) = _named(consumed["spans"], f"{unique_name} process")[:1]
    assert process_one["kind"] == "CONSUMER"
    assert (process_one["trace"], process_one["parent"]) == (one["trace"], one["span"])
    assert process_one["attributes"]["messaging.destination.partition.id"] == "0"
    process_bulk = _named(consumed["spans"], f"{unique_name} process")[1]
    # a batch: a root of its own in the subscriber's process, linked to the (one) producer span of its records
    assert process_bulk["parent"] is None and process_bulk["links"] == [bulk["span"]]
    assert process_bulk["attributes"]["messaging.batch.message_count"] == 2


def _read(grid: Grid, stream: str, count: int) -> list[Record]:
    out: list[Record] = []
    with Subscriber(grid, stream, initial_offset_scheme="earliest") as sub:
        wait_until(lambda: out.extend(sub.poll(timeout_ms=100)) or len(out) >= count, timeout_s=30)
    return out


OWN = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_the_current_span_rides_in_the_headers_and_a_callers_traceparent_wins(grid: Grid, unique_name: str) -> None:
    """No provider is set globally here: the publisher's tracer is the API's no-op one, whose span carries the
    current span's context, so the records carry the caller's span (the API's behaviour without an SDK)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    with (
        Publisher(grid, StreamConfig(unique_name, lanes=1)) as pub,
        Publisher(grid, unique_name, tracing=False) as untraced,
    ):
        pub.publish(b"before")
        pub.publish_many([b"before-1", b"before-2"]).result(30)
        with tracer.start_as_current_span("request") as request:
            pub.publish(b"inside", topic="orders.created")
            pub.publish(Record(b"own", headers=(("x", b"1"), (TRACEPARENT_HEADER, OWN))))
            pub.publish_many([b"m1", "m2", Record(b"m3", headers=((TRACEPARENT_HEADER, OWN),))]).result(30)
            untraced.publish(b"untraced")
    context = request.get_span_context()
    current = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    records = _read(grid, unique_name, 9)
    assert [(r.value, traceparent(r)) for r in records] == [
        (b"before", None),
        (b"before-1", None),
        (b"before-2", None),
        (b"inside", current),
        (b"own", OWN.decode()),
        (b"m1", current),
        (b"m2", current),
        (b"m3", OWN.decode()),
        (b"untraced", None),
    ]
    assert [r.headers for r in records[:3]] == [(), (), ()]  # nothing added without a current span
    assert records[3].topic == "orders.created" and len(records[3].headers) == 2  # meteor.topic + traceparent
    assert records[4].headers == (("x", b"1"), (TRACEPARENT_HEADER, OWN))  # kept as given, once

    with consume_span(records[3], tracer=tracer) as span:
        assert span is not None and span.get_span_context().trace_id == context.trace_id
    (processed,) = exporter.get_finished_spans()[1:]
    assert processed.parent is not None and processed.parent.span_id == context.span_id
    assert processed.name == f"{unique_name} process"

    from opentelemetry import trace

    assert trace.get_current_span(extract(records[4])).get_span_context().span_id == 0xB7AD6B7169203331


def test_a_failing_block_is_recorded_on_the_consumer_span() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with pytest.raises(KeyError), consume_span(Record(b"x", stream="s"), tracer=provider.get_tracer("t")):
        raise KeyError("missing")
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code.name == "ERROR" and [e.name for e in span.events] == ["exception"]


def test_a_batch_span_links_each_distinct_producer_context_up_to_the_bound() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    parents = [f"00-{'ab' * 16}-{n + 1:016x}-01".encode() for n in range(MAX_LINKS + 20)]
    records = [Record(b"v", headers=((TRACEPARENT_HEADER, p),), stream="s") for p in parents]
    records += [Record(b"again", headers=((TRACEPARENT_HEADER, parents[0]),), stream="s")]
    records += [Record(b"none", stream="s"), Record(b"bad", headers=((TRACEPARENT_HEADER, b"garbage"),), stream="s")]
    with consume_span(records, tracer=provider.get_tracer("t")):
        pass
    (span,) = exporter.get_finished_spans()
    assert [link.context.span_id for link in span.links] == list(range(1, MAX_LINKS + 1))
    assert span.attributes is not None and span.attributes["messaging.batch.message_count"] == len(records)


def test_header_sql_reads_one_header_and_refuses_names_it_cannot_quote() -> None:
    assert header_sql() == "CAST(try_element_at(filter(headers, h -> h.key = 'traceparent'), 1).value AS STRING)"
    assert header_sql("tracestate", as_map=True) == "CAST(try_element_at(headers, 'tracestate') AS STRING)"
    for name in ("", "it's", "a\\b"):
        with pytest.raises(ConfigError, match="header name"):
            header_sql(name)
    with pytest.raises(ConfigError, match="plain column name"):
        header_sql(column="headers; drop")
    assert traceparent([("a", b"1"), (TRACEPARENT_HEADER, OWN)]) == OWN.decode()


_WITHOUT_OTEL = r"""
import json, sys
sys.modules["opentelemetry"] = None  # as if opentelemetry-api were not installed
from meteor_spark import Grid, GridSettings, Publisher, Record, StreamConfig, Subscriber
from meteor_spark.format import trace_context
from meteor_spark.testing import wait_until

members, cluster, stream = sys.argv[1:4]
out = {"tracing": repr(trace_context.publish_tracing(stream))}
records = []
with Grid(GridSettings(members=tuple(members.split(",")), cluster_name=cluster)) as grid:
    with Publisher(grid, StreamConfig(stream, lanes=1)) as pub:
        pub.publish(b"a")
        pub.publish(Record(b"b", headers=(("x", b"1"),)))
        pub.publish_many([b"c", b"d"]).result(30)
    with Subscriber(grid, stream, initial_offset_scheme="earliest") as sub:
        wait_until(lambda: records.extend(sub.poll(timeout_ms=100)) or len(records) >= 4, timeout_s=30)
out["headers"] = [[list(map(str, h)) for h in r.headers] for r in records]
with trace_context.consume_span(records[0]) as span:
    out["span"] = repr(span)
try:
    trace_context.extract(records[0])
except ModuleNotFoundError as exc:
    out["extract"] = str(exc)
out["imported"] = sorted(m for m in sys.modules if m.startswith("opentelemetry") and sys.modules[m] is not None)
print(json.dumps(out))
"""


def test_without_opentelemetry_nothing_is_added_or_imported(grid_settings: GridSettings, unique_name: str) -> None:
    out = _run(_WITHOUT_OTEL, grid_settings, unique_name)
    assert out["tracing"] == "None"
    assert out["headers"] == [[], [["x", "b'1'"]], [], []]
    assert out["span"] == "None"
    assert "pip install 'meteor-spark[otel]'" in out["extract"]
    assert out["imported"] == []


def test_the_current_context_is_read_from_the_apis_context_var() -> None:
    """The publisher's per-record check reads the API's ContextVar directly (``meteor_spark.compat_otel``): it
    answers what ``get_current`` answers, in and out of a span."""
    from opentelemetry import context, trace

    from meteor_spark import compat_otel

    assert compat_otel.problems() == []
    read = compat_otel.context_reader(context.get_current)
    assert read is not context.get_current  # the one-call reader on the checked versions
    assert not read() and read() == context.get_current()
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("s"):
        assert read() and read() is context.get_current()
        assert trace.get_current_span(read()).get_span_context().is_valid


def test_a_plain_value_published_inside_a_span_is_traced(grid: Grid, unique_name: str) -> None:
    """A plain value without topic, id or callback takes publish_async's hot path, unless a context is current."""
    tracer = TracerProvider().get_tracer("test")
    with Publisher(grid, StreamConfig(unique_name, lanes=1)) as pub:
        with tracer.start_as_current_span("request") as request:
            pub.publish_async(b"inside").result(30)
        pub.publish_async(b"after").result(30)
    context = request.get_span_context()
    current = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    assert [(r.value, traceparent(r)) for r in _read(grid, unique_name, 2)] == [(b"inside", current), (b"after", None)]


def test_an_asyncio_publishers_records_carry_the_current_span(grid_settings: GridSettings, unique_name: str) -> None:
    """The ``AsyncPublisher`` injects as the threaded one does: the span current in the coroutine (a request
    handler's, say) rides in ``publish`` / ``publish_async`` / ``publish_many`` records, a caller's ``traceparent``
    wins, ``tracing=False`` adds nothing; an ``AsyncSubscriber``'s records give the consumer span its parent."""
    import asyncio

    from meteor_spark.aio import AsyncPublisher, AsyncSubscriber

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter := InMemorySpanExporter()))
    tracer = provider.get_tracer("test")

    async def scenario() -> tuple[Any, list[Record]]:
        async with (
            AsyncPublisher(grid_settings, StreamConfig(unique_name, lanes=1)) as pub,
            AsyncPublisher(grid_settings, unique_name, tracing=False) as untraced,
        ):
            await pub.publish(b"before")
            with tracer.start_as_current_span("request") as request:
                await pub.publish(b"inside")
                await (await pub.publish_async(Record(b"own", headers=((TRACEPARENT_HEADER, OWN),))))
                await pub.publish_many([b"m1", Record(b"m2", headers=((TRACEPARENT_HEADER, OWN),))])
                await untraced.publish(b"untraced")
        got: list[Record] = []
        async with AsyncSubscriber(grid_settings, unique_name, initial_offset_scheme="earliest") as sub:
            while len(got) < 6:
                got.extend(await sub.poll(100))
        return request.get_span_context(), got

    context, records = asyncio.run(asyncio.wait_for(scenario(), 60))
    current = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    assert [(r.value, traceparent(r)) for r in records] == [
        (b"before", None),
        (b"inside", current),
        (b"own", OWN.decode()),
        (b"m1", current),
        (b"m2", OWN.decode()),
        (b"untraced", None),
    ]
    with consume_span(records[1], tracer=tracer) as span:
        assert span is not None and span.get_span_context().trace_id == context.trace_id
    (processed,) = exporter.get_finished_spans()[1:]
    assert processed.parent is not None and processed.parent.span_id == context.span_id
