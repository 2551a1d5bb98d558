"""The grid steps of the deduplication rules (``meteor_spark.producer.dedup.DedupRules``): what a rule asks of the
grid, as values. The rules are generators yielding these; a driver carries each one out and sends its result back
(or throws its error in): ``meteor_spark.grid.steps.drive`` with synchronous calls (the threaded ``DedupWindow``),
``drive_async`` awaited (``aio.claims``).
So one set of rules serves the threaded and the asyncio publisher."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from meteor_spark.producer.dedup import Claim

__all__ = ["ClaimAllStep", "MapStep", "PauseStep", "ReleaseStep", "RingStep", "TxnStep"]


@dataclass(frozen=True)
class MapStep:
    """A call on the claims map: ``method`` (``get``, ``put_if_absent``, ``remove_if_same``, ``replace_if_same``,
    ``set_ttl``) with ``args``; its result comes back."""

    method: str
    args: tuple[Any, ...]


@dataclass(frozen=True)
class RingStep:
    """A call on one lane's ring (``head``, ``tail``, ``read_many``); its result comes back."""

    lane: int
    method: str
    args: tuple[Any, ...] = ()


@dataclass(frozen=True)
class ClaimAllStep:
    """``putIfAbsent(id, text, ttl_s)`` for every pair, all in flight at once; back comes each one's result (the
    entry found, or None) or the ``GridError`` it raised, in order."""

    pairs: tuple[tuple[str, str], ...]
    ttl_s: float


@dataclass(frozen=True)
class ReleaseStep:
    """Give ``claims`` back (``remove(id, pending)`` each): their records were not queued."""

    claims: tuple[Claim, ...]


@dataclass(frozen=True)
class PauseStep:
    """Wait ``seconds`` before looking again."""

    seconds: float


@dataclass(frozen=True)
class TxnStep:
    """The state of transaction ``txn`` (``transactions.TxnState`` or None), one open past its deadline aborted where
    the driver can."""

    txn: str
