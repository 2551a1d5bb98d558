"""AsyncSharedSubscriber: a member of a shared group on the caller's event loop (the threaded ``SharedSubscriber``'s
twin, ``AsyncSubscriber(..., group=..., shared=True)`` makes one).

Every decision is the threaded member's own code: the option checks (``shared_acquire.check_member_options``), the
group settings, the poll loop, timeouts, delivery counts, dead letters, take-up checks and settling are generators
of grid calls (``meteor_spark.consumer.shared_steps``) that ``meteor_spark.grid.steps.drive_async`` drives here,
awaiting each call on the ``AsyncGridMap`` / ``AsyncRing`` of an ``AsyncGrid``. The entries it writes are the same,
so threaded and asyncio members share one group. What is the asyncio member's own: waiting (a task parked on a
one-item read per lane wakes ``poll`` when items arrive, rechecked every ``RECHECK_S`` for timeouts and releases),
dead letters published by an ``AsyncPublisher`` and acknowledged before a record is marked done, and the lifecycle
(``async with``; ``close`` releases what the member holds).

As the threaded member: a typed stream's values are decoded with its schemas (``meteor_spark.aio.typed``, the
registry entry read again at most once a second before a poll's records are decoded), an ephemeral stream is
refused (its records are not acknowledged), and ``metrics=`` exports the member's counters to Prometheus. Not taken:
``hand_over`` / ``settle_spans`` (the Spark source's).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, TypeVar

from meteor_spark.aio.publisher import AsyncPublisher
from meteor_spark.aio.streams import open_stream_async
from meteor_spark.aio.typed import SchemaView, typed_deserializer
from meteor_spark.consumer.refusals import Refusals
from meteor_spark.consumer.shared_acquire import member_choices
from meteor_spark.consumer.shared_polling import SharedPolling
from meteor_spark.consumer.topics import refuse_on_ephemeral
from meteor_spark.errors import MeteorError, StreamNotFoundError
from meteor_spark.format.avro import is_typed_setting
from meteor_spark.format.offsets import InitialOffsetScheme
from meteor_spark.format.records import Record, RecordBatch
from meteor_spark.format.serializers import Deserializer, deserializer
from meteor_spark.grid.aio_client import AsyncGrid, connect_async
from meteor_spark.grid.steps import drive_async
from meteor_spark.grid.streams import StreamConfig
from meteor_spark.groups.shared_state import SHARE_MAP
from meteor_spark.metrics import attach as attach_metrics
from meteor_spark.metrics import registry_of as metrics_registry
from meteor_spark.validate import check_int

__all__ = ["AsyncSharedSubscriber"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


class AsyncSharedSubscriber(SharedPolling):
    """A member of a shared group from asyncio code: ``SharedSubscriber``'s options, checks, errors and semantics
    (see ``meteor_spark.consumer.shared_groups``), its calls awaited.

    Args:
        members_or_grid: ``"host:port[,host:port]"``, a ``GridSettings`` (a connection of its own, closed with the
            member) or an ``AsyncGrid`` (shared, left open).
        stream: a ``StreamConfig`` (created when missing) or the name of an existing stream.
        group: the shared group's name.
        poll_timeout_ms: how long each poll of ``async for`` waits for records (default 1,000 ms).
        initial_offset_scheme, max_poll_records, max_items_per_read, member_id, acquisition_timeout_ms,
            max_deliveries, dead_letter_stream, dead_letter_after, on_corrupt, value_deserializer,
            key_deserializer, skip_data_loss: as ``SharedSubscriber``'s.

    Examples:
        >>> async with AsyncSharedSubscriber("127.0.0.1:5701", "jobs", group="workers") as member:  # doctest: +SKIP
        ...     async for record in member:
        ...         await handle(record)
        ...         await member.ack(record)
    """

    _CLOSE_ENDS_POLL = True

    def __init__(
        self,
        members_or_grid: object,
        stream: StreamConfig | str,
        *,
        group: str | None = None,
        poll_timeout_ms: int = 1000,
        initial_offset_scheme: InitialOffsetScheme | str = InitialOffsetScheme.AUTO,
        max_poll_records: int = 10_000,
        max_items_per_read: int = 100,
        member_id: str | None = None,
        acquisition_timeout_ms: int | None = None,
        max_deliveries: int | None = None,
        dead_letter_stream: str | None = None,
        dead_letter_after: int | None = None,
        on_corrupt: str | None = None,
        value_deserializer: str | Deserializer | None = None,
        key_deserializer: str | Deserializer | None = None,
        skip_data_loss: bool = False,
        **others: Any,
    ) -> None:
        self._registry = metrics_registry(others.pop("metrics", None))
        self._detach_metrics: Callable[[], None] | None = None
        self._choices = member_choices("AsyncSharedSubscriber", locals())
        check_int("poll_timeout_ms", poll_timeout_ms, 1, 3_600_000)
        self._value_setting = value_deserializer  # a typed stream's codec is resolved at start
        self._value_deserializer = (
            None if is_typed_setting(value_deserializer) else deserializer(value_deserializer, "value_deserializer")
        )
        self._schemas: SchemaView | None = None
        self._key_deserializer = deserializer(key_deserializer, "key_deserializer")
        self.poll_timeout_ms = poll_timeout_ms
        self._target = members_or_grid
        self._config = stream
        self.stream = stream if isinstance(stream, str) else getattr(stream, "name", "?")
        self.group = self._choices.group
        self._grid: AsyncGrid | None = None
        self._owns_grid = False
        self._dead_letters: AsyncPublisher | None = None
        self._wakers: dict[int, Any] = {}
        self._wakeup = asyncio.Event()
        self._poll_lock = asyncio.Lock()
        self._ready: deque[Record] = deque()
        self._closed = False
        self._started = False

    # ------------------------------------------------------------------------------------------------ lifecycle

    async def start(self) -> AsyncSharedSubscriber:
        """Connect (unless given a grid), open the stream, read (or, as the group's first member, store) the
        group's settings and open the dead-letter stream. ``async with`` calls it."""
        if self._started:
            return self
        grid, owned = await connect_async(self._target)
        try:
            self.info = await open_stream_async(grid, self._config)
            refuse_on_ephemeral(self.info, "a shared group (acknowledged records)")
            self._value_deserializer, self._schemas = await typed_deserializer(grid, self.info, self._value_setting)
            rings = [await grid.ring(name) for name in self.info.ring_names]
            self._grid = grid
            self._set_up(self._choices, await grid.map(SHARE_MAP), rings)
            settings = await drive_async(self._settings_steps(self._choices))
            if settings.dead_letter_stream is not None:
                self._dead_letters = await self._dead_letter_publisher(grid, settings.dead_letter_stream)
            self.refusals = Refusals(None, self.stream, self.corrupt_policy)
        except BaseException:
            self._grid = None
            if owned:
                await grid.close()
            raise
        self._owns_grid, self._started = owned, True
        self._detach_metrics = attach_metrics(self._registry, self)
        return self

    async def __aenter__(self) -> AsyncSharedSubscriber:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Release every record still held (available to other members at once), stop waiting, close the
        dead-letter publisher and an owned connection. Settle what was processed first: released records are
        delivered again. ``async for`` ends."""
        if self._closed:
            return
        self._closed = True
        self._wakeup.set()
        for task in self._wakers.values():
            task.cancel()
        if self._detach_metrics is not None:
            self._detach_metrics()
        try:
            if self._started:
                await drive_async(self._release_held())
        finally:
            try:
                if self._dead_letters is not None:
                    await self._dead_letters.close()
            finally:
                if self._owns_grid and self._grid is not None:
                    await self._grid.close()

    def _schemas_caught_up(self) -> Any:
        """``SchemaView.catch_up`` (awaited by the steps' driver): records refused for a version registered since the
        view was read are decoded again."""
        return False if self._schemas is None else self._schemas.catch_up()

    def _publish_letters(self, records: list[Record]) -> Any:
        """Dead letters published with the member's ``AsyncPublisher`` (awaited by the steps' driver until the grid
        acknowledged them)."""
        assert self._dead_letters is not None
        return self._dead_letters.publish_many(records)

    # ------------------------------------------------------------------------------------------------ polling

    def __aiter__(self) -> AsyncIterator[Record]:
        return self

    async def __anext__(self) -> Record:
        """The next record, waiting for it (``poll_timeout_ms`` at a time) until the member is closed; errors are
        ``poll``'s. Settle each with ``ack``, ``nack`` or ``reject``."""
        while not self._ready:
            if self._closed:
                raise StopAsyncIteration
            self._ready.extend(await self.poll(self.poll_timeout_ms))
        return self._ready.popleft()

    async def poll(self, timeout_ms: float = 0) -> RecordBatch:
        """``SharedSubscriber.poll``'s twin: acquire records available now, or the first to become available within
        ``timeout_ms``, and hand them out (``SharedRecord``s with their ``delivery_count``); the same errors."""
        if not self._started:
            raise MeteorError(f"the AsyncSharedSubscriber of stream {self.stream!r} is not started: use `async with`")
        self._check_poll(timeout_ms)
        deadline = time.monotonic() + timeout_ms / 1000.0
        async with self._poll_lock:
            return await drive_async(self._poll_steps(deadline))

    async def _wait(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._wakeup.wait(), seconds)
        except TimeoutError:
            pass

    def _park(self, lane: int, sequence: int) -> asyncio.Task[None]:
        """A task parked on a one-item read: it wakes ``poll`` when a new item arrives (or the read ends otherwise:
        the next poll looks again)."""
        return asyncio.create_task(self._wait_for_item(lane, sequence))

    async def _wait_for_item(self, lane: int, sequence: int) -> None:
        try:
            await self._rings[lane].read_many(sequence, 1, 1)
        except Exception as exc:  # a parked read that failed (timed out, connection lost) only wakes the poll
            logger.debug("stream %r lane %d: the parked read ended with %s", self.stream, lane, exc)
        finally:
            self._wakeup.set()

    # ------------------------------------------------------------------------------------------------ settling

    async def _dead_letter_publisher(self, grid: AsyncGrid, name: str) -> AsyncPublisher:
        """The dead-letter stream's ``AsyncPublisher``, the stream created with the default configuration when
        missing (as the threaded member's ``refusals.dead_letter_publisher``)."""
        try:
            return await AsyncPublisher(grid, name).start()
        except StreamNotFoundError:
            return await AsyncPublisher(grid, StreamConfig(name)).start()

    async def ack(self, records: Record | Iterable[Record]) -> None:
        """``SharedSubscriber.ack``: done, never delivered again; ``ConfigError`` for a record not held,
        ``FencedError`` for records whose acquisition timed out and were taken (nothing written for them)."""
        await drive_async(self._ack(records))

    async def nack(self, records: Record | Iterable[Record], *, delay_ms: int = 0) -> None:
        """``SharedSubscriber.nack``: released for redelivery to any member, at once or no earlier than ``delay_ms``
        from now (stored in the lane's entry); delivery count kept."""
        await drive_async(self._nack(records, delay_ms))

    async def reject(self, records: Record | Iterable[Record]) -> None:
        """``SharedSubscriber.reject``: published to the dead-letter stream (acknowledged), then marked done."""
        await drive_async(self._reject(records))

    async def renew(self, records: Record | Iterable[Record]) -> None:
        """``SharedSubscriber.renew``: the lock of held records starts again (another ``acquisition_timeout_ms``)."""
        await drive_async(self._renew(records))

    def __repr__(self) -> str:
        member = getattr(self, "member_id", self._choices.member_id)
        return f"AsyncSharedSubscriber(stream={self.stream!r}, group={self.group!r}, member={member!r})"
