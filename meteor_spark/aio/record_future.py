"""The future ``AsyncPublisher.publish_async`` returns for a plain value: record ``index`` of a run of one-record
calls, whose outcome the run's ``RunOutcomes`` holds (the asyncio twin of the threaded ``RecordFuture``).

An ``asyncio.Future`` per record cost more than the rest of a record's way onto its lane (made, kept by the
caller, traversed by the garbage collector, then settled one by one); a ``PublishFuture`` is two slots, and a call
settles its records by noting one ``(start, count, first offset or error)`` piece. It answers what an asyncio
future answers: ``await``, ``result``, ``exception``, ``done``, ``cancelled``, ``cancel``, ``add_done_callback``,
``remove_done_callback``, ``get_loop``; ``asyncio.isfuture`` recognises it (``_asyncio_future_blocking``), so
``asyncio.gather``, ``wait``, ``wait_for``, ``shield`` and ``as_completed`` take it as they take a future. What a
waiter needs (callbacks, the asyncio future an ``await`` suspends on, the cancelled flag) is made only when a
caller asks for it, in the instance's ``__dict__``. As with an asyncio future, cancelling it does not take the
record back: it is stored all the same.
"""

from __future__ import annotations

import asyncio
import contextvars
from bisect import bisect_right, insort
from collections.abc import Callable, Generator
from typing import Any, Protocol

__all__ = ["OffsetFuture", "PublishFuture", "RunOutcomes"]


class OffsetFuture(Protocol):
    """What ``publish_async`` returns: an asyncio future of the record's offset, or a ``PublishFuture``."""

    def __await__(self) -> Generator[Any, None, int]: ...
    def done(self) -> bool: ...
    def cancelled(self) -> bool: ...
    def cancel(self, msg: Any | None = None) -> bool: ...
    def result(self) -> int: ...
    def exception(self) -> BaseException | None: ...
    def add_done_callback(
        self, fn: Callable[[Any], object], /, *, context: contextvars.Context | None = None
    ) -> None: ...
    def get_loop(self) -> asyncio.AbstractEventLoop: ...


class RunOutcomes:
    """The outcomes of one run of one-record calls: settled pieces ``[start, start + count)`` (sorted by start) with
    their first offset or their error, and the futures waited on (``watchers``) until their record is settled.

    ``values`` is the run's list of values (its length is the run's); dropped once every record is settled, so a
    future kept by a caller holds its run's outcomes, not its values.
    """

    __slots__ = ("counts", "errors", "firsts", "loop", "settled", "starts", "values", "watchers")

    def __init__(self, loop: asyncio.AbstractEventLoop, values: list[bytes]) -> None:
        self.loop = loop
        self.values: list[bytes] | tuple[()] = values
        self.starts: list[int] = []
        self.counts: list[int] = []
        self.firsts: list[int] = []
        self.errors: list[BaseException | None] = []
        self.settled = 0
        self.watchers: list[PublishFuture] = []

    def outcome(self, index: int) -> tuple[int, BaseException | None] | None:
        """Record ``index``'s ``(offset, error)``, or None while it is not settled."""
        k = bisect_right(self.starts, index) - 1
        if k < 0 or index >= self.starts[k] + self.counts[k]:
            return None
        return self.firsts[k] + index - self.starts[k], self.errors[k]

    # The sink interface of aio/calls.py (Sink.stored / Sink.failed).

    def stored(self, run: Any, lo: int, hi: int, first_offset: int) -> None:
        self._settle(lo, hi, first_offset, None)

    def failed(self, error: BaseException, lo: int = 0, hi: int | None = None) -> None:
        """Records ``[lo, hi)`` (``hi`` None: to the run's end) failed with ``error``."""
        self._settle(lo, len(self.values) if hi is None else hi, -1, error)

    def _settle(self, lo: int, hi: int, first: int, error: BaseException | None) -> None:
        if hi <= lo:
            return
        k = bisect_right(self.starts, lo)
        insort(self.starts, lo)
        self.counts.insert(k, hi - lo)
        self.firsts.insert(k, first)
        self.errors.insert(k, error)
        self.settled += hi - lo
        if self.settled >= len(self.values):
            self.values = ()
        if self.watchers:
            waiting = self.watchers
            self.watchers = [future for future in waiting if not lo <= future._index < hi]
            for future in waiting:
                if lo <= future._index < hi:
                    future._wake()


class PublishFuture:
    """The future of one ``publish_async`` of a plain value (module docs)."""

    __slots__ = ("__dict__", "__weakref__", "_index", "_outcomes")

    #: ``asyncio.isfuture`` reads it: this object is a future to asyncio's helpers.
    _asyncio_future_blocking = False

    _index: int
    _outcomes: RunOutcomes

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._outcomes.loop

    def done(self) -> bool:
        return self.__dict__.get("_cancelled", False) or self._outcomes.outcome(self._index) is not None

    def cancelled(self) -> bool:
        return bool(self.__dict__.get("_cancelled", False))

    def cancel(self, msg: Any | None = None) -> bool:
        """Mark the future cancelled (its record is stored all the same); False once it is done."""
        if self.done():
            return False
        self.__dict__["_cancelled"] = True
        self._outcomes.watchers = [future for future in self._outcomes.watchers if future is not self]
        self._wake(msg)
        return True

    def result(self) -> int:
        offset, error = self._settled()
        if error is not None:
            raise error
        return offset

    def exception(self) -> BaseException | None:
        return self._settled()[1]

    def _settled(self) -> tuple[int, BaseException | None]:
        if self.__dict__.get("_cancelled", False):
            raise asyncio.CancelledError()
        outcome = self._outcomes.outcome(self._index)
        if outcome is None:
            raise asyncio.InvalidStateError("Result is not set.")
        return outcome

    def add_done_callback(self, fn: Callable[[Any], object], /, *, context: contextvars.Context | None = None) -> None:
        if self.done():
            self._outcomes.loop.call_soon(fn, self, context=context)
            return
        self._watch().setdefault("_callbacks", []).append((fn, context))

    def remove_done_callback(self, fn: Callable[[Any], object], /) -> int:
        callbacks = self.__dict__.get("_callbacks", [])
        kept = [entry for entry in callbacks if entry[0] != fn]
        self.__dict__["_callbacks"] = kept
        return len(callbacks) - len(kept)

    def __await__(self) -> Generator[Any, None, int]:
        if not self.done():
            waiter = self._outcomes.loop.create_future()
            self._watch().setdefault("_waiters", []).append(waiter)
            try:
                yield from waiter
            except asyncio.CancelledError:  # the awaiting task was cancelled: so is this future, as asyncio's
                self.cancel()
                raise
        return self.result()

    __iter__ = __await__

    def _watch(self) -> dict[str, Any]:
        """This future's waiter state, with the future among its run's watchers."""
        state = self.__dict__
        if not state.get("_watched", False):
            state["_watched"] = True
            self._outcomes.watchers.append(self)
        return state

    def _wake(self, msg: Any | None = None) -> None:
        """The record is settled (or this future cancelled): wake its awaits, schedule its callbacks."""
        state = self.__dict__
        for waiter in state.pop("_waiters", ()):
            if not waiter.done():
                if state.get("_cancelled", False):
                    waiter.cancel(msg)
                else:
                    waiter.set_result(None)
        loop = self._outcomes.loop
        for fn, context in state.pop("_callbacks", ()):
            loop.call_soon(fn, self, context=context)

    def __repr__(self) -> str:
        if self.cancelled():
            return f"<PublishFuture at {id(self):#x} cancelled>"
        outcome = self._outcomes.outcome(self._index)
        if outcome is None:
            return f"<PublishFuture at {id(self):#x} pending>"
        offset, error = outcome
        shown = f"exception={error!r}" if error is not None else f"result={offset}"
        return f"<PublishFuture at {id(self):#x} finished {shown}>"
