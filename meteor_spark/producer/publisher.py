"""The Publisher: publishes records to a stream, per lane, in order, with bounded buffering.

How a record travels:

1. ``publish_async`` (or a bulk call) checks the record, picks its lane (explicit ``lane``, else
   ``lane_for_key(key)``, else the publisher's choice) and appends it to that lane's queue in the accumulator
   (``meteor_spark.producer.accumulator``), which bounds the records accepted but not yet stored (back-pressure instead
   of Meteor's unbounded queue).
2. The accumulator cuts the lane's queue into ring items (``max_batch_records`` / ``max_batch_bytes``, after
   waiting up to ``linger_ms`` for a partly filled item); the sender (``meteor_spark.producer.sender``) sends up to
   ``max_items_per_call`` items in one ``add_all``, at most one per lane at a time. With ``linger_ms=0`` an idle
   lane is sent by the publishing thread itself (one record's latency is then one ``add_all``, with no hand-off to
   another thread); records that arrive while a call is in flight pile up in the next items. ``publish_arrow``
   leaves the encoding and sending to the sender thread, so its caller goes back to producing the next bulk.
3. When the grid answers, the record futures (``meteor_spark.producer.futures``) read their offsets from the
   stored batch; callbacks and bulk futures run on the publisher's completion thread.

Idempotence (``idempotent=True``, the default): an ``add_all`` whose answer was lost (connection dropped, invocation
timed out) is looked up in its lane by producer id and sequence and sent again only when it was not stored, until
``delivery_timeout_ms`` (``meteor_spark.producer.idempotence``); a retry never stores a record twice. Without it, such a
call fails exactly the records it carried. A call the grid refused fails its records either way. ``flush()`` waits until
everything accepted so far is stored (or failed); ``close()`` flushes, so nothing accepted is lost.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa

from meteor_spark.errors import (
    ArgumentTypeError,
    ConfigError,
    GridError,
    PublishTimeoutError,
)
from meteor_spark.format.arrow_columns import ArrowInput
from meteor_spark.format.avro import AvroValues
from meteor_spark.format.records import Record
from meteor_spark.format.serializers import Serializer, serializer
from meteor_spark.format.trace_context import publish_tracing
from meteor_spark.grid.client import Grid, GridSettings, require_grid
from meteor_spark.grid.settings import ITEM_FRAME_OVERHEAD
from meteor_spark.grid.streams import StreamConfig, StreamInfo, open_stream
from meteor_spark.grid.typed_values import value_serializer_for
from meteor_spark.metrics import attach as attach_metrics
from meteor_spark.metrics import registry_of as metrics_registry
from meteor_spark.producer.accumulator import Accumulator
from meteor_spark.producer.batching import PublisherSettings
from meteor_spark.producer.claimed import (
    claim_one,
    claim_records,
    claim_rows,
    queue_claimed,
    released_on_error,
    settle_when_done,
)
from meteor_spark.producer.dedup import Claim, DedupWindow, claim_lease_ms
from meteor_spark.producer.futures import (
    ArrowPublishFuture,
    BulkFuture,
    LaneWritten,
    PublishCallback,
    RecordFuture,
)
from meteor_spark.producer.record_checks import (
    RECORD_COLUMN_BYTES,
    checked_record,
    record_bytes,
    routed,
    serialized,
    shown,
    size_refusal,
)
from meteor_spark.producer.sender import Sender
from meteor_spark.producer.topic_gate import TopicGate, check_refresh_ms, merged_bulk, refuse_refresh_on_persistent
from meteor_spark.validate import check_timeout

__all__ = ["ArrowPublishFuture", "LaneWritten", "PublishCallback", "Publisher", "PublisherSettings", "RecordFuture"]

logger = logging.getLogger(__name__)


class Publisher:
    """Publishes records to a stream.

    Args:
        grid: the grid connection.
        stream: a ``StreamConfig`` (the stream is created when missing), the name of an existing stream, or a stream
            ``open_stream`` already opened (its ``StreamInfo``: not opened again).
        linger_ms, max_batch_records, max_batch_bytes, compression, compression_threshold: override the stream's
            stored batching settings for this publisher.
        max_buffered_records: records accepted but not yet stored, at most (back-pressure beyond).
        max_block_ms: how long a publish call waits for room before ``PublishTimeoutError``.
        max_items_per_call: ring items per ``add_all`` call.
        idempotent: retry an ``add_all`` whose outcome is unknown (lost connection, invocation timeout) after
            checking the lane, so a retry never stores records twice (default True; False: such a call fails its
            records at once).
        delivery_timeout_ms: with ``idempotent``, how long one call is retried from its first attempt before its
            records fail with ``PublishTimeoutError`` saying whether they may have been stored (default 120,000).
        max_call_bytes: value/key/header bytes per ``add_all`` call at most (``PublisherSettings``).
        value_serializer, key_serializer: turn the values / keys given to ``publish``, ``publish_async`` and
            ``publish_many`` into bytes: ``"json"``, ``"str"``, ``"bytes"`` or a callable
            (``meteor_spark.format.serializers``).
            With a value serializer, anything that is not a ``Record`` is a value (bytes and str included); a
            ``Record``'s value and key (when set) go through the serializers. ``publish_arrow`` takes its columns
            as they are. A serializer that raises fails the call with ``SerializationError`` before anything of it
            is queued. ``"avro"`` (or ``AvroValues(version=N)``) on a stream with a schema: dicts or dataclass
            instances checked and encoded with its latest (or pinned) version, each record carrying the version in
            its ``meteor.schema`` header; the default on a stream declared ``value_format="avro"``
            (``meteor_spark.grid.schemas``).
        metrics: True (prometheus_client's default registry) or a ``CollectorRegistry``: export this publisher's
            counters (``meteor_spark.metrics``; needs the ``metrics`` extra).
        transactional: flag every ring item transactional (wire flag 0x10). Register ``producer_id`` under a
            transaction (``meteor_spark.grid.transactions.begin``) before publishing: ``read_committed`` readers deliver
            the records only once that transaction commits this producer.
        dedup_owner: on a stream with a deduplication window, who this publisher's message-id claims are made for
            beyond itself: a claim left by an earlier publisher with the same owner is an earlier attempt of the
            same work and is taken over (the Spark sink passes ``<transaction>#<partition>``, so a retried task
            is not refused its own rows; ``meteor_spark.producer.dedup``).
        subscription_refresh_ms: on an ephemeral stream, how old the publisher's copy of the stream's consuming
            entities may get (default 1,000 ms; ``meteor_spark.grid.subscriptions``). A record whose topic no live
            entity matches is dropped, not stored: its future completes with ``NOT_STORED`` (-1) and it is counted
            in ``metrics()["dropped_records"]`` (``meteor_spark.producer.topic_gate``).
        tracing: with OpenTelemetry installed and a span current, each publish call starts a PRODUCER span and its
            records carry its context in their headers (``traceparent``; ``meteor_spark.format.trace_context``);
            False: never (default True).

    Examples:
        >>> with Publisher(grid, StreamConfig("orders", lanes=4)) as pub:          # doctest: +SKIP
        ...     offset = pub.publish(Record(b"{...}", key=b"customer-42"))
        ...     future = pub.publish_async(b"fire and forget")
    """

    def __init__(
        self,
        grid: Grid,
        stream: StreamConfig | str | StreamInfo,
        *,
        linger_ms: float | None = None,
        max_batch_records: int | None = None,
        max_batch_bytes: int | None = None,
        max_buffered_records: int | None = None,
        max_block_ms: float | None = None,
        max_items_per_call: int | None = None,
        max_call_bytes: int | None = None,
        compression: str | None = None,
        compression_threshold: int | None = None,
        idempotent: bool | None = None,
        delivery_timeout_ms: float | None = None,
        value_serializer: str | Serializer | AvroValues | None = None,
        key_serializer: str | Serializer | None = None,
        metrics: Any = None,
        transactional: bool = False,
        dedup_owner: str | None = None,
        subscription_refresh_ms: int | None = None,
        tracing: bool = True,
    ) -> None:
        require_grid(grid)
        if not isinstance(tracing, bool):
            raise ArgumentTypeError(f"tracing must be True or False, got {tracing!r}")
        check_refresh_ms(subscription_refresh_ms)
        if not isinstance(transactional, bool):
            raise ArgumentTypeError(f"transactional must be True or False, got {transactional!r}")
        registry = metrics_registry(metrics)
        self.info: StreamInfo = stream if isinstance(stream, StreamInfo) else open_stream(grid, stream)
        self._value_serializer = value_serializer_for(grid, self.info, value_serializer)
        #: the header every record gets from the value serializer (a typed stream's schema version), if any
        self._record_header: tuple[str, bytes] | None = getattr(self._value_serializer, "record_header", None)
        self._key_serializer = serializer(key_serializer, "key_serializer")
        self._serializing = self._value_serializer is not None or self._key_serializer is not None
        refuse_refresh_on_persistent(self.info, subscription_refresh_ms)
        self.settings = PublisherSettings.parse(
            self.info.config,
            {
                "linger_ms": linger_ms,
                "max_batch_records": max_batch_records,
                "max_batch_bytes": max_batch_bytes,
                "max_buffered_records": max_buffered_records,
                "max_block_ms": max_block_ms,
                "max_items_per_call": max_items_per_call,
                "max_call_bytes": max_call_bytes,
                "compression": compression,
                "compression_threshold": compression_threshold,
                "idempotent": idempotent,
                "delivery_timeout_ms": delivery_timeout_ms,
            },
        )
        self.stream = self.info.name
        self.lanes = self.info.config.lanes
        self._max_record_bytes = grid.settings.max_record_bytes
        check_item_fits(self.settings, grid.settings)
        self.producer_id = _producer_id(grid)
        self._acc, self._sender = self._pipeline(grid, transactional)
        self._dedup = self._dedup_window(grid, transactional, dedup_owner)
        self._gate = TopicGate(grid, self.stream, subscription_refresh_ms) if self.info.config.ephemeral else None
        self._trace = publish_tracing(self.stream) if tracing else None
        self._append = self._acc.append  # bound once: publish_async runs a million times a second
        if not self._serializing and self._gate is None and type(self).publish_async is Publisher.publish_async:
            # A plain value goes straight to the accumulator, in one frame (``Accumulator.plain_publisher``): nothing
            # to serialize, no topic gate to ask, no subclass's own publish_async to keep. A record published while a
            # trace context is current (``PublishTracing.current``; ``bool()`` is False: without tracing none ever
            # is) takes this method, which may trace it.
            context_now: Callable[[], Any] = self._trace.current if self._trace is not None else bool
            self.publish_async = self._acc.plain_publisher(  # type: ignore[method-assign]
                self._max_record_bytes, context_now, self.publish_async
            )
        self._detach_metrics = attach_metrics(registry, self)
        logger.debug("publisher %x on stream %r started (%s)", self.producer_id, self.stream, self.settings)

    def _pipeline(self, grid: Grid, transactional: bool) -> tuple[Accumulator, Sender]:
        """The accumulator the records queue in, and the sender (its threads started) that takes them to the
        lanes' rings."""
        acc = Accumulator(
            self.stream, self.lanes, self.settings, min(self.settings.max_items_per_call, self.info.config.capacity)
        )
        rings = [grid.ring(name) for name in self.info.ring_names]
        return acc, Sender(acc, rings, self.producer_id, transactional=transactional)

    def _dedup_window(self, grid: Grid, transactional: bool, owner: str | None) -> DedupWindow | None:
        """The stream's deduplication window (``meteor_spark.producer.dedup``), None when it has none."""
        window = self.info.config.dedup_window_ms
        if not window:
            return None
        settings = self.settings
        return DedupWindow(
            grid,
            self.stream,
            window,
            producer_id=self.producer_id,
            lease_ms=claim_lease_ms(settings.delivery_timeout_ms, settings.max_block_ms, settings.linger_ms),
            wait_ms=settings.max_block_ms,
            lane_floor=self._sender.lane_floor,
            rings=self._sender.rings,
            transactional=transactional,
            owner=owner,
        )

    # ------------------------------------------------------------------------------------------------ publishing

    def publish(
        self,
        record: Record | bytes | str | Any,
        timeout_s: float | None = None,
        *,
        topic: str | None = None,
        message_id: str | None = None,
    ) -> int:
        """Publish one record and wait until it is stored; returns its offset.

        ``topic`` and ``message_id``, when given, set the record's (see ``Record``).

        Raises:
            GridError: the grid refused or lost the write. PublishTimeoutError: no room, or not stored in
            ``timeout_s``. PublisherClosedError: after ``close()``. DuplicateMessageError: the stream has a
            deduplication window and ``message_id`` was used on it within the window.
        """
        check_timeout("publish timeout_s", timeout_s, unit="s", none=True)
        future = self.publish_async(record, topic=topic, message_id=message_id)
        try:
            return future.result(timeout_s)
        except TimeoutError:
            raise PublishTimeoutError(
                f"record not stored in stream {self.stream!r} within {timeout_s} s; it may still be stored later"
            ) from None

    def publish_async(
        self,
        record: Record | bytes | str | Any,
        callback: PublishCallback | None = None,
        topic: str | None = None,
        message_id: str | None = None,
    ) -> RecordFuture:
        """Queue one record; the future (and ``callback(offset, error)``) completes once it is stored.

        The callback runs on the publisher's completion thread, never on the caller's or the grid client's.
        ``topic`` and ``message_id``, when given, set the record's (see ``Record``). On a stream with a
        deduplication window, a record with a message id is claimed in the grid first (one round trip), and a
        duplicate raises ``DuplicateMessageError`` here, before anything is queued (``meteor_spark.producer.dedup``).
        A publisher that needs nothing else for a plain value (no serializer, no topic gate) queues those in a function
        of its own (``Accumulator.plain_publisher``), installed as its ``publish_async``.
        """
        if callback is not None and not callable(callback):
            raise ArgumentTypeError(f"publish_async callback must be callable(offset, error) or None, got {callback!r}")
        if self._serializing:
            record = self._serialized(record, None, 1)
        if topic is not None or message_id is not None:
            record = routed(record, topic, message_id)
        if self._trace is not None and self._trace.active():
            return self._trace.publish_one(record, lambda traced: self._queue_one(traced, callback))
        return self._queue_one(record, callback)

    def _queue_one(self, record: Record | bytes | str | Any, callback: PublishCallback | None) -> RecordFuture:
        """``publish_async`` of a record already serialized and routed (and, traced, carrying its context)."""
        if self._gate is not None and not self._gate.wants(record):
            if type(record) is not bytes:
                checked_record(record, route=False)  # bad input is refused, dropped or not
            return self._gate.drop(callback, self._sender.complete_later)
        if type(record) is bytes:
            # The hot path: a plain value needs no Record and one check.
            if len(record) > self._max_record_bytes:
                self._refuse_size(len(record), "the record")
            future, call = self._append(record, -1, time.time_ns() // 1_000_000, callback)
        else:
            rec = checked_record(record)
            size = record_bytes(rec)
            if size > self._max_record_bytes:
                self._refuse_size(size, "the record")
            stamp = rec.timestamp_ms if rec.timestamp_ms is not None else int(time.time() * 1000)
            lane = self._acc.lane_of(rec)
            if rec.message_id is not None and self._dedup is not None:
                lane, claim = claim_one(self._dedup, rec, lane)
                with released_on_error(self._dedup, [claim]):
                    future, call = self._append(rec, lane, stamp, callback)
                settle_when_done(self._dedup, [claim], [-1], future)
            else:
                future, call = self._append(rec, lane, stamp, callback)
        if call is not None:
            self._sender.send(call)
        return future

    def publish_many(self, records: Iterable[Record | bytes | str | Any]) -> BulkFuture:
        """Queue many records at once (cheaper per record); the future completes with their offsets, in order.

        Keyless records without an explicit lane are spread over the lanes in contiguous runs.
        """
        if isinstance(records, (str, bytes, bytearray, memoryview, Record)):
            raise ArgumentTypeError(
                f"publish_many takes an iterable of records (e.g. a list), got one {type(records).__name__}: "
                f"{shown(records)}; use publish or publish_async for one record, or wrap it in a list"
            )
        if isinstance(records, list):
            items = records
        else:
            try:
                items = list(records)
            except TypeError:
                raise ArgumentTypeError(
                    f"publish_many takes an iterable of records (e.g. a list), got {type(records).__name__}: "
                    f"{shown(records)}"
                ) from None
        if self._serializing:
            n = len(items)
            items = [self._serialized(item, position, n) for position, item in enumerate(items)]
        if self._trace is not None and items and self._trace.active():
            return self._trace.publish_many(items, self._gated_many)
        return self._gated_many(items)

    def _gated_many(self, items: list[Any]) -> BulkFuture:
        """``publish_many`` of records already serialized (and, traced, carrying their context)."""
        if self._gate is not None:
            kept = self._gate.split(items)
            if len(kept) < len(items):
                wanted = set(kept)
                for position, item in enumerate(items):
                    if position not in wanted and type(item) is not bytes:
                        checked_record(item, route=False)  # bad input is refused, dropped or not
                inner = self._queue_many([items[k] for k in kept])
                self._gate.count(len(items) - len(kept))
                return merged_bulk(len(items), kept, inner)
        return self._queue_many(items)

    def _queue_many(self, items: list[Any]) -> BulkFuture:
        """``publish_many`` of records already serialized (and, ephemeral, wanted)."""
        sink = BulkFuture("list", len(items))
        if not items:
            sink.set_result([])
            return sink
        now = int(time.time() * 1000)
        if all(type(r) is bytes for r in items):
            # Fast path for plain values: no Record objects, contiguous runs over the lanes.
            values: list[bytes] = items
            largest = max(map(len, values))
            if largest > self._max_record_bytes:
                position = next(i for i, v in enumerate(values) if len(v) == largest)
                self._refuse_size(largest, f"record {position} (0-based) of the {len(values)} given to publish_many")
            self._sender.send_all(self._acc.append_values(values, now, sink))
            return sink
        recs = [checked_record(r) for r in items]
        for position, rec in enumerate(recs):
            size = record_bytes(rec)
            if size > self._max_record_bytes:
                self._refuse_size(size, f"record {position} (0-based) of the {len(recs)} given to publish_many")
        if self._dedup is not None and any(rec.message_id is not None for rec in recs):
            claims, positions = claim_records(self._dedup, recs, self._acc.lane_of)
            return queue_claimed(self._dedup, claims, positions, lambda: self._queue_records(recs, now, sink))
        return self._queue_records(recs, now, sink)

    def _queue_records(self, recs: list[Record], now: int, sink: BulkFuture) -> BulkFuture:
        self._sender.send_all(self._acc.append_records(recs, now, sink))
        return sink

    def publish_arrow(self, batch: pa.RecordBatch | pa.Table, *, duplicates: str = "refuse") -> ArrowPublishFuture:
        """Queue the rows of an Arrow batch or table; the future completes with the number of records stored.

        ``lanes_written()`` of the future then gives, per lane, the records stored and their first/last offsets.

        Columns: ``value`` (required; binary or string), optional ``key`` (binary/string, nulls allowed),
        ``headers`` (list<struct<key: string, value: binary>>), ``timestamp`` (a timestamp type, or int64 ms;
        nulls = now), ``lane`` (integer; nulls = by key), ``topic`` and ``message_id`` (strings; nulls = none).
        Other columns are ignored. The serializers do not apply: the columns are stored as they are (serialize
        into the column first, e.g. JSON text).

        On a stream with a deduplication window, the rows' message ids are claimed first (all at once): a
        duplicate raises ``DuplicateMessageError`` with ``duplicates="refuse"`` (nothing queued), or with
        ``duplicates="skip"`` its row is left out and counted in the future's ``duplicates_skipped``. Their
        claims record no offset (``first_offset`` None for a later duplicate): the rows' offsets are not known
        one by one.

        Rows without a lane of their own (no key, no ``lane``) go to the lanes in contiguous runs of at least a
        whole call (``max_call_bytes`` of them): a bulk smaller than that goes to one lane, the next bulk to the
        next lane. The rows are encoded and sent by the publisher's sender thread.
        """
        if not isinstance(batch, (pa.RecordBatch, pa.Table)):
            raise ArgumentTypeError(
                f"publish_arrow takes a pyarrow RecordBatch or Table, got {type(batch).__name__}: {shown(batch)}; "
                f"use publish_many for Python records"
            )
        if duplicates not in ("refuse", "skip"):
            raise ConfigError(f"publish_arrow duplicates must be 'refuse' or 'skip', got {duplicates!r}")
        dropped = 0
        if self._gate is not None:
            batch, dropped = self._gate.rows_wanted(batch)
        bulk = ArrowInput(batch)
        claims: list[Claim] = []
        skipped = 0
        if self._dedup is not None and bulk.rows and bulk.message_ids is not None:
            bulk, claims, skipped = claim_rows(self._dedup, bulk, duplicates == "skip")
        n = bulk.rows
        sink = ArrowPublishFuture(n)
        sink.duplicates_skipped = skipped
        if dropped:
            self._gate.count(dropped)  # type: ignore[union-attr]  # rows are dropped only by a gate
        if n == 0:
            sink.set_result(0)
            return sink
        if self._dedup is None or not claims:
            return self._queue_arrow(bulk, sink)
        return queue_claimed(self._dedup, claims, [-1] * len(claims), lambda: self._queue_arrow(bulk, sink))

    def _queue_arrow(self, bulk: ArrowInput, sink: ArrowPublishFuture) -> ArrowPublishFuture:
        row, size = bulk.largest_row()
        if size > self._max_record_bytes:
            self._refuse_size(size, f"row {row} (0-based) of the {bulk.rows} given to publish_arrow")
        self._acc.append_arrow(bulk, sink)
        return sink

    def _refuse_size(self, size: int, what: str) -> None:
        raise size_refusal(self.stream, size, what, self._max_record_bytes)

    def _serialized(self, item: Any, position: int | None, count: int) -> Record | bytes:
        return serialized(
            item, self._value_serializer, self._key_serializer, self.stream, position, count, self._record_header
        )

    # ------------------------------------------------------------------------------------------------ lifecycle

    def flush(self, timeout_s: float | None = None) -> None:
        """Send everything queued now (ignoring linger) and wait until all accepted records completed.

        Raises:
            PublishTimeoutError: records were still outstanding after ``timeout_s``.
        """
        check_timeout("flush timeout_s", timeout_s, unit="s", none=True)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        outstanding = self._acc.flush(deadline)
        if outstanding:
            raise PublishTimeoutError(
                f"flush of stream {self.stream!r}: {outstanding} records still not stored after {timeout_s} s; the "
                f"grid is slow or unreachable"
            )

    def close(self, timeout_s: float | None = None) -> None:
        """Stop accepting records, send and wait for everything accepted, then stop the threads.

        With ``timeout_s``, records still not stored when it passes get ``PublishTimeoutError`` in their futures
        (nothing is dropped silently), those of a call an idempotent publisher is retrying included. Without it,
        such a call is waited for until its ``delivery_timeout_ms`` passes (a grid call under way then finishes
        first, within the grid's invocation timeout).
        """
        check_timeout("close timeout_s", timeout_s, unit="s", none=True)
        if not self._acc.begin_close():
            return
        try:
            self.flush(timeout_s)
            if self._dedup is not None and not self._dedup.drain(timeout_s):
                logger.warning("publisher %x: claims still being marked written at close", self.producer_id)
        except PublishTimeoutError as exc:
            self._sender.fail_queued(exc)
            raise
        finally:
            self._acc.mark_closed()
            self._sender.stop()
            if self._detach_metrics is not None:
                self._detach_metrics()
            logger.debug(
                "publisher %x on stream %r closed: %d records in %d items, %d calls, %d failed",
                self.producer_id,
                self.stream,
                self.records_sent,
                self.items_sent,
                self._sender.calls,
                self._sender.failed_records,
            )

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def records_sent(self) -> int:
        """Records stored so far."""
        return self._sender.records_sent

    @property
    def items_sent(self) -> int:
        """Ring items stored so far."""
        return self._sender.items_sent

    def metrics(self) -> dict[str, int]:
        """Counters since creation: records/items sent, add_all calls, failed records, records outstanding; and
        of idempotence: add_all attempts whose answer was lost (``unknown_outcomes``), of those the calls found
        stored in the lane (``recovered_calls``, not sent again) and the attempts sent again (``resent_calls``); of
        a deduplication window: copies refused (``duplicates_refused``), lapsed claims of other publishers taken
        over (``dedup_takeovers``) and own claims that lapsed before their write settled (``dedup_lease_lost``)."""
        sender = self._sender
        retrier = sender.retrier
        outstanding = self._acc.outstanding_records()
        dedup = self._dedup
        return {
            "records_sent": sender.records_sent,
            "items_sent": sender.items_sent,
            "calls": sender.calls,
            "failed_records": sender.failed_records,
            "outstanding": outstanding,
            "unknown_outcomes": 0 if retrier is None else retrier.unknown_outcomes,
            "recovered_calls": 0 if retrier is None else retrier.recovered,
            "resent_calls": 0 if retrier is None else retrier.resent,
            "duplicates_refused": 0 if dedup is None else dedup.refused,
            "dedup_takeovers": 0 if dedup is None else dedup.taken_over,
            "dedup_lease_lost": 0 if dedup is None else dedup.lease_lost,
            "dropped_records": 0 if self._gate is None else self._gate.dropped,
        }


def check_item_fits(settings: PublisherSettings, grid: GridSettings) -> None:
    """A full ring item of many records must fit in one frame of the grid too (a single larger record travels
    alone and is checked when published)."""
    worst = settings.max_item_bytes + settings.max_batch_records * RECORD_COLUMN_BYTES
    if worst > grid.max_record_bytes:
        raise ConfigError(
            f"max_batch_bytes / max_call_bytes ({settings.max_item_bytes:,}) with max_batch_records "
            f"({settings.max_batch_records:,}) allow ring items of up to {worst + ITEM_FRAME_OVERHEAD:,} bytes, more "
            f"than the grid's frame limit (hazelcast.maxFrameBytes = {grid.max_frame_bytes:,}); lower them"
        )


def _producer_id(grid: Grid) -> int:
    try:
        return grid.flake_id("meteor.producer")
    except GridError as exc:
        logger.debug("no FlakeIdGenerator (%s); using a random producer id", exc)
        return random_producer_id()


def random_producer_id() -> int:
    """A producer id for a grid without a FlakeIdGenerator: 63 random bits (collisions as unlikely as UUIDs')."""
    return uuid.uuid4().int >> 65
