"""Time and wake-ups for the engine: the clock it reads (injectable, so tests move time by hand) and the one-shot
wake-up callbacks blocking operations park on. The engine's data structures import these from here, below the
``Engine`` that composes them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int:
        """Wall-clock milliseconds since the epoch (what Hazelcast reports in entry views, publish times)."""

    def monotonic_ms(self) -> float:
        """Monotonic milliseconds for expiry and leases (never jumps)."""


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic_ms(self) -> float:
        return time.monotonic() * 1000.0


@dataclass
class ManualClock:
    """A clock tests move by hand."""

    wall_ms: int = 1_700_000_000_000
    mono_ms: float = 0.0

    def now_ms(self) -> int:
        return self.wall_ms

    def monotonic_ms(self) -> float:
        return self.mono_ms

    def advance(self, ms: float) -> None:
        self.wall_ms += int(ms)
        self.mono_ms += ms


@dataclass
class Waiters:
    """One-shot wake-up callbacks keyed by object (e.g. ``("ring", name)``, ``("map", name, key)``).

    ``notify(key)`` calls and forgets every callback registered for ``key``; callers re-check their condition and
    register again if it still does not hold, so spurious wake-ups are harmless. Between ``hold`` and ``release``
    the notifications wait (a key notified twice meanwhile wakes its callbacks once).
    """

    _callbacks: dict[Hashable, dict[int, Callable[[], None]]] = field(default_factory=dict)
    _next: int = 0
    _held: list[Hashable] | None = None

    def register(self, key: Hashable, callback: Callable[[], None]) -> int:
        self._next += 1
        self._callbacks.setdefault(key, {})[self._next] = callback
        return self._next

    def cancel(self, key: Hashable, handle: int) -> None:
        callbacks = self._callbacks.get(key)
        if callbacks is not None:
            callbacks.pop(handle, None)
            if not callbacks:
                del self._callbacks[key]

    def notify(self, key: Hashable) -> None:
        held = self._held
        if held is not None:
            if key not in held:
                held.append(key)
            return
        callbacks = self._callbacks.pop(key, None)
        if callbacks:
            for callback in callbacks.values():
                callback()

    def hold(self) -> bool:
        """Keep the notifications from now on until ``release`` (a request's handler runs: its wake-ups go out after
        its own response); False when they are held already (the outer holder releases them)."""
        if self._held is not None:
            return False
        self._held = []
        return True

    def release(self) -> None:
        """Stop holding, and notify the keys held meanwhile, in order."""
        keys, self._held = self._held, None
        if keys:
            for key in keys:
                self.notify(key)
