"""Spark offsets of the meteor source: per stream, per lane, the next ring sequence to read.

The JSON form is ``{"<stream>": {"<lane>": next_ring_sequence}}`` with streams sorted by name and lanes in
numeric order. Spark compares offsets **as JSON strings** (its runner serialises our dict with ``json.dumps``,
keeping insertion order), so a logically equal offset with another key order would count as new data and run an
empty batch; ``SparkOffset.to_json`` always builds the dict in the canonical order.

End offsets are exclusive: ``{"orders": {"0": 42}}`` as the end of a batch means the batch read lane 0 up to ring
sequence 41, and the next batch starts at 42. The record offset of "everything before sequence 42" is
``42 << 16`` (``meteor_spark.offsets.first_offset_of(42)``), which is what a group confirms for it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

from meteor_spark.errors import ConfigError


@dataclass(frozen=True)
class SparkOffset:
    """An immutable, canonically ordered position over several streams' lanes.

    Attributes:
        positions: ``((stream, lane, next_sequence), ...)`` sorted by stream name, then lane number.
    """

    positions: tuple[tuple[str, int, int], ...]

    @classmethod
    def of(cls, mapping: Mapping[str, Mapping[int, int]]) -> "SparkOffset":
        """Build from ``{stream: {lane: next_sequence}}``."""
        return cls(
            tuple(
                (stream, int(lane), int(sequence))
                for stream in sorted(mapping)
                for lane, sequence in sorted(mapping[stream].items(), key=lambda kv: int(kv[0]))
            )
        )

    @classmethod
    def from_json(cls, document: Any) -> "SparkOffset":
        """Parse the dict Spark hands back (``json.loads`` of what ``to_json`` returned, e.g. from a checkpoint).

        Raises:
            ConfigError: the document is not ``{stream: {lane: sequence}}`` (a checkpoint written by another
                source, or edited by hand); the message shows it.
        """
        if isinstance(document, str):
            document = json.loads(document)
        problem = "expected {stream: {lane: next_sequence}}"
        if not isinstance(document, dict):
            raise ConfigError(f"not a meteor offset ({problem}): {json.dumps(document)}")
        mapping: dict[str, dict[int, int]] = {}
        for stream, lanes in document.items():
            if not isinstance(lanes, dict):
                raise ConfigError(f"not a meteor offset ({problem}): {json.dumps(document)}")
            mapping[stream] = {}
            for lane, sequence in lanes.items():
                try:
                    lane_number = int(lane)
                except (TypeError, ValueError):
                    raise ConfigError(f"not a meteor offset (lane {lane!r}): {json.dumps(document)}") from None
                if isinstance(sequence, bool) or not isinstance(sequence, int) or sequence < 0:
                    raise ConfigError(f"not a meteor offset (sequence {sequence!r}): {json.dumps(document)}")
                mapping[stream][lane_number] = sequence
        return cls.of(mapping)

    def to_json(self) -> dict[str, dict[str, int]]:
        """The dict Spark serialises; insertion order is the canonical order."""
        result: dict[str, dict[str, int]] = {}
        for stream, lane, sequence in self.positions:
            result.setdefault(stream, {})[str(lane)] = sequence
        return result

    def dumps(self) -> str:
        """The JSON text Spark stores (its identity)."""
        return json.dumps(self.to_json())

    def as_dict(self) -> dict[tuple[str, int], int]:
        return {(stream, lane): sequence for stream, lane, sequence in self.positions}

    def get(self, stream: str, lane: int) -> int | None:
        for s, l, sequence in self.positions:
            if s == stream and l == lane:
                return sequence
        return None

    def lanes(self) -> Iterator[tuple[str, int]]:
        for stream, lane, _ in self.positions:
            yield stream, lane

    def streams(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(stream for stream, _, _ in self.positions))

    def total_items_to(self, end: "SparkOffset") -> int:
        """Ring items between this offset and ``end`` (lanes missing here count from 0)."""
        start = self.as_dict()
        return sum(max(0, seq - start.get(key, 0)) for key, seq in end.as_dict().items())
