"""Spark offsets of the meteor source: per stream, per lane, the next ring sequence to read.

The JSON form is ``{"<stream>": {"<lane>": next_ring_sequence}}`` with streams sorted by name and lanes in
numeric order. Spark compares offsets **as JSON strings** (its runner serialises our dict with ``json.dumps``,
keeping insertion order), so a logically equal offset with another key order would count as new data and run an
empty batch; ``SparkOffset.to_json`` always builds the dict in the canonical order.

End offsets are exclusive: ``{"orders": {"0": 42}}`` as the end of a batch means the batch read lane 0 up to ring
sequence 41, and the next batch starts at 42. The record offset of "everything before sequence 42" is
``42 << 16`` (``meteor_spark.format.offsets.first_offset_of(42)``), which is what a group confirms for it.

Bookkeeping of the query rides along under the key ``"@meteor"`` (``META_KEY``: ``@`` cannot start a stream name),
present only when there is something to carry, so the offsets of most queries are plain position maps:

* ``"skipped": {"<stream>": {"<lane>": n}}``: ring items of the lane lost to overwriting (``failOnDataLoss=false``)
  since the query started, cumulative. Spark checkpoints every batch's end offset and replays a batch with the
  logged one, so each lost item is counted once per query, across restarts, without any state of our own. (Items
  overwritten after their batch was planned are skipped and logged where they are found, outside this count.)
  Checkpoints written before this key existed read as 0.
* ``"items": n``: ring items read by the batch this offset ends, only on a query's first batch (Spark's progress
  report has no start offset for it, and ``lag`` needs the items read to estimate records per item).

* ``"marks": {"<stream>": {"<lane>": [sequence, crc]}}``: the ``meteor_spark.grid.item_marks.ItemMark`` of the item just
  before each lane's position (the last item the batch ending here read). A query restarting from this offset
  reads that item again, and so does the task reading the next batch from it in a running query: another item
  there means the lane was truncated and refilled under the position (``LaneTruncatedError``). Checkpoints written
  before this key existed are not checked.

``SparkOffset.from_json`` reads every form; ``positions`` never contains the bookkeeping.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from meteor_spark.errors import ConfigError
from meteor_spark.grid.item_marks import ItemMark

#: Key of the query's bookkeeping in the offset JSON; a stream name cannot start with ``@``.
META_KEY = "@meteor"


@dataclass(frozen=True)
class SparkOffset:
    """An immutable, canonically ordered position over several streams' lanes.

    Attributes:
        positions: ``((stream, lane, next_sequence), ...)`` sorted by stream name, then lane number.
        skipped: ``((stream, lane, items), ...)``, same order: items lost to overwriting since the query started
            (lanes with none are left out).
        batch_items: ring items read by the batch ending here, on a query's first batch only (else None).
        marks: ``((stream, lane, sequence, crc), ...)``, same order: the item marks of the items before the
            positions (lanes without one are left out).
    """

    positions: tuple[tuple[str, int, int], ...]
    skipped: tuple[tuple[str, int, int], ...] = ()
    batch_items: int | None = None
    marks: tuple[tuple[str, int, int, int], ...] = ()

    @classmethod
    def of(
        cls,
        mapping: Mapping[str, Mapping[int, int]],
        skipped: Mapping[tuple[str, int], int] | None = None,
        batch_items: int | None = None,
        marks: Mapping[tuple[str, int], ItemMark] | None = None,
    ) -> SparkOffset:
        """Build from ``{stream: {lane: next_sequence}}`` (and ``{(stream, lane): items}`` lost so far, and the item
        marks of the lanes' positions)."""
        return cls(
            _canonical(mapping),
            tuple(sorted((stream, lane, n) for (stream, lane), n in (skipped or {}).items() if n)),
            batch_items,
            tuple(sorted((stream, lane, m.sequence, m.crc) for (stream, lane), m in (marks or {}).items())),
        )

    @classmethod
    def from_json(cls, document: Any) -> SparkOffset:
        """Parse the dict Spark hands back (``json.loads`` of what ``to_json`` returned, e.g. from a checkpoint).

        Raises:
            ConfigError: the document is not ``{stream: {lane: sequence}}`` (a checkpoint written by another
                source, or edited by hand); the message shows it.
        """
        if isinstance(document, str):
            document = json.loads(document)
        if not isinstance(document, dict):
            raise ConfigError(
                f"not a meteor offset (expected {{stream: {{lane: next_sequence}}}}): {json.dumps(document)}"
            )
        document = dict(document)
        meta = document.pop(META_KEY, None) or {}
        if not isinstance(meta, dict):
            raise ConfigError(f"not a meteor offset ({META_KEY} {meta!r}): {json.dumps(document)}")
        mapping = _lane_map(document, document)
        skipped = _lane_map(meta.get("skipped") or {}, document)
        items = meta.get("items")
        if items is not None and (isinstance(items, bool) or not isinstance(items, int) or items < 0):
            raise ConfigError(f"not a meteor offset (items {items!r}): {json.dumps(document)}")
        marks: dict[tuple[str, int], ItemMark] = {}
        raw_marks = meta.get("marks") or {}
        if not isinstance(raw_marks, dict):
            raise ConfigError(f"not a meteor offset (marks {raw_marks!r}): {json.dumps(document)}")
        for stream, lanes in raw_marks.items():
            for lane, raw in lanes.items() if isinstance(lanes, dict) else ():
                mark = ItemMark.decode(raw)
                if mark is None or not str(lane).isdigit():
                    raise ConfigError(f"not a meteor offset (mark {raw!r} of lane {lane!r}): {json.dumps(document)}")
                marks[(stream, int(lane))] = mark
        return cls.of(
            mapping,
            {(stream, lane): n for stream, lanes in skipped.items() for lane, n in lanes.items()},
            items,
            marks,
        )

    def to_json(self) -> dict[str, Any]:
        """The dict Spark serialises; insertion order is the canonical order."""
        result: dict[str, Any] = {}
        for stream, lane, sequence in self.positions:
            result.setdefault(stream, {})[str(lane)] = sequence
        meta: dict[str, Any] = {}
        if self.batch_items is not None:
            meta["items"] = self.batch_items
        if self.skipped:
            skipped: dict[str, dict[str, int]] = {}
            for stream, lane, items in self.skipped:
                skipped.setdefault(stream, {})[str(lane)] = items
            meta["skipped"] = skipped
        if self.marks:
            marks: dict[str, dict[str, list[int]]] = {}
            for stream, lane, sequence, crc in self.marks:
                marks.setdefault(stream, {})[str(lane)] = [sequence, crc]
            meta["marks"] = marks
        if meta:
            result[META_KEY] = meta
        return result

    def dumps(self) -> str:
        """The JSON text Spark stores (its identity)."""
        return json.dumps(self.to_json())

    def as_dict(self) -> dict[tuple[str, int], int]:
        return {(stream, lane): sequence for stream, lane, sequence in self.positions}

    def skipped_dict(self) -> dict[tuple[str, int], int]:
        """Items lost to overwriting since the query started, per lane (lanes with none are absent)."""
        return {(stream, lane): items for stream, lane, items in self.skipped}

    def marks_dict(self) -> dict[tuple[str, int], ItemMark]:
        """The item marks of the lanes' positions, per lane (lanes without one are absent)."""
        return {(stream, lane): ItemMark(sequence, crc) for stream, lane, sequence, crc in self.marks}

    @property
    def skipped_items(self) -> int:
        return sum(items for _, _, items in self.skipped)

    def get(self, stream: str, lane: int) -> int | None:
        for s, ln, sequence in self.positions:
            if s == stream and ln == lane:
                return sequence
        return None

    def lanes(self) -> Iterator[tuple[str, int]]:
        for stream, lane, _ in self.positions:
            yield stream, lane

    def streams(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(stream for stream, _, _ in self.positions))

    def total_items_to(self, end: SparkOffset) -> int:
        """Ring items between this offset and ``end`` (lanes missing here count from 0)."""
        start = self.as_dict()
        return sum(max(0, seq - start.get(key, 0)) for key, seq in end.as_dict().items())


def _canonical(mapping: Mapping[str, Mapping[int, int]]) -> tuple[tuple[str, int, int], ...]:
    """Sorted by stream name, then lane number: one sort of all lanes (a pattern query may read thousands)."""
    return tuple(
        sorted(
            (stream, int(lane), int(sequence)) for stream, lanes in mapping.items() for lane, sequence in lanes.items()
        )
    )


def _lane_map(lanes_by_stream: Any, document: Any) -> dict[str, dict[int, int]]:
    """``{stream: {lane: n}}`` with whole numbers n >= 0, or a ConfigError showing ``document``."""
    if not isinstance(lanes_by_stream, dict):
        raise ConfigError(f"not a meteor offset (expected {{stream: {{lane: n}}}}): {json.dumps(document)}")
    mapping: dict[str, dict[int, int]] = {}
    for stream, lanes in lanes_by_stream.items():
        if not isinstance(lanes, dict):
            raise ConfigError(f"not a meteor offset (expected {{stream: {{lane: n}}}}): {json.dumps(document)}")
        mapping[stream] = {}
        for lane, number in lanes.items():
            try:
                lane_number = int(lane)
            except (TypeError, ValueError):
                raise ConfigError(f"not a meteor offset (lane {lane!r}): {json.dumps(document)}") from None
            if isinstance(number, bool) or not isinstance(number, int) or number < 0:
                raise ConfigError(f"not a meteor offset (sequence {number!r}): {json.dumps(document)}")
            mapping[stream][lane_number] = number
    return mapping
