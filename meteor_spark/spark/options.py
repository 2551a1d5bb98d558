"""Options of ``format("meteor")``, parsed once into typed, frozen objects.

Spark hands a data source a case-insensitive dict of strings. ``SourceOptions.parse`` and ``SinkOptions.parse``
turn it into frozen dataclasses, rejecting unknown names (with the closest known one) and invalid values (naming
the option, the value and the fix). No other module reads the raw dict.

Names follow Spark's Kafka source wherever the concept is the same, so switching formats is mostly a matter of
changing ``format("kafka")`` to ``format("meteor")``. One difference matters: **a Spark offset of this source is a
ring item** (one micro-batch of records written by one publisher flush), not a record. ``maxOffsetsPerTrigger``,
``minOffsetsPerTrigger`` and ``maxOffsetsPerPartition`` therefore count ring items. Counting records exactly would
mean reading every item on the driver before planning a batch; the item count is what the driver knows for free.

``option_table.OPTION_TABLE`` is the one place every option is documented; docs/spark.md renders it
(``describe_options()``). ``option_values`` reads the raw values.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from meteor_spark.config import load_config
from meteor_spark.errors import ConfigError
from meteor_spark.format.corrupt import CorruptItemPolicy
from meteor_spark.format.routing import TopicMatcher
from meteor_spark.grid.client import GridSettings
from meteor_spark.grid.item_gate import parse_isolation
from meteor_spark.grid.streams import StreamConfig
from meteor_spark.grid.transactions import DEFAULT_TIMEOUT_MS, SWEEP_INTERVAL_S
from meteor_spark.spark.group_handoff import parse_mode
from meteor_spark.spark.option_table import (
    DEFAULT_GROUP_LEASE_MS,
    DEFAULT_MAX_TRIGGER_DELAY_MS,
    DEFAULT_SHARED_RECORDS_PER_TRIGGER,
    OPTION_TABLE,
)
from meteor_spark.spark.option_values import RawOptions, per_lane_json, timestamp_ms

EARLIEST_SENTINEL, LATEST_SENTINEL = -2, -1  # Kafka's sentinels in per-lane JSON offsets


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
        topics: AMQP topic patterns rows must match (``topics``, comma-separated), or None for every row.
        key_lanes: a pushed ``key`` predicate plans only its key's lane (``keyLanes``; ``spark.pushdown``).
        shared: read as a member of the shared group ``group`` (``spark.shared_reader``).
        max_records_per_trigger: records a shared-group batch acquires at most.
        acquisition_timeout_ms, max_deliveries: the shared group's settings this query asks for (None: the group's).
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
    topics: tuple[str, ...] | None = None
    key_lanes: bool = True
    shared: bool = False
    max_records_per_trigger: int = DEFAULT_SHARED_RECORDS_PER_TRIGGER
    acquisition_timeout_ms: int | None = None
    max_deliveries: int | None = None

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
        raw = RawOptions(options, _SOURCE_NAMES, "read option")
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
            topics=_topics(raw.text("topics")),
            key_lanes=raw.boolean("keyLanes", True),
            shared=raw.boolean("shared", False),
            max_records_per_trigger=raw.positive_int("maxRecordsPerTrigger") or DEFAULT_SHARED_RECORDS_PER_TRIGGER,
            acquisition_timeout_ms=raw.positive_int("acquisitionTimeoutMs"),
            max_deliveries=raw.positive_int("maxDeliveries"),
        )
        parsed._check(raw, batch=batch)
        return parsed

    def _check(self, raw: RawOptions, *, batch: bool | None) -> None:
        """Refuse options that contradict each other; each check names the options and the fix."""
        self._check_read_kind(raw, batch=batch)
        self._check_needed_options(raw)
        self._check_lane_maps()
        self._check_shared(raw)

    def _check_shared(self, raw: RawOptions) -> None:
        """``shared=true`` and the options only it takes (the ephemeral check needs the stream: the reader's)."""
        if not self.shared:
            for name in ("maxRecordsPerTrigger", "acquisitionTimeoutMs", "maxDeliveries"):
                if raw.given(name):
                    raise ConfigError(
                        f"option {name!r} needs shared=true (a shared group read); add it or remove {name!r}"
                    )
            return
        if self.group is None:
            raise ConfigError(
                "shared=true needs option 'group': the shared group to read as; add .option(\"group\", ...)"
            )
        if self.stream_pattern is not None or len(self.streams) != 1:
            raise ConfigError("shared=true reads one stream (a shared group belongs to one); give one 'stream'")
        if (
            raw.given("startingOffsets") and self.starting.spec is not OffsetSpec.GROUP
        ) or self.starting_time is not None:
            raise ConfigError(
                "shared=true starts where the shared group's state says (its first member starts it at the oldest "
                "record); remove startingOffsets / startingTimestamp, or give startingOffsets=group"
            )
        for name in (
            "maxOffsetsPerTrigger",
            "minOffsetsPerTrigger",
            "maxBytesPerTrigger",
            "maxBytesPerLanePerTrigger",
            "maxPartitions",
            "maxOffsetsPerPartition",
            "groupLeaseMs",
            "topics",
            "isolation",
        ):
            if raw.given(name):
                raise ConfigError(
                    f"option {name!r} does not apply with shared=true (records are acquired, not read by lane "
                    "range); use maxRecordsPerTrigger and minPartitions"
                )
        if self.max_deliveries is not None and self.corrupt.dead_letter_stream is None:
            raise ConfigError("option 'maxDeliveries' needs deadLetterStream (where records delivered that often go)")

    def _check_read_kind(self, raw: RawOptions, *, batch: bool | None) -> None:
        """Options of streaming reads only in a batch read, and the reverse (``batch=None``: not known yet)."""
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
                "shared",
                "maxRecordsPerTrigger",
                "acquisitionTimeoutMs",
                "maxDeliveries",
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
            if raw.given("keyLanes"):
                raise ConfigError(
                    "option 'keyLanes' applies to batch reads only (spark.read): Spark pushes no filters to a "
                    "streaming source; remove it from this streaming read"
                )

    def _check_needed_options(self, raw: RawOptions) -> None:
        """Options that only make sense with another one, or within bounds another one sets."""
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

    def _check_lane_maps(self) -> None:
        """Per-lane JSON positions and times may name only streams the query reads."""
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
        group_offsets: commit a grouped meteor source's offsets in the batch's transaction (``group_handoff``).
    """

    stream: str | None
    grid: GridSettings = field(default_factory=GridSettings)
    sink_id: str | None = None
    create_stream: bool = True
    transactional: bool = True
    transaction_timeout_ms: int = DEFAULT_TIMEOUT_MS
    sweep_interval_ms: int = int(SWEEP_INTERVAL_S * 1000)
    group_offsets: str = "auto"

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        """Parse Spark's options for a writer.

        Raises:
            ConfigError: an unknown option (with the closest name) or an invalid value.
        """
        raw = RawOptions(options, _SINK_NAMES, "write option")
        streams = _streams(raw, allow_list=False, required=False)
        return cls(
            stream=streams[0] if streams else None,
            grid=_grid(raw),
            sink_id=raw.text("sinkId") or raw.text("checkpointLocation"),
            create_stream=raw.boolean("createStream", True),
            transactional=raw.boolean("transactional", True),
            group_offsets=parse_mode(raw.text("groupOffsets"), raw.boolean("transactional", True)),
            transaction_timeout_ms=raw.positive_int("transactionTimeoutMs") or DEFAULT_TIMEOUT_MS,
            sweep_interval_ms=raw.positive_int("sweepIntervalMs") or int(SWEEP_INTERVAL_S * 1000),
        )


def _pattern(raw: RawOptions) -> re.Pattern[str] | None:
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


def _streams(raw: RawOptions, *, allow_list: bool, required: bool = True) -> tuple[str, ...]:
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


def _grid(raw: RawOptions) -> GridSettings:
    hazelcast = {k: v for k, v in raw.values.items() if k.startswith("hazelcast.")}
    conf = raw.text("conf")
    if conf is None:
        return GridSettings.from_options(hazelcast)
    # Explicit only: Spark options never read environment variables, so a query behaves the same on every host.
    return load_config(conf, env={}, overrides=hazelcast).grid


def _position(raw: RawOptions, name: str, default: OffsetSpec, allowed: tuple[OffsetSpec, ...]) -> Position:
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
        per_lane_json(name, text, value, unit="sequence", units="ring sequences", example=42, check=checked_sequence),
    )


def _time_position(raw: RawOptions, every_lane: str, per_lane: str, by_offset: str) -> TimePosition | None:
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
        return TimePosition(every_lane, every_lane_ms=timestamp_ms(every_lane, raw.text(every_lane)))
    value = raw.text(per_lane) or ""
    lanes = per_lane_json(
        per_lane,
        value,
        value,
        unit="ms since the epoch",
        units="times (ms since the epoch)",
        example=1700000000000,
        check=lambda stream, lane, ms: timestamp_ms(per_lane, ms, f": stream {stream!r} lane {lane}"),
    )
    return TimePosition(per_lane, lanes=lanes)


def _timestamp_strategy(raw: RawOptions) -> TimestampStrategy:
    value = raw.text("startingOffsetsByTimestampStrategy")
    if value is None:
        return TimestampStrategy.ERROR
    for strategy in TimestampStrategy:
        if value.strip().lower() == strategy.value:
            return strategy
    raise ConfigError(f"option 'startingOffsetsByTimestampStrategy': expected error or latest, got {value!r}")


def _topics(text: str | None) -> tuple[str, ...] | None:
    """The ``topics`` option: comma-separated AMQP patterns, each checked (the error names the pattern)."""
    if text is None:
        return None
    return TopicMatcher([p.strip() for p in text.split(",")], "option 'topics'").patterns
