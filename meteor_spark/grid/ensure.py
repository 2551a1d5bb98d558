"""Ensure a stream: create it, or check its stored configuration against the one a deployment declares.

``open_stream`` refuses a party whose layout differs from the stored one; ``ensure_stream`` is for the party that
owns the stream's configuration (a service at start-up, a deployment script, ``meteor streams ensure``) and wants
to know, field by field, how the stored configuration differs from what it declares, and to choose what happens:
refuse (``"error"``), log and keep the stored one (``"warn"``), or change it (``"apply"``).

What ``"apply"`` can change is what is only stored metadata: the publishers' batching defaults, the deduplication
window and the region. Parties that open the stream afterwards use the new values; a publisher already open keeps
those it opened with. What it cannot change is what the rings and the records already hold (``FIXED_REASONS``):
a changed layout needs a new stream. ``"apply"`` is all or nothing: when one difference cannot be applied, none
is, so a refused ensure leaves the stream as it found it.

Concurrent ensures: creation goes through ``put_if_absent`` (as ``open_stream``'s), a change through
``replace(key, old, new)`` on the stored JSON; the loser of a race reads the winner's configuration and compares
again, so no ensure reports a change from a value that was no longer stored, and the stored configuration is
always one that some ensure declared whole (never a mix of two).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, NoReturn, get_args

from meteor_spark.errors import ArgumentTypeError, ConfigError, StreamConfigConflictError
from meteor_spark.grid.client import Grid, require_grid
from meteor_spark.grid.streams import (
    BATCHING_FIELDS,
    LAYOUT_FIELDS,
    METADATA_VERSION,
    STREAMS_MAP,
    StreamConfig,
    StreamInfo,
    metadata_json,
    open_stream,
    parse_metadata,
)

logger = logging.getLogger(__name__)

OnDifference = Literal["error", "warn", "apply"]
ON_DIFFERENCE: tuple[str, ...] = get_args(OnDifference)

Outcome = Literal["created", "unchanged", "applied", "warned"]
Fate = Literal["applied", "kept", "refused"]

#: Stored settings ``on_difference="apply"`` may change on an existing stream: metadata only, read by the parties
#: that open the stream afterwards.
CHANGEABLE_FIELDS: tuple[str, ...] = (*BATCHING_FIELDS, "dedup_window_ms", "region", "value_format")

_RING_REASON = (
    "the lanes' ring buffers exist with the stored value, and a Hazelcast member refuses a second, different "
    "configuration for an existing ring name (InvalidConfigurationException, as a 5.7.0 member answers) until the "
    "whole cluster restarts"
)

#: Why each setting outside ``CHANGEABLE_FIELDS`` cannot change on an existing stream.
FIXED_REASONS: Mapping[str, str] = {
    "lanes": (
        "a key's lane is CRC-32 of the key mod lanes, so another lane count sends a key's next records to another "
        "lane than its earlier ones (per-key order lost), and the groups' leases and confirmed offsets are per lane"
    ),
    "capacity": _RING_REASON,
    "backup_count": _RING_REASON,
    "async_backup_count": _RING_REASON,
    "ttl_s": _RING_REASON,
    "ephemeral": (
        "it is the stream's delivery contract (at-most-once vs. persistent with acknowledgements): the records "
        "stored, the groups' state and the readers were made for the other kind"
    ),
}

#: Attempts at a compare-and-set before giving up: each failed one means another party changed the stream's
#: configuration in between, so running out means it keeps being changed (bounded, never spins for ever).
_MAX_ATTEMPTS = 32


@dataclass(frozen=True)
class StreamDifference:
    """One setting whose stored value differs from the declared one, and what ``ensure_stream`` did about it.

    Attributes:
        field: the ``StreamConfig`` field.
        stored: its value in the grid before the ensure.
        asked: the declared value.
        fate: ``"applied"`` (the stored value is now ``asked``), ``"kept"`` (the stored value stays: ``"warn"``,
            or a changeable setting not applied because another was refused) or ``"refused"`` (``"error"``, or a
            setting that cannot change).
        reason: why it was refused or kept, when it was.
    """

    field: str
    stored: Any
    asked: Any
    fate: Fate
    reason: str = ""

    @property
    def changeable(self) -> bool:
        """Whether ``on_difference="apply"`` can change this setting on an existing stream."""
        return self.field in CHANGEABLE_FIELDS

    def describe(self) -> str:
        """One line: ``field: asked X, stored Y -> fate (reason)``."""
        text = f"{self.field}: {self.asked!r} asked, {self.stored!r} stored -> {self.fate}"
        return f"{text} ({self.reason})" if self.reason else text


@dataclass(frozen=True)
class EnsureResult:
    """What ``ensure_stream`` found and did.

    Attributes:
        info: the stream as stored after the ensure (its configuration is the stored one: with ``"warn"`` the
            stored values that differ from the declared ones).
        outcome: ``"created"`` (absent, created with the declared configuration), ``"unchanged"`` (stored as
            declared), ``"applied"`` (the differences were written) or ``"warned"`` (differences logged, stored
            configuration kept).
        differences: every setting that differed, each with its fate (empty when created or unchanged).
    """

    info: StreamInfo
    outcome: Outcome
    differences: tuple[StreamDifference, ...] = ()

    @property
    def created(self) -> bool:
        return self.outcome == "created"

    @property
    def changed(self) -> bool:
        """Whether the ensure wrote anything (created the stream or applied differences)."""
        return self.outcome in ("created", "applied")


def compare_configs(asked: StreamConfig, stored: StreamConfig) -> list[tuple[str, Any, Any]]:
    """``(field, stored, asked)`` for every field (but the name) whose values differ, in declaration order."""
    return [
        (f.name, getattr(stored, f.name), getattr(asked, f.name))
        for f in dataclasses.fields(StreamConfig)
        if f.name != "name" and getattr(stored, f.name) != getattr(asked, f.name)
    ]


def ensure_stream(grid: Grid, config: StreamConfig, on_difference: OnDifference = "error") -> EnsureResult:
    """Create ``config``'s stream if it is absent; if present, compare its stored configuration with ``config``
    field by field and act on the differences as ``on_difference`` says.

    Args:
        grid: the connection.
        config: the configuration the caller declares for the stream, whole (settings left at their defaults are
            compared too).
        on_difference: ``"error"`` (default): refuse any difference; ``"warn"``: log a WARNING per difference and
            keep the stored configuration; ``"apply"``: write the declared values of the changeable settings
            (``CHANGEABLE_FIELDS``), all or nothing, and refuse when a setting that cannot change differs.

    Returns:
        An ``EnsureResult``: ``created``, ``unchanged``, ``applied`` or ``warned``, with every difference.

    Raises:
        StreamConfigConflictError: ``"error"`` and some setting differs, or ``"apply"`` and a setting that cannot
            change differs (nothing is then written); the message lists every difference with its fate and
            reason, and ``differences`` carries them as ``StreamDifference`` values.
    """
    require_grid(grid)
    if not isinstance(config, StreamConfig):
        raise ArgumentTypeError(f"ensure_stream needs a StreamConfig, not a {type(config).__name__}: {config!r}")
    if on_difference not in ON_DIFFERENCE:
        raise ConfigError(f"on_difference must be one of {', '.join(map(repr, ON_DIFFERENCE))}, got {on_difference!r}")
    metadata = grid.map(STREAMS_MAP)
    for _ in range(_MAX_ATTEMPTS):
        text = metadata.get(config.name)
        if text is None:
            text = _create(metadata, config)
            if text is None:
                return EnsureResult(_opened(grid, config), "created")
        stored = parse_metadata(config.name, text)
        found = compare_configs(config, stored.config)
        if not found:
            return EnsureResult(_opened(grid, config), "unchanged")
        if on_difference == "error":
            _refuse(config.name, [_refused_by_error(item) for item in found])
        if on_difference == "warn":
            return _warn(grid, stored.config, found)
        fixed = [name for name, _, _ in found if name not in CHANGEABLE_FIELDS]
        if fixed:
            _refuse(config.name, [_refused_by_apply(item, fixed) for item in found])
        if metadata.replace_if_same(config.name, text, _updated_json(text, config)):
            applied = tuple(StreamDifference(n, s, a, "applied") for n, s, a in found)
            for difference in applied:
                logger.info("stream %r: %s", config.name, difference.describe())
            return EnsureResult(_opened(grid, config), "applied", applied)
    raise StreamConfigConflictError(
        f"stream {config.name!r}: its stored configuration changed {_MAX_ATTEMPTS} times while this ensure compared "
        f"it (other parties ensuring other configurations at the same time); agree on one configuration and retry"
    )


def _create(metadata: Any, config: StreamConfig) -> str | None:
    """Store ``config`` as the stream's metadata unless a faster creator did: None when this call created it, else
    the winner's stored JSON (then compared like any stored configuration)."""
    winner: str | None = metadata.put_if_absent(config.name, metadata_json(config, int(time.time() * 1000)))
    if winner is None:
        logger.info("created stream %r (%d lanes, capacity %d)", config.name, config.lanes, config.capacity)
    return winner


def _updated_json(stored_text: str, config: StreamConfig) -> str:
    """The stored metadata document with ``config`` as its configuration; its creation time and the format version
    of the library that created the stream stay as they were."""
    document = json.loads(stored_text)
    document["metadata_version"] = METADATA_VERSION
    document["config"] = config.to_dict()
    return json.dumps(document, sort_keys=True, separators=(",", ":"))


def _refused_by_error(found: tuple[str, Any, Any]) -> StreamDifference:
    name, stored, asked = found
    if name in FIXED_REASONS:
        return StreamDifference(name, stored, asked, "refused", f"cannot change: {FIXED_REASONS[name]}")
    return StreamDifference(name, stored, asked, "refused", "on_difference='error'; 'apply' would change it")


def _refused_by_apply(found: tuple[str, Any, Any], fixed: list[str]) -> StreamDifference:
    name, stored, asked = found
    if name in FIXED_REASONS:
        return StreamDifference(name, stored, asked, "refused", f"cannot change: {FIXED_REASONS[name]}")
    return StreamDifference(
        name, stored, asked, "kept", f"not applied: {', '.join(fixed)} cannot change, so nothing was written"
    )


def _refuse(stream: str, differences: list[StreamDifference]) -> NoReturn:
    refused = [d.field for d in differences if d.fate == "refused"]
    layout = [name for name in refused if name in LAYOUT_FIELDS]
    fix = (
        f"keep the stored {', '.join(layout)} (a new layout needs a new stream name: a deleted stream's rings keep "
        f"their configuration until the cluster restarts)"
        if layout
        else "declare the stored values, or ensure with on_difference='apply' (`meteor streams ensure "
        f"{stream} --on-difference apply`) to change them"
    )
    error = StreamConfigConflictError(
        f"stream {stream!r} differs from the declared configuration in {len(differences)} setting(s): "
        f"{'; '.join(d.describe() for d in differences)}. Nothing was changed; {fix}"
    )
    error.differences = tuple(differences)
    raise error


def _opened(grid: Grid, config: StreamConfig) -> StreamInfo:
    """The stream opened by name (its rings configured from the stored layout), reported with ``config``: what
    this ensure stored or found, not what a concurrent ensure may have written since."""
    return dataclasses.replace(open_stream(grid, config.name, create=False), config=config)


def _warn(grid: Grid, stored: StreamConfig, found: list[tuple[str, Any, Any]]) -> EnsureResult:
    kept = tuple(StreamDifference(n, s, a, "kept", "on_difference='warn'") for n, s, a in found)
    for difference in kept:
        logger.warning(
            "stream %r: %s asked, %s stored; the stored value is kept (on_difference='warn')",
            stored.name,
            f"{difference.field}={difference.asked!r}",
            repr(difference.stored),
        )
    return EnsureResult(_opened(grid, stored), "warned", kept)
