"""What a subscriber cannot deliver: undecodable ring items and records its deserializers refuse, settled by the
``on_corrupt`` policy (``meteor_spark.format.corrupt.CorruptItemPolicy``).

The policy decides (error, skip, dead_letter); this module carries the decision out and keeps its figures: it owns
the dead-letter publisher, publishes a refused item or record and waits for the grid's acknowledgement before the
reader may move past it, counts what was passed over and logs it truthfully. Where the reader's position stands is
the reader's business (``meteor_spark.consumer.subscriber``), so nothing here touches positions.
"""

from __future__ import annotations

import logging

from meteor_spark.errors import DeserializationError, FormatError, StreamNotFoundError
from meteor_spark.format.corrupt import CorruptItemPolicy, dead_letter_for_record, dead_letter_record
from meteor_spark.format.offsets import first_offset_of
from meteor_spark.format.records import BatchPart, Record
from meteor_spark.format.serializers import DecodedLane, Deserializer, deserialize_lane
from meteor_spark.grid.client import Grid
from meteor_spark.grid.streams import StreamConfig
from meteor_spark.producer.publisher import Publisher

logger = logging.getLogger("meteor_spark.consumer.subscriber")


def dead_letter_publisher(grid: Grid, name: str) -> Publisher:
    """A publisher to the dead-letter stream ``name``, created with the default configuration when missing."""
    try:
        return Publisher(grid, name, value_serializer="bytes")
    except StreamNotFoundError:
        return Publisher(grid, StreamConfig(name), value_serializer="bytes")


class Refusals:
    """A subscriber's undecodable items and refused records: dead letters, counts and log lines.

    Attributes:
        policy: the parsed ``on_corrupt`` policy.
        corrupt_items: undecodable ring items passed over (skip or dead_letter).
        corrupt: ``(lane, sequence)`` of each of them.
        undecodable_records: records the deserializers refused and the policy passed over.
    """

    def __init__(self, grid: Grid | None, stream: str, policy: CorruptItemPolicy) -> None:
        """``grid`` None: no dead-letter publisher of its own (the asyncio subscriber publishes dead letters with an
        ``AsyncPublisher``); its owner publishes ``dead_letters_of`` / ``dead_letter_record`` itself."""
        self.policy = policy
        self.stream = stream
        self.corrupt_items = 0
        self.corrupt: list[tuple[int, int]] = []
        self.undecodable_records = 0
        self._dead_letters = (
            None
            if policy.dead_letter_stream is None or grid is None
            else dead_letter_publisher(grid, policy.dead_letter_stream)
        )

    def dead_letter_item(self, lane: int, sequence: int, raw: bytes, error: FormatError) -> None:
        """With ``dead_letter``: publish an undecodable item and wait for the grid's acknowledgement (a failure
        raises, and nothing moved); otherwise nothing to do."""
        if self._dead_letters is not None:
            self._dead_letters.publish(
                dead_letter_record(raw, stream=self.stream, lane=lane, sequence=sequence, error=error)
            )

    def passed_item(self, lane: int, sequence: int, error: FormatError) -> None:
        """Count and log an undecodable item the reader has moved past."""
        self.corrupt_items += 1
        self.corrupt.append((lane, sequence))
        logger.warning(
            "stream %r lane %d: passed over the undecodable ring item at sequence %d (offset %d)%s: %s",
            self.stream,
            lane,
            sequence,
            first_offset_of(sequence),
            self._how(),
            error,
        )

    def deserialize(
        self, taken: dict[int, list[BatchPart]], value: Deserializer | None, key: Deserializer | None
    ) -> dict[int, DecodedLane]:
        """Deserialize the records taken, lane by lane, applying the policy to those refused: with ``error`` a
        lane's taken parts are cut before its first refused record (``taken`` is updated); a dead letter is
        acknowledged before the record is passed over (a failure raises before any position moved: the next poll
        retries)."""
        decoded = self.decode(taken, value, key)
        if self._dead_letters is not None:
            for record in self.dead_letters_of(decoded):
                self._dead_letters.publish(record)
        self.count_refused(decoded)
        return decoded

    def decode(
        self, taken: dict[int, list[BatchPart]], value: Deserializer | None, key: Deserializer | None
    ) -> dict[int, DecodedLane]:
        """The deserializing step of ``deserialize`` alone (no dead letter published, nothing counted): the
        asyncio subscriber publishes the dead letters itself, awaited, then calls ``count_refused``."""
        decoded: dict[int, DecodedLane] = {}
        for lane, parts in taken.items():
            lane_result = deserialize_lane(parts, value, key, stop_at_failure=self.policy.is_error)
            if lane_result.stopped is not None:
                taken[lane] = lane_result.parts
            decoded[lane] = lane_result
        return decoded

    def dead_letters_of(self, decoded: dict[int, DecodedLane]) -> list[Record]:
        """With ``dead_letter``: the records to publish for the records refused; otherwise none."""
        if self.policy.dead_letter_stream is None:
            return []
        return [dead_letter_for_record(raw, error) for lane in decoded.values() for raw, error in lane.refused]

    def count_refused(self, decoded: dict[int, DecodedLane]) -> None:
        """Count and log the records refused and passed over (their dead letters acknowledged)."""
        for lane_result in decoded.values():
            for raw, error in lane_result.refused:
                self._passed_over(raw, error)

    def refuse_record(self, raw: Record, error: DeserializationError) -> None:
        """A record decoded outside ``deserialize`` (a Spark task's typed ``value`` column) that failed: with
        ``dead_letter`` published first (a failure raises), then counted and logged."""
        if self._dead_letters is not None:
            self._dead_letters.publish(dead_letter_for_record(raw, error))
        self._passed_over(raw, error)

    def _passed_over(self, raw: Record, error: DeserializationError) -> None:
        self.undecodable_records += 1
        logger.warning(
            "stream %r lane %d: passed over the record at offset %d%s: %s",
            self.stream,
            raw.lane,
            raw.offset,
            self._how(),
            error,
        )

    def _how(self) -> str:
        if self.policy.dead_letter_stream is not None:
            return f" after publishing it to dead-letter stream {self.policy.dead_letter_stream!r}"
        return " (on_corrupt=skip)"

    def close(self) -> None:
        if self._dead_letters is not None:
            self._dead_letters.close()
