"""AsyncPublisher: the asyncio twin of ``meteor_spark.producer.publisher.Publisher``, on the caller's event loop.

The same ring items (``meteor_spark.format.item_encoding``: producer id and sequence, the lane's running maximum
timestamp, LZ4 past the threshold, the transactional flag), the same options checked by the same code
(``PublisherSettings``, the serializers, ``checked_record``, the frame-size refusal) and the same errors. What
differs is only how the work is scheduled: no threads. Each lane has a queue and, while it holds records, one
task that cuts the queue into ring items and sends them with one ``add_all`` at a time (so order per lane holds,
as Hazelcast does not promise the order of concurrent appends); lanes are sent concurrently. Records published
while a lane's call is in flight go in its next call, so a loaded publisher batches on its own; ``linger_ms`` makes
a lane wait that long for more before a call that is not full.

Idempotence (default): an ``add_all`` whose answer was lost (connection dropped, invocation timed out) is looked
up in its lane by producer id and sequence (``meteor_spark.producer.idempotence.call_search``, the threaded
retrier's search, driven here with awaited reads) and sent again only when absent, backing off, until
``delivery_timeout_ms``; its records then fail with the threaded publisher's ``PublishTimeoutError``.

Typed streams (``value_format="avro"``, ``value_serializer="avro"`` / ``AvroValues``): the threaded Avro serializer
with the registry entry read ahead (``meteor_spark.aio.typed``). ``metrics=``: Prometheus export as the threaded
publisher's (``meteor_spark.metrics``). Ephemeral streams: records no live entity wants are dropped before they
are queued and counted, their offset ``NOT_STORED`` (``meteor_spark.aio.topics``). Deduplication windows: a record's
``message_id`` is claimed in the threaded publisher's claims map before it is queued (``DuplicateMessageError``
naming the first copy's offset, whichever publisher stored it; ``meteor_spark.aio.claims``). ``publish_arrow`` is
the threaded client's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from functools import partial
from time import time_ns as _time_ns
from typing import Any, cast

from meteor_spark.aio.calls import (
    Attempts,
    Lane,
    Piece,
    Run,
    Sink,
    cut_call,
    encode_call,
    fail_pieces,
    lane_at_start,
    producer_id_of,
    recover_call,
    settle_pieces,
)
from meteor_spark.aio.claims import AsyncDedup, check_dedup
from meteor_spark.aio.options import PUBLISHER_ONLY_THREADED, PUBLISHER_OPTIONS, PUBLISHER_SETTINGS, check_option_names
from meteor_spark.aio.record_future import OffsetFuture
from meteor_spark.aio.record_future import PublishFuture as _PublishFuture
from meteor_spark.aio.record_input import RecordInput
from meteor_spark.aio.streams import open_stream_async
from meteor_spark.aio.topics import AsyncTopicGate
from meteor_spark.aio.typed import typed_serializer
from meteor_spark.errors import (
    ArgumentTypeError,
    GridError,
    MeteorError,
    PublisherClosedError,
    PublishTimeoutError,
)
from meteor_spark.format.avro import is_typed_setting
from meteor_spark.format.item_encoding import ItemFraming
from meteor_spark.format.partitioning import lane_for_key
from meteor_spark.format.records import Record
from meteor_spark.format.serializers import serializer
from meteor_spark.format.trace_context import PublishTracing, publish_tracing
from meteor_spark.grid.aio_client import AsyncGrid, connect_async
from meteor_spark.grid.streams import StreamConfig, StreamInfo
from meteor_spark.grid.subscriptions import NOT_STORED
from meteor_spark.metrics import attach as attach_metrics
from meteor_spark.metrics import registry_of as metrics_registry
from meteor_spark.producer.batching import PublisherSettings
from meteor_spark.producer.idempotence import outcome_unknown
from meteor_spark.producer.publisher import check_item_fits
from meteor_spark.producer.record_checks import record_bytes
from meteor_spark.producer.sticky import sticky_run, sticky_runs
from meteor_spark.producer.topic_gate import check_refresh_ms, refuse_refresh_on_persistent

__all__ = ["AsyncPublisher"]

logger = logging.getLogger(__name__)


class AsyncPublisher:
    """Publishes records to a stream from asyncio code.

    Args:
        members_or_grid: ``"host:port[,host:port]"``, a ``GridSettings`` (a connection of its own, closed with the
            publisher) or an ``AsyncGrid`` (shared, left open).
        stream: a ``StreamConfig`` (created when missing) or the name of an existing stream.
        **options: those of the threaded ``Publisher``, with the same meaning and checks: ``linger_ms``,
            ``max_batch_records``, ``max_batch_bytes``, ``max_buffered_records``, ``max_block_ms``,
            ``max_items_per_call``, ``max_call_bytes``, ``compression``, ``compression_threshold``, ``idempotent``,
            ``delivery_timeout_ms``, ``value_serializer`` (also ``"avro"`` / ``AvroValues``), ``key_serializer``,
            ``transactional``, ``metrics`` (True or a ``CollectorRegistry``), ``subscription_refresh_ms``,
            ``tracing`` (with OpenTelemetry installed and a span current, each publish call starts a PRODUCER span
            and its records carry its ``traceparent``, as the threaded publisher's: ``format/trace_context.py``).

    Examples:
        >>> async with AsyncPublisher("127.0.0.1:5701", StreamConfig("orders", lanes=4)) as pub:   # doctest: +SKIP
        ...     offset = await pub.publish(b"{...}", key=b"customer-42")
    """

    def __init__(self, members_or_grid: object, stream: StreamConfig | str, **options: Any) -> None:
        check_option_names("AsyncPublisher", options, PUBLISHER_OPTIONS, PUBLISHER_ONLY_THREADED)
        tracing = options.pop("tracing", True)
        if not isinstance(tracing, bool):
            raise ArgumentTypeError(f"tracing must be True or False, got {tracing!r}")
        transactional = options.pop("transactional", False)
        if not isinstance(transactional, bool):
            raise ArgumentTypeError(f"transactional must be True or False, got {transactional!r}")
        self._registry = metrics_registry(options.pop("metrics", None))
        self._refresh_ms = options.pop("subscription_refresh_ms", None)
        check_refresh_ms(self._refresh_ms)
        self._gate: AsyncTopicGate | None = None
        self._dedup: AsyncDedup | None = None
        self._value_setting = options.pop("value_serializer", None)  # a typed stream's codec is resolved at start
        typed = is_typed_setting(self._value_setting)
        self._value_serializer = None if typed else serializer(self._value_setting, "value_serializer")
        self._detach_metrics: Callable[[], None] | None = None
        self._key_serializer = serializer(options.pop("key_serializer", None), "key_serializer")
        self._transactional = transactional
        self._tracing = tracing
        self._trace: PublishTracing | None = None  # set at start, for the stream's name
        self._overrides = {name: options.get(name) for name in PUBLISHER_SETTINGS}
        self._target = members_or_grid
        self._config = stream
        self._grid: AsyncGrid | None = None
        self._owns_grid = False
        self._lanes: list[Lane] = []
        self._sticky = 0  # the lane keyless records go to, and how many it holds since (sticky.sticky_runs)
        self._sticky_fill = 0
        self._producer_seq = 0
        self._outstanding = 0
        self._room: asyncio.Condition | None = None
        self._closed = False
        self._plain = False  # publish_async's one-coroutine path is open (started, not closing, no serializer or gate)
        self.stream = stream if isinstance(stream, str) else getattr(stream, "name", "?")
        self.producer_id = 0
        self.records_sent = self.items_sent = self.calls = self.failed_records = 0
        self.unknown_outcomes = self.recovered_calls = self.resent_calls = 0

    # ------------------------------------------------------------------------------------------------ lifecycle

    async def start(self) -> AsyncPublisher:
        """Connect (unless given a grid), open the stream, check the options against it, read every lane's tail and
        last item (where idempotent calls land, and the lane's timestamp to continue). ``async with`` calls it."""
        if self._grid is not None:
            return self
        grid, owned = await connect_async(self._target)
        try:
            self.info: StreamInfo = await open_stream_async(grid, self._config)
            refuse_refresh_on_persistent(self.info, self._refresh_ms)
            if self.info.config.ephemeral:
                self._gate = AsyncTopicGate(grid, self.info.name, self._refresh_ms)
            self.settings = PublisherSettings.parse(self.info.config, self._overrides)
            check_item_fits(self.settings, grid.settings)
            self.stream = self.info.name
            self._trace = publish_tracing(self.stream) if self._tracing else None
            self._max_record_bytes = grid.settings.max_record_bytes
            self._value_serializer = await typed_serializer(grid, self.info, self._value_setting)
            self._input = RecordInput(
                self.info.name, self._value_serializer, self._key_serializer, self._max_record_bytes, self.info.lanes
            )
            self.producer_id = await producer_id_of(grid)
            rings = [await grid.ring(name) for name in self.info.ring_names]
            self._lanes = list(
                await asyncio.gather(*(lane_at_start(self.stream, lane, ring) for lane, ring in enumerate(rings)))
            )
            if self.info.config.dedup_window_ms:
                check_dedup(self.info, self._transactional)
                floor = lambda lane: self._lanes[lane].next_start  # noqa: E731  (at or below its next write)
                self._dedup = await AsyncDedup.open(grid, self.info, self.settings, self.producer_id, rings, floor)
        except BaseException:
            if owned:
                await grid.close()
            raise
        self._grid, self._owns_grid = grid, owned
        self._room = asyncio.Condition()
        self._loop = asyncio.get_running_loop()
        self._max_buffered = self.settings.max_buffered_records
        self._one_lane = len(self._lanes) == 1
        # asyncio.Future made directly where the loop's create_future is the standard one (a Python frame less)
        self._new_future: Callable[[], asyncio.Future[Any]] = (
            partial(asyncio.Future, loop=self._loop)
            if getattr(type(self._loop), "create_future", None) is asyncio.BaseEventLoop.create_future
            else self._loop.create_future
        )
        self._context_now: Callable[[], Any] = self._trace.current if self._trace is not None else bool
        self._plain = self._value_serializer is None and self._gate is None
        self._detach_metrics = attach_metrics(self._registry, self)
        return self

    async def __aenter__(self) -> AsyncPublisher:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def flush(self, timeout_s: float | None = None) -> None:
        """Wait until every record accepted so far is stored (or failed).

        Raises:
            PublishTimeoutError: records were still outstanding after ``timeout_s``.
        """
        tasks = [lane.task for lane in self._lanes if lane.task is not None]
        if not tasks:
            return
        _done, pending = await asyncio.wait(tasks, timeout=timeout_s)
        if pending:
            raise PublishTimeoutError(
                f"flush of stream {self.stream!r}: {self._outstanding} records still not stored after {timeout_s} s; "
                f"the grid is slow or unreachable"
            )

    async def close(self, timeout_s: float | None = None) -> None:
        """Stop accepting records, wait for everything accepted (``flush``), then close an owned connection. With
        ``timeout_s``, records still not stored when it passes fail with ``PublishTimeoutError`` (nothing is
        dropped silently)."""
        if self._closed:
            return
        self._closed = True
        self._plain = False
        try:
            await self.flush(timeout_s)
            if self._dedup is not None and not await self._dedup.drain(timeout_s):
                logger.warning("publisher %x: claims still being marked written at close", self.producer_id)
        except PublishTimeoutError as exc:
            for lane in self._lanes:
                if lane.task is not None:
                    lane.task.cancel()
                for run in lane.queue:
                    run.sink.failed(exc, run.pos)
                    self.failed_records += len(run.values) - run.pos
                lane.queue.clear()
                lane.queued = 0
                lane.singles = None
            self._outstanding = 0
            raise
        finally:
            if self._detach_metrics is not None:
                self._detach_metrics()
            if self._owns_grid and self._grid is not None:
                await self._grid.close()

    # ------------------------------------------------------------------------------------------------ publishing

    async def publish(
        self,
        value: Record | bytes | str | Any,
        *,
        key: bytes | Any | None = None,
        headers: Iterable[tuple[str, bytes]] | None = None,
        lane: int | None = None,
        timestamp_ms: int | None = None,
        topic: str | None = None,
        message_id: str | None = None,
    ) -> int:
        """Publish one record and wait until it is stored; returns its offset (``Publisher.publish``'s twin).

        ``value`` is a ``Record`` or a value (through ``value_serializer`` when set); ``key``, ``headers``,
        ``lane``, ``timestamp_ms``, ``topic`` and ``message_id`` set the record's fields.

        Raises:
            GridError: the grid refused or lost the write. PublishTimeoutError: no room within ``max_block_ms``, or
            (idempotent) not stored within ``delivery_timeout_ms``. PublisherClosedError: after ``close()``.
        """
        future = await self.publish_async(
            value, key=key, headers=headers, lane=lane, timestamp_ms=timestamp_ms, topic=topic, message_id=message_id
        )
        return await (future.asyncio_future() if type(future) is _PublishFuture else future)  # no frame of its own

    async def publish_async(
        self,
        value: Record | bytes | str | Any,
        *,
        key: bytes | Any | None = None,
        headers: Iterable[tuple[str, bytes]] | None = None,
        lane: int | None = None,
        timestamp_ms: int | None = None,
        topic: str | None = None,
        message_id: str | None = None,
    ) -> OffsetFuture:
        """Queue one record (waiting for room up to ``max_block_ms``); the future's value is its offset once stored.
        Many records queued before their futures are awaited go out in few calls (aiokafka's ``send``). A plain
        value's future is a ``PublishFuture`` (``meteor_spark.aio.record_future``: what an asyncio future answers,
        at a fraction of its cost), other records' an ``asyncio.Future``.

        A plain value on a stream without serializer or topic gate, no trace context current, goes onto its lane in
        this one coroutine (the steps of ``_record``, ``_publish_one``, ``Lane.append_plain``): frames cost more."""
        if (
            type(value) is bytes
            and key is None
            and headers is None
            and lane is None
            and timestamp_ms is None
            and topic is None
            and message_id is None
            and self._plain
            and len(value) <= self._max_record_bytes
            and not self._context_now()
        ):
            if self._outstanding < self._max_buffered:
                self._outstanding += 1
            else:
                await self._admit(1)
            state = self._lanes[0] if self._one_lane else self._lanes[self._spread(1, len(value))[0][0]]
            run = state.singles or state.open_singles(self._loop)
            values = run.values
            future = _PublishFuture()
            future._outcomes = run.outcomes  # type: ignore[assignment]
            future._index = len(values)
            values.append(value)
            run.stamps.append(_time_ns())
            state.queued += 1
            if state.task is None:
                self._keep_sending(state)
            return future
        record = self._record(value, key, headers, lane, timestamp_ms, topic, message_id, None, 1)
        if self._trace is not None and self._trace.active():
            return await self._trace.publish_one_async(record, self._publish_one)
        return await self._publish_one(record)

    async def _publish_one(self, record: Record | bytes) -> OffsetFuture:
        if self._gate is not None and not await self._gate.wants(record):
            dropped = self._loop.create_future()  # no live entity wants it (ephemeral): not stored, counted
            dropped.set_result(NOT_STORED)
            return dropped
        if self._dedup is not None and isinstance(record, Record) and record.message_id is not None:
            return await self._dedup.queued([record], self._lane_of, self._enqueue, single=True)
        if self._outstanding < self._max_buffered:
            self._outstanding += 1  # room at once (the common case): no waiting
        else:
            await self._admit(1)
        if type(record) is bytes:  # a plain value: onto its lane's run of one-record calls (Lane.singles)
            state = self._lanes[self._spread(1, len(record))[0][0]]
            handle = state.append_plain(self._loop, record)
            self._keep_sending(state)
            return handle
        future: asyncio.Future[int] = self._new_future()
        self._queue([record], Sink(future, 1, True))
        return future

    async def publish_many(self, records: Iterable[Record | bytes | str | Any]) -> list[int]:
        """Publish many records at once and wait until all are stored; their offsets, in order. A record that
        cannot be stored fails the call with its error (the others may be stored). Keyless records without a lane
        go to the lanes in contiguous runs."""
        if isinstance(records, (str, bytes, bytearray, memoryview, Record)):
            raise ArgumentTypeError(
                f"publish_many takes an iterable of records (e.g. a list), got one {type(records).__name__}; use "
                f"publish for one record, or wrap it in a list"
            )
        items = list(records)
        n = len(items)
        checked = [self._record(item, None, None, None, None, None, None, i, n) for i, item in enumerate(items)]
        if self._trace is not None and checked and self._trace.active():
            return await self._trace.publish_many_async(checked, self._publish_many)
        return await self._publish_many(checked)

    async def _publish_many(self, checked: list[Record | bytes]) -> list[int]:
        n = len(checked)
        if self._gate is None:
            return await self._publish_checked(checked)
        kept = await self._gate.split(checked)  # ephemeral: only what some live entity wants is stored
        offsets = [NOT_STORED] * n
        for position, offset in zip(kept, await self._publish_checked([checked[i] for i in kept]), strict=True):
            offsets[position] = offset
        self._gate.count(n - len(kept))
        return offsets

    async def _publish_checked(self, checked: list[Record | bytes]) -> list[int]:
        if not checked:
            return []
        if self._dedup is not None:  # ids claimed first (aio/claims.py)
            return cast(list[int], await (await self._dedup.queued(checked, self._lane_of, self._enqueue)))
        return cast(list[int], await (await self._enqueue(checked)))

    async def _enqueue(self, records: list[Record | bytes], single: bool = False) -> asyncio.Future[Any]:
        """Admit and queue ``records``; the future of their offset (``single``) or offsets."""
        await self._admit(len(records))
        sink = Sink(self._loop.create_future(), len(records), single)
        self._queue(records, sink)
        return sink.future

    def _lane_of(self, rec: Record) -> int:
        """A record's lane: explicit, else by key, else -1 (the sticky lane)."""
        return rec.lane if rec.lane >= 0 else -1 if rec.key is None else lane_for_key(rec.key, len(self._lanes))

    def _record(
        self,
        value: Any,
        key: Any,
        headers: Iterable[tuple[str, bytes]] | None,
        lane: int | None,
        timestamp_ms: int | None,
        topic: str | None,
        message_id: str | None,
        position: int | None,
        count: int,
    ) -> Record | bytes:
        """The record ``publish`` was given, serialized and checked (``RecordInput.checked``)."""
        if self._grid is None:
            raise PublisherClosedError(
                f"the AsyncPublisher of stream {self.stream!r} is not started: use `async with` or `await start()`"
            )
        if self._closed:
            raise PublisherClosedError(f"the publisher of stream {self.stream!r} is closed; create a new one")
        return self._input.checked(value, key, headers, lane, timestamp_ms, topic, message_id, position, count)

    async def _admit(self, n: int) -> None:
        """Wait until ``n`` more records fit under ``max_buffered_records`` (a bulk larger than the bound goes when
        nothing else is outstanding), at most ``max_block_ms``."""
        assert self._room is not None
        limit = self.settings.max_buffered_records
        fits = lambda: self._outstanding + n <= limit or self._outstanding == 0  # noqa: E731
        if not fits():
            async with self._room:
                try:
                    await asyncio.wait_for(self._room.wait_for(fits), self.settings.max_block_ms / 1000.0)
                except TimeoutError:
                    raise PublishTimeoutError(
                        f"stream {self.stream!r}: {self._outstanding} records are waiting to be stored (max_buffered_"
                        f"records={limit}) and no room freed up within max_block_ms={self.settings.max_block_ms:g}; "
                        f"the grid is slower than the publishing rate, or unreachable"
                    ) from None
        if self._closed:
            raise PublisherClosedError(f"the publisher of stream {self.stream!r} was closed while waiting")
        self._outstanding += n

    def _queue(self, records: list[Record | bytes], sink: Sink) -> None:
        """Append the records of one call to their lanes' queues as runs (explicit lane, else by key, else the
        sticky lane; plain values of ``publish_many`` in contiguous runs over the lanes) and make sure each lane
        touched has its sending task."""
        now = int(time.time() * 1000)
        lanes = self._lanes
        n = len(records)
        runs: dict[int, Run] = {}
        if all(type(rec) is bytes for rec in records):
            values = cast(list[bytes], records)
            for lane, lo, hi in self._spread(n, sum(map(len, values))):
                chunk = values[lo:hi]
                runs[lane] = Run(chunk, None, None, [now] * len(chunk), map(len, chunk), sink, lo)
        else:
            by_lane: dict[int, list[int]] = {}
            for index, rec in enumerate(records):
                lane = -1
                if type(rec) is not bytes:
                    assert isinstance(rec, Record)
                    lane = self._lane_of(rec)
                if lane < 0:
                    lane = self._spread(1)[0][0]
                by_lane.setdefault(lane, []).append(index)
            for lane, indices in by_lane.items():
                recs = [rec if isinstance(rec, Record) else Record(rec) for rec in (records[i] for i in indices)]
                runs[lane] = Run(
                    [r.value for r in recs],
                    [r.key for r in recs],
                    [r.headers for r in recs],
                    [now if r.timestamp_ms is None else r.timestamp_ms for r in recs],
                    map(record_bytes, recs),
                    sink,
                    indices=indices,
                )
        for lane, run in runs.items():
            state = lanes[lane]
            state.append_run(run)
            self._keep_sending(state)

    def _keep_sending(self, state: Lane) -> None:
        """Make sure the lane ``state`` has its sending task."""
        if state.task is None or state.task.done():
            lane = state.number
            state.task = self._loop.create_task(self._drain(lane), name=f"meteor-aio-publisher-{self.stream}-{lane}")

    def _spread(self, n: int, nbytes: int = 0) -> list[tuple[int, int, int]]:
        """Contiguous runs ``(lane, start, stop)`` of ``n`` keyless records (``nbytes`` in all; 0: unknown) in sticky
        runs of a whole call each, as the threaded publisher's (``sticky.sticky_runs``)."""
        settings = self.settings
        run = sticky_run(n, nbytes, settings.max_items_per_call * settings.max_batch_records, settings.max_call_bytes)
        runs, self._sticky, self._sticky_fill = sticky_runs(n, len(self._lanes), run, self._sticky, self._sticky_fill)
        return runs

    # ------------------------------------------------------------------------------------------------ sending

    async def _drain(self, lane: int) -> None:
        """Send the lane's queue, one ``add_all`` at a time, until it is empty (then the lane has no task)."""
        state = self._lanes[lane]
        try:
            await self._send_queue(lane, state)
        finally:
            if state.task is asyncio.current_task():
                state.task = None

    async def _send_queue(self, lane: int, state: Lane) -> None:
        settings = self.settings
        while state.queue:
            if settings.linger_ms > 0 and state.queued < settings.max_batch_records:
                await asyncio.sleep(settings.linger_ms / 1000.0)
            taken = cut_call(state.queue, settings)
            state.after_cut()
            records = sum(hi - lo for item in taken for _, lo, hi in item)
            state.queued -= records
            try:
                items, first_seq = self._encode(lane, taken)
                last = await self._store(lane, items, first_seq, records)
            except (MeteorError, OSError) as exc:
                fail_pieces(taken, exc)
                self.failed_records += records
                await self._completed(records)
                continue
            except asyncio.CancelledError:  # close gave up waiting: these records' calls never answered
                fail_pieces(taken, PublishTimeoutError(f"stream {self.stream!r}: closed while a call was in flight"))
                raise
            first = last - len(items) + 1
            self.calls += 1
            self.items_sent += len(items)
            settle_pieces(taken, first)
            self.records_sent += records
            await self._completed(records)

    def _encode(self, lane: int, taken: list[list[Piece]]) -> tuple[list[bytes], int]:
        """The ring items of one call, with this publisher's id and the next producer sequences."""
        first_seq = self._producer_seq
        self._producer_seq += len(taken)
        settings, state = self.settings, self._lanes[lane]
        framing = ItemFraming(
            self.producer_id,
            first_seq,
            settings.compression,
            settings.compression_threshold,
            self._transactional,
            state.lane_max,
        )
        return encode_call(self.stream, state, taken, framing), first_seq

    async def _store(self, lane: int, items: list[bytes], first_seq: int, n_records: int) -> int:
        """``add_all`` the call's items; returns the last one's sequence. Idempotent: an attempt whose answer was
        lost is searched for in the lane before it is sent again (module docs)."""
        state = self._lanes[lane]
        call = Attempts(lane, n_records, len(items))
        deadline = time.monotonic() + self.settings.delivery_timeout_ms / 1000.0
        start = state.next_start
        while True:
            call.attempts += 1
            try:
                last = await state.ring.add_all(items)
                state.next_start = last + 1
                return last
            except GridError as exc:
                if not (self.settings.idempotent and outcome_unknown(exc)):
                    raise
                call.sent = True
                self.unknown_outcomes += 1
                error: BaseException = exc
            found, start = await recover_call(
                self.stream, self._lanes[lane].ring, call, start, self.producer_id, first_seq, deadline, error
            )
            if found is not None:
                self.recovered_calls += 1
                state.next_start = found + len(items)
                return found + len(items) - 1
            self.resent_calls += 1
            logger.info(
                "stream %r lane %d: a publish whose answer was lost was not stored; sending it again (attempt %d)",
                self.stream,
                lane,
                call.attempts + 1,
            )

    async def _completed(self, n: int) -> None:
        assert self._room is not None
        async with self._room:
            self._outstanding -= n
            self._room.notify_all()

    # ------------------------------------------------------------------------------------------------ figures

    def metrics(self) -> dict[str, int]:
        """The threaded ``Publisher.metrics()`` counters."""
        return {
            "records_sent": self.records_sent,
            "items_sent": self.items_sent,
            "calls": self.calls,
            "failed_records": self.failed_records,
            "outstanding": self._outstanding,
            "unknown_outcomes": self.unknown_outcomes,
            "recovered_calls": self.recovered_calls,
            "resent_calls": self.resent_calls,
            "duplicates_refused": 0 if self._dedup is None else self._dedup.refused,
            "dedup_takeovers": 0 if self._dedup is None else self._dedup.taken_over,
            "dedup_lease_lost": 0 if self._dedup is None else self._dedup.lease_lost,
            "dropped_records": 0 if self._gate is None else self._gate.dropped,
        }

    def __repr__(self) -> str:
        return f"AsyncPublisher(stream={self.stream!r}, producer_id={self.producer_id:x})"
