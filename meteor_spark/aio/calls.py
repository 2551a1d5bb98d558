"""What the asyncio publisher's calls are made of (``meteor_spark.aio.publisher``): the sink a call's offsets go to,
a queued record, a lane's state, an ``add_all`` under retry, and the lookup of a call whose answer was lost.

The lookup is the threaded retrier's search (``meteor_spark.producer.idempotence.call_search``), each grid call it
asks for awaited on an ``AsyncRing``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from meteor_spark.errors import GridError
from meteor_spark.format.item_header import NO_TIMESTAMP
from meteor_spark.grid.aio_client import AsyncGrid, AsyncRing
from meteor_spark.producer.idempotence import call_search
from meteor_spark.producer.publisher import random_producer_id

logger = logging.getLogger("meteor_spark.aio.publisher")


class Sink:
    """Where the offsets of one ``publish`` / ``publish_many`` call go: its future completes once every record of
    the call is stored (with the offset, or the list of offsets), or with the first error."""

    __slots__ = ("future", "left", "offsets", "single")

    def __init__(self, future: asyncio.Future[Any], count: int, single: bool) -> None:
        self.future = future
        self.left = count
        self.offsets = [0] * count
        self.single = single

    def stored(self, index: int, offset: int) -> None:
        self.offsets[index] = offset
        self.left -= 1
        if self.left == 0 and not self.future.done():
            self.future.set_result(self.offsets[0] if self.single else self.offsets)

    def failed(self, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(error)
            self.future.exception()  # retrieved: a fire-and-forget publish_async does not log "never retrieved"


#: A record accepted and not yet stored: value, key, headers, timestamp, size (value, key and headers bytes), the
#: sink its offset goes to and its index there.
Queued = tuple[bytes, "bytes | None", "tuple[tuple[str, bytes], ...]", int, int, Sink, int]


@dataclass
class Lane:
    """One lane of the publisher: its queue, the task sending it, where its next call lands and its largest
    timestamp so far (the time index every item carries)."""

    ring: AsyncRing
    queue: deque[Queued] = field(default_factory=deque)
    task: asyncio.Task[None] | None = None
    next_start: int = 0
    lane_max: int = NO_TIMESTAMP


@dataclass
class Attempts:
    """An ``add_all`` call under retry: what the idempotence errors read (``RetriedCall``)."""

    lane: int
    n_records: int
    n_items: int
    sent: bool = False
    attempts: int = 0


async def find_call_async(ring: AsyncRing, start: int, producer_id: int, first_seq: int) -> tuple[int | None, int]:
    """``meteor_spark.producer.idempotence.find_call`` on an ``AsyncRing``: its search (``call_search``), each grid
    call it asks for awaited."""
    steps = call_search(start, producer_id, first_seq)
    answer: Any = None
    error: GridError | None = None
    while True:
        try:
            step = steps.send(answer) if error is None else steps.throw(error)
        except StopIteration as done:
            return done.value
        answer, error = None, None
        try:
            if step[0] == "read":
                answer = await ring.read_many(step[1], 0, step[2])
            else:
                answer = await (ring.head() if step[0] == "head" else ring.tail())
        except GridError as exc:
            error = exc


async def producer_id_of(grid: AsyncGrid) -> int:
    try:
        return await grid.flake_id("meteor.producer")
    except GridError as exc:
        logger.debug("no FlakeIdGenerator (%s); using a random producer id", exc)
        return random_producer_id()
