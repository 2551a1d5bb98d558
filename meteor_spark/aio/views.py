"""Synchronous views of grid state read ahead with awaited calls, for the socket-free pieces the asyncio subscriber
reuses as they are.

The threaded reader's pieces ask the grid synchronously in a few places: ``LaneState`` asks its ring for the lane's
end when an answer shows the lane now ends before the position (``past_end``), and ``ItemGate`` looks transactions
up in grid maps (``read_committed``). Rather than copying them, the asyncio subscriber awaits exactly those reads
first and hands the pieces these views, which answer from what was read:

- ``RingBounds``: a ring's head and tail as last read (``refresh``), with the two synchronous calls ``LaneState``
  and ``grid.reading.oldest_in`` make (``tail()`` and ``read_many(head, 0, 1)``'s first sequence).
- ``TxnSnapshot``: the entries of the transaction maps the gate will ask for, for the transactional producers of
  one read (``prefetch``); the gate's own caching (``KnownTransactions``: decided transactions for good, open ones
  for ``RECHECK_S``) is kept, so a decided transaction is read once. A transaction found open past its deadline is
  aborted here (``aio.txn_grid.abort_expired``), and stale open-transaction entries are cleared now and then
  (``txn_grid.clear_stale_if_due``), as a threaded ``read_committed`` reader's gate does: the gate then reads the
  decision, so an asyncio reader does not wait for ever at a transaction whose writer died.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from meteor_spark.aio import txn_grid
from meteor_spark.errors import FormatError, MeteorError
from meteor_spark.format.item_header import item_producer
from meteor_spark.grid.aio_client import AsyncGrid, AsyncRing
from meteor_spark.grid.client import ReadBatch
from meteor_spark.grid.item_gate import KnownTransactions
from meteor_spark.grid.transactions import PRODUCERS_MAP, SWEPT_KEY, TXNS_MAP, TxnState
from meteor_spark.grid.txn_decisions import expired

__all__ = ["RingBounds", "TxnSnapshot"]


class RingBounds:
    """A ring's head and tail as last read (``refresh``), answering ``LaneState``'s synchronous questions."""

    def __init__(self, ring: AsyncRing, head: int, tail: int) -> None:
        self.ring = ring
        self.name = ring.name
        self._head = head
        self._tail = tail

    async def refresh(self) -> None:
        """Read the ring's head, then its tail (a tail read after the head keeps ``head <= tail + 1``)."""
        self._head = await self.ring.head()
        self._tail = await self.ring.tail()

    def tail(self) -> int:
        return self._tail

    def head(self) -> int:
        return self._head

    def read_many(self, start: int, min_count: int, max_count: int) -> ReadBatch:
        """What ``oldest_in`` reads (``read_many(0, 0, 1)``): the sequence of the oldest item held, no item bytes."""
        if self._head > self._tail:
            return ReadBatch([], [], self._tail + 1)
        return ReadBatch([b""], [self._head], self._head + 1)


class _Entries:
    """One map of a ``TxnSnapshot``: ``get`` answers from the entries read ahead."""

    def __init__(self, name: str, entries: dict[str, str | None]) -> None:
        self.name = name
        self._entries = entries

    def get(self, key: str) -> str | None:
        if key not in self._entries:
            raise MeteorError(f"map {self.name!r} key {key!r} was not read ahead for the item gate")
        return self._entries[key]


class TxnSnapshot:
    """The grid, as far as a ``read_committed`` ``ItemGate`` asks it: the transaction maps' entries it needs for the
    items about to be checked, read ahead (``prefetch``, which also aborts expired transactions). Pass it as the gate's
    grid with ``abort_expired=False`` (the gate then only reads what was read ahead)."""

    def __init__(self, grid: AsyncGrid, known: KnownTransactions) -> None:
        self._grid = grid
        self._known = known
        self._maps: dict[str, dict[str, str | None]] = {PRODUCERS_MAP: {}, TXNS_MAP: {}}

    def map(self, name: str) -> _Entries:
        return _Entries(name, self._maps[name])

    async def prefetch(self, items: Sequence[Any], sequences: Sequence[int], *, stream: str, lane: int) -> None:
        """Read the transaction entries the gate will ask for about ``items``: each transactional producer's
        transaction key and its transaction (unless already decided), and the maps' swept marker. Transactions
        open past their deadline are aborted, and stale open entries cleared now and then, as ``ItemGate`` does."""
        await txn_grid.clear_stale_if_due(self._grid)
        producers = set()
        for item, sequence in zip(items, sequences, strict=True):
            try:
                header = item_producer(item, stream=stream, lane=lane, sequence=sequence)
            except FormatError:
                continue  # the reader's corrupt-item policy deals with it
            if header.transactional:
                producers.add(header.producer_id)
        known = self._known
        todo = [p for p in producers if known.txn_of.get(p) not in known.decided]
        if not todo:
            return
        registry = await self._grid.map(PRODUCERS_MAP)
        txns = await self._grid.map(TXNS_MAP)
        keys = await asyncio.gather(*(registry.get(str(p)) for p in todo))
        swept = await registry.get(SWEPT_KEY)
        self._maps[PRODUCERS_MAP] = {str(p): key for p, key in zip(todo, keys, strict=True)}
        self._maps[PRODUCERS_MAP][SWEPT_KEY] = swept
        names = [key for key in keys if key is not None]
        states = list(await asyncio.gather(*(txns.get(key) for key in names)))
        for index, (key, text) in enumerate(zip(names, states, strict=True)):
            if text is not None and expired(TxnState.parse(key, text), int(time.time() * 1000)):
                decided = await txn_grid.abort_expired(self._grid, key)  # as a threaded reader's gate does
                states[index] = None if decided is None else decided.to_json()
        self._maps[TXNS_MAP] = dict(zip(names, states, strict=True))
