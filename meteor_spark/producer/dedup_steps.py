"""The grid steps of the deduplication rules (``meteor_spark.producer.dedup.DedupRules``): what a rule asks of the
grid, as values. The rules are generators yielding these; a driver carries each one out and sends its result back
(or throws its error in): ``drive`` with synchronous calls (the threaded ``DedupWindow``), ``aio.claims`` awaited.
So one set of rules serves the threaded and the asyncio publisher."""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from meteor_spark.producer.dedup import Claim

__all__ = ["ClaimAllStep", "MapStep", "PauseStep", "ReleaseStep", "RingStep", "Steps", "TxnStep", "drive"]

T = TypeVar("T")


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


Steps = Generator[Any, Any, T]


def drive(steps: Steps[T], do: Callable[[Any], Any]) -> T:
    """Run ``steps`` to its result, carrying out each step it yields with ``do`` (an error ``do`` raises is thrown
    into the steps, which may handle it)."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = steps.throw(error) if error is not None else steps.send(value)
        except StopIteration as stop:
            return stop.value
        try:
            value, error = do(step), None
        except Exception as exc:
            value, error = None, exc
