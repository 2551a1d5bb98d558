"""The live tail of a stream: the page polls with a cursor (per lane, the next ring sequence to read) and gets the
records written since, filtered by key, topic pattern and lane, with the cursor to ask from next time.

A poll reads at most ``ITEMS_PER_POLL`` ring items per lane and hands out at most ``RECORDS_PER_POLL`` records
(counting the ones it left out); items overwritten before the tail reached them are counted, not hidden. The
server keeps nothing per viewer: the cursor travels with each request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from meteor_spark.errors import ConfigError, FormatError, OffsetOutOfRangeError
from meteor_spark.format.records import decode_batch
from meteor_spark.format.routing import TopicMatcher
from meteor_spark.grid.client import Grid
from meteor_spark.grid.reading import check_lane, read_range
from meteor_spark.grid.streams import StreamInfo, lane_bounds

#: Ring items read per lane and poll at most.
ITEMS_PER_POLL = 50
#: Records one poll hands out at most (the rest are counted in ``dropped``).
RECORDS_PER_POLL = 200
#: Ring items per lane a tail without a cursor starts back from the end (what the page shows on opening).
START_BACK = 5


@dataclass(frozen=True)
class TailFilter:
    """Which records the tail shows: an exact key (UTF-8), a topic pattern (AMQP, as ``topics=``), one lane."""

    key: str | None = None
    topic: str | None = None
    lane: int | None = None

    @classmethod
    def parse(cls, info: StreamInfo, key: str | None, topic: str | None, lane: str | None) -> TailFilter:
        """From the query string; empty values mean no filter. A bad lane or topic pattern is a ConfigError."""
        number = None
        if lane:
            try:
                number = int(lane)
            except ValueError:
                raise ConfigError(f"lane {lane!r}: expected a lane number 0..{info.lanes - 1}") from None
            check_lane(info, number)
        if topic:
            TopicMatcher(topic, "topic")  # checks the pattern
        return cls(key or None, topic or None, number)


def parse_cursor(info: StreamInfo, text: str | None) -> dict[int, int] | None:
    """``"0:12,1:40"`` -> ``{0: 12, 1: 40}``; None for no cursor. Lanes missing from it start at their end."""
    if not text:
        return None
    try:
        pairs = [(int(lane), int(seq)) for lane, _, seq in (part.partition(":") for part in text.split(","))]
    except ValueError:
        raise ConfigError(f"cursor {text!r}: expected LANE:SEQUENCE[,LANE:SEQUENCE...]") from None
    return {check_lane(info, lane): max(0, seq) for lane, seq in pairs}


def format_cursor(cursor: dict[int, int]) -> str:
    return ",".join(f"{lane}:{seq}" for lane, seq in sorted(cursor.items()))


def _record_view(record: Any) -> dict[str, Any]:
    def text(raw: bytes | None) -> str | None:
        if raw is None:
            return None
        try:
            shown = raw.decode("utf-8")
        except UnicodeDecodeError:
            shown = "0x" + raw[:100].hex()
        return shown if len(shown) <= 300 else shown[:300] + "…"

    return {
        "lane": record.lane,
        "offset": record.offset,
        "timestamp_ms": record.timestamp_ms,
        "key": text(record.key),
        "topic": record.topic,
        "value": text(record.value),
    }


def tail(grid: Grid, info: StreamInfo, cursor: dict[int, int] | None, selection: TailFilter) -> dict[str, Any]:
    """The records after ``cursor`` that ``selection`` takes, oldest first per lane, and the next cursor."""
    bounds = lane_bounds(grid, info)
    lanes = range(info.lanes) if selection.lane is None else [selection.lane]
    nxt: dict[int, int] = {}
    records: list[dict[str, Any]] = []
    dropped = skipped = 0
    matcher = TopicMatcher(selection.topic, "topic") if selection.topic else None
    key = None if selection.key is None else selection.key.encode("utf-8")
    for lane in lanes:
        head, end = bounds[lane]
        start = max(head, end - START_BACK) if cursor is None or lane not in cursor else cursor[lane]
        start = min(start, end)
        stop = min(end, start + ITEMS_PER_POLL)
        nxt[lane] = stop
        if stop <= start:
            continue
        reader = read_range(grid, info, lane, start, stop, skip_data_loss=True)
        try:
            for items, sequences in reader:
                for raw, seq in zip(items, sequences, strict=True):
                    try:
                        batch = decode_batch(raw, stream=info.name, lane=lane, sequence=seq)
                    except FormatError:
                        skipped += 1
                        continue
                    for record in batch:
                        if key is not None and record.key != key:
                            continue
                        if matcher is not None and not matcher.matches(record.topic):
                            continue
                        if len(records) >= RECORDS_PER_POLL:
                            dropped += 1
                            continue
                        records.append(_record_view(record))
        except OffsetOutOfRangeError:
            nxt[lane] = lane_bounds(grid, info)[lane][1]  # the lane was truncated: go on from its new end
        skipped += reader.skipped_items
    return {"records": records, "cursor": format_cursor(nxt), "dropped": dropped, "skipped_items": skipped}
