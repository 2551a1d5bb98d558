"""W3C trace context in record headers, so that a trace crosses publish -> consume.

Publishing: when OpenTelemetry's API is installed (the ``otel`` extra) and a span is current, a ``Publisher`` starts
a PRODUCER span ``"<stream> publish"`` for each publish call (one for a ``publish_many`` bulk) as a child of the
current span, and injects that span's context into the records' headers through the configured propagator
(``opentelemetry.propagate``: by default W3C ``traceparent`` and ``tracestate``, plus ``baggage`` when baggage is
set), so an application's own propagators are honoured. The span ends when the records are stored (or failed: the
error is recorded on it). A record that already carries a ``traceparent`` header keeps it untouched and gets no
span: a context the caller set wins. ``publish_arrow`` (and so the Spark sink) injects nothing: its rows keep the
``headers`` column they come with.

``traceparent`` is not a reserved header. ``meteor.topic`` / ``meteor.id`` are reserved because they mirror record
fields and are rewritten from them; ``traceparent`` is the W3C name every tracing system reads, any producer may set
it, and meteor only adds it when it is absent. Readers see it as an ordinary header (``Record.headers``, the Spark
``headers`` column).

Consuming: ``extract(record)`` gives the OpenTelemetry ``Context`` a record carries; ``consume_span(record)`` runs a
block in a CONSUMER span ``"<stream> process"`` whose parent is the producer's span; ``consume_span(records)`` (a
polled batch) makes one span with a link to each record's producer span, the messaging conventions' rule for
batches (one span cannot have several parents). ``traceparent(record)`` reads the header without OpenTelemetry;
``header_sql()`` is the Spark SQL expression that reads it from the source's ``headers`` column.

Attributes follow the messaging semantic conventions as of v1.24 (span name ``<destination> <operation>``,
``messaging.operation``), the version opentelemetry-instrumentation-kafka-python emits: ``messaging.system`` =
``"meteor"``, ``messaging.destination.name`` (the stream), ``messaging.operation``, ``messaging.batch.message_count``
(bulks), ``messaging.destination.partition.id`` (the lane) and ``messaging.message.id`` (a record's message id).

Cost: without the API nothing is imported and a publisher makes one ``is None`` test per call; with the API and no
current span, one read of the current context per call (an empty context answers at once) and nothing added.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, TypeVar

from meteor_spark.compat_otel import context_reader
from meteor_spark.errors import ConfigError
from meteor_spark.format.records import Record

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer

TRACEPARENT_HEADER = "traceparent"
TRACESTATE_HEADER = "tracestate"
MESSAGING_SYSTEM = "meteor"
#: The instrumentation scope of meteor's spans.
INSTRUMENTATION_NAME = "meteor_spark"
#: Links a batch's consumer span gets at most, one per distinct producer context (the SDK's default span limit).
MAX_LINKS = 128

_INSTALL_HINT = "pip install 'meteor-spark[otel]' (opentelemetry-api)"
_NOT_LOOKED = object()
_otel: Any = _NOT_LOOKED  # the API's modules, looked for once: a namespace, or None when the API is not installed

F = TypeVar("F")
T = TypeVar("T")


def _api() -> Any:
    """The OpenTelemetry API modules, imported on first use; None when the API is not installed."""
    global _otel
    if _otel is _NOT_LOOKED:
        try:
            from opentelemetry import propagate, trace
            from opentelemetry.context import Context, get_current
        except ImportError:
            _otel = None
        else:
            _otel = SimpleNamespace(propagate=propagate, trace=trace, Context=Context, get_current=get_current)
    return _otel


def _tracer(api: Any, tracer: Tracer | None) -> Tracer:
    # the global provider's tracer: a proxy that follows a provider the application sets later
    return tracer if tracer is not None else api.trace.get_tracer(INSTRUMENTATION_NAME)


def _end(api: Any, span: Span, error: BaseException | None) -> None:
    if error is not None:
        span.record_exception(error)
        span.set_status(api.trace.Status(api.trace.StatusCode.ERROR, f"{type(error).__name__}: {error}"))
    span.end()


# --------------------------------------------------------------------------------------------------- publishing


def _has_traceparent(headers: tuple[tuple[str, bytes], ...]) -> bool:
    return any(type(pair) is tuple and pair and pair[0] == TRACEPARENT_HEADER for pair in headers)


def _traceable(item: object) -> bool:
    """Whether ``item`` may take trace headers: a record without a ``traceparent`` of its own. Not a record at all
    (the publisher's checks refuse it, with their own message) or bad headers: False, ``item`` goes on as it is."""
    if isinstance(item, Record):
        return type(item.headers) is tuple and not _has_traceparent(item.headers)
    return isinstance(item, (bytes, bytearray, memoryview, str))


def _with_headers(item: Any, extra: tuple[tuple[str, bytes], ...]) -> Any:
    """A traceable ``item`` (``_traceable``) as a record carrying ``extra`` headers; any other as it is."""
    if type(item) is bytes:
        return Record(item, None, extra)
    if isinstance(item, Record):
        if type(item.headers) is not tuple or _has_traceparent(item.headers):
            return item
        r = item  # the constructor, not dataclasses.replace: 3x cheaper, and this runs per traced record
        return Record(
            r.value, r.key, r.headers + extra, r.timestamp_ms, r.offset, r.lane, r.stream, r.topic, r.message_id
        )
    if isinstance(item, (bytearray, memoryview)):
        return Record(bytes(item), None, extra)
    if isinstance(item, str):
        return Record(item.encode("utf-8"), None, extra)
    return item


class PublishTracing:
    """A publisher's side of tracing: its tracer and the API's functions, bound once (``publish_tracing``)."""

    __slots__ = (
        "_api",
        "_attributes",
        "_current_span",
        "_inject",
        "_kind",
        "_name",
        "_set_span",
        "_tracer",
        "current",
    )

    def __init__(self, api: Any, stream: str) -> None:
        trace = api.trace
        self._api = api
        #: The current OpenTelemetry context, in one call (``meteor_spark.compat_otel``); an empty one is false: the
        #: publisher's hot path asks ``active`` only when it is not.
        self.current: Callable[[], Any] = context_reader(api.get_current)
        self._current_span = trace.get_current_span
        self._set_span = trace.set_span_in_context
        self._inject = api.propagate.inject
        self._kind = trace.SpanKind.PRODUCER
        self._tracer = _tracer(api, None)
        self._name = f"{stream} publish"
        self._attributes = {
            "messaging.system": MESSAGING_SYSTEM,
            "messaging.destination.name": stream,
            "messaging.operation": "publish",
        }

    def active(self) -> bool:
        """Whether a valid span context is current (a local span, or a remote one an application extracted).

        An empty current context (the usual case outside traced code) answers at once: a context-variable read."""
        context = self.current()
        return bool(context) and bool(self._current_span(context).get_span_context().is_valid)

    def _start(self, extra: dict[str, Any]) -> tuple[Span, tuple[tuple[str, bytes], ...]]:
        """A PRODUCER span (child of the current span) and the headers its context injects."""
        attributes = {**self._attributes, **extra} if extra else self._attributes
        span = self._tracer.start_span(self._name, kind=self._kind, attributes=attributes)
        carrier: dict[str, str] = {}
        self._inject(carrier, context=self._set_span(span))
        return span, tuple((name, value.encode("utf-8")) for name, value in carrier.items())

    def _finish_when_done(self, span: Span, future: Any) -> None:
        def done(settled: Any) -> None:
            try:
                error = settled.exception()
            except BaseException as exc:  # a cancelled future
                error = exc
            _end(self._api, span, error)

        future.add_done_callback(done)

    def _traced_one(self, item: object) -> tuple[Span | None, Any]:
        """``item`` carrying a new PRODUCER span's context, and the span; ``(None, item)`` when it cannot take one."""
        if not _traceable(item):
            return None, item
        message_id = item.message_id if isinstance(item, Record) else None
        span, headers = self._start({} if message_id is None else {"messaging.message.id": message_id})
        return span, _with_headers(item, headers)

    def _traced_many(self, items: list[Any]) -> tuple[Span, list[Any]]:
        """Every record of ``items`` without a ``traceparent`` of its own carrying one PRODUCER span's context (the
        bulk's), and the span."""
        span, headers = self._start({"messaging.batch.message_count": len(items)})
        return span, [_with_headers(item, headers) for item in items]

    def _queued(self, span: Span | None, queue: Callable[[], F]) -> F:
        if span is None:
            return queue()
        try:
            future = queue()
        except BaseException as exc:
            _end(self._api, span, exc)
            raise
        self._finish_when_done(span, future)
        return future

    def publish_one(self, item: object, queue: Callable[[Any], F]) -> F:
        """``queue(item)`` with ``item`` carrying a PRODUCER span's context, the span ending with its outcome."""
        span, traced = self._traced_one(item)
        return self._queued(span, lambda: queue(traced))

    def publish_many(self, items: list[Any], queue: Callable[[list[Any]], F]) -> F:
        """``queue(items)`` with every record that has no ``traceparent`` of its own carrying one PRODUCER span's
        context (the bulk's), the span ending when the whole bulk settled."""
        span, traced = self._traced_many(items)
        return self._queued(span, lambda: queue(traced))

    async def publish_one_async(self, item: object, queue: Callable[[Any], Awaitable[F]]) -> F:
        """``publish_one`` for an asyncio publisher: ``await queue(item)`` gives the record's future."""
        span, traced = self._traced_one(item)
        if span is None:
            return await queue(traced)
        try:
            future = await queue(traced)
        except BaseException as exc:
            _end(self._api, span, exc)
            raise
        self._finish_when_done(span, future)
        return future

    async def publish_many_async(self, items: list[Any], publish: Callable[[list[Any]], Awaitable[T]]) -> T:
        """``publish_many`` for an asyncio publisher: ``await publish(items)`` stores them all; the span ends then."""
        span, traced = self._traced_many(items)
        try:
            result = await publish(traced)
        except BaseException as exc:
            _end(self._api, span, exc)
            raise
        _end(self._api, span, None)
        return result


def publish_tracing(stream: str) -> PublishTracing | None:
    """The tracing of a publisher to ``stream``; None (nothing to do, ever) when OpenTelemetry is not installed."""
    api = _api()
    return None if api is None else PublishTracing(api, stream)


# ---------------------------------------------------------------------------------------------------- consuming


def _pairs(source: Record | Iterable[Any] | Mapping[str, Any]) -> Iterable[Any]:
    """``(name, value)`` pairs of a record's headers, of a mapping (a Spark row's ``headers`` with
    ``headersAsMap=true``) or of pairs as they are (a Spark row's ``headers`` array, tuples)."""
    if isinstance(source, Record):
        return source.headers
    if isinstance(source, Mapping):
        return source.items()
    return source


def _carrier(source: Record | Iterable[Any] | Mapping[str, Any]) -> dict[str, str]:
    """The headers as the propagators read them: names to text, the first of a repeated name."""
    carrier: dict[str, str] = {}
    for name, value in _pairs(source):
        if name not in carrier and value is not None:
            carrier[name] = value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)
    return carrier


def traceparent(source: Record | Iterable[Any] | Mapping[str, Any]) -> str | None:
    """The ``traceparent`` header of a record (or of headers as ``(name, value)`` pairs or a mapping, e.g. a Spark
    row's ``headers`` in either shape) as text; None when it has none. Needs no OpenTelemetry."""
    for name, value in _pairs(source):
        if name == TRACEPARENT_HEADER and value is not None:
            return bytes(value).decode("ascii", "replace") if not isinstance(value, str) else value
    return None


def extract(source: Record | Iterable[Any] | Mapping[str, Any]) -> Context:
    """The OpenTelemetry context a record carries (or headers as ``(name, value)`` pairs or a mapping, e.g. a Spark
    row's ``headers``), through the configured propagator; the current context when the record carries none.

    Raises:
        ModuleNotFoundError: OpenTelemetry's API is not installed (the message says how to install it).
    """
    api = _api()
    if api is None:
        raise ModuleNotFoundError(f"meteor_spark.format.trace_context.extract needs OpenTelemetry: {_INSTALL_HINT}")
    context: Context = api.propagate.extract(_carrier(source))
    return context


def _consume_attributes(records: list[Record], operation: str) -> tuple[str, dict[str, Any]]:
    streams = {r.stream for r in records}
    stream = streams.pop() if len(streams) == 1 else ""
    attributes: dict[str, Any] = {"messaging.system": MESSAGING_SYSTEM, "messaging.operation": operation}
    if stream:
        attributes["messaging.destination.name"] = stream
    if len(records) == 1:
        record = records[0]
        if record.lane >= 0:
            attributes["messaging.destination.partition.id"] = str(record.lane)
        if record.message_id is not None:
            attributes["messaging.message.id"] = record.message_id
    else:
        attributes["messaging.batch.message_count"] = len(records)
    return (f"{stream} {operation}" if stream else operation), attributes


@contextmanager
def consume_span(
    records: Record | Iterable[Record], *, tracer: Tracer | None = None, operation: str = "process"
) -> Iterator[Span | None]:
    """Run the ``with`` block in a CONSUMER span ``"<stream> <operation>"`` (current inside the block, so what the
    block publishes or calls is its child).

    One record: the span's parent is the producer's span the record carries (the current span when it carries
    none). Several records (a list, a ``RecordBatch``): the span is a child of the current span, linked to each
    distinct producer span (``MAX_LINKS`` at most), as the messaging conventions say for batches. ``tracer``:
    the global provider's when None. An exception leaving the block is recorded on the span and re-raised.
    Without OpenTelemetry installed the block runs as it is and gets None.
    """
    api = _api()
    if api is None:
        yield None
        return
    trace = api.trace
    batch = [records] if isinstance(records, Record) else list(records)
    name, attributes = _consume_attributes(batch, operation)
    kind = trace.SpanKind.CONSUMER
    if isinstance(records, Record):
        start = _tracer(api, tracer).start_as_current_span(
            name, context=extract(records), kind=kind, attributes=attributes, record_exception=True
        )
    else:
        start = _tracer(api, tracer).start_as_current_span(
            name, kind=kind, attributes=attributes, links=_links(api, batch), record_exception=True
        )
    with start as span:
        yield span


def _links(api: Any, records: list[Record]) -> list[Any]:
    """One link per distinct valid producer context among ``records`` (``MAX_LINKS`` at most)."""
    trace = api.trace
    seen: set[tuple[int, int]] = set()
    links = []
    for record in records:
        if traceparent(record) is None:
            continue
        # extracted onto an empty context: a record whose headers hold no valid context gives no link
        found = trace.get_current_span(api.propagate.extract(_carrier(record), api.Context())).get_span_context()
        key = (found.trace_id, found.span_id)
        if found.is_valid and key not in seen:
            seen.add(key)
            links.append(trace.Link(found))
            if len(links) >= MAX_LINKS:
                break
    return links


def header_sql(name: str = TRACEPARENT_HEADER, column: str = "headers", *, as_map: bool = False) -> str:
    """A Spark SQL expression for header ``name`` of the source's ``headers`` column (option
    ``includeHeaders=true``; ``as_map=True`` for ``headersAsMap=true``) as a string, NULL when the record has none:
    ``df.selectExpr("*", f"{header_sql()} AS traceparent")``.

    The array form takes the first header of that name; ``try_element_at`` rather than ``[...]`` (an error on a
    missing element under ANSI mode, Spark 4's default), and ``filter`` rather than ``map_from_entries`` (an error
    on a repeated header name under the default ``spark.sql.mapKeyDedupPolicy``).

    Raises:
        ConfigError: ``name`` is empty or holds a quote or backslash, or ``column`` is not a plain column name.
    """
    if not isinstance(name, str) or not name or "'" in name or "\\" in name:
        raise ConfigError(
            f"header_sql: the header name must be a non-empty str without quotes or backslashes; got {name!r}"
        )
    if not isinstance(column, str) or not column.replace("_", "").isalnum():
        raise ConfigError(f"header_sql: column must be a plain column name (letters, digits, _); got {column!r}")
    if as_map:
        return f"CAST(try_element_at({column}, '{name}') AS STRING)"
    return f"CAST(try_element_at(filter({column}, h -> h.key = '{name}'), 1).value AS STRING)"
