"""AsyncSubscriber: the asyncio twin of the ungrouped ``meteor_spark.consumer.subscriber.Subscriber``.

It reads every lane of a stream with local positions, on the caller's event loop: each lane has at most one
``read_many`` outstanding (a task parked on the grid until an item arrives, like the threaded reader's future), and
``poll`` waits for the first answer, or the deadline. What an answer does to a lane is the threaded reader's own
code: ``LaneState.accept`` (gaps and data loss, positions past the end, undecodable items, the item gate with
``read_committed`` and re-sent copies), ``choose_parts`` / ``deliver_taken`` (lanes in rotation, positions), the
options' checks (``SubscriberOptions``), the ``on_corrupt`` policy's bookkeeping (``Refusals``) with the dead
letters published by an ``AsyncPublisher`` and acknowledged before the reader moves past them. The few synchronous
grid questions those pieces ask are answered from reads awaited first (``meteor_spark.aio.views``).

``async for record in subscriber`` hands out records one by one until the subscriber is closed, polling
``poll_timeout_ms`` at a time.

With ``group=``, a member of an exclusive group (``meteor_spark.aio.group_member.AsyncGroupMember``, the threaded
``GroupMember``'s protocol and stored values: threaded and asyncio members share a group): it reads the lanes the
group assigns it, ``await confirm()`` stores delivered positions (fenced: ``FencedError`` once a lane was taken
over), ``auto_confirm_interval_ms`` confirms at the start of a poll and on close, and close releases the leases
(``meteor_spark.aio.grouped``).

A group member also has ``await nack(records, delay_ms=...)`` and ``dead_letter_after`` (``meteor_spark.aio.nack``),
``await deactivate()`` / ``await reactivate()``, and takes part in transactions
(``meteor_spark.aio.transactional.AsyncTransactionalPublisher.send_offsets``). A ``read_committed`` reader aborts a
transaction it finds open past its deadline, as threaded readers do (``meteor_spark.aio.views.TxnSnapshot``).

Differences from the threaded subscriber, by scope: no shared groups (``shared=True`` makes an
``AsyncSharedSubscriber``); after a lost connection a lane whose tail was lost and refilled raises
``LaneTruncatedError`` (``skip_data_loss`` does not re-read it from its oldest record); no receivers. ``topics=``
and ephemeral streams follow the threaded rules (``meteor_spark.aio.topics``), for an ungrouped reader and an
exclusive group's member alike.
Typed streams decode as the threaded reader does (``meteor_spark.aio.typed``); ``metrics=`` exports the threaded
families, the lag gauge refreshed on the loop (``meteor_spark.aio.exported``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import replace
from typing import Any, cast

from meteor_spark.aio.exported import LagWatch
from meteor_spark.aio.group_member import AsyncGroupMember
from meteor_spark.aio.grouped import GroupedLanes
from meteor_spark.aio.lane_reads import LaneReads, wait_first
from meteor_spark.aio.nack import check_group_settings, dead_letter_publisher
from meteor_spark.aio.options import SUBSCRIBER_ONLY_THREADED, check_option_names
from meteor_spark.aio.streams import open_stream_async
from meteor_spark.aio.subscriber_figures import SubscriberFigures
from meteor_spark.aio.topics import AsyncTopics
from meteor_spark.aio.typed import SchemaView, typed_deserializer
from meteor_spark.aio.views import TxnSnapshot
from meteor_spark.consumer.auto_confirm import AutoConfirm
from meteor_spark.consumer.lane_state import LaneState, choose_parts, deliver_taken
from meteor_spark.consumer.refusals import Refusals
from meteor_spark.consumer.subscriber_options import SubscriberOptions
from meteor_spark.consumer.topics import refuse_on_ephemeral
from meteor_spark.errors import (
    ConfigError,
    GroupError,
    MeteorError,
    OffsetOutOfRangeError,
)
from meteor_spark.format.offsets import first_offset_of
from meteor_spark.format.records import BatchPart, Record, RecordBatch
from meteor_spark.format.serializers import DecodedLane
from meteor_spark.grid.aio_client import AsyncGrid, connect_async
from meteor_spark.grid.client import Grid
from meteor_spark.grid.item_gate import ItemGate, KnownTransactions
from meteor_spark.grid.item_marks import ItemMark
from meteor_spark.grid.streams import StreamConfig, StreamInfo
from meteor_spark.groups.balancing import default_member_id
from meteor_spark.metrics import attach as attach_metrics
from meteor_spark.metrics import registry_of as metrics_registry
from meteor_spark.validate import check_int, check_timeout

__all__ = ["AsyncSubscriber"]

logger = logging.getLogger(__name__)

_OPTIONS = (
    "initial_offset_scheme",
    "skip_data_loss",
    "max_poll_records",
    "max_items_per_read",
    "max_bytes_per_read",
    "on_corrupt",
    "dead_letter_stream",
    "value_deserializer",
    "key_deserializer",
    "isolation",
)


class AsyncSubscriber(SubscriberFigures):
    """Reads records from a stream from asyncio code: ungrouped (every lane, local positions) or as a member of an
    exclusive group (``group=``: the lanes the group assigns, positions confirmed in the grid).

    Args:
        members_or_grid: ``"host:port[,host:port]"``, a ``GridSettings`` (a connection of its own, closed with the
            subscriber) or an ``AsyncGrid`` (shared, left open).
        stream: a ``StreamConfig`` (created when missing) or the name of an existing stream.
        shared: True makes an ``AsyncSharedSubscriber`` instead (``__new__``); False, the default, is accepted as
            the threaded ``Subscriber`` accepts it.
        poll_timeout_ms: how long each poll of ``async for`` waits for records (default 1,000 ms): the iteration
            notices ``close`` within it.
        group: exclusive group name; None = ungrouped.
        member_id: grouped: this member's id (default ``<host>-<pid>-<random>``).
        lease_ms: grouped: lease length, i.e. failover time after a crash (default 5 s).
        auto_confirm_interval_ms: grouped: confirm what earlier polls handed out at the start of a poll, at most
            every that many ms, and on close (``meteor_spark.consumer.auto_confirm``); None = only ``confirm()``.
        dead_letter_after: grouped: the group setting of ``Subscriber``'s (a record ``nack``-ed more than this many
            records behind the furthest one the group delivered on its lane goes to ``dead_letter_stream``).
        **options: those of the threaded ``Subscriber``, with the same meaning and checks:
            ``initial_offset_scheme``, ``skip_data_loss``, ``max_poll_records``, ``max_items_per_read``,
            ``max_bytes_per_read``, ``on_corrupt``, ``dead_letter_stream``, ``value_deserializer`` (also
            ``"avro"`` / ``AvroValues``), ``key_deserializer``, ``isolation``, ``metrics``, ``topics``,
            ``subscription_ttl_ms``.

    Examples:
        >>> async with AsyncSubscriber("127.0.0.1:5701", "orders") as sub:  # doctest: +SKIP
        ...     async for record in sub:
        ...         handle(record)
        >>> async with AsyncSubscriber("127.0.0.1:5701", "orders", group="billing") as sub:  # doctest: +SKIP
        ...     async for record in sub:
        ...         handle(record)
        ...         await sub.confirm(record)
    """

    def __new__(cls, *args: Any, shared: bool = False, **options: Any) -> Any:
        """``shared=True`` makes an ``AsyncSharedSubscriber`` (``meteor_spark.aio.shared_subscriber``) from the same
        arguments: a type of its own, as the threaded ``SharedSubscriber`` is not a ``Subscriber`` (no positions,
        records settled one by one)."""
        if shared:
            from meteor_spark.aio.shared_subscriber import AsyncSharedSubscriber

            return AsyncSharedSubscriber(*args, **options)
        return super().__new__(cls)

    def __init__(
        self,
        members_or_grid: object,
        stream: StreamConfig | str,
        *,
        shared: bool = False,
        poll_timeout_ms: int = 1000,
        group: str | None = None,
        member_id: str | None = None,
        lease_ms: int = 5000,
        auto_confirm_interval_ms: int | None = None,
        dead_letter_after: int | None = None,
        **options: Any,
    ) -> None:
        check_option_names(
            "AsyncSubscriber",
            options,
            (*_OPTIONS, "poll_timeout_ms", "metrics", "topics", "subscription_ttl_ms"),
            SUBSCRIBER_ONLY_THREADED,
        )
        check_int("poll_timeout_ms", poll_timeout_ms, 1, 3_600_000)
        self._registry = metrics_registry(options.pop("metrics", None))
        self._topics = AsyncTopics(options.pop("topics", None), options.pop("subscription_ttl_ms", None))
        self._lag_watch: LagWatch | None = None
        self._detach_metrics: Callable[[], None] | None = None
        self._value_setting = options.get("value_deserializer")  # a typed stream's codec is resolved at start
        self._schemas: SchemaView | None = None
        self.options = SubscriberOptions.parse(**options)
        if group is None and (auto_confirm_interval_ms is not None or member_id is not None):
            raise ConfigError(
                "AsyncSubscriber: auto_confirm_interval_ms and member_id are for a group member; give group=... or "
                "leave them out"
            )
        self.group = group
        self._member_args: dict[str, Any] = {"member_id": member_id, "lease_ms": lease_ms}
        if group is not None:  # checked now, like the threaded subscriber's, before anything connects
            AsyncGroupMember.check(group, member_id, lease_ms)
        self._wanted = check_group_settings(group, dead_letter_after, self.options.corrupt_policy.dead_letter_stream)
        self._auto_confirm = None if auto_confirm_interval_ms is None else AutoConfirm(auto_confirm_interval_ms)
        self._grouped: GroupedLanes | None = None
        self.poll_timeout_ms = poll_timeout_ms
        self._target = members_or_grid
        self._config = stream
        self.stream = stream if isinstance(stream, str) else getattr(stream, "name", "?")
        self._grid: AsyncGrid | None = None
        self._owns_grid = False
        self._reads: LaneReads | None = None
        self._next_lane = 0
        self._ready: deque[Record] = deque()
        self._poll_lock = asyncio.Lock()
        self._closed = False
        self.delivered_records = 0
        self._known = KnownTransactions()

    # ------------------------------------------------------------------------------------------------ lifecycle

    async def start(self) -> AsyncSubscriber:
        """Connect (unless given a grid), open the stream, place every lane by ``initial_offset_scheme``, and open
        the dead-letter stream (``on_corrupt=dead_letter``). ``async with`` calls it."""
        if self._grid is not None:
            return self
        grid, owned = await connect_async(self._target)
        try:
            self.info: StreamInfo = await open_stream_async(grid, self._config)
            self.stream = self.info.name
            self.options.check_stream(self.stream)
            self._value_deserializer, self._schemas = await typed_deserializer(grid, self.info, self._value_setting)
            member_id = self._member_args["member_id"] = self._member_args["member_id"] or default_member_id()
            auto_confirm = self._auto_confirm is not None
            scheme = await self._topics.open(
                grid, self.info, self.options.scheme, self.group, member_id, auto_confirm=auto_confirm
            )
            self.options = replace(self.options, scheme=scheme)  # an ephemeral stream is read from the lanes' ends
            snapshot = TxnSnapshot(grid, self._known)
            self._snapshot = snapshot
            self.item_gate = ItemGate(
                cast(Grid, snapshot), self.options.isolation, abort_expired=False, known=self._known
            )
            self.refusals = Refusals(None, self.stream, self.options.corrupt_policy)
            self._reads = LaneReads(grid, self.stream, self.options, self.item_gate, snapshot, self.refusals)
            if self.group is None:
                for lane in range(self.info.lanes):
                    await self._reads.place(self.info.ring_names[lane], lane)
            else:
                await self._join(grid, self._reads)
            target = self.options.corrupt_policy.dead_letter_stream
            if target is not None:
                self._reads.dead_letters = await dead_letter_publisher(grid, target)
        except BaseException:
            await self._topics.close()
            if self._grouped is not None:
                await self._grouped.member.close()
            if owned:
                await grid.close()
            raise
        self._grid, self._owns_grid = grid, owned
        if self._registry is not None:
            self._lag_watch = LagWatch(self._reads, self.stream)
            self._detach_metrics = attach_metrics(self._registry, self)
        return self

    async def _join(self, grid: AsyncGrid, reads: LaneReads) -> None:
        """Join the group (take the lanes it assigns now) and start reading them."""
        assert self.group is not None
        member = AsyncGroupMember(
            grid, self.info, self.group, on_change=lambda _assignment: self._wake(), **self._member_args
        )
        self._grouped = GroupedLanes(
            member,
            reads.lanes,
            reads.bounds,
            scheme=self.options.scheme,
            skip_data_loss=self.options.skip_data_loss,
            auto_confirm=self._auto_confirm,
            stale_offsets=self._topics.stale_offsets,
        )
        await self._grouped.join(grid, list(self.info.ring_names), self._wanted)

    def _wake(self) -> None:
        if self._grouped is not None:
            self._grouped.wakeup.set()

    async def __aenter__(self) -> AsyncSubscriber:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop reading (outstanding reads are cancelled), close the dead-letter publisher and an owned
        connection. ``async for`` ends."""
        if self._closed:
            return
        grouped = self._grouped
        if grouped is not None and grouped.auto_confirm is not None and self._grid is not None and grouped.active:
            try:
                await grouped.confirm_automatically()
            except MeteorError as exc:
                logger.warning("auto-confirm of stream %r group %r on close failed: %s", self.stream, self.group, exc)
        self._closed = True
        if self._lag_watch is not None:
            self._lag_watch.stop()
        if self._detach_metrics is not None:
            self._detach_metrics()
        self._wake()
        reads = self._reads
        if reads is not None:
            reads.cancel()
        try:
            if grouped is not None:
                await grouped.close()
            if reads is not None and reads.dead_letters is not None:
                await reads.dead_letters.close()
            await self._topics.close()
        finally:
            if self._owns_grid and self._grid is not None:
                await self._grid.close()

    # ------------------------------------------------------------------------------------------------ reading

    def __aiter__(self) -> AsyncIterator[Record]:
        return self

    async def __anext__(self) -> Record:
        """The next record, waiting for it (``poll_timeout_ms`` at a time) until the subscriber is closed; errors
        are ``poll``'s."""
        while not self._ready:
            if self._closed:
                raise StopAsyncIteration
            self._ready.extend(await self.poll(self.poll_timeout_ms))
        return self._ready.popleft()

    async def poll(self, timeout_ms: float = 0) -> RecordBatch:
        """Records available now, or the first to arrive within ``timeout_ms``; empty when none came. The errors
        and the order of records and errors are ``Subscriber.poll``'s (``DataLossError``, ``FormatError``,
        ``OffsetOutOfRangeError``, ``DeserializationError``, ``GridError``)."""
        if self._grid is None:
            raise MeteorError(f"the AsyncSubscriber of stream {self.stream!r} is not started: use `async with`")
        if self._closed:
            raise MeteorError(f"the subscriber of stream {self.stream!r} is closed; create a new one")
        check_timeout("poll timeout_ms", timeout_ms)
        deadline = time.monotonic() + timeout_ms / 1000.0
        while True:  # empty with time left: every record read was passed over by ``topics``
            batch = await self._poll_until(deadline)
            if batch or self._closed or time.monotonic() >= deadline:
                return batch

    async def _poll_until(self, deadline: float) -> RecordBatch:
        """``poll``'s steps until records, an error or the deadline (the poll lock held)."""
        reads = self._lane_reads()
        if self._grouped is not None and not self._grouped.active:  # deactivated: nothing to read until reactivate
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._grouped.wakeup.wait(), max(0.0, deadline - time.monotonic()))
            if not self._grouped.active:
                self._grouped.wakeup.clear()
                return RecordBatch.empty()
        async with self._poll_lock:
            await self._topics.renew()  # an ephemeral reader's registration, kept while it polls
            grouped = self._grouped
            if grouped is not None:
                if grouped.auto_confirm is not None and grouped.auto_confirm.due():
                    await grouped.confirm_automatically()
                await self._follow_assignment(grouped)
            while True:
                await reads.harvest()
                await reads.settle_bad_items()
                if reads.has_buffered() or reads.has_error():
                    break
                if self._issue_reads(reads):
                    await asyncio.sleep(0)  # a read answered at once is taken in by this poll
                    await reads.harvest()
                    await reads.settle_bad_items()
                    if reads.has_buffered() or reads.has_error():
                        break
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._closed:
                    break
                waits = reads.outstanding()
                wait = min(remaining, self.item_gate.hold_left(), await self._topics.renew())
                if grouped is not None:
                    wait = min(wait, grouped.pause_left())
                    waits.append(asyncio.ensure_future(grouped.wakeup.wait()))
                if waits:
                    await wait_first(waits, wait)
                    if grouped is not None:
                        waits[-1].cancel()
                else:
                    await asyncio.sleep(wait)
                if self._closed:
                    break
                if grouped is not None:
                    await self._follow_assignment(grouped)
            reads.raise_stopped_lane()
            batch = await self._take(reads)
            if not self._closed:
                self._issue_reads(reads)  # prefetch while the caller works on this batch
            return batch

    def _issue_reads(self, reads: LaneReads) -> int:
        """Reads sent for the lanes that had none out (0 when closed)."""
        if self._closed:
            return 0
        return reads.issue(None if self._grouped is None else self._grouped.paused)

    async def _follow_assignment(self, grouped: GroupedLanes) -> None:
        """Grouped: lanes given up or taken since the last look are dropped or started."""
        assert self._grid is not None
        if grouped.wakeup.is_set() or set(grouped.member.assignment()) != set(self._lane_reads().lanes):
            grouped.wakeup.clear()
            await grouped.sync(self._grid, list(self.info.ring_names))

    async def _take(self, reads: LaneReads) -> RecordBatch:
        """Up to ``max_poll_records`` buffered records, lanes in rotation; deserialized by the options'
        deserializers, refused records settled by ``on_corrupt`` (dead letters acknowledged before anything moves)."""
        options = self.options
        taken, self._next_lane = choose_parts(reads.lanes, self._next_lane, options.max_poll_records, self.info.lanes)
        if self._grouped is not None:
            self._grouped.revalidate(taken)  # a lane taken over meanwhile must not be delivered here too
        if not taken:
            return RecordBatch.empty()
        decoded = None
        if self._value_deserializer is not None or options.key_deserializer is not None:
            decoded = await self._decode(taken)
            if reads.dead_letters is not None:
                letters = self.refusals.dead_letters_of(decoded)
                if letters:
                    await reads.dead_letters.publish_many(letters)
            self.refusals.count_refused(decoded)
        out, records, orphans = deliver_taken(reads.lanes, taken, decoded)
        for orphan in orphans:
            orphan.cancel()
        save = None if self._grouped is None else self._grouped.save_positions
        batch = await self._topics.hand_out(RecordBatch(out, records), decoded is not None, save)
        self.delivered_records += len(batch)
        return batch

    async def _decode(self, taken: dict[int, list[BatchPart]]) -> dict[int, DecodedLane]:
        """``Refusals.decode``; once more when records were refused for a schema version the view did not hold yet
        (registered since it was read: ``SchemaView.catch_up`` read it)."""
        before = dict(taken)
        value, key = self._value_deserializer, self.options.key_deserializer
        decoded = self.refusals.decode(taken, value, key)
        refused = any(lane.refused or lane.stopped is not None for lane in decoded.values())
        if refused and self._schemas is not None and await self._schemas.catch_up():
            taken.clear()
            taken.update(before)
            decoded = self.refusals.decode(taken, value, key)
        return decoded

    # ------------------------------------------------------------------------------------------------ positions

    def position(self, lane: int) -> int:
        """The offset of the next record to deliver on ``lane``."""
        return self._lane(lane).position

    async def seek(self, offset: int, *, lane: int) -> None:
        """Continue reading ``lane`` at ``offset`` (also the way on from a lane stopped at an error).

        Raises:
            ConfigError: a negative offset, or a lane the stream does not have.
            OffsetOutOfRangeError: an offset past the lane's end (the valid range is named).
        """
        state = self._lane(lane)
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ConfigError(f"seek: offset {offset!r} is invalid; offsets are integers >= 0")
        bounds = self._lane_reads().bounds[lane]
        await bounds.refresh()
        end = bounds.tail() + 1
        if offset > first_offset_of(end):
            oldest = min(bounds.head(), end)
            raise OffsetOutOfRangeError(self.stream, lane, offset, first_offset_of(oldest), first_offset_of(end))
        if offset < state.position:
            refuse_on_ephemeral(self.info, f"seek back to offset {offset} on lane {lane}")
        async with self._poll_lock:
            if self._grouped is not None:
                await self._grouped.member.seek(lane, offset)  # grouped: the group's offset, fenced
            orphan = state.reset(offset)
            if orphan is not None:
                orphan.cancel()

    def _lane(self, lane: int) -> LaneState:
        lanes = self._lane_reads().lanes
        if lane not in lanes:
            raise ConfigError(f"lane {lane!r} does not exist in stream {self.stream!r} (lanes 0..{len(lanes) - 1})")
        return lanes[lane]

    async def confirm(self, offset: int | Record | None = None, *, lane: int | None = None) -> None:
        """Grouped: store in the group that records were processed (fenced), as ``Subscriber.confirm``.

        ``confirm()`` confirms everything delivered so far on every lane; ``confirm(record)`` or
        ``confirm(offset, lane=...)`` up to and including that record.

        Raises:
            GroupError: ungrouped. FencedError: the lane was taken over (nothing written for it; with ``confirm()``,
            the other lanes are confirmed first). ConfigError: an offset that was not delivered yet.
        """
        grouped = self._grouped
        if grouped is None:
            raise GroupError(
                "confirm needs a subscriber group: an ungrouped subscriber keeps its position locally; create it "
                "with group=... to store offsets in the grid"
            )
        await grouped.confirm(offset, lane, self.info.lanes)

    async def nack(self, records: Record | Iterable[Record], *, delay_ms: int = 0) -> None:
        """Grouped: ``Subscriber.nack`` (``meteor_spark.aio.nack``): redeliver from the first of ``records`` in each
        of their lanes, not before ``delay_ms`` from now, for this group only; with ``dead_letter_after``, records
        nacked too far behind are dead-lettered instead. Errors: ``Subscriber.nack``'s."""
        nack = self._group_part("nack").nack
        assert nack is not None
        async with self._poll_lock:  # not between a poll's delivery and its auto-confirm
            await nack.nack(records, delay_ms)
        self._wake()

    async def deactivate(self) -> None:
        """Grouped: ``Subscriber.deactivate``: leave the group (its lanes go to other members); ``poll`` returns
        nothing until ``reactivate``. Confirm first (auto-confirm does it): unconfirmed records are read again."""
        grouped = self._group_part("deactivate")
        async with self._poll_lock:
            await grouped.leave()

    async def reactivate(self) -> None:
        """Grouped: ``Subscriber.reactivate``: join the group again after ``deactivate``."""
        grouped = self._group_part("reactivate")
        assert self._grid is not None
        async with self._poll_lock:
            await grouped.rejoin(self._grid, list(self.info.ring_names))

    def _group_part(self, what: str) -> GroupedLanes:
        if self.group is None:
            raise GroupError(
                f"{what} needs a subscriber group: an ungrouped subscriber keeps its position locally; create it "
                f"with group=... to store offsets in the grid"
            )
        if self._grouped is None:
            raise MeteorError(f"the AsyncSubscriber of stream {self.stream!r} is not started: use `async with`")
        return self._grouped

    def delivered_unconfirmed(self) -> list[tuple[int, int, int | None, ItemMark | None]]:
        """Grouped: what a transaction stages (``Subscriber.delivered_unconfirmed``)."""
        return self._group_part("send_offsets").delivered_unconfirmed()

    def mark_confirmed(self, positions: dict[int, int]) -> None:
        """Note that ``positions`` (lane -> position) are the group's offsets now (a committed transaction)."""
        self._group_part("send_offsets").mark_confirmed(positions)

    async def rewind(self) -> dict[int, int]:
        """Grouped: ``Subscriber.rewind``: every held lane back to the group's confirmed offset, locally (what an
        aborted transaction's records came from is delivered again). Returns lane -> position now."""
        grouped = self._group_part("rewind")
        async with self._poll_lock:
            return await grouped.rewind()

    @property
    def member(self) -> AsyncGroupMember | None:
        """Grouped: the ``AsyncGroupMember`` (None when ungrouped or deactivated)."""
        return None if self._grouped is None or not self._grouped.active else self._grouped.member

    @property
    def truncated_lanes(self) -> int:
        """Grouped, ``skip_data_loss``: lanes found truncated and refilled under the group's offset, read again from
        their oldest record (``Subscriber.truncated_lanes``)."""
        return 0 if self._grouped is None else self._grouped.truncated_lanes

    @property
    def lanes(self) -> list[int]:
        """The lanes this subscriber reads now."""
        return [] if self._reads is None else sorted(self._reads.lanes)

    def __repr__(self) -> str:
        kind = "ungrouped" if self.group is None else f"group {self.group!r}"
        return f"AsyncSubscriber(stream={self.stream!r}, {kind}, lanes={self.lanes})"
