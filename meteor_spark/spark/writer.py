"""Writers of ``format("meteor")``: ``df.write`` and ``df.writeStream`` publish rows as records.

Input columns (Kafka's sink, with ``topic`` -> ``stream`` and ``partition`` -> ``lane``):

==========  ====================================================  ==========================================
column      type                                                  meaning
==========  ====================================================  ==========================================
value       binary or string; a struct for a typed stream (required)  the record value (strings as UTF-8)
key         binary or string                                      the record key; picks the lane by CRC-32
headers     array<struct<key: string, value: binary or string>>   record headers (or map<string, binary or
                                                                  string>, the source's headersAsMap shape)
timestamp   timestamp                                             record timestamp (default: publish time)
lane        int                                                   explicit lane (else by key, else any)
stream      string                                                target stream (the ``stream`` option wins)
topic       string                                                the record's topic (null: none)
message_id  string                                                the record's message id (null: none)
offset      bigint                                                ignored (a meteor source's column)
==========  ====================================================  ==========================================

Anything else fails at query start, naming the column and listing these (``sink_columns``).

Guarantees. Each Spark task publishes its rows through one core ``Publisher`` per target stream and flushes before
it reports success; its commit message carries, per target stream, the records and ring items written (counted
after the grid acknowledged them). For
``writeStream``, the micro-batch id of every committed batch is recorded in the grid map ``meteor.sink.commits``
under ``<sinkId>/<query id>`` (``sinkId`` defaults to the checkpoint location; Spark's query id survives restarts
from the same checkpoint and changes when the checkpoint is deleted), and a task of a batch id already recorded
publishes nothing. So:

* a batch Spark replays **after** it was committed (the driver died between the sink commit and Spark's commit
  log) is not published twice;
* with ``transactional=false``, a batch that failed part-way (some tasks published, then a failure) is published
  again when Spark retries it: **at least once** for that batch, never lost.

Transactions (``transactional=true``, the default; ``meteor_spark.grid.transactions``): a micro-batch run by one query
run is one transaction, key ``<sinkId>/<query id>/<batch id>/<run id>`` (the run id is Spark's job group,
``spark.jobGroup.id``); a ``df.write`` job is one transaction keyed by an id the writer draws when the job is
planned. Each task attempt publishes through producers of its own (a fresh ``Publisher`` producer id per target
stream), registered under the transaction before their first record, with every ring item flagged transactional.
A streaming task first takes the batch over for its run (``transactions.take_batch``: a previous run's open
transaction of the same batch is aborted at once; a batch another run already committed is not published
again). The sink's ``commit`` decides the transaction with one CAS, listing the producers of the successful
attempts (their commit messages): rows of failed or superseded attempts are aborted by that write. ``abort``
aborts it. ``read_committed`` readers deliver each row exactly once; ``read_uncommitted`` readers see the rows of
failed attempts too. If the transaction timed out first (``transactionTimeoutMs``), the commit raises and the
query fails; a restart replays the batch under a new transaction.

Message ids on a stream with a deduplication window (``meteor_spark.producer.dedup``): a row whose ``message_id``
was already published on the stream within the window (by anyone, or by another row of the same batch) is
**skipped and counted** (``StreamWrite.duplicates``, logged with the commit), not a failure. A replayed batch comes
back with the same rows, so a failing duplicate would fail the query again at every restart; and an id that is
there already is what the sink was asked to make true. Batch replays themselves are handled before any claim
(committed batch ids, transactions). The claims of a transactional task name its transaction and partition: a
retried attempt of the same task takes its earlier attempt's claims over (that attempt's rows are aborted), a
claim of an aborted transaction is taken over, and one of a transaction still open is waited for.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from meteor_spark.errors import ConfigError, MeteorError
from meteor_spark.grid import transactions
from meteor_spark.grid.streams import StreamConfig, open_stream
from meteor_spark.producer.batching import DEFAULT_MAX_CALL_BYTES
from meteor_spark.producer.publisher import LaneWritten, Publisher
from meteor_spark.spark import group_handoff
from meteor_spark.spark.clients import grid_for
from meteor_spark.spark.options import SinkOptions
from meteor_spark.spark.sink_columns import validate_input_schema
from meteor_spark.spark.typed_columns import cached_encoder, encode_values

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow

    from meteor_spark.grid.client import Grid
    from meteor_spark.producer.publisher import ArrowPublishFuture
logger = logging.getLogger(__name__)

#: Grid map of committed micro-batch ids: key ``<sinkId>/<query id>``, value JSON ``{"batch": N, ...}``.
SINK_COMMITS_MAP = "meteor.sink.commits"
#: ``max_call_bytes`` of the sink's publishers: record bytes per ``add_all`` call, before compression (4 MiB; a
#: publisher's default is 1 MiB). A task hands over Arrow batches Spark already holds and waits for them all when it
#: flushes, so how soon a call's first records are stored is worth nothing here, while every call costs the task
#: worker the same again whatever its size (the request, the answer on the grid client's thread, settling and
#: completing its pieces). Ring items stay those a default publisher cuts (``max_batch_bytes`` is held to what the
#: 1 MiB call allows it), and memory stays bounded by ``max_buffered_records``.
#: Kafka's ``max.request.size`` (1 MB) bounds a request's compressed bytes: 4 MiB of 100-byte values that LZ4
#: shrinks 12:1 (``meteor bench spark``'s) is about 350 KB on the wire.
SINK_MAX_CALL_BYTES = 4 << 20


@dataclass(frozen=True)
class StreamWrite:
    """What one task wrote to one stream.

    Attributes:
        stream: stream name.
        records: records stored in the stream (counted by the publisher after the grid acknowledged them).
        items: ring items they took.
        lanes: per lane (sorted), records stored and their first/last offsets (records of other writers of the
            lane may lie in between).
        duplicates: rows skipped because their message id was already published within the stream's
            deduplication window.
    """

    stream: str
    records: int
    items: int
    lanes: tuple[LaneWritten, ...] = ()
    duplicates: int = 0


@dataclass(frozen=True)
class MeteorCommitMessage(WriterCommitMessage):
    """What one task did, sent back to the committer.

    Attributes:
        batch_id: the micro-batch id (None for ``df.write``).
        query_id: Spark's query id (None for ``df.write``).
        rows: rows the task received.
        skipped: True when the batch id was already committed and nothing was published (a replay).
        streams: per target stream, records and ring items written, and per lane records and first/last offsets.
        transaction: the transaction the task published under (``transactional``), else None.
        producers: the producer ids the task published with (one per target stream).
        run: the query run's id (Spark's job group), which keys the group lanes the batch read (``group_handoff``).
    """

    batch_id: int | None
    query_id: str | None
    rows: int
    skipped: bool = False
    streams: tuple[StreamWrite, ...] = field(default_factory=tuple)
    transaction: str | None = None
    producers: tuple[int, ...] = ()
    run: str | None = None


def _local_property(name: str) -> str | None:
    from pyspark import TaskContext

    context = TaskContext.get()
    return None if context is None else context.getLocalProperty(name)


class _PublishesRows:
    """``write()`` shared by the batch and streaming writers: publishes Arrow batches through the core Publisher."""

    options: SinkOptions
    schema: StructType

    def _open_publisher(self, grid: Any, stream: str, transaction: str | None) -> Any:
        """A publisher to ``stream`` (created with the default configuration when missing and ``createStream``); in
        a transaction, registered with it before its first record is stored, so readers find its transaction."""
        try:
            info = open_stream(grid, stream)
        except LookupError:
            if not self.options.create_stream:
                raise
            info = open_stream(grid, StreamConfig(stream))
        owner = None
        if transaction is not None:
            from pyspark import TaskContext

            context = TaskContext.get()
            owner = f"{transaction}#{context.partitionId() if context is not None else 0}"
        publisher = Publisher(
            grid,
            info,  # opened once: the publisher does not open it again
            transactional=transaction is not None,
            dedup_owner=owner,
            max_call_bytes=SINK_MAX_CALL_BYTES,
            # the items a default publisher cuts
            max_batch_bytes=min(info.config.max_batch_bytes, DEFAULT_MAX_CALL_BYTES),
        )
        if transaction is not None:
            try:
                transactions.begin(
                    grid, transaction, publisher.producer_id, self.options.transaction_timeout_ms, stream=stream
                )
            except BaseException:
                publisher.close()
                raise
        return publisher

    def _publish(
        self,
        batches: Iterator[pyarrow.RecordBatch],
        batch_id: int | None,
        query_id: str | None,
        transaction: str | None = None,
    ) -> MeteorCommitMessage:
        grid = grid_for(self.options.grid)
        publishers: dict[str, Any] = {}
        rows = 0
        stored: dict[str, list[ArrowPublishFuture]] = {}  # stream -> futures of publish_arrow
        encoders: dict[str, Any] = {}  # stream -> the encoder of a struct value column (typed_columns)

        def publisher_for(stream: str) -> Any:
            if stream not in publishers:
                publishers[stream] = self._open_publisher(grid, stream, transaction)
            return publishers[stream]

        try:
            for batch in batches:
                if batch.num_rows == 0:
                    continue
                rows += batch.num_rows
                batch = _prepare(batch)
                groups = _by_stream(batch, self.options.stream)
                for stream, part in groups:
                    if "stream" in part.schema.names:
                        part = part.drop_columns(["stream"])
                    publisher = publisher_for(stream)
                    encoder = cached_encoder(encoders, grid, stream)
                    part = encode_values(part, stream, publisher.info.config.value_format, encoder)
                    stored.setdefault(stream, []).append(publisher.publish_arrow(part, duplicates="skip"))
            for publisher in publishers.values():
                publisher.flush()
            # A failed write raises here, so the task fails and Spark does not commit the batch.
            writes = tuple(
                StreamWrite(
                    stream,
                    sum(f.result() for f in futures),
                    publishers[stream].items_sent,
                    _merge_lanes(futures),
                    sum(f.duplicates_skipped for f in futures),
                )
                for stream, futures in sorted(stored.items())
            )
        finally:
            for publisher in publishers.values():
                publisher.close()
        producers = tuple(publishers[stream].producer_id for stream in sorted(publishers))
        return MeteorCommitMessage(
            batch_id, query_id, rows, False, writes, transaction if producers else None, producers
        )


def _by_stream(batch: pyarrow.RecordBatch, default_stream: str | None) -> list[tuple[str, Any]]:
    """The rows of ``batch`` per target stream: all to option ``stream`` when set, else by the ``stream`` column
    (a null there is a ``ConfigError``: the row has nowhere to go)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if default_stream is not None:
        return [(default_stream, batch)]
    streams = batch.column("stream")
    if streams.null_count:
        raise ConfigError(
            "a row to write has a null 'stream' and option 'stream' is not set; fill the column or set the option"
        )
    return [(name, batch.filter(pc.equal(streams, pa.scalar(name)))) for name in pc.unique(streams).to_pylist()]


def _merge_lanes(futures: Sequence[ArrowPublishFuture]) -> tuple[LaneWritten, ...]:
    """One entry per lane over all the publishes of a task (a few per Arrow batch, never per record)."""
    return _merged(written for future in futures for written in future.lanes_written())


def _merged(entries: Iterable[LaneWritten]) -> tuple[LaneWritten, ...]:
    by_lane: dict[int, LaneWritten] = {}
    for entry in entries:
        seen = by_lane.get(entry.lane)
        by_lane[entry.lane] = (
            entry
            if seen is None
            else LaneWritten(
                entry.lane,
                seen.records + entry.records,
                min(seen.first_offset, entry.first_offset),
                max(seen.last_offset, entry.last_offset),
            )
        )
    return tuple(by_lane[lane] for lane in sorted(by_lane))


def _prepare(batch: pyarrow.RecordBatch) -> pyarrow.RecordBatch:
    """Drop what is not published (a meteor source's ``offset``) and make timestamps timezone-aware."""
    import pyarrow as pa

    if "offset" in batch.schema.names:
        batch = batch.drop_columns(["offset"])
    if "timestamp" in batch.schema.names:
        column = batch.column("timestamp")
        if pa.types.is_timestamp(column.type) and column.type.tz is None:
            # TIMESTAMP_NTZ: Spark's wall-clock time, taken as UTC.
            index = batch.schema.get_field_index("timestamp")
            batch = batch.set_column(index, "timestamp", column.cast(pa.timestamp("us", tz="UTC")))
    return batch


class MeteorBatchWriter(_PublishesRows, DataSourceArrowWriter):
    """``df.write.format("meteor")``: every task publishes its rows; at least once if the job is retried."""

    def __init__(self, options: SinkOptions, schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise ConfigError(
                "mode('overwrite') is not supported by format('meteor'): a stream is an append-only log. Use "
                "mode('append')"
            )
        validate_input_schema(schema, options)
        self.options = options
        self.schema = schema
        # Drawn where the job is planned and pickled into every task and the committer: one transaction per job.
        self.transaction = f"write/{uuid.uuid4()}" if options.transactional else None

    def write(self, iterator: Iterator[pyarrow.RecordBatch]) -> MeteorCommitMessage:
        return self._publish(iterator, None, None, self.transaction)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        done = _ours(messages)
        _decide(grid_for(self.options.grid), done, self.options.sweep_interval_ms / 1000)
        logger.info("wrote %d rows to meteor (%s)", sum(m.rows for m in done), _summary(done))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        done = _ours(messages)
        if self.transaction is not None:
            transactions.abort(grid_for(self.options.grid), self.transaction, "Spark aborted the write job")
            logger.warning(
                "the write job failed; its transaction %r is aborted: read_committed readers see none of its rows",
                self.transaction,
            )
            return
        logger.warning(
            "the write job failed; %d rows of %d successful tasks were already published (ring items cannot be "
            "taken back)",
            sum(m.rows for m in done),
            len(done),
        )


class MeteorStreamWriter(_PublishesRows, DataSourceStreamArrowWriter):
    """``df.writeStream.format("meteor")``: publishes each micro-batch; a committed batch is never republished."""

    def __init__(self, options: SinkOptions, schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise ConfigError(
                "outputMode('complete') is not supported by format('meteor'): a stream is an append-only log. Use "
                "outputMode('append')"
            )
        validate_input_schema(schema, options)
        if options.sink_id is None:
            raise ConfigError("writeStream to meteor needs option 'checkpointLocation' (or 'sinkId')")
        self.options = options
        self.schema = schema
        # The run id when Spark's job group is not set (it always is for a streaming query's batches).
        self._writer_id = str(uuid.uuid4())

    def write(self, iterator: Iterator[pyarrow.RecordBatch]) -> MeteorCommitMessage:
        batch_text = _local_property("streaming.sql.batchId")
        query_id = _local_property("sql.streaming.queryId")
        batch_id = None if batch_text is None else int(batch_text)
        if batch_id is not None:
            committed = _committed_batch(grid_for(self.options.grid), self._key(query_id))
            if committed is not None and batch_id <= committed:
                rows = sum(b.num_rows for b in iterator)
                logger.info(
                    "micro-batch %d of sink %r was already committed (last committed %d): not publishing its %d "
                    "rows again",
                    batch_id,
                    self.options.sink_id,
                    committed,
                    rows,
                )
                return MeteorCommitMessage(batch_id, query_id, rows, skipped=True)
        transaction, run = None, _local_property("spark.jobGroup.id")
        if self.options.transactional and batch_id is not None:
            run_id = run or self._writer_id
            batch_key = f"{self._key(query_id)}/{batch_id}"
            transaction = f"{batch_key}/{run_id}"
            try:
                transactions.take_batch(grid_for(self.options.grid), batch_key, transaction)
            except transactions.BatchCommittedError as exc:
                rows = sum(b.num_rows for b in iterator)
                logger.info("%s: not publishing its %d rows again", exc, rows)
                return MeteorCommitMessage(batch_id, query_id, rows, skipped=True)
        return replace(self._publish(iterator, batch_id, query_id, transaction), run=run)

    def _key(self, query_id: str | None) -> str:
        return f"{self.options.sink_id}/{query_id or 'unknown-query'}"

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        done = _ours(messages)
        query_ids = {m.query_id for m in done if m.query_id is not None}
        if not done:
            return  # no task ran: nothing was published, nothing to remember
        if len(query_ids) > 1:
            raise ConfigError(f"tasks of micro-batch {batchId} report different query ids {sorted(query_ids)}")
        query_id, run = next(iter(query_ids), None), next((m.run for m in done if m.run is not None), None)
        grid = grid_for(self.options.grid)
        published = any(m.transaction for m in done)
        lanes = group_handoff.lanes_for(grid, self.options.group_offsets, query_id, run, batchId, published)
        _decide(grid, done, self.options.sweep_interval_ms / 1000, lanes, batchId)
        _record_commit(grid, self._key(query_id), batchId, done)
        group_handoff.forget(grid, query_id, run, batchId)
        if all(m.skipped for m in done):
            logger.info("micro-batch %d replayed after its commit: nothing republished", batchId)
        else:
            logger.info("micro-batch %d: wrote %d rows (%s)", batchId, sum(m.rows for m in done), _summary(done))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        done = [m for m in _ours(messages) if not m.skipped]
        keys = sorted({m.transaction for m in done if m.transaction is not None})
        for key in keys:
            transactions.abort(grid_for(self.options.grid), key, f"Spark aborted micro-batch {batchId}")
        if self.options.transactional:
            logger.warning(
                "micro-batch %d failed; its transaction %s is aborted (read_committed readers see none of its rows; "
                "without a successful task, it stays open until transactionTimeoutMs or the query's restart)",
                batchId,
                ", ".join(map(repr, keys)) or "(no task published)",
            )
            return
        logger.warning(
            "micro-batch %d failed; %d rows of %d successful tasks were already published and will be published "
            "again when Spark retries the batch (at least once)",
            batchId,
            sum(m.rows for m in done),
            len(done),
        )


def _decide(
    grid: Grid, messages: Sequence[MeteorCommitMessage], sweep_s: float, lanes: Sequence[Any] = (), batch: int = -1
) -> None:
    """Commit the transaction of a job or micro-batch with the producers of its successful task attempts (one
    CAS), with the group offsets ``lanes`` the micro-batch read (``group_handoff.commit``); every other attempt's
    records are aborted by that write. A no-op when nothing was published transactionally.

    Raises:
        TransactionAbortedError: the transaction was aborted first (timed out, or fenced by a newer run).
        FencedError: a group lane of ``lanes`` was taken over since the batch was planned (the transaction aborted).
    """
    keys = {m.transaction for m in messages if m.transaction is not None}
    if len(keys) > 1:
        raise MeteorError(f"tasks of one batch report different transactions {sorted(keys)}")
    for key in keys:
        producers = [p for m in messages if m.transaction == key for p in m.producers]
        group_handoff.commit(grid, key, producers, lanes, batch, sweep_s)


def _committed_batch(grid: Grid, key: str) -> int | None:
    text = grid.map(SINK_COMMITS_MAP).get(key)
    if text is None:
        return None
    return int(json.loads(text)["batch"])


def _record_commit(grid: Grid, key: str, batch_id: int, messages: Sequence[MeteorCommitMessage]) -> None:
    """Store ``batch_id`` as the sink's last committed batch, never moving it backwards (CAS loop)."""
    commits = grid.map(SINK_COMMITS_MAP)
    value = json.dumps(
        {"batch": batch_id, "rows": sum(m.rows for m in messages), "updated_ms": int(time.time() * 1000)},
        sort_keys=True,
        separators=(",", ":"),
    )
    for _ in range(100):
        current = commits.get(key)
        if current is None:
            if commits.put_if_absent(key, value) is None:
                return
            continue
        if int(json.loads(current)["batch"]) >= batch_id:
            return
        if commits.replace_if_same(key, current, value):
            return
    raise MeteorError(
        f"could not record the commit of micro-batch {batch_id} under {key!r}: too many concurrent "
        f"writers of that sink id; give each query its own sinkId"
    )


def lanes_written(messages: Sequence[MeteorCommitMessage]) -> dict[tuple[str, int], LaneWritten]:
    """Per (stream, lane), what the tasks of a job or micro-batch wrote: records and first/last offsets."""
    per_stream: dict[str, list[LaneWritten]] = {}
    for message in messages:
        for write in message.streams:
            per_stream.setdefault(write.stream, []).extend(write.lanes)
    return {(stream, w.lane): w for stream, entries in sorted(per_stream.items()) for w in _merged(entries)}


def _summary(messages: Sequence[MeteorCommitMessage]) -> str:
    per_stream: dict[str, list[int]] = {}
    for message in messages:
        for write in message.streams:
            entry = per_stream.setdefault(write.stream, [0, 0, 0])
            entry[0] += write.records
            entry[1] += write.items
            entry[2] += write.duplicates
    lanes: dict[str, list[str]] = {}
    for (stream, lane), w in lanes_written(messages).items():
        lanes.setdefault(stream, []).append(
            f"lane {lane} {w.records} records at offsets {w.first_offset}..{w.last_offset}"
        )
    return (
        "; ".join(
            f"{s}: {n} records in {i} items"
            + (f" ({', '.join(lanes[s])})" if s in lanes else "")
            + (f", {d} duplicate message ids skipped" if d else "")
            for s, (n, i, d) in sorted(per_stream.items())
        )
        or "nothing published"
    )


def _ours(messages: list[WriterCommitMessage | None]) -> list[MeteorCommitMessage]:
    """The messages of the tasks that succeeded (Spark passes None for failed ones); every task ran ``_publish``."""
    done = [m for m in messages if m is not None]
    for message in done:
        if not isinstance(message, MeteorCommitMessage):
            raise TypeError(f"a meteor write task returned {type(message).__name__}, not MeteorCommitMessage")
    return done  # type: ignore[return-value]
