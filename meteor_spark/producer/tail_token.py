"""The token ``publish_async``'s tail append holds (``Accumulator.plain_publisher``): a mutex whose uncontended take
and give are the cheapest calls CPython 3.11 has, and whose holder is never waited for by a publishing thread.

One token in a ``deque``: ``tokens.pop()`` takes it and ``tokens.append(token)`` gives it back, each one C call
under the GIL that CPython 3.11 specializes as a method call (``SimpleQueue.get``, the token queue before, is not
specialized: 9 ns a value more, of ~280). A ``pop`` that finds no token does not wait: the publishing thread then
takes the accumulator's counted way, under its lock. Only the accumulator's steps under that lock wait for the token
(``take``), while a publishing thread finishes its append: they count themselves in ``waiters`` first, and a
publishing thread that gives the token back while any waits wakes them (``given_back``). Taking the lock first, then
the token, and never the lock while holding the token, no one waits in a circle.
"""

from __future__ import annotations

import threading
from collections import deque

__all__ = ["TailToken"]


class TailToken:
    """The one token (``tokens``) and the accumulator's steps waiting for it (``waiters``); see the module docstring.

    ``tokens`` and ``waiters`` are read by the publishing thread's append itself, in one frame: a method per take and
    give cost more than the token saves.
    """

    __slots__ = ("_back", "tokens", "waiters")

    def __init__(self) -> None:
        self.tokens: deque[bool] = deque([True])
        self.waiters = 0
        self._back = threading.Condition(threading.Lock())

    def take(self) -> bool:
        """The token, waited for while a publishing thread's append holds it (the accumulator's lock held: only one
        step waits at a time)."""
        tokens = self.tokens
        try:
            return tokens.pop()
        except IndexError:
            pass
        with self._back:
            self.waiters += 1
            try:
                while True:
                    try:
                        return tokens.pop()
                    except IndexError:
                        self._back.wait()
            finally:
                self.waiters -= 1

    def give(self, token: bool) -> None:
        """Give the token back (after ``take``; a publishing thread appends it to ``tokens`` itself, then calls
        ``given_back`` when ``waiters`` is not 0)."""
        self.tokens.append(token)
        if self.waiters:
            self.given_back()

    def given_back(self) -> None:
        """A publishing thread gave the token back while a step waits for it: wake it (it takes the token, or, when
        another publishing thread took it first, waits for that one)."""
        with self._back:
            self._back.notify_all()
