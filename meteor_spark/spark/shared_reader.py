"""The streaming reader of ``format("meteor")`` with ``shared=true``: a query as a member of a shared group.

A shared group (``meteor_spark.consumer.shared_groups``) hands records out by acquisition, not by lane range. Here
the source runner (driver side) is one member of the group, named ``groupMemberId`` or ``spark-<host>-<pid>-...``:

* ``latestOffset(start, limit)`` acquires up to ``maxRecordsPerTrigger`` records (or the trigger's ``ReadMaxRows``)
  with one ``poll`` under the group's acquisition timeout. Redelivered records come first, each with its delivery
  count; records past the group's ``max_deliveries`` are dead-lettered there by the core, never handed out. The
  acquired records are cut into *chunks* of about ``records / tasks`` contiguous records of one lane and one
  acquisition (``tasks`` = ``minPartitions``, else the driver's CPUs), so a batch spreads over more tasks than the
  stream has lanes. The end offset is the list of chunks, ``{"shared": {"stream": ..., "chunks": [[lane, first,
  end, deliveries, token, records], ...]}}``: Spark logs it in the checkpoint, so a batch it replays after a driver
  restart re-reads exactly the same records (``partitions`` depends on the offset only). No record acquired: the
  end is ``start`` itself, and Spark runs no batch.
* Acknowledgement (the acquisitions of a batch become DONE in the group's state): in ``latestOffset(start, ...)``,
  since Spark asks for the next end only once the batch ending at ``start`` is in its commit log, and again in
  ``commit(end)`` (which lags a batch and is never called for the last batch of a run). Both are idempotent: an
  acquisition already settled is refused by the state and counted in ``refused_acks``.
* A batch that never commits (a failed or killed query) is not released: its records stay acquired until the
  group's acquisition timeout, then any member (this query's next run among them) acquires them again with
  ``delivery_count + 1``. Releasing them on stop would be unsafe: a batch whose sink committed just before the
  stop would be delivered twice. A restart from the same checkpoint replays the uncommitted batch with its logged
  acquisitions and acknowledges them, when it commits within the timeout.
* Executors (``read``) read each chunk's ring items (``executor.LaneRange`` with record offset bounds) and add the
  chunk's delivery count as the ``delivery_count`` column (int).

Guarantee: at-least-once per acquisition, like every shared member: a batch that takes longer than the group's
acquisition timeout may see its records acquired by another member meanwhile (their acknowledgement is refused and
counted). Within one query, a retried task re-reads the same chunk, so task retries neither lose nor duplicate.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows

from meteor_spark.errors import ConfigError, FormatError
from meteor_spark.format.offsets import sequence_of
from meteor_spark.groups.balancing import default_member_id
from meteor_spark.groups.shared_state import DONE
from meteor_spark.spark.clients import grid_for
from meteor_spark.spark.executor import LaneRange, read_lane_ranges
from meteor_spark.spark.planning import default_partitions
from meteor_spark.spark.stop_hooks import install_stop_hooks, stopping
from meteor_spark.spark.typed_columns import value_version_of

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow
    from pyspark.sql.types import StructType

    from meteor_spark.consumer.shared_subscriber import SharedSubscriber
    from meteor_spark.spark.options import SourceOptions

logger = logging.getLogger(__name__)

__all__ = ["Chunk", "MeteorSharedStreamReader", "SharedTask", "cut_chunks", "parse_chunks"]

#: Acquisitions this source runner remembers as acknowledged (so ``commit`` after ``latestOffset`` is free).
MAX_REMEMBERED_ACKS = 1024


@dataclass(frozen=True)
class Chunk:
    """Records ``[first, end)`` of ``lane`` acquired under ``token``, delivered ``deliveries`` times."""

    lane: int
    first: int
    end: int
    deliveries: int
    token: str
    records: int

    def encode(self) -> list[Any]:
        return [self.lane, self.first, self.end, self.deliveries, self.token, self.records]


def parse_chunks(offset: dict | None, stream: str) -> list[Chunk]:
    """The chunks of a shared end offset (``FormatError`` for an offset of another kind or another stream)."""
    if not offset:
        return []
    shared = offset.get("shared") if isinstance(offset, dict) else None
    if not isinstance(shared, dict) or shared.get("stream") != stream:
        raise FormatError(
            f"checkpoint offset {json.dumps(offset)[:200]} is not a shared-group offset of stream {stream!r}: the "
            "checkpoint belongs to another query (an exclusive read, or another stream); use a new checkpoint "
            "location for shared=true"
        )
    try:
        return [Chunk(int(c[0]), int(c[1]), int(c[2]), int(c[3]), str(c[4]), int(c[5])) for c in shared["chunks"]]
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise FormatError(f"malformed shared-group offset {json.dumps(offset)[:200]}: {exc}") from None


def cut_chunks(spans: Sequence[tuple[int, int, int, int, str]], tasks: int) -> list[Chunk]:
    """Cut acquired records (``(lane, offset, end, deliveries, token)`` each) into chunks of at most
    ``ceil(records / tasks)`` contiguous records of one lane, acquisition and delivery count."""
    if not spans:
        return []
    size = max(1, math.ceil(len(spans) / max(1, tasks)))
    chunks: list[Chunk] = []
    for lane, offset, end, deliveries, token in sorted(spans):
        last = chunks[-1] if chunks else None
        if (
            last is not None
            and (last.lane, last.end, last.deliveries, last.token) == (lane, offset, deliveries, token)
            and last.records < size
        ):
            chunks[-1] = Chunk(lane, last.first, end, deliveries, token, last.records + 1)
        else:
            chunks.append(Chunk(lane, offset, end, deliveries, token, 1))
    return chunks


def _offset(stream: str, chunks: Sequence[Chunk]) -> dict[str, Any]:
    return {"shared": {"chunks": [c.encode() for c in chunks], "stream": stream}}


@dataclass(frozen=True)
class SharedTask(InputPartition):
    """One Spark task of a shared-group batch: chunks as lane ranges, and each chunk's delivery count."""

    ranges: tuple[LaneRange, ...]
    deliveries: tuple[int, ...]


def read_shared(task: SharedTask) -> Iterator[pyarrow.RecordBatch]:
    """The rows of ``task``'s chunks with the ``delivery_count`` column (int32) last."""
    import pyarrow as pa

    field = pa.field("delivery_count", pa.int32(), True)
    for lane_range, deliveries in zip(task.ranges, task.deliveries, strict=True):
        for batch in read_lane_ranges((lane_range,)):
            yield batch.append_column(field, pa.array([deliveries] * batch.num_rows, pa.int32()))


class MeteorSharedStreamReader(DataSourceStreamReader):
    """``spark.readStream.format("meteor").option("group", g).option("shared", "true")`` (see the module docs)."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        self.stream = options.streams[0]
        self._member: SharedSubscriber | None = None
        self._acked: dict[str, None] = {}
        self.refused_acks = 0

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_member"] = None  # the member lives in the source runner only
        return state

    # -- driver side (source runner) ---------------------------------------------------------------------------

    def _driver(self) -> SharedSubscriber:
        if self._member is None:
            from meteor_spark.consumer.shared_subscriber import SharedSubscriber
            from meteor_spark.grid.streams import open_stream

            grid = grid_for(self.options.grid)
            info = open_stream(grid, self.stream, create=False)
            if info.config.ephemeral:
                raise ConfigError(
                    f"shared=true with stream {self.stream!r}: the stream is ephemeral (at-most-once), so records "
                    "cannot be acknowledged; read a persistent stream, or drop shared/group"
                )
            corrupt = self.options.corrupt
            self._member = SharedSubscriber(
                grid,
                self.stream,
                group=self.options.group,
                member_id=self.options.group_member_id or f"spark-{default_member_id()}",
                max_poll_records=self.options.max_records_per_trigger,
                acquisition_timeout_ms=self.options.acquisition_timeout_ms,
                max_deliveries=self.options.max_deliveries,
                dead_letter_stream=corrupt.dead_letter_stream,
                on_corrupt=corrupt.mode,
                value_deserializer="bytes",  # the executors decode a typed stream's values (typed_columns)
            )
            install_stop_hooks(self)
            logger.info(
                "query reads stream %r as member %r of shared group %r (acquisition timeout %d ms)",
                self.stream,
                self._member.member_id,
                self.options.group,
                self._member.acquisition_timeout_ms,
            )
        return self._member

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.options.max_records_per_trigger)

    def initialOffset(self) -> dict[str, Any]:
        self._driver()
        return _offset(self.stream, [])

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict[str, Any]:
        member = self._driver()
        self._acknowledge(start)  # Spark asks for a new end only once the batch ending at start is committed
        most = self.options.max_records_per_trigger
        if isinstance(limit, ReadMaxRows):
            most = min(most, max(1, limit.max_rows))
        member.max_poll_records = most
        batch = member.poll(0)
        if not len(batch):
            return start
        chunks = cut_chunks(member.hand_over(batch), self._tasks())
        logger.info(
            "shared group %r: acquired %d record(s) in %d chunk(s)", self.options.group, len(batch), len(chunks)
        )
        return _offset(self.stream, chunks)

    def _tasks(self) -> int:
        return self.options.min_partitions or default_partitions()

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        chunks = parse_chunks(end, self.stream)
        info = self._driver().info
        total = sum(c.records for c in chunks)
        target = max(1, math.ceil(total / max(1, self._tasks())))
        tasks: list[SharedTask] = []
        ranges: list[LaneRange] = []
        deliveries: list[int] = []
        count = 0
        for chunk in chunks:
            ranges.append(self._lane_range(info, chunk))
            deliveries.append(chunk.deliveries)
            count += chunk.records
            if count >= target:
                tasks.append(SharedTask(tuple(ranges), tuple(deliveries)))
                ranges, deliveries, count = [], [], 0
        if ranges:
            tasks.append(SharedTask(tuple(ranges), tuple(deliveries)))
        return tasks

    def _lane_range(self, info: Any, chunk: Chunk) -> LaneRange:
        o = self.options
        return LaneRange(
            self.stream,
            chunk.lane,
            sequence_of(chunk.first),
            sequence_of(chunk.end - 1) + 1,
            o.grid,
            info,
            o.include_headers,
            True,
            chunk.first,
            o.corrupt,
            o.headers_as_map,
            stop_offset=chunk.end,
            value_version=value_version_of(self.schema),
        )

    def commit(self, end: dict) -> None:
        self._acknowledge(end)

    def _acknowledge(self, offset: dict | None) -> None:
        """Mark the acquisitions of the batch ending at ``offset`` done (each once per source runner)."""
        chunks = [c for c in parse_chunks(offset, self.stream) if c.token not in self._acked]
        if not chunks:
            return
        member = self._driver()
        by_lane: dict[int, list[tuple[int, int, str]]] = {}
        for chunk in chunks:
            by_lane.setdefault(chunk.lane, []).append((chunk.first, chunk.end, chunk.token))
        for lane, spans in sorted(by_lane.items()):
            refused = member.settle_spans(lane, spans, DONE)
            if refused:
                self.refused_acks += len(refused)
                logger.info(
                    "shared group %r lane %d: acknowledging %d range(s) refused (%s): acknowledged already, or "
                    "their acquisition timed out (%d ms) and another member took them",
                    self.options.group,
                    lane,
                    len(refused),
                    refused[:4],
                    member.acquisition_timeout_ms,
                )
        for chunk in chunks:
            self._acked[chunk.token] = None
        while len(self._acked) > MAX_REMEMBERED_ACKS:
            del self._acked[next(iter(self._acked))]

    def stop(self) -> None:
        stopping()  # a SIGTERM from here on would abort the release (``stop_hooks``)
        if self._member is not None:
            self._member.close()
            self._member = None

    # -- executors ---------------------------------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pyarrow.RecordBatch]:
        if isinstance(partition, SharedTask):
            return read_shared(partition)
        raise TypeError(f"not a meteor shared-group read task: {partition!r}")
