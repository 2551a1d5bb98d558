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
    register again if it still does not hold, so spurious wake-ups are harmless.
    """

    _callbacks: dict[Hashable, dict[int, Callable[[], None]]] = field(default_factory=dict)
    _next: int = 0

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
        callbacks = self._callbacks.pop(key, None)
        if callbacks:
            for callback in callbacks.values():
                callback()
