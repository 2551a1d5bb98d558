"""LaneReads: an ``AsyncSubscriber``'s lanes and their reads, one ``read_many`` outstanding per lane at most.

What an answer does to a lane is the threaded reader's own code (``LaneState.accept``: gaps and data loss,
positions past the end, undecodable items, the item gate with ``read_committed`` and re-sent copies); what this
module adds is only the scheduling on the loop: issuing a read per lane (a task parked on the grid until an item
arrives), taking in the finished ones after reading ahead what ``accept`` will ask the grid synchronously
(``meteor_spark.aio.views``), settling undecodable items by ``on_corrupt`` (a dead letter acknowledged before the
lane moves past it), and raising a lane's error once the records before it were delivered.

The lanes and their bounds are the dicts ``lanes`` and ``bounds``, the one place they are kept: an exclusive
group's ``GroupedLanes`` adds and drops lanes in them as its member's assignment changes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from meteor_spark.aio.views import RingBounds, TxnSnapshot
from meteor_spark.consumer.lane_state import LaneState
from meteor_spark.consumer.refusals import Refusals
from meteor_spark.consumer.subscriber_options import SubscriberOptions
from meteor_spark.errors import GridOperationError, LaneTruncatedError
from meteor_spark.format.corrupt import dead_letter_record
from meteor_spark.format.offsets import first_offset_of, resolve_initial
from meteor_spark.grid.aio_client import AsyncGrid
from meteor_spark.grid.item_gate import READ_COMMITTED, ItemGate
from meteor_spark.grid.reading import oldest_in

if TYPE_CHECKING:
    from meteor_spark.aio.publisher import AsyncPublisher

__all__ = ["LaneReads", "wait_first"]

logger = logging.getLogger(__name__)


async def wait_first(futures: list[asyncio.Future[Any]], timeout_s: float) -> None:
    """Until one of ``futures`` is done or ``timeout_s`` passed; the futures are left as they are.

    ``asyncio.wait(..., FIRST_COMPLETED)`` without its sets of done and pending futures: a poll waiting for its
    parked reads does this once per record in flight, so its fixed cost is paid on every hop.
    """
    waiter = asyncio.get_running_loop().create_future()

    def wake(_: Any = None) -> None:
        if not waiter.done():
            waiter.set_result(None)

    for future in futures:
        future.add_done_callback(wake)
    timer = waiter.get_loop().call_later(timeout_s, wake)
    try:
        await waiter
    finally:
        timer.cancel()
        for future in futures:
            future.remove_done_callback(wake)


class LaneReads:
    """The lanes an ``AsyncSubscriber`` reads now, their outstanding reads, and what their answers did."""

    def __init__(
        self,
        grid: AsyncGrid,
        stream: str,
        options: SubscriberOptions,
        item_gate: ItemGate,
        snapshot: TxnSnapshot,
        refusals: Refusals,
    ) -> None:
        self.grid = grid
        self.stream = stream
        self.options = options
        self.item_gate = item_gate
        self.snapshot = snapshot
        self.refusals = refusals
        self.lanes: dict[int, LaneState] = {}
        self.bounds: dict[int, RingBounds] = {}
        self.dead_letters: AsyncPublisher | None = None
        self.skipped_items = 0
        self.skips: list[tuple[int, int, int]] = []

    async def place(self, ring_name: str, lane: int) -> None:
        """Start reading ``lane`` where ``initial_offset_scheme`` says (ungrouped: positions are local)."""
        ring = await self.grid.ring(ring_name)
        head, tail = await ring.head(), await ring.tail()
        bounds = RingBounds(ring, head, tail)
        start = resolve_initial(
            self.options.scheme,
            False,
            None,
            min(oldest_in(bounds), tail + 1),  # type: ignore[arg-type]  # the view answers what oldest_in asks
            tail + 1,
            where=f"stream {self.stream!r} lane {lane}",
        )
        self.bounds[lane] = bounds
        self.lanes[lane] = LaneState(
            self.stream, lane, cast(Any, bounds), await ring.capacity(), start, None, self.grid.connection_losses
        )

    def cancel(self) -> None:
        """Cancel every outstanding read (the subscriber is closing)."""
        for state in self.lanes.values():
            if state.pending is not None:
                state.pending.cancel()
                state.pending = None

    def outstanding(self) -> list[asyncio.Future[Any]]:
        return [state.pending for state in self.lanes.values() if state.pending is not None]

    def issue(self, paused: Callable[[LaneState], bool] | None = None) -> int:
        """A read for every lane that has none outstanding, room in its buffer and nothing stopping it; ``paused``
        says which lanes wait for a delayed nack's instant. Returns how many reads it sent."""
        losses = self.grid.connection_losses
        sent = 0
        for state in self.lanes.values():
            if state.losses_seen != losses and state.pending is None:
                state.connection_lost(losses)
            if state.pending is not None or state.buffered >= self.options.max_poll_records:
                continue
            if state.error is not None or state.bad is not None or state.truncated is not None:
                continue  # stopped at a bad position until seek (or until the policy settles the item)
            if self.item_gate.held(state.lane):
                continue  # waiting at an open transaction
            if paused is not None and paused(state):
                continue  # a delayed nack of another member: not before its instant
            count = state.read_count(self.options.max_items_per_read, self.options.max_bytes_per_read)
            ring = self.bounds[state.lane].ring
            state.pending = ring.read_soon(state.read_start(), 1, count)
            state.pending_seq = state.fetch_seq
            state.pending_losses = losses
            sent += 1
        return sent

    async def harvest(self) -> None:
        """Take in every finished read (``LaneState.accept``), after reading ahead what it will ask the grid."""
        losses = self.grid.connection_losses
        for state in self.lanes.values():
            task = state.pending
            if task is None or not task.done():
                continue
            state.pending = None
            if task.cancelled():
                continue  # the subscriber was closed meanwhile
            if state.pending_seq != state.fetch_seq:
                task.exception()  # issued before a seek: its answer (or error) is of no use
                continue
            if state.pending_losses != losses:
                task.exception()
                state.connection_lost(losses)  # answered perhaps after a restart: read again
                continue
            await self._accept(state, task)

    async def _accept(self, state: LaneState, task: asyncio.Future[Any]) -> None:
        bounds = self.bounds[state.lane]
        try:
            batch = bounds.ring.batch_of(task, state.fetch_seq)
        except GridOperationError:
            await bounds.refresh()
            if state.fetch_seq <= bounds.tail() + 1:
                raise
            state.error = state.past_end(bounds.tail() + 1)
            return
        if not batch.items:
            return
        items, sequences = list(batch.items), list(batch.sequences)
        state.item_bytes = max(1, sum(map(len, items)) // len(items))
        if sequences[0] < state.read_start():
            await bounds.refresh()  # the lane now ends below the position: accept names the valid range
        if self.item_gate.isolation == READ_COMMITTED:
            await self.snapshot.prefetch(items, sequences, stream=self.stream, lane=state.lane)
        skip = state.accept(items, sequences, skip_data_loss=self.options.skip_data_loss, gate=self.item_gate)
        if skip is not None:
            self.skipped_items += skip.items
            self.skips.append((state.lane, skip.lost_from, skip.oldest))
            logger.warning(
                "stream %r lane %d: offsets %d..%d were gone before they were read; skipped them "
                "(skip_data_loss is on)",
                self.stream,
                state.lane,
                skip.lost_from,
                skip.oldest - 1,
            )

    async def settle_bad_items(self) -> None:
        """Apply ``on_corrupt`` to lanes stopped at an undecodable item; a dead letter is acknowledged first."""
        for state in list(self.lanes.values()):
            if state.bad is None:
                continue
            sequence, raw, error = state.bad
            if self.options.corrupt_policy.is_error:
                state.fail_bad_item()
                continue
            if self.dead_letters is not None:
                await self.dead_letters.publish(
                    dead_letter_record(raw, stream=self.stream, lane=state.lane, sequence=sequence, error=error)
                )
            if state.pass_bad_item(sequence, raw):
                self.refusals.passed_item(state.lane, sequence, error)

    def has_buffered(self) -> bool:
        return any(state.buffered for state in self.lanes.values())

    def has_error(self) -> bool:
        return any(state.error is not None or state.truncated is not None for state in self.lanes.values())

    def raise_stopped_lane(self) -> None:
        """Raise the error of a lane stopped at it, once the records read before it were delivered."""
        for lane in sorted(self.lanes):
            state = self.lanes[lane]
            if state.buffered:
                continue
            if state.error is not None:
                raise state.error
            mark = state.truncated
            if mark is not None:
                raise LaneTruncatedError(
                    self.stream,
                    lane,
                    state.position,
                    first_offset_of(self.bounds[lane].head()),
                    mark.sequence,
                    whose="this subscriber's position, while it read across a lost connection",
                    fix="Decide where reading goes on: seek the lane (AsyncSubscriber.seek), e.g. to its oldest "
                    "record.",
                )
