"""Options of ``format("meteor")``, parsed once into typed, frozen objects.

Spark hands a data source a case-insensitive dict of strings. ``SourceOptions.parse`` and ``SinkOptions.parse``
turn it into frozen dataclasses, rejecting unknown names (with the closest known one) and invalid values (naming
the option, the value and the fix). No other module reads the raw dict.

Names follow Spark's Kafka source wherever the concept is the same, so switching formats is mostly a matter of
changing ``format("kafka")`` to ``format("meteor")``. One difference matters: **a Spark offset of this source is a
ring item** (one micro-batch of records written by one publisher flush), not a record. ``maxOffsetsPerTrigger``,
``minOffsetsPerTrigger`` and ``maxOffsetsPerPartition`` therefore count ring items. Counting records exactly would
mean reading every item on the driver before planning a batch; the item count is what the driver knows for free.

``OPTION_TABLE`` is the one place every option is documented; docs/spark.md renders it (``describe_options()``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from meteor_spark.config import load_config
from meteor_spark.errors import ConfigError, unknown_option
from meteor_spark.format.corrupt import CORRUPT_MODES, CorruptItemPolicy
from meteor_spark.grid.client import GridSettings
from meteor_spark.grid.item_gate import ISOLATIONS, parse_isolation
from meteor_spark.grid.streams import StreamConfig
from meteor_spark.grid.transactions import DEFAULT_TIMEOUT_MS, SWEEP_INTERVAL_S

#: Spark adds these keys itself (``load(path)`` / ``start(path)``, the sink's checkpoint and ``queryName``);
#: they are not typos.
_SPARK_ADDED = frozenset({"path", "checkpointlocation", "queryname"})

#: Kafka's sentinels in per-lane JSON offsets.
EARLIEST_SENTINEL = -2
LATEST_SENTINEL = -1

DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60 * 1000
DEFAULT_GROUP_LEASE_MS = 5000


@dataclass(frozen=True)
class OptionDoc:
    """One row of the options table.

    Attributes:
        name: the option name as documented (Spark matches it case-insensitively).
        applies_to: ``read``, ``readStream``, ``read (batch)``, ``write``, ``writeStream`` or a combination.
        type: the value's type as a user writes it.
        default: the default, as text.
        meaning: what it does, in one or two sentences.
    """

    name: str
    applies_to: str
    type: str
    default: str
    meaning: str


def _grid_type(name: str) -> str:
    if name.endswith(("enabled", "checkHostname", "smartRouting")):
        return "bool"
    if name.endswith("Timeout"):
        return "seconds"
    if name.endswith("Bytes"):
        return "int (bytes)"
    return "string"


#: Every option of format("meteor"). The option table of docs/spark.md is generated from this tuple.
OPTION_TABLE: tuple[OptionDoc, ...] = (
    OptionDoc(
        "stream",
        "read, write",
        "string (comma list when reading)",
        "(required)",
        "Stream(s) to read, or the stream to write to when the rows have no `stream` column. "
        '`load("name")` / `save("name")` / `start("name")` set it too.',
    ),
    OptionDoc(
        "streamPattern",
        "read, readStream",
        "regular expression (Python)",
        "(none)",
        "Read every stream whose whole name matches (Kafka's subscribePattern; exclusive with `stream`). A "
        "streaming query lists the streams at every micro-batch: a stream created while it runs is read from "
        "its oldest item at the next batch; a deleted one is logged (WARNING) and drops out of the offsets, and "
        "if it still held items the query had not read (as far as the running query saw), that is data loss "
        "(failOnDataLoss). No matching stream yet: the query waits, running no batch. With `group`, each "
        "stream is read as that group. An AvailableNow run reads the streams that existed when it started.",
    ),
    OptionDoc(
        "conf",
        "read, write",
        "path",
        "(none)",
        "A meteor TOML file (`[hazelcast]` section) read on the driver; `hazelcast.*` options override it.",
    ),
    OptionDoc(
        "startingOffsets",
        "read, readStream",
        "earliest | latest | group | JSON",
        "latest (stream), earliest (batch)",
        "Where a query without a checkpoint starts. `earliest` = oldest item each lane still holds; "
        "`latest` = after the newest; `group` = the group's confirmed offsets, failing for lanes that have "
        'none; JSON `{"stream": {"0": 42}}` = per-lane ring sequence (-2 earliest, -1 latest). With '
        "`group` set, lanes the group has confirmed start there whatever this option says.",
    ),
    OptionDoc(
        "endingOffsets",
        "read (batch)",
        "latest | JSON",
        "latest",
        "Where a batch read stops (exclusive): `latest` = the lane ends when the query is planned, or "
        "per-lane JSON like startingOffsets (-1 latest).",
    ),
    OptionDoc(
        "startingTimestamp",
        "read, readStream",
        "int >= 0 (ms since the epoch)",
        "(none)",
        "Start every lane of every stream at its first record whose timestamp is >= this time (Kafka's "
        "offsetsForTimes; found by a binary search over the lane's ring items, see "
        "`meteor_spark.grid.timestamps` for out-of-order timestamps). Records of that ring item before it are not "
        "read. A lane with no such record follows startingOffsetsByTimestampStrategy. Excludes "
        "startingOffsets and startingOffsetsByTimestamp (Kafka's source would silently prefer this one).",
    ),
    OptionDoc(
        "startingOffsetsByTimestamp",
        "read, readStream",
        "JSON",
        "(none)",
        'Per-lane start times `{"stream": {"0": 1700000000000}}` (ms since the epoch), every lane of '
        "every stream read; otherwise as startingTimestamp. Excludes startingOffsets.",
    ),
    OptionDoc(
        "startingOffsetsByTimestampStrategy",
        "read, readStream",
        "error | latest",
        "error",
        "A lane with no record at or after its start time: `error` = fail naming stream, lane and time "
        "(Kafka's default); `latest` = start that lane at its end (it reads only newer records). Needs "
        "startingTimestamp or startingOffsetsByTimestamp.",
    ),
    OptionDoc(
        "endingTimestamp",
        "read (batch)",
        "int >= 0 (ms since the epoch)",
        "(none)",
        "End every lane (exclusive) at its first record whose timestamp is >= this time; a lane with no "
        "such record ends at latest (as in Kafka). Excludes endingOffsets and endingOffsetsByTimestamp.",
    ),
    OptionDoc(
        "endingOffsetsByTimestamp",
        "read (batch)",
        "JSON",
        "(none)",
        "Per-lane end times, JSON like startingOffsetsByTimestamp; otherwise as endingTimestamp. Excludes "
        "endingOffsets.",
    ),
    OptionDoc(
        "maxOffsetsPerTrigger",
        "readStream",
        "int > 0 (ring items)",
        "(no limit)",
        "Most ring items one micro-batch reads, over all lanes, split in proportion to each lane's backlog "
        "(a lane with data gets at least 1, so a batch may hold up to one item per lane more). A ring item "
        "holds one publisher batch (up to the stream's max_batch_records records).",
    ),
    OptionDoc(
        "maxBytesPerTrigger",
        "readStream",
        "size (64m, 1g, 512k or bytes)",
        "(no limit)",
        "About the most bytes one micro-batch reads, over all lanes, split in proportion to each lane's "
        "backlog. The driver knows item counts, not sizes: it estimates each lane's item size from the items "
        "it samples (one read of one item per lane and batch, a running average), so a batch may exceed the "
        "cap by up to one item per lane, and a lane with data always admits at least one item. Honoured by "
        "Trigger.AvailableNow (several batches); with maxOffsetsPerTrigger the tighter limit wins; Trigger.Once "
        "reads everything, as with every limit.",
    ),
    OptionDoc(
        "maxBytesPerLanePerTrigger",
        "readStream",
        "size (64m, 1g, 512k or bytes)",
        "(no limit)",
        "About the most bytes one micro-batch reads from one lane (estimated like maxBytesPerTrigger; at least "
        "one item per lane with data).",
    ),
    OptionDoc(
        "minOffsetsPerTrigger",
        "readStream",
        "int > 0 (ring items)",
        "(none)",
        "Skip a trigger until at least this many ring items are waiting, or maxTriggerDelay passed. "
        "Ignored by Trigger.AvailableNow (it reads what was there when it started, then stops).",
    ),
    OptionDoc(
        "maxTriggerDelay",
        "readStream",
        "duration (15m, 30s, 500ms)",
        "15m",
        "Longest wait for minOffsetsPerTrigger before a smaller batch runs anyway.",
    ),
    OptionDoc(
        "minPartitions",
        "read, readStream",
        "int > 0",
        "(the driver's CPU count)",
        "Split lane ranges so a batch has at least this many Spark tasks. Given explicitly, ranges are split "
        "down to single ring items if needed; by default only into pieces of at least 64 items, so one "
        "busy lane uses every local core but small batches are not cut up. On a cluster, set it to the "
        "cores that read.",
    ),
    OptionDoc(
        "maxPartitions",
        "read, readStream",
        "int > 0",
        "(see meaning)",
        "Most Spark tasks per batch: lane ranges beyond it are grouped, a task reading its ranges one after "
        "another. Without it, ranges are grouped only while the batch has more tasks than minPartitions "
        "and than one per 4096 ring items (a Python task costs ~0.1 s to start, so many small ranges read "
        "faster together); large ranges keep one task each, like Kafka's.",
    ),
    OptionDoc(
        "maxOffsetsPerPartition",
        "read, readStream",
        "int > 0 (ring items)",
        "(no limit)",
        "Split a lane range into Spark tasks of at most this many ring items (Kafka's "
        "maxRecordsPerPartition, counted in ring items).",
    ),
    OptionDoc(
        "failOnDataLoss",
        "read, readStream",
        "bool",
        "true",
        "Fail the query when the ring overwrote items it had not read yet (the error names stream, lane, "
        "requested and oldest available sequence). false = skip to the oldest available item, log and "
        "count the skipped items. The driver moves a lane that fell behind straight to its oldest "
        "available item and counts each lost item once per query, across restarts (the count rides in the "
        "checkpointed offsets); items overwritten while their batch is being read are skipped and logged by "
        "the task.",
    ),
    OptionDoc(
        "onCorrupt",
        "read, readStream",
        " | ".join(CORRUPT_MODES),
        "error (dead_letter with deadLetterStream)",
        "What a task does with a ring item that is not a valid record batch (damaged, a foreign writer's, a "
        "newer format). `error` = fail the query naming stream, lane and sequence; `skip` = leave it out, "
        "count and log it (executor log); `dead_letter` = publish the raw item to deadLetterStream and read "
        "on.",
    ),
    OptionDoc(
        "deadLetterStream",
        "read, readStream",
        "string (an existing stream)",
        "(none)",
        "Where refused items go (alone it implies onCorrupt=dead_letter): the raw item as the value of one "
        "record, with headers meteor.source.stream, .lane, .sequence, .offset and meteor.error. Published "
        "before the task hands on the rows after the item; a retried task may publish it again "
        "(at-least-once).",
    ),
    OptionDoc(
        "isolation",
        "read, readStream",
        " | ".join(ISOLATIONS),
        "read_uncommitted",
        "Kafka's kafka.isolation.level. `read_committed` = rows of a transactional sink's micro-batch only "
        "once its commit recorded them, never those of failed or superseded task attempts or aborted "
        "batches; a lane's batch ends at the first item of a transaction still open (its last stable "
        "offset) until it is decided (committed, aborted, or timed out). `read_uncommitted` = every record "
        "as stored. Both drop re-sent copies of a ring item (same producer id and sequence) within a task's "
        "range.",
    ),
    OptionDoc(
        "includeHeaders",
        "read, readStream",
        "bool",
        "false",
        "Add the `headers` column (array<struct<key: string, value: binary>>).",
    ),
    OptionDoc(
        "headersAsMap",
        "read, readStream",
        "bool",
        "false",
        "With includeHeaders: the `headers` column is map<string, binary> instead. A record with the same "
        "header key twice keeps the last value (Kafka's lastHeader); use the array form to see every value.",
    ),
    OptionDoc(
        "group",
        "readStream",
        "string",
        "(none)",
        "Read as this subscriber group: the query holds the group's lane leases (on the driver) and writes "
        "the group's confirmed offsets after each batch is committed. A second query in the group waits "
        "as standby and takes over when the first stops or dies.",
    ),
    OptionDoc(
        "groupLeaseMs",
        "readStream",
        "int > 0 (ms)",
        str(DEFAULT_GROUP_LEASE_MS),
        "Lease length of the group's lanes; a dead query's lanes pass to a standby after this long. Needs group.",
    ),
    OptionDoc(
        "groupMemberId",
        "readStream",
        "string",
        "(generated)",
        "Member id this query uses in the group (shown by `meteor groups`); unique per running query. Needs group.",
    ),
    OptionDoc(
        "sinkId",
        "writeStream",
        "string",
        "(the checkpoint location)",
        "Key under which committed micro-batch ids are recorded in the grid (map meteor.sink.commits) so "
        "that a batch Spark replays after it was committed is not published twice.",
    ),
    OptionDoc(
        "transactional",
        "write, writeStream",
        "bool",
        "true",
        "Publish each micro-batch (writeStream) or job (write) as one transaction: every task attempt under "
        "its own producer id, committed by one fenced write in the sink's commit with the attempts that "
        "succeeded. read_committed readers then see every row exactly once, even when tasks fail part-way or "
        "the driver dies and restarts; read_uncommitted readers also see the rows of failed attempts. "
        "false = plain items (at least once for a batch that fails part-way).",
    ),
    OptionDoc(
        "transactionTimeoutMs",
        "write, writeStream",
        "int > 0 (ms)",
        str(DEFAULT_TIMEOUT_MS),
        "A transaction still open this long after its last task attempt started is aborted by the first "
        "read_committed reader that meets it (a dead writer's rows never hold readers up for longer); its "
        "commit then fails and the query fails. Keep it above the longest batch. A restarted query aborts "
        "its previous run's open transaction of the replayed batch at once (fencing by sinkId and query "
        "id).",
    ),
    OptionDoc(
        "sweepIntervalMs",
        "write, writeStream",
        "int > 0 (ms)",
        str(int(SWEEP_INTERVAL_S * 1000)),
        "How often (at most) the sink's commit removes decided transactions no reader can still need from "
        "the transaction maps (meteor.txns, meteor.txn.producers, meteor.txn.batches). Shorter keeps the "
        "maps nearer their bound at the cost of one listing of them per interval.",
    ),
    OptionDoc(
        "createStream",
        "write, writeStream",
        "bool",
        "true",
        "Create the target stream (default configuration) when it does not exist; false = fail instead.",
    ),
    *(
        OptionDoc(name, "read, write", _grid_type(name), default, meaning)
        for name, default, meaning in GridSettings.OPTION_DOCS
    ),
)


def describe_options() -> list[tuple[str, str, str, str, str]]:
    """Rows (name, applies to, type, default, meaning) of every option, for docs/spark.md and ``meteor`` help."""
    return [(d.name, d.applies_to, d.type, d.default, d.meaning) for d in OPTION_TABLE]


_SOURCE_NAMES = frozenset(
    d.name for d in OPTION_TABLE if "read" in d.applies_to and not d.name.startswith("hazelcast.")
)
_SINK_NAMES = frozenset(d.name for d in OPTION_TABLE if "write" in d.applies_to and not d.name.startswith("hazelcast."))


class OffsetSpec(Enum):
    """A symbolic start/end position; per-lane positions use ``LanePositions``."""

    EARLIEST = "earliest"
    LATEST = "latest"
    GROUP = "group"


#: stream -> lane -> ring sequence, or EARLIEST_SENTINEL / LATEST_SENTINEL.
LanePositions = Mapping[str, Mapping[int, int]]


@dataclass(frozen=True)
class Position:
    """Where to start or end: a symbolic spec, or explicit per-lane ring sequences.

    Attributes:
        spec: the symbolic position, or None when ``lanes`` is given.
        lanes: stream -> lane -> ring sequence (or -2 earliest / -1 latest), when given as JSON.
    """

    spec: OffsetSpec | None = None
    lanes: LanePositions = field(default_factory=dict)

    def describe(self) -> str:
        if self.spec is not None:
            return self.spec.value
        return json.dumps({s: {str(k): v for k, v in sorted(lanes.items())} for s, lanes in self.lanes.items()})


class TimestampStrategy(Enum):
    """What a start by time does on a lane with no record at or after its time (option
    ``startingOffsetsByTimestampStrategy``)."""

    ERROR = "error"
    LATEST = "latest"


@dataclass(frozen=True)
class TimePosition:
    """A start or end given by time (ms since the epoch): one time for every lane, or per-lane times.

    Attributes:
        option: the option it came from (named in errors).
        every_lane_ms: the time of every lane of every stream, or None when ``lanes`` is given.
        lanes: stream -> lane -> time, when given as JSON.
    """

    option: str
    every_lane_ms: int | None = None
    lanes: Mapping[str, Mapping[int, int]] = field(default_factory=dict)

    def ms_for(self, stream: str, lane: int) -> int:
        """The time of one lane; a ``ConfigError`` naming the option when the JSON leaves the lane out."""
        if self.every_lane_ms is not None:
            return self.every_lane_ms
        lanes = self.lanes.get(stream, {})
        if lane not in lanes:
            given = ", ".join(str(k) for k in sorted(lanes))
            raise ConfigError(
                f"{self.option} has no time for stream {stream!r} lane {lane} (given lanes: {given or 'none'}); "
                f'give every lane of every stream read, e.g. {{"{stream}": {{"{lane}": 1700000000000}}}}'
            )
        return lanes[lane]


@dataclass(frozen=True)
class SourceOptions:
    """Everything a meteor reader needs, parsed and validated.

    Attributes:
        streams: the streams to read, in the order given (empty with ``stream_pattern``).
        stream_pattern: a regular expression matched against whole stream names (``streamPattern``), or None.
        grid: how to reach the grid.
        starting: where a query without a checkpoint starts.
        ending: where a batch read ends (exclusive).
        max_offsets_per_trigger: most ring items per micro-batch over all lanes (None = no limit).
        min_offsets_per_trigger: fewest ring items worth a micro-batch (None = any).
        max_trigger_delay_ms: longest wait for ``min_offsets_per_trigger``.
        min_partitions: fewest Spark tasks per batch (None = the driver's CPU count, for large ranges only).
        max_partitions: most Spark tasks per batch (None = grouping by size only; see ``planning.plan_tasks``).
        max_offsets_per_partition: most ring items per Spark task (None = no limit).
        fail_on_data_loss: fail (True) or skip and count (False) when unread items were overwritten.
        include_headers: add the ``headers`` column.
        headers_as_map: the ``headers`` column is ``map<string, binary>`` (last value of a repeated key).
        max_bytes_per_trigger: about the most bytes per micro-batch over all lanes (None = no limit).
        max_bytes_per_lane_per_trigger: about the most bytes per micro-batch and lane (None = no limit).
        group: subscriber group name, or None.
        group_lease_ms: lease length of the group's lanes.
        group_member_id: member id in the group, or None to generate one.
        corrupt: what a task does with an undecodable ring item (``onCorrupt`` / ``deadLetterStream``).
        starting_time: a start by time (``startingTimestamp`` / ``startingOffsetsByTimestamp``), replacing
            ``starting``; None = ``starting`` applies.
        ending_time: a batch read's end by time (``endingTimestamp`` / ``endingOffsetsByTimestamp``); None =
            ``ending`` applies.
        timestamp_strategy: a lane with no record at or after its start time: error or start at its end.
    """

    streams: tuple[str, ...]
    grid: GridSettings = field(default_factory=GridSettings)
    starting: Position = field(default_factory=lambda: Position(OffsetSpec.LATEST))
    ending: Position = field(default_factory=lambda: Position(OffsetSpec.LATEST))
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = DEFAULT_MAX_TRIGGER_DELAY_MS
    min_partitions: int | None = None
    max_partitions: int | None = None
    max_offsets_per_partition: int | None = None
    fail_on_data_loss: bool = True
    include_headers: bool = False
    group: str | None = None
    group_lease_ms: int = DEFAULT_GROUP_LEASE_MS
    group_member_id: str | None = None
    corrupt: CorruptItemPolicy = field(default_factory=CorruptItemPolicy)
    stream_pattern: re.Pattern[str] | None = None
    headers_as_map: bool = False
    max_bytes_per_trigger: int | None = None
    max_bytes_per_lane_per_trigger: int | None = None
    starting_time: TimePosition | None = None
    ending_time: TimePosition | None = None
    timestamp_strategy: TimestampStrategy = TimestampStrategy.ERROR
    isolation: str = "read_uncommitted"

    def matches(self, name: str) -> bool:
        """Whether the query reads stream ``name`` (listed in ``stream``, or matching ``streamPattern``)."""
        if self.stream_pattern is not None:
            return self.stream_pattern.fullmatch(name) is not None
        return name in self.streams

    @classmethod
    def parse(cls, options: Mapping[str, str], *, batch: bool | None = False) -> SourceOptions:
        """Parse Spark's options for a reader: ``batch=True`` for ``spark.read``, False for ``spark.readStream``,
        None when not yet known (``schema()`` at ``load()``: options that only one of them takes are not checked).

        Raises:
            ConfigError: an unknown option (with the closest name), an invalid value, or options that contradict
                each other (the message names them and says how to fix it).
        """
        raw = _Raw(options, _SOURCE_NAMES, "read option")
        pattern = _pattern(raw)
        streams = () if pattern is not None else _streams(raw, allow_list=True)
        starting_default = OffsetSpec.EARLIEST if batch else OffsetSpec.LATEST
        starting = _position(raw, "startingOffsets", starting_default, allowed=tuple(OffsetSpec))
        ending = _position(raw, "endingOffsets", OffsetSpec.LATEST, allowed=(OffsetSpec.LATEST,))
        group = raw.text("group")
        if group is not None and not group.strip():
            raise ConfigError("option 'group' is empty; give a group name or leave the option out")
        parsed = cls(
            streams=streams,
            grid=_grid(raw),
            starting=starting,
            ending=ending,
            max_offsets_per_trigger=raw.positive_int("maxOffsetsPerTrigger"),
            min_offsets_per_trigger=raw.positive_int("minOffsetsPerTrigger"),
            max_trigger_delay_ms=raw.duration_ms("maxTriggerDelay", DEFAULT_MAX_TRIGGER_DELAY_MS),
            min_partitions=raw.positive_int("minPartitions"),
            max_partitions=raw.positive_int("maxPartitions"),
            max_offsets_per_partition=raw.positive_int("maxOffsetsPerPartition"),
            fail_on_data_loss=raw.boolean("failOnDataLoss", True),
            include_headers=raw.boolean("includeHeaders", False),
            group=group,
            group_lease_ms=raw.positive_int("groupLeaseMs") or DEFAULT_GROUP_LEASE_MS,
            group_member_id=raw.text("groupMemberId"),
            corrupt=CorruptItemPolicy.parse(
                raw.text("onCorrupt"),
                raw.text("deadLetterStream"),
                mode_name="onCorrupt",
                stream_name="deadLetterStream",
            ),
            stream_pattern=pattern,
            headers_as_map=raw.boolean("headersAsMap", False),
            max_bytes_per_trigger=raw.size_bytes("maxBytesPerTrigger"),
            max_bytes_per_lane_per_trigger=raw.size_bytes("maxBytesPerLanePerTrigger"),
            starting_time=_time_position(raw, "startingTimestamp", "startingOffsetsByTimestamp", "startingOffsets"),
            ending_time=_time_position(raw, "endingTimestamp", "endingOffsetsByTimestamp", "endingOffsets"),
            timestamp_strategy=_timestamp_strategy(raw),
            isolation=parse_isolation(raw.text("isolation"), "option 'isolation'"),
        )
        parsed._check(raw, batch=batch)
        return parsed

    def _check(self, raw: _Raw, *, batch: bool | None) -> None:
        if batch:
            for name in (
                "group",
                "maxOffsetsPerTrigger",
                "minOffsetsPerTrigger",
                "maxTriggerDelay",
                "groupLeaseMs",
                "groupMemberId",
                "maxBytesPerTrigger",
                "maxBytesPerLanePerTrigger",
            ):
                if raw.given(name):
                    raise ConfigError(
                        f"option {name!r} applies to streaming reads only (spark.readStream); remove it from this "
                        f"batch read (spark.read)"
                    )
            if self.starting.spec is OffsetSpec.GROUP:
                raise ConfigError(
                    "startingOffsets=group needs a streaming read with option 'group'; a batch read takes "
                    "earliest, latest or per-lane JSON"
                )
        elif batch is False:
            for name in ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp"):
                if raw.given(name):
                    raise ConfigError(
                        f"option {name!r} applies to batch reads only (spark.read); a streaming query has no end. "
                        f"Use trigger(availableNow=True) to read what is there and stop"
                    )
        if raw.given("startingOffsetsByTimestampStrategy") and self.starting_time is None:
            raise ConfigError(
                "option 'startingOffsetsByTimestampStrategy' needs startingTimestamp or startingOffsetsByTimestamp "
                "(it says what a start by time does on a lane with no record at or after the time)"
            )
        if raw.given("headersAsMap") and not self.include_headers:
            raise ConfigError(
                "option 'headersAsMap' shapes the headers column, which only includeHeaders=true adds; set "
                "includeHeaders=true or remove headersAsMap"
            )
        if self.group is None:
            for name in ("groupLeaseMs", "groupMemberId"):
                if raw.given(name):
                    raise ConfigError(
                        f"option {name!r} needs option 'group' (it sets how this query reads as a group member); "
                        f'add .option("group", ...) or remove {name!r}'
                    )
        if self.group_member_id is not None and not self.group_member_id.strip():
            raise ConfigError(
                "option 'groupMemberId' is empty; give a member id or leave the option out to generate one"
            )
        dead_letter = self.corrupt.dead_letter_stream
        if dead_letter is not None:
            check_stream_name(dead_letter, "deadLetterStream")
            if self.matches(dead_letter):
                raise ConfigError(
                    f"deadLetterStream {dead_letter!r} is also a stream this query reads; refused items would be "
                    f"read back. Send them to a stream of their own"
                )
        if self.starting.spec is OffsetSpec.GROUP and self.group is None:
            raise ConfigError("startingOffsets=group needs option 'group' (the subscriber group to start from)")
        if (
            self.min_offsets_per_trigger is not None
            and self.max_offsets_per_trigger is not None
            and self.min_offsets_per_trigger > self.max_offsets_per_trigger
        ):
            raise ConfigError(
                f"minOffsetsPerTrigger ({self.min_offsets_per_trigger}) is larger than maxOffsetsPerTrigger "
                f"({self.max_offsets_per_trigger}); lower the minimum or raise the maximum"
            )
        if (
            self.min_partitions is not None
            and self.max_partitions is not None
            and self.min_partitions > self.max_partitions
        ):
            raise ConfigError(
                f"minPartitions ({self.min_partitions}) is larger than maxPartitions ({self.max_partitions}); "
                f"lower the minimum or raise the maximum"
            )
        lane_maps: list[tuple[Mapping[str, Any], str]] = [
            (self.starting.lanes, "startingOffsets"),
            (self.ending.lanes, "endingOffsets"),
        ]
        lane_maps += [(t.lanes, t.option) for t in (self.starting_time, self.ending_time) if t is not None]
        for lanes, name in lane_maps:
            extra = sorted(s for s in lanes if not self.matches(s))
            if extra and self.stream_pattern is not None:
                raise ConfigError(
                    f"{name} names stream(s) {', '.join(map(repr, extra))} that streamPattern "
                    f"{self.stream_pattern.pattern!r} does not match; fix the pattern or remove them from {name}"
                )
            if extra:
                raise ConfigError(
                    f"{name} names stream(s) {', '.join(map(repr, extra))} that option 'stream' does not read "
                    f"({', '.join(self.streams)}); add them to 'stream' or remove them from {name}"
                )


@dataclass(frozen=True)
class SinkOptions:
    """Everything a meteor writer needs, parsed and validated.

    Attributes:
        stream: the target stream for rows without a ``stream`` column value (None = the column is required).
        grid: how to reach the grid.
        sink_id: key of this sink's committed batch ids in ``meteor.sink.commits`` (streaming writes).
        create_stream: create missing target streams with the default configuration.
        transactional: publish each micro-batch / job as one transaction (``meteor_spark.grid.transactions``).
        transaction_timeout_ms: a transaction open this long after its last task attempt started is aborted.
        sweep_interval_ms: the commit sweeps the transaction maps at most this often (``transactions.sweep_if_due``).
    """

    stream: str | None
    grid: GridSettings = field(default_factory=GridSettings)
    sink_id: str | None = None
    create_stream: bool = True
    transactional: bool = True
    transaction_timeout_ms: int = DEFAULT_TIMEOUT_MS
    sweep_interval_ms: int = int(SWEEP_INTERVAL_S * 1000)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        """Parse Spark's options for a writer.

        Raises:
            ConfigError: an unknown option (with the closest name) or an invalid value.
        """
        raw = _Raw(options, _SINK_NAMES, "write option")
        streams = _streams(raw, allow_list=False, required=False)
        sink_id = raw.text("sinkId") or raw.text("checkpointLocation")
        return cls(
            stream=streams[0] if streams else None,
            grid=_grid(raw),
            sink_id=sink_id,
            create_stream=raw.boolean("createStream", True),
            transactional=raw.boolean("transactional", True),
            transaction_timeout_ms=raw.positive_int("transactionTimeoutMs") or DEFAULT_TIMEOUT_MS,
            sweep_interval_ms=raw.positive_int("sweepIntervalMs") or int(SWEEP_INTERVAL_S * 1000),
        )


class _Raw:
    """Spark's option dict, lower-cased once, with typed accessors that name the option in every error."""

    def __init__(self, options: Mapping[str, str], known: frozenset[str], kind: str) -> None:
        self.values: dict[str, str] = {str(k).lower(): str(v) for k, v in options.items()}
        known_lower = {n.lower(): n for n in known}
        for key in self.values:
            if key.startswith("hazelcast.") or key in _SPARK_ADDED or key in known_lower:
                continue
            if key == "maxrecordsperpartition":
                raise ConfigError(
                    "option 'maxRecordsPerPartition' is Kafka's; meteor's Spark offsets are ring items (each holds "
                    "a batch of records), so use 'maxOffsetsPerPartition' (ring items per Spark task)"
                )
            raise unknown_option(kind, key, known | {"hazelcast.*"})

    def given(self, name: str) -> bool:
        return name.lower() in self.values

    def text(self, name: str) -> str | None:
        return self.values.get(name.lower())

    def positive_int(self, name: str) -> int | None:
        value = self.text(name)
        if value is None:
            return None
        try:
            number = int(value.strip())
        except ValueError:
            raise ConfigError(f"option {name!r}: expected a whole number > 0, got {value!r}") from None
        if number <= 0:
            raise ConfigError(f"option {name!r}: expected a whole number > 0, got {value!r}")
        return number

    def size_bytes(self, name: str) -> int | None:
        value = self.text(name)
        return None if value is None else parse_size_bytes(name, value)

    def boolean(self, name: str, default: bool) -> bool:
        value = self.text(name)
        if value is None:
            return default
        lowered = value.strip().lower()
        if lowered in ("true", "1", "yes"):
            return True
        if lowered in ("false", "0", "no"):
            return False
        raise ConfigError(f"option {name!r}: expected true or false, got {value!r}")

    def duration_ms(self, name: str, default: int) -> int:
        value = self.text(name)
        if value is None:
            return default
        return parse_duration_ms(name, value)


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h|d)?\s*$", re.IGNORECASE)
_UNIT_MS = {None: 1, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration_ms(name: str, value: str) -> int:
    """Parse ``15m``, ``30s``, ``500ms``, ``1h``, ``2d`` or a plain number of milliseconds (Spark's style)."""
    match = _DURATION.match(value)
    if match is None:
        raise ConfigError(f"option {name!r}: expected a duration like 15m, 30s or 500ms, got {value!r}")
    unit = match.group(2).lower() if match.group(2) else None
    return int(float(match.group(1)) * _UNIT_MS[unit])


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_UNIT_BYTES = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size_bytes(name: str, value: str) -> int:
    """Parse ``64m``, ``1g``, ``512k``, ``1.5g``, ``64MiB`` or a plain number of bytes (Spark's style: binary
    units, so 1k = 1024 bytes) into bytes > 0."""
    match = _SIZE.match(value)
    if match is None:
        raise ConfigError(f"option {name!r}: expected a size like 64m, 1g, 512k or a number of bytes, got {value!r}")
    unit = (match.group(2) or "").lower()[:1]
    number = int(float(match.group(1)) * _UNIT_BYTES[unit])
    if number <= 0:
        raise ConfigError(f"option {name!r}: expected a size > 0 bytes, got {value!r}")
    return number


def _pattern(raw: _Raw) -> re.Pattern[str] | None:
    """``streamPattern`` compiled, or None; it replaces ``stream`` (and a ``load(path)``)."""
    text = raw.text("streamPattern")
    if text is None:
        return None
    if raw.given("stream") or raw.given("path"):
        raise ConfigError(
            "options 'stream' (or load(\"name\")) and 'streamPattern' exclude each other: name the streams or "
            "give a pattern, not both"
        )
    if not text.strip():
        raise ConfigError("option 'streamPattern' is empty; give a regular expression such as 'orders-.*'")
    try:
        return re.compile(text)
    except re.error as exc:
        raise ConfigError(f"option 'streamPattern': {text!r} is not a valid regular expression ({exc})") from None


def _streams(raw: _Raw, *, allow_list: bool, required: bool = True) -> tuple[str, ...]:
    given = raw.text("stream")
    path = raw.text("path")
    if given is not None and path is not None and given != path:
        raise ConfigError(
            f"option 'stream' ({given!r}) and the path given to load()/save()/start() ({path!r}) disagree; "
            f"name the stream once"
        )
    text = given if given is not None else path
    if text is None:
        if required:
            raise ConfigError(
                'option \'stream\' is required: .option("stream", "orders") or .load("orders") (or '
                "'streamPattern' when reading)"
            )
        return ()
    names = tuple(part.strip() for part in text.split(","))
    if any(not name for name in names):
        raise ConfigError(f"option 'stream': empty stream name in {text!r}; write names separated by commas")
    if len(names) > 1 and not allow_list:
        raise ConfigError(
            f"option 'stream' names several streams ({text!r}); a writer takes one default stream. Route rows "
            f"with a 'stream' column instead"
        )
    if len(set(names)) != len(names):
        raise ConfigError(f"option 'stream' names a stream twice: {text!r}")
    for name in names:
        check_stream_name(name, "stream")
    return names


def check_stream_name(name: str, option: str) -> None:
    """A ConfigError naming ``option`` when ``name`` cannot be a stream name (the rule of ``StreamConfig``)."""
    try:
        StreamConfig(name)
    except ConfigError as exc:
        raise ConfigError(f"option {option!r}: {exc}") from None


def _grid(raw: _Raw) -> GridSettings:
    hazelcast = {k: v for k, v in raw.values.items() if k.startswith("hazelcast.")}
    conf = raw.text("conf")
    if conf is None:
        return GridSettings.from_options(hazelcast)
    # Explicit only: Spark options never read environment variables, so a query behaves the same on every host.
    return load_config(conf, env={}, overrides=hazelcast).grid


def _position(raw: _Raw, name: str, default: OffsetSpec, allowed: tuple[OffsetSpec, ...]) -> Position:
    value = raw.text(name)
    if value is None:
        return Position(default)
    text = value.strip()
    if not text.startswith("{"):
        for spec in allowed:
            if text.lower() == spec.value:
                return Position(spec)
        choices = ", ".join(s.value for s in allowed)
        raise ConfigError(
            f'option {name!r}: expected {choices} or per-lane JSON like {{"orders": {{"0": 42}}}}, got {value!r}'
        )
    lowest = LATEST_SENTINEL if name == "endingOffsets" else EARLIEST_SENTINEL

    def checked_sequence(stream: str, lane: int, sequence: Any) -> int:
        if isinstance(sequence, bool) or not isinstance(sequence, int) or sequence < lowest:
            raise ConfigError(
                f"option {name!r}: stream {stream!r} lane {lane}: expected a ring sequence >= 0 "
                f"(or {lowest} for {'latest' if lowest == -1 else 'earliest, -1 for latest'}), got "
                f"{json.dumps(sequence)}"
            )
        return sequence

    return Position(
        None,
        _per_lane_json(name, text, value, unit="sequence", units="ring sequences", example=42, check=checked_sequence),
    )


def _time_position(raw: _Raw, every_lane: str, per_lane: str, by_offset: str) -> TimePosition | None:
    """``startingTimestamp`` / ``startingOffsetsByTimestamp`` (or the ending pair): at most one of them, and not
    with the position option ``by_offset``. Kafka's source silently prefers the timestamp options; two positions
    for one query are refused here, so no option is ever ignored."""
    given = [name for name in (every_lane, per_lane, by_offset) if raw.given(name)]
    if every_lane not in given and per_lane not in given:
        return None
    if len(given) > 1:
        raise ConfigError(
            f"options {' and '.join(repr(n) for n in given)} both say where the read "
            f"{'starts' if by_offset == 'startingOffsets' else 'ends'}; give one of them (Kafka's source would "
            f"silently take {given[0]!r})"
        )
    if every_lane in given:
        return TimePosition(every_lane, every_lane_ms=_timestamp(every_lane, raw.text(every_lane)))
    value = raw.text(per_lane) or ""
    lanes = _per_lane_json(
        per_lane,
        value,
        value,
        unit="ms since the epoch",
        units="times (ms since the epoch)",
        example=1700000000000,
        check=lambda stream, lane, ms: _timestamp(per_lane, ms, f": stream {stream!r} lane {lane}"),
    )
    return TimePosition(per_lane, lanes=lanes)


def _per_lane_json(
    option: str,
    text: str,
    shown: str,
    *,
    unit: str,
    units: str,
    example: int,
    check: Callable[[str, int, Any], int],
) -> dict[str, dict[int, int]]:
    """A JSON option ``{"stream": {"lane": value}}`` (startingOffsets, endingOffsets, the *ByTimestamp options): the
    shape and the lane numbers are checked here, each value by ``check(stream, lane, value)``; ``shown`` is the
    option's text as given, for messages."""
    try:
        document: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"option {option!r}: not valid JSON ({exc.msg} at character {exc.pos}): {shown!r}") from None
    if not isinstance(document, dict) or not document:
        raise ConfigError(
            f"option {option!r}: expected a JSON object stream -> {{lane: {unit}}}, like "
            f'{{"orders": {{"0": {example}}}}}, got {shown!r}'
        )
    lanes: dict[str, dict[int, int]] = {}
    for stream, per_stream in document.items():
        if not isinstance(per_stream, dict) or not per_stream:
            raise ConfigError(
                f"option {option!r}: stream {stream!r} must map lane numbers to {units}, e.g. "
                f'{{"{stream}": {{"0": {example}}}}}, got {json.dumps(per_stream)}'
            )
        lanes[stream] = {}
        for lane_text, raw_value in per_stream.items():
            lane = _as_int(lane_text)
            if lane is None or lane < 0:
                raise ConfigError(f"option {option!r}: stream {stream!r}: lane {lane_text!r} is not a lane number")
            lanes[stream][lane] = check(stream, lane, raw_value)
    return lanes


def _timestamp(option: str, value: Any, where: str = "") -> int:
    """A time in ms since the epoch: a whole number >= 0 (a JSON number, or text of digits)."""
    number = value if isinstance(value, int) and not isinstance(value, bool) else None
    if isinstance(value, str) and value.strip().isdigit():
        number = int(value.strip())
    if number is None or number < 0:
        shown = repr(value) if isinstance(value, str) else json.dumps(value)
        raise ConfigError(
            f"option {option!r}{where}: expected a time in ms since the epoch (a whole number >= 0), got {shown}"
        )
    return number


def _timestamp_strategy(raw: _Raw) -> TimestampStrategy:
    value = raw.text("startingOffsetsByTimestampStrategy")
    if value is None:
        return TimestampStrategy.ERROR
    for strategy in TimestampStrategy:
        if value.strip().lower() == strategy.value:
            return strategy
    raise ConfigError(f"option 'startingOffsetsByTimestampStrategy': expected error or latest, got {value!r}")


def _as_int(text: Any) -> int | None:
    try:
        return int(text)
    except (TypeError, ValueError):
        return None
