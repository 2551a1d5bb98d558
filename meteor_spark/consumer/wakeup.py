"""The flag a ``Subscriber``'s poll sleeps on: ``threading.Event``'s behaviour on one bare lock.

A poll that finds nothing waits until a read's answer (set on the client's reactor thread), an assignment change or
``close`` sets it. With one record in flight that hand-off happens on every round trip, and ``threading.Event``
pays for it in Python code on both threads: its ``Condition`` allocates a waiter lock per wait and takes its own
lock on each side twice. ``Wakeup`` holds a single lock while the flag is clear: ``set`` releases it (any thread may
release a bare lock) and ``wait`` acquires it, so the hand-off is one C-level release and one acquire.
"""

from __future__ import annotations

import threading


class Wakeup:
    """A flag with ``threading.Event``'s ``set`` / ``clear`` / ``is_set`` / ``wait`` (any number of setters and
    waiters); the lock is held exactly while the flag is clear."""

    __slots__ = ("_clear",)

    def __init__(self) -> None:
        self._clear = threading.Lock()
        self._clear.acquire()

    def set(self) -> None:
        """Set the flag, waking the waiters (a no-op when it is set already)."""
        try:
            self._clear.release()
        except RuntimeError:
            pass  # set already (another setter released it first)

    def clear(self) -> None:
        """Clear the flag (a no-op when it is clear)."""
        self._clear.acquire(False)

    def is_set(self) -> bool:
        return not self._clear.locked()

    def wait(self, timeout: float) -> bool:
        """Block until the flag is set or ``timeout`` seconds passed (clamped to ``[0, threading.TIMEOUT_MAX]``);
        returns whether it is set. The flag stays set: the lock taken to see it is released again, which also
        wakes the next waiter."""
        if self._clear.acquire(True, min(max(0.0, timeout), threading.TIMEOUT_MAX)):
            self.set()
            return True
        return False
