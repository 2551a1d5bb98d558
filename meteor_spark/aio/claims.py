"""Message-id deduplication windows on the asyncio publisher: the threaded rules (``producer.dedup.DedupRules``),
their grid steps awaited.

The claims are the threaded publisher's, in the same map ``meteor.dedup::<stream>`` with the same entries, so
threaded and asyncio publishers refuse each other's repeated ids: claim (``putIfAbsent`` with the window's TTL)
before the record is queued, mark it written (``replace`` then ``setTtl``) once stored, release it when the write
certainly stored nothing; a conflicting pending claim is waited on, its lane searched, and taken over after its
lease. What differs is only how the steps run: ``AsyncDedup`` awaits each (``ClaimAllStep``'s ``putIfAbsent``
calls concurrently), and settles a stored record's claim in a task the publisher's ``close`` waits for.

One difference, by scope: a conflicting claim made by a transactional publisher (the Spark sink) whose transaction
is open past its deadline is not aborted here (the threaded publisher aborts it, as readers do); this publisher
waits for it up to ``max_block_ms`` and raises ``PublishTimeoutError``, nothing queued. Transactional asyncio
publishers on such streams are refused (``check_dedup``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, cast

from meteor_spark.errors import ConfigError, GridError, MeteorError
from meteor_spark.format.records import Record
from meteor_spark.grid import transactions
from meteor_spark.grid.aio_client import AsyncGrid, AsyncGridMap, AsyncRing
from meteor_spark.grid.client import Grid
from meteor_spark.grid.steps import drive_async
from meteor_spark.grid.streams import StreamInfo
from meteor_spark.producer.claimed import ids_to_claim
from meteor_spark.producer.dedup import Claim, DedupRules, claim_lease_ms
from meteor_spark.producer.dedup_steps import (
    ClaimAllStep,
    MapStep,
    PauseStep,
    ReleaseStep,
    RingStep,
    TxnStep,
)

__all__ = ["AsyncDedup", "check_dedup"]

logger = logging.getLogger("meteor_spark.producer.publisher")


def check_dedup(info: StreamInfo, transactional: bool) -> None:
    """``ConfigError`` for a transactional asyncio publisher on a stream with a deduplication window."""
    if transactional and info.config.dedup_window_ms:
        raise ConfigError(
            f"AsyncPublisher(transactional=True): stream {info.name!r} has a deduplication window, whose claims name "
            f"the publisher's transaction; the asyncio publisher does not make such claims: use the threaded "
            f"Publisher, or a stream without dedup_window_ms"
        )


class _TxnEntry:
    """One ``meteor.txns`` entry read ahead, answering ``transactions.state_of``'s synchronous get."""

    def __init__(self, key: str, text: str | None) -> None:
        self._key = key
        self._text = text

    def map(self, name: str) -> _TxnEntry:
        return self

    def get(self, key: str) -> str | None:
        if key != self._key:
            raise AssertionError(f"transaction {key!r} was not read ahead (only {self._key!r})")
        return self._text


class AsyncDedup(DedupRules):
    """An ``AsyncPublisher``'s side of its stream's deduplication window (module docs). Build it with ``open``."""

    def __init__(self, grid: AsyncGrid, claims: AsyncGridMap, rings: Sequence[AsyncRing], **rules: Any) -> None:
        super().__init__(**rules)
        self._grid = grid
        self._map = claims
        self._rings = rings
        self._settling: set[asyncio.Task[None]] = set()

    @classmethod
    async def open(
        cls, grid: AsyncGrid, info: StreamInfo, settings: Any, producer_id: int, rings: Sequence[AsyncRing], floor: Any
    ) -> AsyncDedup:
        """The window of stream ``info`` for a publisher with ``settings`` (its lease as the threaded one's);
        ``floor(lane)``: a sequence at or below where its next write in the lane lands."""
        return cls(
            grid,
            await grid.map(f"meteor.dedup::{info.name}"),
            rings,
            stream=info.name,
            window_ms=info.config.dedup_window_ms,
            producer_id=producer_id,
            lease_ms=claim_lease_ms(settings.delivery_timeout_ms, settings.max_block_ms, settings.linger_ms),
            wait_ms=settings.max_block_ms,
            lane_floor=floor,
        )

    async def claim_records(
        self, records: list[Record | bytes], lane_of: Callable[[Record], int]
    ) -> tuple[list[Claim], list[int]]:
        """Claim the ids of the records (``publish`` or ``publish_many``), all at once, a repeat within the call
        refused first (``claimed.ids_to_claim``); each record with an id moved to its claim's lane (in place).
        Returns the claims and their positions."""
        wanted, positions = ids_to_claim(self.stream, records, lane_of, len(self._rings))
        if not wanted:
            return [], []
        claimed = await drive_async(self.claim_steps(wanted), self._do)
        return [claim for claim in claimed if claim is not None], positions

    async def queued(
        self,
        records: list[Record | bytes],
        lane_of: Callable[[Record], int],
        enqueue: Callable[[list[Record | bytes], bool], Coroutine[Any, Any, asyncio.Future[Any]]],
        single: bool = False,
    ) -> asyncio.Future[Any]:
        """Claim the records' ids, then ``enqueue`` them (it admits and queues, returning their future); the
        claims are released when that raises, else settled when the future is done."""
        claims, positions = await self.claim_records(records, lane_of)
        try:
            future = await enqueue(records, single)
        except BaseException:
            await self.release_all(claims)
            raise
        self.settle_when_done(claims, positions, future)
        return future

    async def _do(self, step: Any) -> Any:
        """One grid step of the rules, awaited."""
        if isinstance(step, MapStep):
            return await getattr(self._map, step.method)(*step.args)
        if isinstance(step, RingStep):
            return await getattr(self._rings[step.lane], step.method)(*step.args)
        if isinstance(step, ClaimAllStep):
            found = await asyncio.gather(
                *(self._map.put_if_absent(mid, text, step.ttl_s) for mid, text in step.pairs), return_exceptions=True
            )
            for item in found:
                if isinstance(item, BaseException) and not isinstance(item, GridError):
                    raise item
            return found
        if isinstance(step, ReleaseStep):
            await self.release_all(step.claims)
            return None
        if isinstance(step, PauseStep):
            await asyncio.sleep(step.seconds)
            return None
        if isinstance(step, TxnStep):
            text = await (await self._grid.map(transactions.TXNS_MAP)).get(step.txn)
            return transactions.state_of(cast(Grid, _TxnEntry(step.txn, text)), step.txn)
        raise AssertionError(f"unknown deduplication step {step!r}")

    async def release_all(self, claims: Sequence[Claim]) -> None:
        """Give claims back (their records were not queued); a failure is logged (the claim then lapses with its
        lease, and the lane search finds no record)."""
        done = await asyncio.gather(
            *(self._map.remove_if_same(c.message_id, c.text) for c in claims), return_exceptions=True
        )
        for claim, outcome in zip(claims, done, strict=True):
            if isinstance(outcome, BaseException):
                logger.warning("stream %r: releasing message id %r failed: %s", self.stream, claim.message_id, outcome)

    def settle_when_done(self, claims: list[Claim], positions: list[int], future: asyncio.Future[Any]) -> None:
        """Settle each claim once ``future`` (the claimed records' write: an offset, or a list of them) is done;
        ``positions``: where each claim's offset is in a list result."""
        if not claims:
            return

        def done(_: asyncio.Future[Any]) -> None:
            error = None if future.cancelled() else future.exception()
            if future.cancelled():
                return  # the publisher was closed with records outstanding: their claims lapse with the lease
            outcome = None if error is not None else future.result()
            for claim, position in zip(claims, positions, strict=True):
                offset = outcome if outcome is None or isinstance(outcome, int) else outcome[position]
                task = asyncio.get_running_loop().create_task(self._settle(claim, offset, error))
                self._settling.add(task)
                task.add_done_callback(self._settling.discard)

        future.add_done_callback(done)

    async def _settle(self, claim: Claim, offset: int | None, error: BaseException | None) -> None:
        """Mark a claim written (``replace`` then ``setTtl``), or release it when its write certainly stored
        nothing."""
        try:
            if error is not None:
                if self.releases(error):
                    await self._map.remove_if_same(claim.message_id, claim.text)
                return
            replaced = await self._map.replace_if_same(claim.message_id, claim.text, self.written_text(claim, offset))
            if replaced:
                await self._map.set_ttl(claim.message_id, self.left_s(claim.at_ms))
        except MeteorError as exc:
            logger.warning("stream %r: marking message id %r written failed: %s", self.stream, claim.message_id, exc)
            return
        if not replaced:
            self.lost_lease(claim)

    async def drain(self, timeout_s: float | None) -> bool:
        """Wait until the claims of the records stored so far are marked written (``close``); False when
        ``timeout_s`` passed first."""
        if self._settling:
            _done, pending = await asyncio.wait(set(self._settling), timeout=timeout_s)
            return not pending
        return True
