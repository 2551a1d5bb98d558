"""Reading the values of Spark's option dict: names checked against the known ones, typed accessors (whole numbers,
sizes, durations, booleans, per-lane JSON, times) whose errors name the option, the value and the fix.

``options`` builds the typed ``SourceOptions`` / ``SinkOptions`` from these; nothing else reads the raw dict.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from meteor_spark.errors import ConfigError, unknown_option

#: Spark adds these keys itself (``load(path)`` / ``start(path)``, the sink's checkpoint and ``queryName``);
#: they are not typos.
_SPARK_ADDED = frozenset({"path", "checkpointlocation", "queryname"})


class RawOptions:
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


def per_lane_json(
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
            lane = as_int(lane_text)
            if lane is None or lane < 0:
                raise ConfigError(f"option {option!r}: stream {stream!r}: lane {lane_text!r} is not a lane number")
            lanes[stream][lane] = check(stream, lane, raw_value)
    return lanes


def timestamp_ms(option: str, value: Any, where: str = "") -> int:
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


def as_int(text: Any) -> int | None:
    try:
        return int(text)
    except (TypeError, ValueError):
        return None
