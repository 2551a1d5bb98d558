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
    their first offset or their error, and an asyncio future per record someone waits on (``waiters``, made on
    demand: ``future_of``), settled with the record.

    ``values`` is the run's list of values (its length is the run's); dropped once every record is settled, so a
    future kept by a caller holds its run's outcomes, not its values.
    """

    __slots__ = ("counts", "errors", "firsts", "loop", "settled", "starts", "values", "waiters")

    def __init__(self, loop: asyncio.AbstractEventLoop, values: list[bytes]) -> None:
        self.loop = loop
        self.values: list[bytes] | tuple[()] = values
        self.starts: list[int] = []
        self.counts: list[int] = []
        self.firsts: list[int] = []
        self.errors: list[BaseException | None] = []
        self.settled = 0
        self.waiters: dict[int, asyncio.Future[int]] = {}

    def outcome(self, index: int) -> tuple[int, BaseException | None] | None:
        """Record ``index``'s ``(offset, error)``, or None while it is not settled."""
        k = bisect_right(self.starts, index) - 1
        if k < 0 or index >= self.starts[k] + self.counts[k]:
            return None
        return self.firsts[k] + index - self.starts[k], self.errors[k]

    def future_of(self, index: int) -> asyncio.Future[int]:
        """An asyncio future of record ``index``'s offset: the one already waited on, or a new one (done at once
        when the record is settled)."""
        future = self.waiters.get(index)
        if future is None:
            future = self.loop.create_future()
            outcome = self.outcome(index) if self.starts else None
            if outcome is None:
                self.waiters[index] = future
            else:
                _settle_future(future, *outcome)
        return future

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
        waiters = self.waiters
        if waiters:  # the fewer of the waiters and the settled records is looked through
            ready = (
                [i for i in waiters if lo <= i < hi]
                if len(waiters) < hi - lo
                else [i for i in range(lo, hi) if i in waiters]
            )
            if error is None:
                for index in ready:
                    future = waiters.pop(index)
                    if not future.done():
                        future.set_result(first + index - lo)
            else:
                for index in ready:
                    _settle_future(waiters.pop(index), -1, error)


def _settle_future(future: asyncio.Future[int], offset: int, error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(offset)
    else:
        future.set_exception(error)
        future.exception()  # retrieved: a future only called back does not log "never retrieved"


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
        waiter = self._outcomes.waiters.pop(self._index, None)
        if waiter is not None:
            waiter.cancel(msg)
        self._call_back()
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

    def asyncio_future(self) -> asyncio.Future[int]:
        """An asyncio future of the same offset (``AsyncPublisher.publish`` awaits it: no frame of this class)."""
        return self._outcomes.future_of(self._index)

    def add_done_callback(self, fn: Callable[[Any], object], /, *, context: contextvars.Context | None = None) -> None:
        if self.done():
            self._outcomes.loop.call_soon(fn, self, context=context)
            return
        callbacks = self.__dict__.setdefault("_callbacks", [])
        if not callbacks:
            self._outcomes.future_of(self._index).add_done_callback(self._call_back)
        callbacks.append((fn, context))

    def remove_done_callback(self, fn: Callable[[Any], object], /) -> int:
        callbacks = self.__dict__.get("_callbacks", [])
        kept = [entry for entry in callbacks if entry[0] != fn]
        self.__dict__["_callbacks"] = kept
        return len(callbacks) - len(kept)

    def __await__(self) -> Generator[Any, None, int]:
        if not self.done():
            try:
                return (yield from self._outcomes.future_of(self._index))
            except asyncio.CancelledError:  # the awaiting task was cancelled: so is this future, as asyncio's
                self.cancel()
                raise
        return self.result()

    __iter__ = __await__

    def _call_back(self, _settled: object = None) -> None:
        """Schedule the callbacks (the record is settled, or this future cancelled)."""
        loop = self._outcomes.loop
        for fn, context in self.__dict__.pop("_callbacks", ()):
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
