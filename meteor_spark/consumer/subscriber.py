"""The Subscriber, ungrouped or grouped (its push-style ``Receiver`` is in ``meteor_spark.consumer.receiver``).

An **ungrouped** subscriber reads every lane of a stream with its own, local positions (lost on close, like
Meteor). A **grouped** subscriber is a member of a subscriber group (``meteor_spark.groups.exclusive.GroupMember``): it
reads only the lanes the group assigned to it, starts each at the group's confirmed offset (else the initial scheme),
re-validates its lease before delivering a batch (so a lane it lost is never delivered again), and confirms
offsets synchronously and fenced.


Offsets: ``position(lane)`` is the offset of the next record to deliver; ``last_offset(lane)`` that of the last
one delivered. ``confirm()`` stores every delivered position in the group (the confirmed offset means "the next
record to read"); ``confirm(offset)`` / ``confirm(record)`` stores "everything up to and including this record".
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from meteor_spark.consumer.auto_confirm import AutoConfirm
from meteor_spark.consumer.exclusive_nack import ExclusiveNack
from meteor_spark.consumer.lane_reader import LaneReader
from meteor_spark.consumer.lane_state import LaneState
from meteor_spark.consumer.receiver import ErrorHandler, Receiver, RecordHandler
from meteor_spark.consumer.refusals import Refusals
from meteor_spark.consumer.subscriber_offsets import SubscriberOffsets
from meteor_spark.consumer.subscriber_options import SubscriberOptions
from meteor_spark.consumer.topics import refuse_on_ephemeral
from meteor_spark.consumer.wakeup import Wakeup
from meteor_spark.errors import (
    ConfigError,
    FencedError,
    GroupError,
    MeteorError,
)
from meteor_spark.format.avro import AvroValues
from meteor_spark.format.offsets import (
    InitialOffsetScheme,
    resolve_initial,
    sequence_of,
)
from meteor_spark.format.records import RecordBatch
from meteor_spark.format.serializers import Deserializer
from meteor_spark.grid.client import Grid, require_grid
from meteor_spark.grid.item_gate import ItemGate
from meteor_spark.grid.reading import oldest_in
from meteor_spark.grid.streams import StreamConfig, StreamInfo, open_stream
from meteor_spark.grid.typed_values import value_deserializer_for
from meteor_spark.groups.balancing import default_member_id
from meteor_spark.groups.exclusive import GroupMember
from meteor_spark.metrics import attach as attach_metrics
from meteor_spark.metrics import registry_of as metrics_registry
from meteor_spark.validate import check_timeout

logger = logging.getLogger(__name__)

__all__ = ["InitialOffsetScheme", "Receiver", "RecordHandler", "Subscriber"]


class Subscriber(SubscriberOffsets, LaneReader, ExclusiveNack):
    """Reads records from a stream.

    Args:
        grid: the grid connection.
        stream: a ``StreamConfig`` (created when missing) or the name of an existing stream.
        shared: deprecated spelling of ``SharedSubscriber(grid, stream, group=...)`` (a member of a *shared*
            group: queue semantics, records acquired for a time and acknowledged one by one); the object made is a
            ``SharedSubscriber``, not a ``Subscriber`` (see ``__new__``).
        group: subscriber group name; None = ungrouped.
        initial_offset_scheme: where to start without a position (``InitialOffsetScheme`` or its name).
        skip_data_loss: skip (and count) lost records instead of raising ``DataLossError``; a lane truncated and
            refilled under the group's offset (grouped, on taking it up) or under the reader's position (while it
            reads across a member restart) is read again from its oldest record (counted in ``truncated_lanes``)
            instead of raising ``LaneTruncatedError``.
        on_corrupt: what to do with a ring item that cannot be decoded: ``"error"`` (default: ``FormatError``,
            position left at the item), ``"skip"`` (counted in ``corrupt_items``, logged) or ``"dead_letter"``.
        dead_letter_after: grouped: a group setting (stored with the group by the first member that gives it):
            a record ``nack``-ed more than this many records behind the furthest one the group delivered on its lane
            goes to ``dead_letter_stream`` instead of being redelivered (``meteor_spark.consumer.exclusive_nack``).
        dead_letter_stream: the stream undecodable items are published to (implies ``on_corrupt="dead_letter"``);
            opened by name, created with the default configuration when missing. Each refused item becomes one
            record (its raw bytes, with headers naming source stream, lane, sequence, offset and the error;
            ``meteor_spark.format.corrupt``), acknowledged by the grid before reading goes on.
        value_deserializer, key_deserializer: turn stored values / keys (keys that are set) into objects:
            ``"json"``, ``"str"``, ``"bytes"`` or a callable (``meteor_spark.format.serializers``). A record they refuse
            goes through ``on_corrupt`` (error, skip or dead_letter; see the module docs).
        max_poll_records: records returned by one ``poll`` at most.
        max_items_per_read: ring items asked for by one ``read_many`` (each holds up to ``max_batch_records``).
        max_bytes_per_read: ring-item bytes asked for by one ``read_many``, about: the item count is adapted to the
            lane's item size (at least one item). One response of many MiB holds up every other reader sharing the
            grid connection and makes the member buffer it; about a MiB keeps responses streaming.
        lease_ms: grouped: lease length, i.e. failover time after a crash (default 5 s).
        member_id: grouped: this member's id (default ``<host>-<pid>-<random>``).
        metrics: True (prometheus_client's default registry) or a ``CollectorRegistry``: export this subscriber's
            counters, its lag per lane and, grouped, its group figures (``meteor_spark.metrics``; needs the
            ``metrics`` extra).
        auto_confirm_interval_ms: grouped: confirm on its own, at most every that many ms, at the start of a
            ``poll`` (what the previous polls handed out) and on ``close`` (``meteor_spark.consumer.auto_confirm``: the
            semantics, at-least-once; a crash re-delivers what was handed out since the last confirm).
        isolation: ``"read_uncommitted"`` (default: every item) or ``"read_committed"``: records of transactions
            (the transactional Spark sink) only once committed, never aborted ones; a lane waits at the first item
            of a transaction still open (``meteor_spark.grid.item_gate``). Re-sent copies of an item (same producer id
            and sequence) are dropped in both.
        topics: an AMQP topic pattern or a list of them (``*`` one word, ``#`` zero or more): hand out only records
            whose topic matches; the others are passed over and counted (``filtered_records``). On an ephemeral
            stream the subscriber is a consuming entity (grouped: its group is) and delivery is at most once
            (``meteor_spark.consumer.topics``); default there: every topic (``#``).
        subscription_ttl_ms: ephemeral streams: how long this reader stays registered without polling (default
            10,000; ``meteor_spark.grid.subscriptions``).

    Attributes:
        skipped_items: ring items lost and skipped (``skip_data_loss``), each counted once.
        skips: ``(lane, first lost offset, first offset read after)`` per skip.
        truncated_lanes: ``skip_data_loss``: lanes found truncated and refilled under the group's offset or the
            reader's position (``LaneTruncatedError`` otherwise) and read again from their oldest record.
        truncations: ``(lane, confirmed offset or position, offset read again from)`` of each of them.
        corrupt_items: undecodable ring items passed over (``on_corrupt`` skip or dead_letter).
        corrupt: ``(lane, sequence)`` of each of them.
        undecodable_records: records the deserializers refused and ``on_corrupt`` passed over (skip or dead_letter).
        delivered_records: records returned by ``poll``.
        filtered_records: records read and passed over because their topic matched no pattern of ``topics``.
        item_gate: the ``meteor_spark.grid.item_gate.ItemGate`` (isolation, re-sent copies); its counters
            (``aborted_items``, ``aborted_records``, ``duplicate_items``, ``duplicate_records``) are in ``metrics()``.

    Examples:
        >>> with Subscriber(grid, "orders", group="billing") as sub:      # doctest: +SKIP
        ...     batch = sub.poll(timeout_ms=100)
        ...     for record in batch:
        ...         handle(record)
        ...     sub.confirm()
    """

    def __new__(cls, grid: Grid, stream: StreamConfig | str, *, shared: bool = False, **options: Any) -> Any:
        """``shared=True`` is the older spelling of ``SharedSubscriber(grid, stream, ...)`` and still makes one,
        with a ``DeprecationWarning``: the object is a ``SharedSubscriber``, not a ``Subscriber``.

        The two are separate types on purpose, as Kafka's ``KafkaShareConsumer`` is not a ``KafkaConsumer``: a
        shared member has no position, so nothing of ``Subscriber``'s offset API (``position``, ``confirm``,
        ``seek``, ``lag``, ``attach_receiver``) applies to it, and it settles records one by one (``ack``, ``nack``,
        ``reject``, ``renew``), which a ``Subscriber`` does not. A common base claiming otherwise would let
        ``isinstance`` say a shared member can ``confirm``. So ``isinstance(x, Subscriber)`` is False for it and
        ``isinstance(x, SharedSubscriber)`` True, and static type checkers, which take ``Subscriber(...)`` to be a
        ``Subscriber``, are right once the constructor is spelled ``SharedSubscriber(...)``."""
        if shared:
            import warnings

            from meteor_spark.consumer.shared_subscriber import SharedSubscriber

            warnings.warn(
                "Subscriber(..., shared=True) makes a SharedSubscriber, which is not a Subscriber (no positions, "
                "records settled one by one); construct it as SharedSubscriber(grid, stream, group=..., ...)",
                DeprecationWarning,
                stacklevel=2,
            )
            return SharedSubscriber(grid, stream, **options)
        misplaced = sorted({"acquisition_timeout_ms", "max_deliveries"} & set(options))
        if misplaced:
            raise ConfigError(
                f"{', '.join(misplaced)}: only for shared groups; use SharedSubscriber(grid, stream, group=..., ...)"
            )
        return super().__new__(cls)

    def __init__(
        self,
        grid: Grid,
        stream: StreamConfig | str,
        *,
        shared: bool = False,
        group: str | None = None,
        initial_offset_scheme: InitialOffsetScheme | str = InitialOffsetScheme.AUTO,
        skip_data_loss: bool = False,
        max_poll_records: int = 10_000,
        max_items_per_read: int = 100,
        max_bytes_per_read: int = 1 << 20,
        lease_ms: int = 5000,
        member_id: str | None = None,
        on_corrupt: str | None = None,
        dead_letter_stream: str | None = None,
        dead_letter_after: int | None = None,
        value_deserializer: str | Deserializer | AvroValues | None = None,
        key_deserializer: str | Deserializer | None = None,
        metrics: Any = None,
        auto_confirm_interval_ms: int | None = None,
        isolation: str | None = None,
        # shared groups' own: __new__ hands them to a SharedSubscriber, and refuses them without shared=True
        acquisition_timeout_ms: int | None = None,
        max_deliveries: int | None = None,
        topics: str | list[str] | None = None,
        subscription_ttl_ms: int | None = None,
    ) -> None:
        # long: one constructor on purpose: every option is checked (raising a ConfigError that names it) before
        # anything is asked of the grid or a group is joined, then the state is set in one place; split up, an
        # option's check would sit apart from the attribute it guards.
        require_grid(grid)
        registry = metrics_registry(metrics)
        options = SubscriberOptions.parse(
            group=group,
            initial_offset_scheme=initial_offset_scheme,
            skip_data_loss=skip_data_loss,
            max_poll_records=max_poll_records,
            max_items_per_read=max_items_per_read,
            max_bytes_per_read=max_bytes_per_read,
            lease_ms=lease_ms,
            member_id=member_id,
            on_corrupt=on_corrupt,
            dead_letter_stream=dead_letter_stream,
            value_deserializer=value_deserializer,
            key_deserializer=key_deserializer,
            auto_confirm_interval_ms=auto_confirm_interval_ms,
            isolation=isolation,
        )
        self.item_gate = ItemGate(grid, options.isolation)
        self._key_deserializer = options.key_deserializer
        self.scheme = options.scheme
        self.corrupt_policy = options.corrupt_policy
        self._auto_confirm = None if auto_confirm_interval_ms is None else AutoConfirm(auto_confirm_interval_ms)
        self._grid = grid
        self.info: StreamInfo = open_stream(grid, stream)
        self.stream = self.info.name
        self._value_deserializer = value_deserializer_for(grid, self.info, value_deserializer)
        if auto_confirm_interval_ms is not None:
            refuse_on_ephemeral(self.info, "auto_confirm_interval_ms")
        options.check_stream(self.stream)
        self.group = group
        self.skip_data_loss = skip_data_loss
        self.max_poll_records = max_poll_records
        self._items_per_read = max_items_per_read
        self._bytes_per_read = max_bytes_per_read
        self._lease_ms = lease_ms
        self._member_id = member_id if member_id is not None else default_member_id()
        self._lock = threading.RLock()  # reader state
        self._poll_lock = threading.Lock()  # one poll at a time
        self._wakeup = Wakeup()
        self._lanes: dict[int, LaneState] = {}
        self._unconfirmed_lost: dict[int, int | None] = {}  # lane -> epoch of records delivered, lost unconfirmed
        self._orphans: list[Any] = []
        self._next_lane = 0
        self._full_lanes = False  # a lane skipped by the last _issue_reads for its full buffer
        self._lanes_unread = True  # a lane without an outstanding read at the last _take_in
        self._member: Any = None
        self._receiver: Receiver | None = None
        self._closed = False
        self._active = True
        self.skipped_items = 0
        self.skips: list[tuple[int, int, int]] = []  # (lane, first lost offset, first offset read after)
        self.truncated_lanes = 0
        self.truncations: list[tuple[int, int, int]] = []  # (lane, offset or position, offset read again from)
        self.delivered_records = 0
        self.nacked_records = self.delayed_records = self.dead_lettered_records = 0
        self._load_group_settings(dead_letter_after, dead_letter_stream)
        self._refusals: Refusals | None = None
        self._open_topics(topics, subscription_ttl_ms, self._member_id)
        if group is None:
            for lane in range(self.info.lanes):
                ring = grid.ring(self.info.ring_names[lane])
                nxt = ring.tail() + 1
                start = resolve_initial(
                    self.scheme,
                    False,
                    None,
                    min(oldest_in(ring), nxt),
                    nxt,
                    where=f"stream {self.stream!r} lane {lane}",
                )
                self._lanes[lane] = LaneState(
                    self.stream, lane, ring, ring.capacity(), start, None, grid.connection_losses
                )
        else:
            member = self._join()
            if self.ephemeral:
                self._sync_assignment()  # positions now: records published from here on are this entity's
            if self.scheme is InitialOffsetScheme.NONE:
                missing = [lane for lane in range(self.info.lanes) if member.confirmed(lane) is None]
                if missing:
                    member.close()
                    raise GroupError(
                        f"initial_offset_scheme NONE: group {group!r} has no confirmed offset on stream "
                        f"{self.stream!r} lane(s) {missing}; confirm or seek the group first, or use EARLIEST/LATEST"
                    )
        try:
            self._refusals = Refusals(grid, self.stream, self.corrupt_policy)
        except BaseException:
            if self._member is not None:
                self._member.close()
            self._close_subscription()
            raise
        self._detach_metrics = attach_metrics(registry, self)

    # ------------------------------------------------------------------------------------------------ state

    def _join(self) -> GroupMember:
        member = GroupMember(
            self._grid,
            self.info,
            self.group,  # type: ignore[arg-type]
            member_id=self._member_id,
            lease_ms=self._lease_ms,
            on_change=lambda _assignment: self._wakeup.set(),
        )
        member.start()
        self._member = member
        return member

    # ------------------------------------------------------------------------------------------------ polling

    def poll(self, timeout_ms: float = 0) -> RecordBatch:
        """Records available now, or the first to arrive within ``timeout_ms``; empty when none came.

        Records read before a bad item are returned first; the error comes with the next poll. A lane stays
        stopped at its error until ``seek``.

        Raises:
            DataLossError: the next records are gone (unless ``skip_data_loss``).
            FormatError: a ring item cannot be decoded (named by stream, lane and sequence) and ``on_corrupt`` is
                ``error``; the position stays at the item; ``seek`` past it to go on.
            OffsetOutOfRangeError: the lane's position lies past its end.
            LaneTruncatedError: grouped, the lane was truncated and refilled under the group's offset (unless
                ``skip_data_loss``); ``seek`` the lane to go on.
            DeserializationError: a deserializer refused a record and ``on_corrupt`` is ``error``; the position
                stays at the record; ``seek`` past it to go on.
            GridError: the grid failed (for ``dead_letter``: publishing the refused item failed; retried by the
                next poll).
        """
        if self._closed:
            raise MeteorError(f"the subscriber of stream {self.stream!r} is closed; create a new one")
        check_timeout("poll timeout_ms", timeout_ms)
        deadline = time.monotonic() + timeout_ms / 1000.0
        with self._poll_lock:
            if self._auto_confirm is not None and self._auto_confirm.due():
                self._confirm_automatically()
            while True:
                batch = self._hand_out(self._poll_until(deadline))
                if batch or time.monotonic() >= deadline:
                    return batch

    def _poll_until(self, deadline: float) -> RecordBatch:
        """The steps of ``poll`` until records, an error or the deadline (poll lock held)."""
        while True:
            self._wakeup.clear()
            renewal = self._renew_subscription()
            if self._active:
                self._sync_assignment()
                if self._take_in():
                    break
                # A read answered at once is taken in now; with none started, the pass above saw everything (an
                # answer arriving from here on sets the wake-up cleared before it, so the wait returns at once).
                if self._lanes_unread and self._issue_reads() and self._take_in():
                    break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._wakeup.wait(min(remaining, self.item_gate.hold_left(), renewal, self._pause_left()))
        if self._active:
            self._issue_reads()  # the next read parks on the grid before this batch is handed out
        self._raise_stopped_lane()
        batch = self._take()
        if self._active and self._full_lanes:
            self._issue_reads()  # lanes whose full buffer the batch just drained
        return batch

    def _confirm_automatically(self) -> None:
        """Auto-confirm what earlier polls handed out. A lane lost meanwhile is logged, not raised: its new holder
        reads those records again (at-least-once), and the other lanes were confirmed."""
        assert self._auto_confirm is not None
        try:
            self.confirm()
        except FencedError as exc:
            logger.warning("auto-confirm of stream %r group %r: %s", self.stream, self.group, exc)
        self._auto_confirm.done()

    def _confirm_on_leaving(self) -> None:
        """With auto-confirm, before leaving the group (close, deactivate): confirm what was handed out, or with a
        receiver what its callback finished (not the rest of a batch it stopped in). A failure is logged: leaving
        goes on, and the next holder reads those records again."""
        if self._auto_confirm is None or self._member is None:
            return
        try:
            if self._receiver is not None:
                self._receiver.confirm_finished()
            else:
                self._confirm_automatically()
        except MeteorError as exc:
            logger.warning("auto-confirm of stream %r group %r on leaving failed: %s", self.stream, self.group, exc)

    # ------------------------------------------------------------------------------------------------ groups

    def is_assigned(self) -> bool:
        """Ungrouped: always True. Grouped: holds at least one lane."""
        if self._member is None:
            return self.group is None
        return bool(self._member.assignment())

    @property
    def lanes(self) -> list[int]:
        """The lanes this subscriber reads now."""
        with self._lock:
            return sorted(self._lanes)

    @property
    def member(self) -> Any:
        """Grouped: the ``GroupMember`` (None when ungrouped or deactivated)."""
        return self._member

    def deactivate(self) -> None:
        """Grouped: leave the group (its lanes go to other members); ``poll`` returns nothing until ``reactivate``.

        Confirm what was processed first (with ``auto_confirm_interval_ms`` this does it): unconfirmed records are
        read again by the next holder.
        """
        self._need_group("deactivate")
        with self._poll_lock:
            self._confirm_on_leaving()
            member, self._member = self._member, None
            self._active = False
            with self._lock:
                for lane in list(self._lanes):
                    self._drop_lane(lane, "deactivated")
        if member is not None:
            member.close()

    def reactivate(self) -> None:
        """Grouped: join the group again after ``deactivate``."""
        self._need_group("reactivate")
        with self._poll_lock:
            if self._active:
                return
            self._join()
            self._active = True
        self._wakeup.set()

    # ------------------------------------------------------------------------------------------------ receiver

    def attach_receiver(
        self,
        callback: RecordHandler,
        poll_timeout_ms: float = 100,
        *,
        on_error: ErrorHandler | None = None,
        per_batch: bool = False,
        auto_confirm_interval_ms: int | None = None,
    ) -> Receiver:
        """Deliver records to ``callback`` on a background thread (at most one receiver per subscriber);
        ``auto_confirm_interval_ms``: confirm what the callback finished (``Receiver``)."""
        if auto_confirm_interval_ms is not None:
            refuse_on_ephemeral(self.info, "attach_receiver auto_confirm_interval_ms")
        if self._receiver is not None and self._receiver.is_alive():
            raise ConfigError(
                f"the subscriber of stream {self.stream!r} already has a receiver; close it before attaching another"
            )
        self._receiver = Receiver(
            self,
            callback,
            poll_timeout_ms,
            on_error=on_error,
            per_batch=per_batch,
            auto_confirm_interval_ms=auto_confirm_interval_ms,
        )
        return self._receiver

    # ------------------------------------------------------------------------------------------------ lifecycle

    @property
    def corrupt_items(self) -> int:
        return self.refusals.corrupt_items

    @property
    def corrupt(self) -> list[tuple[int, int]]:
        return self.refusals.corrupt

    @property
    def undecodable_records(self) -> int:
        return self.refusals.undecodable_records

    def metrics(self) -> dict[str, int]:
        """Counters since creation; grouped, also the group member's lease figures and the lanes it holds."""
        figures = {
            "delivered_records": self.delivered_records,
            "skipped_items": self.skipped_items,
            "corrupt_items": self.corrupt_items,
            "undecodable_records": self.undecodable_records,
            "nacked_records": self.nacked_records,
            "delayed_records": self.delayed_records,
            "dead_lettered_records": self.dead_lettered_records,
            "filtered_records": self.filtered_records,
            **self.item_gate.counters(),
        }
        member = self._member
        if member is not None:
            figures.update(member.metrics())
        return figures

    def lag(self) -> dict[int, int]:
        """Ring items behind each lane's end, from the next record to deliver, per lane read (one grid call per
        lane)."""
        with self._lock:
            lanes = [(state.lane, state.ring, state.position) for state in self._lanes.values()]
        return {lane: max(0, ring.tail() + 1 - sequence_of(position)) for lane, ring, position in lanes}

    def close(self) -> None:
        """Stop the receiver, leave the group (grouped), close the dead-letter publisher. Confirm what was processed
        before closing (with ``auto_confirm_interval_ms`` close does it: what was handed out, or with a receiver
        what its callback finished)."""
        if self._closed:
            return
        if self._receiver is not None:
            self._receiver.close()
        self._confirm_on_leaving()
        if self._detach_metrics is not None:
            self._detach_metrics()
        self._closed = True
        self._wakeup.set()
        with self._poll_lock:
            member, self._member = self._member, None
            with self._lock:
                self._lanes.clear()
        try:
            if member is not None:
                member.close()
        finally:
            self._close_subscription()
            self.refusals.close()
            self._close_nack()

    def __enter__(self) -> Subscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        kind = f"group {self.group!r}" if self.group else "ungrouped"
        return f"Subscriber(stream={self.stream!r}, {kind}, lanes={self.lanes})"
