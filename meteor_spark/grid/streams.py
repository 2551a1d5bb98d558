"""Streams: configuration, metadata stored in the grid, lanes, and lane naming.

A stream is ``lanes`` ring buffers named ``meteor.stream::<stream>.<lane>``. Its configuration is stored once, as
JSON, in the grid map ``meteor.streams`` (key = stream name), so publishers and subscribers can open a stream by
name alone (the Meteor roadmap's metadata service) and a party asking for a different layout gets a clear
``StreamConfigConflictError`` instead of Meteor's silent first-creator-wins.

Which fields must agree: the layout fields (``lanes``, ``capacity``, ``backup_count``, ``async_backup_count``,
``ttl_s``) describe the rings every party shares, so a mismatch is a conflict. The backup counts are layout because
the cluster holds one ring configuration per ring name and refuses a different one (Hazelcast's
InvalidConfiguration): a mismatch would fail anyway, later and less clearly. The batching fields (``compression``,
``compression_threshold``, ``max_batch_records``, ``max_batch_bytes``, ``linger_ms``) only tune how one publisher
writes; they are stored as the defaults for parties that open the stream by name, and a party passing its own
``StreamConfig`` keeps its own. The deduplication window and the region (``AGREED_SETTINGS``) are stored settings
too, but every party must agree on them (a publisher with another window would misjudge message ids); unlike the
layout they can be changed on an existing stream, by ``ensure_stream(..., on_difference="apply")``
(``meteor_spark.grid.ensure``).

Keys choose lanes with ``lane_for_key`` (``meteor_spark.format.partitioning``): CRC-32 (zlib /
IEEE 802.3) of the key bytes modulo the lane count. It is the same in every process, platform and version (it is
part of the format: changing it would split a key's records over two lanes).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from meteor_spark.errors import (
    ArgumentTypeError,
    ConfigError,
    GridOperationError,
    StreamConfigConflictError,
    StreamNotFoundError,
    UnsupportedFormatVersionError,
    unknown_option,
)
from meteor_spark.format.item_encoding import COMPRESSIONS
from meteor_spark.format.item_header import FORMAT_VERSION
from meteor_spark.format.offsets import MAX_RECORDS_PER_ITEM
from meteor_spark.grid.client import Grid, require_grid, result
from meteor_spark.validate import check_int, check_number

logger = logging.getLogger(__name__)

STREAMS_MAP = "meteor.streams"
RING_PREFIX = "meteor.stream::"
#: Version of the JSON stored in ``meteor.streams``; a newer one stops an older library with a clear error.
METADATA_VERSION = 1

#: Hazelcast's InvalidConfigurationException: a dynamic config conflicting with an existing one.
_INVALID_CONFIGURATION = 32

MAX_LANES = 1024
MAX_BACKUPS = 6
_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,199}$")

#: Fields every party must agree on (they describe the shared rings).
LAYOUT_FIELDS = ("lanes", "capacity", "backup_count", "async_backup_count", "ttl_s", "ephemeral")

#: Stored settings a party opening the stream with its own ``StreamConfig`` must also agree on, though
#: ``ensure_stream(..., on_difference="apply")`` may change them: a publisher with another deduplication window
#: would check message ids against the wrong window (or not at all), and a party naming another region expects the
#: stream somewhere else; a party that takes a typed stream for a bytes one (or the reverse) would write values its
#: readers cannot decode.
AGREED_SETTINGS = ("dedup_window_ms", "region", "value_format")

#: Fields added after the first metadata version, with their defaults: stored only when set.
OPTIONAL_FIELDS: dict[str, Any] = {"ephemeral": False, "dedup_window_ms": 0, "region": "", "value_format": ""}

#: ``StreamConfig.value_format`` values: ``""`` (bytes, the clients' own serializers) or ``"avro"`` (a typed
#: stream: values encoded with its schemas in ``meteor.schemas``, ``meteor_spark.grid.schemas``).
VALUE_FORMATS = ("", "avro")

#: Longest deduplication window: a week (ids are kept in the grid for that long).
MAX_DEDUP_WINDOW_MS = 7 * 24 * 3600 * 1000

#: Field names of older stored metadata -> today's names (read, never written).
_RENAMED_FIELDS = {"backups": "backup_count"}


def ring_name(stream: str, lane: int) -> str:
    """Name of the ring buffer holding lane ``lane`` of ``stream``."""
    return f"{RING_PREFIX}{stream}.{lane}"


_MAX_I32 = (1 << 31) - 1
MAX_LINGER_MS = 60_000


@dataclass(frozen=True)
class Batching:
    """The batching fields a stream stores as its publishers' defaults: one frozen value, validated once (a
    publisher's own settings, ``batching.PublisherSettings``, extend it with the bounds of its buffer).

    Attributes:
        compression: ``"lz4"`` or ``"none"``.
        compression_threshold: compress an item only from this many body bytes on.
        max_batch_records: records per ring item at most (1..65,536).
        max_batch_bytes: value/key/header bytes per ring item at most, before compression.
        linger_ms: how long a publisher waits for more records before sending a partly filled item (0: send at
            once; records pile up into an item anyway while the previous one is in flight).
    """

    compression: str = "lz4"
    compression_threshold: int = 1024
    max_batch_records: int = 1000
    max_batch_bytes: int = 1 << 20
    linger_ms: float = 0.0

    def __post_init__(self) -> None:
        if self.compression not in COMPRESSIONS:
            raise ConfigError(
                f"compression {self.compression!r} is not supported; use one of {', '.join(COMPRESSIONS)}"
            )
        check_int("compression_threshold", self.compression_threshold, 0, _MAX_I32)
        check_int("max_batch_records", self.max_batch_records, 1, MAX_RECORDS_PER_ITEM)
        check_int("max_batch_bytes", self.max_batch_bytes, 1, _MAX_I32)
        check_number("linger_ms", self.linger_ms, 0, MAX_LINGER_MS, what="(milliseconds)")


#: The batching fields, by name (``StreamConfig`` carries them flat, as stored and as users give them).
BATCHING_FIELDS = tuple(f.name for f in fields(Batching))


def batching_of(settings: Any) -> dict[str, Any]:
    """The batching fields of any object carrying them (a ``StreamConfig``, a ``Batching``), by name."""
    return {name: getattr(settings, name) for name in BATCHING_FIELDS}


@dataclass(frozen=True)
class StreamConfig:
    """A stream's configuration.

    Attributes:
        name: stream name (letters, digits, ``_ . -``; up to 200 characters).
        lanes: ring buffers in the stream; records with the same key go to the same lane (1..1024).
        capacity: ring items each lane keeps before overwriting the oldest (an item is a micro-batch of records).
        backup_count: synchronous backup copies of each lane on other members (0..6; Hazelcast's
            ``backup-count``). A publish is acknowledged after the backups have it. A single member (the embedded
            grid) accepts and stores it but has nowhere to put a backup.
        async_backup_count: asynchronous backup copies (Hazelcast's ``async-backup-count``); the sum of both is
            at most 6.
        ttl_s: seconds a ring item lives (0 = until overwritten).
        compression: ``"lz4"`` or ``"none"`` (publisher default).
        compression_threshold: compress an item only from this many body bytes on (publisher default).
        max_batch_records: records per ring item at most (1..65,536; publisher default).
        max_batch_bytes: value/key/header bytes per ring item at most, before compression (publisher default).
        linger_ms: how long a publisher waits for more records before sending a partly filled item (default 0:
            send at once; records pile up into an item anyway while the previous one is in flight).
        ephemeral: an at-most-once stream: records carry a topic, subscribers match topics, nothing is confirmed
            or redelivered, and a record no subscriber matches is dropped and counted.
        dedup_window_ms: how long a message id stays taken on this stream (0: no deduplication); a record whose
            ``message_id`` was published within the window is refused with ``DuplicateMessageError``.
        region: where the stream lives, as the deployment names it (``""``: the cluster the client talks to).
        value_format: ``"avro"``: a typed stream, whose publishers encode and subscribers decode values with its
            registered schemas when they name no serializer of their own (``meteor_spark.grid.schemas``);
            ``""``: values are bytes.
    """

    name: str
    lanes: int = 1
    capacity: int = 10_000
    backup_count: int = 1
    async_backup_count: int = 0
    ttl_s: int = 0
    # The batching fields (publisher defaults stored with the stream): Batching's, flat, as stored and as given.
    compression: str = Batching.compression
    compression_threshold: int = Batching.compression_threshold
    max_batch_records: int = Batching.max_batch_records
    max_batch_bytes: int = Batching.max_batch_bytes
    linger_ms: float = Batching.linger_ms
    ephemeral: bool = False
    dedup_window_ms: int = 0
    region: str = ""
    value_format: str = ""

    def __post_init__(self) -> None:
        check_stream_name(self.name)
        check_int("lanes", self.lanes, 1, MAX_LANES)
        check_int("capacity", self.capacity, 1, _MAX_I32)
        check_int("backup_count", self.backup_count, 0, MAX_BACKUPS)
        check_int("async_backup_count", self.async_backup_count, 0, MAX_BACKUPS)
        if self.backup_count + self.async_backup_count > MAX_BACKUPS:
            raise ConfigError(
                f"backup_count ({self.backup_count}) + async_backup_count ({self.async_backup_count}) must be at "
                f"most {MAX_BACKUPS} (Hazelcast's limit)"
            )
        check_int("ttl_s", self.ttl_s, 0, _MAX_I32)
        Batching(**batching_of(self))  # validates the batching fields, once, the same way everywhere
        if not isinstance(self.ephemeral, bool):
            raise ConfigError(f"ephemeral must be True or False, got {self.ephemeral!r}")
        check_int("dedup_window_ms", self.dedup_window_ms, 0, MAX_DEDUP_WINDOW_MS, what="(milliseconds; 0 = off)")
        if self.ephemeral and self.dedup_window_ms:
            raise ConfigError(
                f"dedup_window_ms={self.dedup_window_ms} on an ephemeral stream: an at-most-once stream keeps no "
                f"message ids; drop dedup_window_ms or make the stream persistent (ephemeral=False)"
            )
        if not isinstance(self.region, str) or (self.region and not _NAME_PATTERN.match(self.region)):
            raise ConfigError(
                f"region {self.region!r} must be a name of letters, digits and '_ . -' (or '' for the cluster the "
                f"client talks to)"
            )

        if self.value_format not in VALUE_FORMATS:
            raise ConfigError(
                f"value_format {self.value_format!r} is not a value format; use 'avro' (a typed stream) or '' (bytes)"
            )

    @property
    def batching(self) -> Batching:
        """The publisher defaults stored with the stream, as one validated value."""
        return Batching(**batching_of(self))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StreamConfig:
        """Build from a mapping (stored JSON, TOML); unknown keys are rejected with a suggestion."""
        known = {f.name for f in fields(cls)}
        for key in data:
            if key not in known:
                raise unknown_option("stream setting", key, known)
        if "name" not in data:
            raise ConfigError("a stream configuration needs a 'name'")
        return cls(**dict(data))

    def to_dict(self) -> dict[str, Any]:
        """The fields as stored; the later fields (``OPTIONAL_FIELDS``) only when set, so the metadata of a stream
        that does not use them stays readable by libraries that predate them."""
        data = asdict(self)
        for name, default in OPTIONAL_FIELDS.items():
            if data[name] == default:
                del data[name]
        return data

    def layout_differences(self, other: StreamConfig) -> list[str]:
        """Human-readable differences in the layout fields (empty when compatible)."""
        return [
            f"{name}: {getattr(self, name)!r} asked, {getattr(other, name)!r} stored"
            for name in LAYOUT_FIELDS
            if getattr(self, name) != getattr(other, name)
        ]

    def settings_differences(self, other: StreamConfig) -> list[str]:
        """Human-readable differences in ``AGREED_SETTINGS`` (empty when they agree)."""
        return [
            f"{name}: {getattr(self, name)!r} asked, {getattr(other, name)!r} stored"
            for name in AGREED_SETTINGS
            if getattr(self, name) != getattr(other, name)
        ]


@dataclass(frozen=True)
class StreamInfo:
    """An opened stream: its stored configuration and where its lanes live.

    Attributes:
        config: the configuration stored in the grid (batching fields: the caller's when it passed a config).
        created_at_ms: when the stream's metadata was first stored (ms since the epoch).
        format_version: the record format version of the library that created the stream (readers accept all
            versions up to their own; this is informational).
        ring_names: the ring buffer of each lane, index = lane.
    """

    config: StreamConfig
    created_at_ms: int
    format_version: int
    ring_names: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def lanes(self) -> int:
        return self.config.lanes


def metadata_json(config: StreamConfig, created_at_ms: int) -> str:
    """The JSON document stored in ``meteor.streams`` for a stream created now with ``config``."""
    document = {
        "metadata_version": METADATA_VERSION,
        "format_version": FORMAT_VERSION,
        "created_at_ms": created_at_ms,
        "config": config.to_dict(),
    }
    return json.dumps(document, sort_keys=True, separators=(",", ":"))


def parse_metadata(name: str, text: str) -> StreamInfo:
    try:
        document = json.loads(text)
        version = int(document.get("metadata_version", 0))
    except (ValueError, TypeError, AttributeError):
        raise ConfigError(
            f"the metadata of stream {name!r} in map {STREAMS_MAP!r} is not valid JSON; delete the stream "
            f"(`meteor streams delete {name}`) and create it again"
        ) from None
    if version > METADATA_VERSION:
        raise UnsupportedFormatVersionError(
            f"stream {name!r} was created by a newer meteor-spark (metadata version {version}, this library knows "
            f"up to {METADATA_VERSION}); upgrade meteor-spark to open it"
        )
    try:
        stored = {_RENAMED_FIELDS.get(key, key): value for key, value in document["config"].items()}
        config = StreamConfig.from_dict(stored)
        created = int(document["created_at_ms"])
        format_version = int(document.get("format_version", 0))
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(
            f"the stored metadata of stream {name!r} is invalid ({exc}); delete and recreate it"
        ) from None
    return StreamInfo(config, created, format_version, tuple(ring_name(config.name, i) for i in range(config.lanes)))


def check_stream_name(name: object) -> str:
    """``name`` if it is a valid stream name, else ``ConfigError`` (``ArgumentTypeError`` for a non-str) naming it."""
    if not isinstance(name, str):
        raise ArgumentTypeError(
            f"a stream is a StreamConfig or a stream name (str), not a {type(name).__name__}: {name!r}"
        )
    if not _NAME_PATTERN.fullmatch(name):
        raise ConfigError(
            f"stream name {name!r} is not valid: use 1-200 letters, digits, '_', '.' or '-' "
            f"(starting with a letter, digit or '_'), e.g. 'orders'"
        )
    return name


def open_stream(grid: Grid, config: StreamConfig | str, *, create: bool = True) -> StreamInfo:
    """Open a stream by configuration (created when missing, if ``create``) or by name alone.

    The decisions are ``stream_name``, ``stream_creation``, ``settled_info`` and ``ring_configs`` (no I/O), which
    the asyncio clients (``meteor_spark.aio``) share; this function does the grid calls between them.

    Raises:
        StreamNotFoundError: opened by name (or with ``create=False``) and no metadata is stored.
        StreamConfigConflictError: the stored layout, deduplication window or region differs from the given
            configuration (the batching fields may differ: a party passing its own keeps its own).
    """
    require_grid(grid)
    name = stream_name(config)
    metadata = grid.map(STREAMS_MAP)
    stored = metadata.get(name)
    if stored is None:
        candidate = stream_creation(config, create)
        # put_if_absent settles a race between two creators: the loser compares against the winner.
        stored = metadata.put_if_absent(name, candidate)
        if stored is None:
            created_log(config)
            stored = candidate
    info = settled_info(config, stored)
    for ring, capacity, backups, async_backups, ttl_s in ring_configs(info):
        try:
            grid.add_ring_config(ring, capacity=capacity, backups=backups, async_backups=async_backups, ttl_s=ttl_s)
        except GridOperationError as exc:
            conflict = ring_config_conflict(info, ring, exc)
            if conflict is None:
                raise
            raise conflict from exc
    return info


def stream_name(config: StreamConfig | str) -> str:
    """The name of the stream ``config`` opens, checked (``ConfigError`` / ``ArgumentTypeError``)."""
    if isinstance(config, str):
        return check_stream_name(config)
    if not isinstance(config, StreamConfig):
        raise ArgumentTypeError(
            f"a stream is a StreamConfig or a stream name (str), not a {type(config).__name__}: {config!r}"
        )
    return config.name


def stream_creation(config: StreamConfig | str, create: bool) -> str:
    """The metadata to store for a stream found missing, or ``StreamNotFoundError`` when it may not be created
    (opened by name, or ``create=False``)."""
    if isinstance(config, str):
        raise StreamNotFoundError(
            f"stream {config!r} does not exist (no metadata in map {STREAMS_MAP!r}); create it by opening "
            f"it with a StreamConfig (e.g. Publisher(grid, StreamConfig({config!r}, lanes=...))) or "
            f"`meteor streams create {config}`"
        )
    if not create:
        raise StreamNotFoundError(f"stream {config.name!r} does not exist and create=False")
    return metadata_json(config, int(time.time() * 1000))


def created_log(config: StreamConfig | str) -> None:
    """Log that this process created the stream (its metadata went in first)."""
    if isinstance(config, StreamConfig):
        logger.info("created stream %r (%d lanes, capacity %d)", config.name, config.lanes, config.capacity)


def settled_info(config: StreamConfig | str, stored: str) -> StreamInfo:
    """The opened stream from its stored metadata: by name, as stored; by configuration, the caller's (its batching
    fields kept), after checking that the stored layout and settings match it (``StreamConfigConflictError``)."""
    if isinstance(config, str):
        return parse_metadata(config, stored)
    info = parse_metadata(config.name, stored)
    differences = config.layout_differences(info.config)
    if differences:
        raise StreamConfigConflictError(
            f"stream {config.name!r} already exists with another layout ({'; '.join(differences)}); open it "
            f"by name to use the stored configuration, or delete it first (`meteor streams delete "
            f"{config.name}`) to change it"
        )
    differences = config.settings_differences(info.config)
    if differences:
        raise StreamConfigConflictError(
            f"stream {config.name!r} is stored with other settings ({'; '.join(differences)}); open it by name "
            f"to use the stored ones, or change them for everyone with ensure_stream(grid, config, "
            f"on_difference='apply') (`meteor streams ensure {config.name} ... --on-difference apply`)"
        )
    return StreamInfo(config, info.created_at_ms, info.format_version, info.ring_names)


def ring_configs(info: StreamInfo) -> list[tuple[str, int, int, int, int]]:
    """``(ring name, capacity, backups, async backups, TTL s)`` of every lane's ring, added to the cluster's
    dynamic configuration when a stream is opened. Exact names, not a wildcard: ``meteor.stream::a.*`` would also
    match the lanes of a stream named ``a.b``."""
    c = info.config
    return [(name, c.capacity, c.backup_count, c.async_backup_count, c.ttl_s) for name in info.ring_names]


def ring_config_conflict(info: StreamInfo, name: str, exc: GridOperationError) -> StreamConfigConflictError | None:
    """What a refused ring configuration means: the cluster holds another one under that name; None for any other
    refusal (``exc`` stands)."""
    if exc.code != _INVALID_CONFIGURATION:
        return None
    config = info.config
    return StreamConfigConflictError(
        f"stream {info.name!r}: the cluster already holds another ring configuration for {name!r} "
        f"(capacity/backups/async backups/TTL differ from {config.capacity}/{config.backup_count}/"
        f"{config.async_backup_count}/{config.ttl_s}); a stream "
        f"deleted and recreated with a new layout keeps the old ring configuration until the cluster "
        f"restarts. Use the old layout or a new stream name ({exc})"
    )


def lane_bounds(grid: Grid, info: StreamInfo) -> dict[int, tuple[int, int]]:
    """Per lane ``(head_sequence, next_sequence)``: the oldest item held and one past the newest (``tail + 1``)."""
    return {lane: bounds for (_, lane), bounds in streams_bounds(grid, [info]).items()}


def streams_bounds(grid: Grid, infos: Iterable[StreamInfo]) -> dict[tuple[str, int], tuple[int, int]]:
    """``lane_bounds`` of every lane of every stream in ``infos``, keyed ``(stream, lane)``: every head is asked
    for at once, then every tail, so two round trips whatever the number of lanes. Heads first: a tail read
    afterwards can only have moved forward, so head <= tail + 1 always holds."""
    rings = {(info.name, lane): grid.ring(name) for info in infos for lane, name in enumerate(info.ring_names)}
    head_futures = {key: ring.head_async() for key, ring in rings.items()}
    heads = {key: result(future, f"head of ring {rings[key].name!r}") for key, future in head_futures.items()}
    tail_futures = {key: ring.tail_async() for key, ring in rings.items()}
    return {
        key: (heads[key], result(future, f"tail of ring {rings[key].name!r}") + 1)
        for key, future in tail_futures.items()
    }
