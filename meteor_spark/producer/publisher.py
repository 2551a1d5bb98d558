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
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import pyarrow as pa

from meteor_spark.errors import (
    ArgumentTypeError,
    ConfigError,
    GridError,
    PublishTimeoutError,
    SerializationError,
    SizeLimitError,
)
from meteor_spark.format.arrow_columns import ArrowInput
from meteor_spark.format.records import Record, as_record, with_routing
from meteor_spark.format.routing import check_message_id, check_topic
from meteor_spark.format.serializers import Serializer, serializer
from meteor_spark.grid.client import Grid, GridSettings, require_grid
from meteor_spark.grid.settings import HAZELCAST_MAX_FRAME_BYTES, ITEM_FRAME_OVERHEAD
from meteor_spark.grid.streams import StreamConfig, StreamInfo, open_stream
from meteor_spark.metrics import attach as attach_metrics
from meteor_spark.metrics import registry_of as metrics_registry
from meteor_spark.producer.accumulator import Accumulator
from meteor_spark.producer.batching import PublisherSettings
from meteor_spark.producer.futures import (
    ArrowPublishFuture,
    BulkFuture,
    LaneWritten,
    PublishCallback,
    RecordFuture,
)
from meteor_spark.producer.sender import Sender
from meteor_spark.producer.topic_gate import TopicGate, merged_bulk
from meteor_spark.validate import check_int, check_timeout

__all__ = ["ArrowPublishFuture", "LaneWritten", "PublishCallback", "Publisher", "PublisherSettings", "RecordFuture"]

logger = logging.getLogger(__name__)


class Publisher:
    """Publishes records to a stream.

    Args:
        grid: the grid connection.
        stream: a ``StreamConfig`` (the stream is created when missing) or the name of an existing stream.
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
            is queued.
        metrics: True (prometheus_client's default registry) or a ``CollectorRegistry``: export this publisher's
            counters (``meteor_spark.metrics``; needs the ``metrics`` extra).
        transactional: flag every ring item transactional (wire flag 0x10). Register ``producer_id`` under a
            transaction (``meteor_spark.grid.transactions.begin``) before publishing: ``read_committed`` readers deliver
            the records only once that transaction commits this producer.
        subscription_refresh_ms: on an ephemeral stream, how old the publisher's copy of the stream's consuming
            entities may get (default 1,000 ms; ``meteor_spark.grid.subscriptions``). A record whose topic no live
            entity matches is dropped, not stored: its future completes with ``NOT_STORED`` (-1) and it is counted
            in ``metrics()["dropped_records"]`` (``meteor_spark.producer.topic_gate``).

    Examples:
        >>> with Publisher(grid, StreamConfig("orders", lanes=4)) as pub:          # doctest: +SKIP
        ...     offset = pub.publish(Record(b"{...}", key=b"customer-42"))
        ...     future = pub.publish_async(b"fire and forget")
    """

    def __init__(
        self,
        grid: Grid,
        stream: StreamConfig | str,
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
        value_serializer: str | Serializer | None = None,
        key_serializer: str | Serializer | None = None,
        metrics: Any = None,
        transactional: bool = False,
        subscription_refresh_ms: int | None = None,
    ) -> None:
        require_grid(grid)
        if subscription_refresh_ms is not None:
            check_int("subscription_refresh_ms", subscription_refresh_ms, 1, 3_600_000)
        if not isinstance(transactional, bool):
            raise ArgumentTypeError(f"transactional must be True or False, got {transactional!r}")
        registry = metrics_registry(metrics)
        self._value_serializer = serializer(value_serializer, "value_serializer")
        self._key_serializer = serializer(key_serializer, "key_serializer")
        self._serializing = self._value_serializer is not None or self._key_serializer is not None
        self.info: StreamInfo = open_stream(grid, stream)
        if subscription_refresh_ms is not None and not self.info.config.ephemeral:
            raise ConfigError(
                f"subscription_refresh_ms: stream {self.info.name!r} is not ephemeral, so its publishers keep every "
                f"record and read no registry; leave it unset"
            )
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
        _check_item_fits(self.settings, grid.settings)
        self.producer_id = _producer_id(grid)
        self._acc, self._sender = self._pipeline(grid, transactional)
        self._gate = TopicGate(grid, self.stream, subscription_refresh_ms) if self.info.config.ephemeral else None
        # Bound once: publish_async runs a million times a second.
        self._append = self._acc.append
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
            ``timeout_s``. PublisherClosedError: after ``close()``.
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
        *,
        topic: str | None = None,
        message_id: str | None = None,
    ) -> RecordFuture:
        """Queue one record; the future (and ``callback(offset, error)``) completes once it is stored.

        The callback runs on the publisher's completion thread, never on the caller's or the grid client's.
        ``topic`` and ``message_id``, when given, set the record's (see ``Record``).
        """
        if callback is not None and not callable(callback):
            raise ArgumentTypeError(f"publish_async callback must be callable(offset, error) or None, got {callback!r}")
        if self._serializing:
            record = self._serialized(record, None, 1)
        if topic is not None or message_id is not None:
            record = _routed(record, topic, message_id)
        if self._gate is not None and not self._gate.wants(record):
            if type(record) is not bytes:
                _checked_record(record, route=False)  # bad input is refused, dropped or not
            return self._gate.drop(callback, self._sender.complete_later)
        if type(record) is bytes:
            # The hot path: a plain value needs no Record and one check.
            if len(record) > self._max_record_bytes:
                self._refuse_size(len(record), "the record")
            future, call = self._append(record, -1, time.time_ns() // 1_000_000, callback)
        else:
            rec = _checked_record(record)
            size = _record_bytes(rec)
            if size > self._max_record_bytes:
                self._refuse_size(size, "the record")
            stamp = rec.timestamp_ms if rec.timestamp_ms is not None else int(time.time() * 1000)
            future, call = self._append(rec, self._acc.lane_of(rec), stamp, callback)
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
                f"{_shown(records)}; use publish or publish_async for one record, or wrap it in a list"
            )
        if isinstance(records, list):
            items = records
        else:
            try:
                items = list(records)
            except TypeError:
                raise ArgumentTypeError(
                    f"publish_many takes an iterable of records (e.g. a list), got {type(records).__name__}: "
                    f"{_shown(records)}"
                ) from None
        if self._serializing:
            n = len(items)
            items = [self._serialized(item, position, n) for position, item in enumerate(items)]
        if self._gate is not None:
            kept = self._gate.split(items)
            if len(kept) < len(items):
                wanted = set(kept)
                for position, item in enumerate(items):
                    if position not in wanted and type(item) is not bytes:
                        _checked_record(item, route=False)  # bad input is refused, dropped or not
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
        recs = [_checked_record(r) for r in items]
        for position, rec in enumerate(recs):
            size = _record_bytes(rec)
            if size > self._max_record_bytes:
                self._refuse_size(size, f"record {position} (0-based) of the {len(recs)} given to publish_many")
        self._sender.send_all(self._acc.append_records(recs, now, sink))
        return sink

    def publish_arrow(self, batch: pa.RecordBatch | pa.Table) -> ArrowPublishFuture:
        """Queue the rows of an Arrow batch or table; the future completes with the number of records stored.

        ``lanes_written()`` of the future then gives, per lane, the records stored and their first/last offsets.

        Columns: ``value`` (required; binary or string), optional ``key`` (binary/string, nulls allowed),
        ``headers`` (list<struct<key: string, value: binary>>), ``timestamp`` (a timestamp type, or int64 ms;
        nulls = now) and ``lane`` (integer; nulls = by key). Other columns are ignored. The serializers do not
        apply: the columns are stored as they are (serialize into the column first, e.g. JSON text).

        Rows without a lane of their own (no key, no ``lane``) go to the lanes in contiguous runs of at least a
        whole call (``max_call_bytes`` of them): a bulk smaller than that goes to one lane, the next bulk to the
        next lane. The rows are encoded and sent by the publisher's sender thread.
        """
        if not isinstance(batch, (pa.RecordBatch, pa.Table)):
            raise ArgumentTypeError(
                f"publish_arrow takes a pyarrow RecordBatch or Table, got {type(batch).__name__}: {_shown(batch)}; "
                f"use publish_many for Python records"
            )
        dropped = 0
        if self._gate is not None:
            batch, dropped = self._gate.rows_wanted(batch)
        bulk = ArrowInput(batch)
        n = bulk.rows
        sink = ArrowPublishFuture(n)
        if n:
            row, size = bulk.largest_row()
            if size > self._max_record_bytes:
                self._refuse_size(size, f"row {row} (0-based) of the {n} given to publish_arrow")
        if dropped:
            self._gate.count(dropped)  # type: ignore[union-attr]  # rows are dropped only by a gate
        if n == 0:
            sink.set_result(0)
            return sink
        self._acc.append_arrow(bulk, sink)
        return sink

    def _refuse_size(self, size: int, what: str) -> None:
        """Refuse a record no ring item of the grid can carry, before anything of the call is queued or sent: the
        member would drop the connection (and every call on it) on the oversize frame."""
        limit = self._max_record_bytes
        raise SizeLimitError(
            f"{what} for stream {self.stream!r} carries {size:,} bytes (value, key and headers), more than the "
            f"{limit:,} bytes one record may carry (hazelcast.maxFrameBytes = {limit + ITEM_FRAME_OVERHEAD:,}, the "
            f"grid's frame limit, less {ITEM_FRAME_OVERHEAD} bytes of item framing); nothing of this call was sent. "
            f"Split the record, or raise GridSettings.max_frame_bytes if every member accepts larger frames "
            f"(a Hazelcast member: up to {HAZELCAST_MAX_FRAME_BYTES:,})"
        )

    def _serialized(self, item: Any, position: int | None, count: int) -> Record | bytes:
        """``item`` with its value (and a Record's key) through the serializers; ``position`` of ``count`` in a
        ``publish_many`` call (None: a single record) names it when a serializer fails."""
        rec = item if isinstance(item, Record) else None
        value = item if rec is None else rec.value
        if self._value_serializer is not None:
            value = self._apply(self._value_serializer, "value_serializer", value, position, count)
        if rec is None:
            return value
        key = rec.key
        if key is not None and self._key_serializer is not None:
            key = self._apply(self._key_serializer, "key_serializer", key, position, count)
        return replace(rec, value=value, key=key)

    def _apply(self, function: Serializer, name: str, obj: Any, position: int | None, count: int) -> bytes:
        try:
            out = function(obj)
            if type(out) is bytes:
                return out
            if not isinstance(out, (bytes, bytearray)):
                raise TypeError(f"it returned {type(out).__name__}, not bytes")
            return bytes(out)
        except Exception as exc:
            where = "the record"
            if position is not None:
                where = f"record {position} (0-based) of the {count} given to publish_many"
            raise SerializationError(
                f"{name} failed on {where} for stream {self.stream!r}: {type(exc).__name__}: {exc}; nothing of "
                f"this call was queued"
            ) from exc

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
        stored in the lane (``recovered_calls``, not sent again) and the attempts sent again (``resent_calls``)."""
        sender = self._sender
        retrier = sender.retrier
        outstanding = self._acc.outstanding_records()
        return {
            "records_sent": sender.records_sent,
            "items_sent": sender.items_sent,
            "calls": sender.calls,
            "failed_records": sender.failed_records,
            "outstanding": outstanding,
            "unknown_outcomes": 0 if retrier is None else retrier.unknown_outcomes,
            "recovered_calls": 0 if retrier is None else retrier.recovered,
            "resent_calls": 0 if retrier is None else retrier.resent,
            "dropped_records": 0 if self._gate is None else self._gate.dropped,
        }


def _checked_record(item: Record | bytes | str, *, route: bool = True) -> Record:
    """``item`` as a valid ``Record``, its topic and message id in its headers (unless ``route`` is False: a record
    only checked, e.g. before it is dropped)."""
    item = as_record(item)
    if not isinstance(item.value, (bytes, bytearray)):
        raise ArgumentTypeError(f"Record.value must be bytes, got {type(item.value).__name__}; encode it first")
    if item.key is not None and not isinstance(item.key, (bytes, bytearray)):
        raise ArgumentTypeError(f"Record.key must be bytes or None, got {type(item.key).__name__}; encode it first")
    if item.headers:
        for pair in item.headers:
            if (
                not isinstance(pair, tuple)
                or len(pair) != 2
                or not isinstance(pair[0], str)
                or not isinstance(pair[1], (bytes, bytearray))
            ):
                raise ArgumentTypeError(
                    f"Record.headers must be (str, bytes) pairs, e.g. (('trace-id', b'abc'),); got {pair!r}"
                )
    if item.topic or item.message_id is not None:
        check_topic(item.topic, "Record.topic")
        if item.message_id is not None:
            check_message_id(item.message_id, "Record.message_id")
        if route:
            item = with_routing(item)
    stamp = item.timestamp_ms
    if stamp is not None:
        if isinstance(stamp, bool) or not isinstance(stamp, int):
            raise ArgumentTypeError(
                f"Record.timestamp_ms must be an int (ms since the epoch) or None, got {item.timestamp_ms!r}"
            )
        check_int("Record.timestamp_ms", stamp, 0, _MAX_I64, what="(ms since the epoch; None = now)")
    lane = item.lane
    if lane != -1:
        check_int("Record.lane", lane, 0, _MAX_I32, what="(-1 = by key; the stream's lanes are checked next)")
    return item


def _routed(item: Record | bytes | str, topic: str | None, message_id: str | None) -> Record:
    """``item`` with the ``topic`` / ``message_id`` given to ``publish`` (None: the record's own)."""
    record = as_record(item)
    if topic is not None:
        record = replace(record, topic=check_topic(topic))
    if message_id is not None:
        record = replace(record, message_id=check_message_id(message_id))
    return record


_MAX_I64 = (1 << 63) - 1
_MAX_I32 = (1 << 31) - 1


def _shown(value: object) -> str:
    """A short ``repr`` for an error message (a refused argument may be megabytes)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


#: Column bytes one record adds to a ring item besides its data (value and key lengths, timestamp, header count),
#: rounded up: what many small records add to an item filled to ``max_batch_bytes``.
_RECORD_COLUMN_BYTES = 32


def _record_bytes(record: Record) -> int:
    """Value, key and header bytes of a record: what it weighs against the grid's frame limit."""
    size = len(record.value)
    if record.key is not None:
        size += len(record.key)
    for name, value in record.headers or ():
        size += len(name.encode("utf-8", "surrogatepass")) + len(value)
    return size


def _check_item_fits(settings: PublisherSettings, grid: GridSettings) -> None:
    """A full ring item of many records must fit in one frame of the grid too (a single larger record travels
    alone and is checked when published)."""
    worst = settings.max_item_bytes + settings.max_batch_records * _RECORD_COLUMN_BYTES
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
        return uuid.uuid4().int >> 65
