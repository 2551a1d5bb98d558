"""The streaming reader of ``format("meteor")``: admission control, AvailableNow, groups (the batch reader is
``batch_reader``).

What runs where (PySpark 4.3, see the module docstring of ``datasource``):

* ``MeteorStreamReader`` #1 lives in Spark's **source runner**, one long-lived Python process per query run on the
  driver. Only it talks to the grid on the driver side: lane bounds, the group's leases and confirmed offsets.
  Its grid connection and group members are created on first use (``_driver()``), never in ``__init__``, and are
  dropped when the reader is pickled.
* ``MeteorStreamReader`` #2 is pickled into the read UDF once per query run; its ``read(partition)`` runs in
  executor workers and depends only on the partition (replays read exactly the same ring items).

Offsets (``meteor_spark.spark.source_offset``): per lane, the next ring sequence; a batch reads ``[start, end)``.

The modules behind them: ``planning`` (which tasks a batch becomes, admission control), ``driver`` (the source
runner's lane bounds, group member and position checks), ``executor`` (the tasks and reading them into Arrow).

Groups. With option ``group`` the source runner holds the group's lane leases for the whole query
(``GroupMember(want="all")``, renewed by the member's background thread) and confirms offsets, fenced by the lease
epoch, **only for batches Spark has committed**:

1. in ``latestOffset(start, ...)``: Spark asks for the next batch's end only after the previous batch (which ended
   at ``start``) is in the commit log, so ``start`` is confirmed then. This is what makes confirmation timely:
   Spark's own ``commit(end)`` lags one batch, and an AvailableNow run never calls it for its last batch, but it
   does call ``latestOffset`` once more to learn there is nothing left, which confirms the last batch before the
   query stops;
2. in ``commit(end)``, which repeats it (and is what a restarted query calls first).

A new query also confirms its start (``initialOffset``) once it has resolved ``startingOffsets``, so a member
taking a lane over before the first commit resumes there. Confirming costs one compare-and-set per lane that
moves and nothing for one that does not (``driver``).

Confirmed offsets only move forward. A query that does not hold a lane (a standby: another query in the group
holds it) reads nothing from it; its checkpoint follows the group's confirmed offset for that lane with batches
that read no rows, so when it takes over (the holder stopped, or died and its lease expired) it starts where the
group stopped, without re-reading. Start position of a new query: the checkpoint, else the group's confirmed
offsets, else ``startingOffsets``.

Leases are released when the source runner ends: Spark terminates it with SIGTERM (``stop()`` is otherwise never
called in 4.3), so the first driver-side call installs a SIGTERM handler that raises ``SystemExit``; Spark's
runner then runs ``stop()`` from its ``finally``, once the main thread has unwound out of whatever the signal
interrupted, and ``atexit`` covers a normal exit (``stop_hooks``). A SIGKILLed driver cannot release anything: its
leases expire after ``groupLeaseMs``.

Positions are checked when a query starts (``initialOffset``; ``partitions`` for a batch read): a position past a
lane's end is an ``OffsetOutOfRangeError`` naming stream, lane, position and the valid range, a lane the stream does
not have is a ``ConfigError``, a missing stream a ``StreamNotFoundError``. A checkpointed position or a group's
confirmed offset past the lane's end (the stream was deleted and re-created, or the grid restarted without
persistence) is the same error, saying the checkpoint or group offset is stale. Nothing is ever skipped silently.

History: ``earliest`` means the oldest sequence the grid can serve (``reading.oldest_sequence``), below the ring's
head where the grid keeps history (a persistent embedded member, a RingbufferStore), and the loss check compares
positions with that sequence, not with the head.

Data loss (the ring overwrote items before this query read them) fails the query with ``DataLossError`` (stream,
lane, requested and oldest available sequence, how to fix) or, with ``failOnDataLoss=false``, is skipped **by the
driver when it plans a batch**: a lane whose position is below the oldest available sequence moves straight to it
(``maxOffsetsPerTrigger`` counts from there, so no batch is spent on a range known to be gone), the skip is logged
once, and the lost items are added to the lane's count carried in the batch's end offset (``SparkOffset.skipped``).
Spark checkpoints that offset and replays a batch with it, so every lost item is counted once per query, across
restarts; ``partitions`` starts the executors' ranges after the skipped items, so executors never count them again.
Items overwritten after a batch was planned (while it waits or is read, or before a replay) are skipped and logged
where they are found (``partitions``, or the task), outside that count.

Corrupt items (``onCorrupt`` / ``deadLetterStream``): handled by the task that meets them (``executor``).

Stream patterns (``streamPattern``, Kafka's ``subscribePattern``): ``latestOffset`` lists the matching streams
(one read of map ``meteor.streams``) before it reads the lane bounds, and again after, so a stream deleted while
its bounds were read is left out of the batch. A new stream's lanes enter the offsets at their oldest item (Kafka
reads new partitions from earliest) and, with ``group``, get a group member of their own. A deleted stream's
positions drop out of the next end offset with a WARNING; when the driver last saw the stream's lanes end past the
query's position, unread items were deleted with it: ``StreamDeletedError`` (a ``DataLossError``) unless
``failOnDataLoss=false``. (Kafka's source fails on every deleted partition, PARTITIONS_DELETED; here deleting a
stream the query has read to its end is a normal way to retire it.) Deletions the runner did not see (while the
query was stopped) are logged only: nothing tells how much was unread. With no matching stream the offsets stay
empty and no batch runs. An AvailableNow run reads the streams that existed when it started.

Byte admission (``maxBytesPerTrigger``, ``maxBytesPerLanePerTrigger``): the driver knows item counts, not sizes.
For every lane with a backlog it reads the item at the batch's start (one ``read_many`` of one item, which the task
reads again) and keeps a running average of those sizes per lane; ``planning.byte_limit`` turns the caps into item
counts with it. A lane always admits one item, so a batch may exceed a cap by up to one item per lane (and by the
estimate's error). ``maxOffsetsPerTrigger`` applies too; per lane, the tighter end wins. Trigger.Once reads
everything (Spark passes no limit), as with every other limit.

Positions by time (``startingTimestamp`` / ``startingOffsetsByTimestamp``, and for batch reads ``endingTimestamp``
/ ``endingOffsetsByTimestamp``): a lane starts at the ring item holding its first record at or after the time
(``timestamps.offset_for_timestamp``; lanes with a group offset start there instead). The records of that item
before the found record are not read: a batch read passes the record offset to the task (``LaneRange.first_offset``);
a streaming query's source runner remembers it (``DriverState.start_offsets``) for the batch that reads the item.
That memory is the runner's own: a runner restarted before that batch finished reads the item whole, so the
records before the time in that one item are delivered too (never fewer records). An end by time inside an item
stops the task before the end record (``LaneRange.stop_offset``).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Sequence
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from meteor_spark.errors import DataLossError, StreamDeletedError
from meteor_spark.format.offsets import index_of, sequence_of
from meteor_spark.grid.item_marks import ItemMark
from meteor_spark.spark.checkpoint_checks import check_checkpoint, restarted
from meteor_spark.spark.driver import DriverState, LaneView
from meteor_spark.spark.executor import LaneRange, LaneRanges, ReadsLaneRanges
from meteor_spark.spark.group_handoff import LaneHandoff
from meteor_spark.spark.lane_takeover import moved_back
from meteor_spark.spark.options import SourceOptions
from meteor_spark.spark.planning import Piece, by_stream, byte_limit, plan_for, rate_limit
from meteor_spark.spark.positions import check_lanes, check_time_lanes, resolve_position, start_by_time
from meteor_spark.spark.source_offset import SparkOffset
from meteor_spark.spark.stop_hooks import install_stop_hooks, stopping
from meteor_spark.spark.typed_columns import value_version_of

logger = logging.getLogger(__name__)


class MeteorStreamReader(ReadsLaneRanges, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("meteor")``: micro-batches of ring items per lane, with admission control."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        self._state: DriverState | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_state"] = None  # connections and leases stay in the source runner
        return state

    # -- driver side (source runner) ---------------------------------------------------------------------------

    def _driver(self) -> DriverState:
        if self._state is None:
            self._state = DriverState(self.options)
            install_stop_hooks(self)
        return self._state

    @property
    def skipped_items(self) -> int:
        """Ring items skipped because they were overwritten before they were read (``failOnDataLoss=false``): the
        query's count as of the last batch this source runner planned (carried across restarts in the offsets), plus
        items lost between planning a batch and reading it."""
        return 0 if self._state is None else self._state.skipped_items

    def prepareForTriggerAvailableNow(self) -> None:
        target = self._driver().prepare_available_now()
        logger.info("Trigger.AvailableNow: reading up to %s", target.dumps())

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        byte_cap = self.options.max_bytes_per_trigger or self.options.max_bytes_per_lane_per_trigger
        if byte_cap is not None:
            return ReadMaxBytes(byte_cap)  # the caps themselves come from the options (``_admit``)
        if self.options.min_offsets_per_trigger is not None:
            return ReadMinRows(self.options.min_offsets_per_trigger)
        return ReadAllAvailable()

    def initialOffset(self) -> dict[str, Any]:
        state = self._driver()
        check_lanes(self.options.starting, "startingOffsets", state.infos)
        check_time_lanes(self.options.starting_time, state.infos)
        view = state.view()
        start: dict[tuple[str, int], int] = {}
        inside: dict[tuple[str, int], int] = {}
        for (stream, lane), (head, next_seq) in sorted(view.bounds.items()):
            confirmed = view.confirmed_sequence(stream, lane)
            if confirmed is not None:
                # The group's item mark was checked by ``view`` (a lane truncated under it starts at its oldest).
                state.check_confirmed(stream, lane, confirmed[1], self.options.group, next_seq)
                start[(stream, lane)] = confirmed[0]
            elif self.options.starting_time is not None:
                start[(stream, lane)], record = start_by_time(
                    state.grid,
                    state.infos[stream],
                    lane,
                    self.options.starting_time,
                    self.options.timestamp_strategy,
                    next_seq,
                )
                if record is not None:
                    inside[(stream, lane)] = record
            elif (stream, lane) in state.subscribed_ends:
                start[(stream, lane)] = state.subscribed_ends[(stream, lane)]
            else:
                start[(stream, lane)] = resolve_position(
                    self.options.starting,
                    "startingOffsets",
                    stream,
                    lane,
                    head,
                    next_seq,
                    group=self.options.group,
                    oldest=functools.partial(state.oldest, stream, lane),
                )
        offset = SparkOffset.of(by_stream(start), marks=state.marks_for(start, SparkOffset(())))
        state.began_at(offset, inside)
        # A start resolved from startingOffsets is the group's position from now on: a member taking a lane over
        # before this query's first commit resumes there instead of resolving the option again.
        state.confirm(offset)
        logger.info("new query starts at %s", offset.dumps())
        return offset.to_json()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict[str, dict[str, int]]:
        """The end of the next micro-batch, in steps: settle where the last batch ended, read the lanes once, check
        the positions against them, follow the group, admit what the read limit allows, mark the new end."""
        state = self._driver()
        begin = self._settle(state, SparkOffset.from_json(start))
        known_ends = state.seen_ends()
        view = state.plan_view()
        current, gone = self._positions(state, begin, view, known_ends)
        skipped = begin.skipped_dict()
        state.resume_skip_count(begin)
        ends, candidates = self._lane_starts(state, view, current, skipped)
        ends.update(self._admit(state, candidates, self._readable_ends(state, view, candidates), limit))
        end = SparkOffset.of(
            by_stream(ends),
            skipped,
            sum(ends[key] - position for key, position in candidates.items()) if state.is_first_batch(begin) else None,
            state.marks_for(ends, begin),
        )
        if not gone and not view.restarts and ends == current:
            return begin.to_json()  # nothing new: the same offset, so Spark runs no batch
        state.batch_planned(end)
        return end.to_json()

    def _settle(self, state: DriverState, begin: SparkOffset) -> SparkOffset:
        """Where the next batch starts. Its item marks are checked once per source runner (``restarted``). Spark
        asks for the next end only once the batch that ended at ``begin`` is in its commit log, so ``begin`` is
        confirmed for the group here (Spark's own ``commit`` lags a batch, and never comes for an AvailableNow
        run's last one)."""
        begin = restarted(state, begin)
        if state.available_now_target is not None and state.members:
            # An AvailableNow run stops at the first batch that finds nothing to read; give a holder that just died
            # (its lease not yet expired) the time to lose its lanes instead of ending without reading.
            self._await_lanes(state, 2 * self.options.group_lease_ms / 1000 + 1)
        state.confirm(begin)
        return begin

    def _positions(
        self, state: DriverState, begin: SparkOffset, view: LaneView, known_ends: dict[tuple[str, int], int]
    ) -> tuple[dict[tuple[str, int], int], list[str]]:
        """Each lane's position as the batch starts, and the ``streamPattern`` streams deleted since: those drop
        out (``_drop_deleted``), lanes new to the checkpoint start at their oldest item (Kafka reads new partitions
        from earliest), and a checkpoint the lanes contradict is refused (``check_checkpoint``) rather than
        skipping records."""
        current = begin.as_dict()
        gone = self._drop_deleted(state, current, known_ends) if self.options.stream_pattern is not None else []
        for key, (head, _) in view.bounds.items():
            current.setdefault(key, head)
        current.update(state.ended_below(begin, view.bounds, known_ends))
        current = moved_back(current, view.restarts)  # lanes taken over whose group offset was truncated under it
        check_checkpoint(state, current, view.bounds)
        return current, gone

    def _lane_starts(
        self,
        state: DriverState,
        view: LaneView,
        current: dict[tuple[str, int], int],
        skipped: dict[tuple[str, int], int],
    ) -> tuple[dict[tuple[str, int], int], dict[tuple[str, int], int]]:
        """Split the lanes into those whose end is already known (``ends``: a standby follows the group's
        confirmed offset and reads nothing; a lane taken over skips what the group already processed) and those
        the batch may read from (``candidates``: their start, moved past items known lost with
        ``failOnDataLoss=false``, so no batch is spent on a range that is gone)."""
        ends: dict[tuple[str, int], int] = {}
        candidates: dict[tuple[str, int], int] = {}
        for key, position in current.items():
            stream, lane = key
            confirmed = view.confirmed_sequence(stream, lane)
            state.check_confirmed(
                stream, lane, confirmed[1] if confirmed else None, self.options.group, view.bounds.get(key, (0, 0))[1]
            )
            if not state.held(stream, lane) or (stream in state.members and key not in view.epochs):
                state.standing_by(stream, lane)
                ends[key] = max(position, confirmed[0]) if confirmed is not None else position
            elif confirmed is not None and confirmed[0] > position:
                ends[key] = confirmed[0]
            else:
                state.holding(stream, lane)
                if key in view.bounds and position < view.bounds[key][0] and not self.options.fail_on_data_loss:
                    position = self._skip_lost(state, stream, lane, position, skipped)
                candidates[key] = position
        return ends, candidates

    def _readable_ends(
        self, state: DriverState, view: LaneView, candidates: dict[tuple[str, int], int]
    ) -> dict[tuple[str, int], int]:
        """How far each lane may be read: its end; for an AvailableNow run, no further than the end it had when the
        run started (a stream created since is not part of the run, which must end); with ``read_committed``, no
        further than its last stable offset (the first item of a transaction still open)."""
        latest = {key: nxt for key, (_, nxt) in view.bounds.items()}
        if state.available_now_target is not None:
            target = state.available_now_target.as_dict()
            latest = {key: min(nxt, target.get(key, view.bounds[key][0])) for key, nxt in latest.items()}
        return {key: state.stable_end(key, candidates.get(key, nxt), nxt) for key, nxt in latest.items()}

    def _drop_deleted(
        self, state: DriverState, current: dict[tuple[str, int], int], known_ends: dict[tuple[str, int], int]
    ) -> list[str]:
        """Remove the positions of streams no longer read (deleted while a ``streamPattern`` query ran) from
        ``current``, so they drop out of the next offset; a deleted stream with unread items is data loss."""
        gone = sorted({stream for stream, _ in current if stream not in state.infos})
        for stream in gone:
            unread = {
                lane: (position, known_ends[(stream, lane)])
                for (s, lane), position in sorted(current.items())
                if s == stream and known_ends.get((stream, lane), position) > position
            }
            if unread and self.options.fail_on_data_loss:
                lane, (position, end) = next(iter(unread.items()))
                raise StreamDeletedError(stream, lane, position, end)
            logger.warning(
                "stream %r was deleted while this query read it (streamPattern %r); it drops out of the query's "
                "offsets%s",
                stream,
                self.options.stream_pattern.pattern if self.options.stream_pattern else None,
                ""
                if not unread
                else "; unread items lost (failOnDataLoss=false): "
                + ", ".join(f"lane {lane} sequences {lo}..{hi - 1}" for lane, (lo, hi) in unread.items()),
            )
            for key in [key for key in current if key[0] == stream]:
                del current[key]
        return gone

    def _skip_lost(
        self, state: DriverState, stream: str, lane: int, position: int, skipped: dict[tuple[str, int], int]
    ) -> int:
        """Move a lane below the oldest servable sequence straight to it, counting the lost items into ``skipped``
        (the query's count per lane, carried in the end offset). Called only when ``position`` is below the ring
        head: the oldest servable sequence costs a grid read, the head is known anyway."""
        oldest = state.oldest(stream, lane)
        if position >= oldest:
            return position  # below the head, but the grid serves it from its store
        lost = oldest - position
        skipped[(stream, lane)] = skipped.get((stream, lane), 0) + lost
        logger.warning(
            "data loss on stream %r lane %d: ring items %d..%d were overwritten before this query read them; "
            "skipping %d items (failOnDataLoss=false); %d items of this lane lost since the query started",
            stream,
            lane,
            position,
            oldest - 1,
            lost,
            skipped[(stream, lane)],
        )
        return oldest

    def _admit(
        self,
        state: DriverState,
        start: dict[tuple[str, int], int],
        latest: dict[tuple[str, int], int],
        limit: ReadLimit,
    ) -> dict[tuple[str, int], int]:
        """Admission control: the ends the read limit and the options admit from ``start`` towards ``latest``."""
        available = {key: max(start[key], latest.get(key, start[key])) for key in start}
        if isinstance(limit, ReadAllAvailable) or not start:
            return available  # Trigger.Once (or a limit-less query) reads everything
        backlog = sum(available[key] - start[key] for key in start)
        minimum = self.options.min_offsets_per_trigger
        if (
            minimum is not None
            and state.available_now_target is None
            and backlog < minimum
            and state.ms_since_last_batch() < self.options.max_trigger_delay_ms
        ):
            return dict(start)
        maximum = self.options.max_offsets_per_trigger
        if isinstance(limit, ReadMaxRows):
            maximum = limit.max_rows if maximum is None else min(maximum, limit.max_rows)
        ends = available if maximum is None else rate_limit(start, available, maximum)
        max_bytes, max_lane_bytes = self.options.max_bytes_per_trigger, self.options.max_bytes_per_lane_per_trigger
        if max_bytes is None and max_lane_bytes is None:
            return ends
        sizes = {
            key: size
            for key in start
            if ends[key] > start[key] and (size := state.item_bytes(key[0], key[1], start[key])) is not None
        }
        by_bytes = byte_limit(start, ends, sizes, max_bytes=max_bytes, max_lane_bytes=max_lane_bytes)
        return {key: min(ends[key], by_bytes[key]) for key in ends}

    def reportLatestOffset(self) -> dict[str, dict[str, int]] | None:
        state = self._state
        return None if state is None or state.latest is None else state.latest.to_json()

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        state = self._driver()
        begin, finish = restarted(state, SparkOffset.from_json(start)), SparkOffset.from_json(end)
        view = state.planned()
        ranges: list[Piece] = []
        # (stream, lane) -> (first sequence, record offset inside that item to start at)
        first_offsets: dict[tuple[str, int], tuple[int, int]] = {}
        begin_at = moved_back(begin.as_dict(), view.restarts)
        skipped_before, skipped_after = begin.skipped_dict(), finish.skipped_dict()
        for stream, lane, end_seq in finish.positions:
            key = (stream, lane)
            lo = begin_at.get(key, view.bounds.get(key, (0, 0))[0])
            if stream not in state.infos:  # a streamPattern stream deleted before this (replayed) batch was read
                self._deleted_range(stream, lane, lo, end_seq)
                continue
            # Items the driver skipped as lost when it planned this batch: counted there, never read or counted here.
            lo += skipped_after.get(key, 0) - skipped_before.get(key, 0)
            if end_seq <= lo:
                continue
            lo = self._range_start(state, view, stream, lane, lo, end_seq, first_offsets)
            if lo < end_seq:
                ranges.append((stream, lane, lo, end_seq))
        return self._tasks(state, ranges, first_offsets, begin.marks_dict(), state.handoffs(view, begin, finish))

    def _deleted_range(self, stream: str, lane: int, lo: int, end_seq: int) -> None:
        """A planned range of a stream deleted since: data loss (``StreamDeletedError``), or logged and skipped."""
        if end_seq > lo and self.options.fail_on_data_loss:
            raise StreamDeletedError(stream, lane, lo, end_seq)
        if end_seq > lo:
            logger.warning(
                "stream %r was deleted; skipping lane %d sequences %d..%d (failOnDataLoss=false)",
                stream,
                lane,
                lo,
                end_seq - 1,
            )

    def _range_start(
        self,
        state: DriverState,
        view: LaneView,
        stream: str,
        lane: int,
        lo: int,
        end_seq: int,
        first_offsets: dict[tuple[str, int], tuple[int, int]],
    ) -> int:
        """Where a lane's range of this batch really starts: past what the group already processed (a standby's or
        a takeover's catch-up batch reads nothing twice), inside the first item where a confirmed offset or a start
        by time lies (``first_offsets``), and past items overwritten since planning (``_check_loss``)."""
        confirmed = view.confirmed_sequence(stream, lane)
        if confirmed is not None:
            confirmed_seq, confirmed_offset = confirmed
            if end_seq <= confirmed_seq:
                return end_seq
            if confirmed_seq >= lo:
                lo = confirmed_seq
                if index_of(confirmed_offset):
                    first_offsets[(stream, lane)] = (lo, confirmed_offset)
        by_time = state.start_offsets.get((stream, lane))
        if by_time is not None and sequence_of(by_time) == lo:
            # The first batch reading the item a start by time resolved to: its records before that time
            # are not read (a later confirmed offset inside the same item is further on and wins).
            first = first_offsets.get((stream, lane))
            first_offsets[(stream, lane)] = (lo, max(by_time, first[1] if first is not None else by_time))
        if not state.held(stream, lane):
            self._await_lane(state, stream, lane)
        return self._check_loss(state, stream, lane, lo, view.bounds.get((stream, lane)))

    def _tasks(
        self,
        state: DriverState,
        ranges: list[Piece],
        first_offsets: dict[tuple[str, int], tuple[int, int]],
        marks: dict[tuple[str, int], ItemMark],
        handoffs: dict[tuple[str, int], LaneHandoff],
    ) -> list[LaneRanges]:
        """The Spark tasks reading the ranges (``planning.plan_for``). A range starting where the batch starts
        carries the item mark of the item before it, checked by the task (``LaneRange.expect``)."""
        tasks = []
        for task in plan_for(self.options, ranges):
            lane_ranges = []
            for stream, lane, lo, hi in task:
                first, mark = first_offsets.get((stream, lane)), marks.get((stream, lane))
                lane_ranges.append(
                    LaneRange(
                        stream,
                        lane,
                        lo,
                        hi,
                        self.options.grid,
                        state.infos[stream],
                        self.options.include_headers,
                        self.options.fail_on_data_loss,
                        first[1] if first is not None and first[0] == lo else None,
                        self.options.corrupt,
                        self.options.headers_as_map,
                        isolation=self.options.isolation,
                        expect=mark if mark is not None and mark.sequence == lo - 1 else None,
                        topics=self.options.topics,
                        value_version=value_version_of(self.schema),
                        handoff=handoffs.get((stream, lane)),
                    )
                )
            tasks.append(LaneRanges(tuple(lane_ranges)))
        return tasks

    def _await_lanes(self, state: DriverState, timeout_s: float) -> None:
        lanes = state.lane_keys()
        if all(state.held(*key) for key in lanes):
            return
        logger.info(
            "standby: waiting up to %.0f s for group %r's lanes held by another member", timeout_s, self.options.group
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not all(state.held(*key) for key in lanes):
            time.sleep(0.05)

    def _await_lane(self, state: DriverState, stream: str, lane: int) -> None:
        """A batch planned while holding the lane is being replayed: wait (bounded) until we hold it again."""
        deadline = time.monotonic() + 3 * self.options.group_lease_ms / 1000
        while time.monotonic() < deadline and not state.held(stream, lane):
            time.sleep(0.05)  # the group member's background thread acquires the lease; poll its local view
        if not state.held(stream, lane):
            logger.warning(
                "replaying a batch of stream %r lane %d without holding the group %r lease (another member holds "
                "it); its rows may also be read by that member",
                stream,
                lane,
                self.options.group,
            )

    def _check_loss(
        self, state: DriverState, stream: str, lane: int, start: int, bounds: tuple[int, int] | None
    ) -> int:
        head = bounds[0] if bounds else start
        if start >= head:
            return start
        oldest = state.oldest(stream, lane)
        if start >= oldest:
            return start  # below the ring head, but the grid serves it from its store
        if self.options.fail_on_data_loss:
            raise DataLossError(stream, lane, requested=start, oldest_available=oldest, unit="sequence")
        # Lost after the batch was planned (or replayed after more was overwritten): the batch's end offset is
        # logged already, and the next batch's start is past these items, so they are logged and counted by this
        # source runner only (``skipped_items``), not in the query's count carried in the offsets.
        state.count_late_skip(oldest - start)
        logger.warning(
            "data loss on stream %r lane %d: ring items %d..%d were overwritten after this batch was planned; "
            "skipping %d items (failOnDataLoss=false)",
            stream,
            lane,
            start,
            oldest - 1,
            oldest - start,
        )
        return oldest

    def commit(self, end: dict) -> None:
        self._driver().confirm(SparkOffset.from_json(end))

    def stop(self) -> None:
        stopping()  # a SIGTERM from here on would abort the release (``stop_hooks``)
        if self._state is not None:
            self._state.close()
