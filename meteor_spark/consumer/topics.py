"""A ``Subscriber``'s topics: filtering by AMQP patterns, and the at-most-once rules of ephemeral streams
(``TopicReading``, a base class of ``Subscriber``).

``Subscriber(..., topics="orders.*.created")`` (a pattern or a list; ``meteor_spark.format.routing.TopicMatcher``)
hands out only the records whose topic matches; the others are passed over (the position moves past them, so
``confirm()`` confirms them) and counted in ``filtered_records``. Without ``topics`` every record is handed out
(on an ephemeral stream the subscriber registers ``#``, match-all).

On an **ephemeral** stream (``StreamConfig(ephemeral=True)``) the subscriber is a consuming entity, or a member of
one (its group), and delivery is at most once:

- It registers its patterns in the stream's registry (``meteor_spark.grid.subscriptions``) before reading, and
  renews the entry while it polls; publishers store only records some live entity matches.
- It starts at the lanes' ends: nothing published before it subscribed is delivered. A group keeps its position
  across member changes, but a member that finds no live member of its group when it joins starts each lane whose
  group offset nobody moved since at the lane's end (the group was gone: what was stored meanwhile is not its).
- Grouped, it saves the lanes' positions in the group before it hands the records out (one fenced confirm per
  lane; a lane lost meanwhile is not handed out), so a member that dies while processing loses those records and
  nobody gets them again.
- There is no acknowledgement: ``confirm``, ``seek``, ``auto_confirm_interval_ms`` and shared groups raise
  ``ConfigError``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from meteor_spark.consumer.lane_state import SubscriberFields
from meteor_spark.errors import ConfigError, FencedError, NotAssignedError
from meteor_spark.format.offsets import InitialOffsetScheme, first_offset_of
from meteor_spark.format.records import BatchPart, Record, RecordBatch
from meteor_spark.format.routing import TOPIC_HEADER, TopicMatcher
from meteor_spark.format.serializers import Deserializer
from meteor_spark.grid.subscriptions import (
    DEFAULT_SUBSCRIPTION_TTL_MS,
    MIN_SUBSCRIPTION_TTL_MS,
    Subscription,
    SubscriptionLease,
    live_subscriptions,
)
from meteor_spark.groups.store import OFFSETS_MAP, ConfirmedOffset, read_offset
from meteor_spark.validate import check_int

logger = logging.getLogger(__name__)

__all__ = [
    "TopicReading",
    "entity_of",
    "entity_was_gone",
    "ephemeral_lane_start",
    "ephemeral_scheme",
    "filtered_batch",
    "part_topics",
    "refuse_on_ephemeral",
    "registration",
    "stale_offsets",
    "without_lanes",
]


def refuse_on_ephemeral(info: Any, what: str) -> None:
    """``ConfigError`` for an acknowledgement or seek on an ephemeral stream (``info``: its ``StreamInfo``)."""
    if info.config.ephemeral:
        raise ConfigError(
            f"{what}: stream {info.name!r} is ephemeral (at-most-once): there is no acknowledgement and no going "
            f"back, a group's position is saved when records are handed out; use a persistent stream to "
            f"confirm, seek or nack"
        )


def entity_of(group: str | None, member_id: str) -> str:
    """The consuming entity a reader belongs to: its group, or itself."""
    return f"group/{group}" if group is not None else f"subscriber/{member_id}"


def part_topics(part: BatchPart) -> list[str]:
    """The topic of each record of ``part`` (``""`` for none), from the item's header columns only."""
    item = part.item
    n = part.size
    if item.header_counts is None or item.hkey_data is None or item.hvalue_data is None:
        return [""] * n
    ho = item.header_offsets[part.start : part.stop + 1].tolist()
    hko = item.hkey_offsets.tolist()
    hvo = item.hvalue_offsets.tolist()
    hkeys = bytes(item.hkey_data)
    hvalues = bytes(item.hvalue_data)
    wanted = TOPIC_HEADER.encode("utf-8")
    out = []
    for i in range(n):
        topic = ""
        for j in range(ho[i], ho[i + 1]):
            if hkeys[hko[j] : hko[j + 1]] == wanted:
                topic = hvalues[hvo[j] : hvo[j + 1]].decode("utf-8", "replace")
        out.append(topic)
    return out


def filtered_batch(batch: RecordBatch, matcher: TopicMatcher, decoded: bool) -> RecordBatch:
    """The records of ``batch`` whose topic ``matcher`` matches, in runs of their parts (``decoded``: the batch
    carries deserialized records, kept in step with the parts)."""
    records: list[Record] | None = list(batch) if decoded else None
    parts: list[BatchPart] = []
    kept_records: list[Record] = []
    at = 0
    for part in batch.parts:
        topics = part_topics(part) if records is None else [r.topic for r in records[at : at + part.size]]
        run_start = None
        for i, topic in enumerate([*topics, None]):
            wanted = topic is not None and matcher.matches(topic)
            if wanted and run_start is None:
                run_start = i
            elif not wanted and run_start is not None:
                base = part.start
                parts.append(BatchPart(part.stream, part.lane, part.sequence, part.item, base + run_start, base + i))
                if records is not None:
                    kept_records.extend(records[at + run_start : at + i])
                run_start = None
        at += part.size
    return RecordBatch(parts, kept_records if records is not None else None)


def ephemeral_scheme(info: Any, scheme: InitialOffsetScheme, ttl_ms: int | None) -> InitialOffsetScheme:
    """Where a reader of the stream ``info`` describes starts, after checking ``subscription_ttl_ms`` and the
    initial offset scheme against it: LATEST on an ephemeral stream (the lanes' ends), ``scheme`` otherwise.

    Raises:
        ConfigError: a TTL out of range or on a persistent stream, or a scheme other than LATEST on an ephemeral one.
    """
    if ttl_ms is not None:
        check_int("subscription_ttl_ms", ttl_ms, MIN_SUBSCRIPTION_TTL_MS, 3_600_000)
    if not info.config.ephemeral:
        if ttl_ms is not None:
            raise ConfigError(
                f"subscription_ttl_ms: stream {info.name!r} is not ephemeral; only readers of ephemeral "
                f"streams register, leave it unset"
            )
        return scheme
    if scheme not in (InitialOffsetScheme.AUTO, InitialOffsetScheme.LATEST):
        raise ConfigError(
            f"initial_offset_scheme {scheme.name}: stream {info.name!r} is ephemeral, so a reader starts "
            f"at the lanes' ends (nothing published before it subscribed is delivered); leave it unset or LATEST"
        )
    return InitialOffsetScheme.LATEST


def registration(
    entity: str, member_id: str, matcher: TopicMatcher | None, ttl_ms: int | None
) -> tuple[Subscription, int]:
    """A reading member's registry entry (its patterns, ``#`` without ``topics``) and its TTL."""
    patterns = ("#",) if matcher is None else matcher.patterns
    return Subscription(entity, member_id, patterns), DEFAULT_SUBSCRIPTION_TTL_MS if ttl_ms is None else ttl_ms


def entity_was_gone(entity: str, live: Iterable[Subscription]) -> bool:
    """Whether no member of ``entity`` is registered (``live``: the registry read before this member registers):
    a group joining then had no live member, so the offsets it stored are from a previous life."""
    return not any(s.entity == entity for s in live)


def stale_offsets(stored: Mapping[int, ConfirmedOffset | None]) -> dict[int, int]:
    """lane -> the group's stored offset, of the lanes that have one (``stored``: read when the group was gone)."""
    return {lane: entry.offset for lane, entry in stored.items() if entry is not None and entry.offset is not None}


def ephemeral_lane_start(stale: int | None, position: int, next_seq: int) -> int:
    """Where a grouped reader of an ephemeral stream starts a lane it takes up: ``position`` (the group's offset),
    or the lane's end when that offset is still ``stale`` (the one stored when the group was gone: nobody of the
    revived group moved it, and what was stored meanwhile is not the group's)."""
    end = first_offset_of(next_seq)
    if stale is None or stale != position or position >= end:
        return position
    return end


def without_lanes(batch: RecordBatch, lost: set[int], decoded: bool) -> RecordBatch:
    """``batch`` without the records of the ``lost`` lanes (``decoded``: the batch carries deserialized records,
    kept in step with its parts)."""
    if not lost:
        return batch
    kept = [part for part in batch.parts if part.lane not in lost]
    records = [record for record in batch if record.lane not in lost] if decoded else None
    return RecordBatch(kept, records)


class TopicReading(SubscriberFields):
    """The topic side of a ``Subscriber`` (see the module docs); every attribute is the ``Subscriber``'s."""

    scheme: InitialOffsetScheme
    delivered_records: int
    _value_deserializer: Deserializer | None
    _key_deserializer: Deserializer | None
    _matcher: TopicMatcher | None
    _subscription: SubscriptionLease | None
    _stale_offsets: dict[int, int]
    filtered_records: int

    @property
    def ephemeral(self) -> bool:
        """Whether the stream is ephemeral (at-most-once, no acknowledgement)."""
        return bool(self.info.config.ephemeral)

    def _open_topics(self, topics: Any, ttl_ms: int | None, member_id: str) -> None:
        """Check ``topics`` and the ephemeral rules; on an ephemeral stream, register before reading anything."""
        self.filtered_records = 0
        self._stale_offsets = {}
        self._subscription = None
        self._matcher = None if topics is None else TopicMatcher(topics, "topics")
        self.scheme = ephemeral_scheme(self.info, self.scheme, ttl_ms)
        if not self.ephemeral:
            return
        entity = entity_of(self.group, member_id)
        if self.group is not None and entity_was_gone(entity, live_subscriptions(self._grid, self.stream)):
            offsets = self._grid.map(OFFSETS_MAP)
            lanes = range(self.info.lanes)
            self._stale_offsets = stale_offsets(
                {lane: read_offset(offsets, self.stream, self.group, lane) for lane in lanes}
            )
        subscription, ttl = registration(entity, member_id, self._matcher, ttl_ms)
        self._subscription = SubscriptionLease(self._grid, self.stream, subscription, ttl)

    @property
    def _decoded_records(self) -> bool:
        """Whether batches carry deserialized records (kept in step with their parts when filtering)."""
        return self._value_deserializer is not None or self._key_deserializer is not None

    def _renew_subscription(self) -> float:
        """Renew the registry entry when due; how long a waiting poll may sleep before the next renewal."""
        lease = self._subscription
        if lease is None:
            return float("inf")
        lease.renew_if_due()
        return lease.seconds_to_renewal()

    def _close_subscription(self) -> None:
        lease, self._subscription = self._subscription, None
        if lease is not None:
            lease.close()

    def _lane_start(self, lane: int, position: int, next_seq: int) -> int:
        """Where a grouped reader starts a lane it takes up (``ephemeral_lane_start``), the group's offset moved
        there when it is the lane's end."""
        end = ephemeral_lane_start(self._stale_offsets.pop(lane, None), position, next_seq)
        if end == position:
            return position
        self._member.seek(lane, end)
        logger.info(
            "ephemeral stream %r lane %d: group %r had no live member, starting at the end (offset %d, not %d)",
            self.stream,
            lane,
            self.group,
            end,
            position,
        )
        return end

    def _hand_out(self, batch: RecordBatch) -> RecordBatch:
        """What ``poll`` hands out of ``batch``: the records matching ``topics``, with, on an ephemeral stream,
        the grouped lanes' positions saved first (a lane whose save is refused is not handed out)."""
        filtering = self._matcher is not None and not self._matcher.match_all
        saving = self.ephemeral and self._member is not None
        if not batch or not (filtering or saving):
            return batch
        lanes = sorted({part.lane for part in batch.parts})
        if filtering:
            before = len(batch)
            batch = self._filtered(batch)
            self.filtered_records += before - len(batch)
            self.delivered_records -= before - len(batch)
        if saving:
            before = len(batch)
            batch = without_lanes(batch, self._save_positions(lanes), self._decoded_records)
            self.delivered_records -= before - len(batch)
        return batch

    def _filtered(self, batch: RecordBatch) -> RecordBatch:
        assert self._matcher is not None
        return filtered_batch(batch, self._matcher, self._decoded_records)

    def _save_positions(self, lanes: list[int]) -> set[int]:
        """Grouped, ephemeral: store each lane's new position in the group (fenced); the lanes refused."""
        lost: set[int] = set()
        for lane in lanes:
            with self._lock:
                state = self._lanes.get(lane)
                todo = None if state is None else (state.position, state.epoch, state.position_mark)
            if todo is None:
                lost.add(lane)
                continue
            try:
                self._member.confirm(lane, todo[0], epoch=todo[1], mark=todo[2])
            except (FencedError, NotAssignedError) as exc:
                logger.info(
                    "ephemeral stream %r lane %d lost before hand-out, not delivered: %s", self.stream, lane, exc
                )
                lost.add(lane)
                continue
            with self._lock:
                if state is not None:
                    state.confirmed_at(todo[0])
        return lost
