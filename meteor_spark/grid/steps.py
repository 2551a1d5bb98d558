"""Grid calls as steps: one piece of logic for the threaded and the asyncio clients.

Logic that talks to the grid more than once (a shared group's acquire and settle, a deduplication window's claims)
is written once, as a generator that *yields* each step it needs and receives the step's result back. A driver
carries the steps out: ``drive`` synchronously (the threaded clients), ``drive_async`` on the event loop, awaiting
a result that is awaitable (the asyncio clients, whose grid calls return coroutines). An error a step raises is
thrown into the generator where it yielded, so the logic's own ``try`` blocks handle it under either driver.

What a step is belongs to its user: a zero-argument callable (``call``, the shared group's) or a value describing
the call that a dispatcher turns into one (the deduplication window's ``dedup_steps``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Generator
from types import CoroutineType
from typing import Any, TypeVar

__all__ = ["Steps", "call", "drive", "drive_async"]

T = TypeVar("T")

#: Steps returning ``T``: each yielded value is a step to carry out, and the generator receives its result.
Steps = Generator[Any, Any, T]


def call(step: Callable[[], Any]) -> Any:
    """The dispatcher of steps that are zero-argument callables: call it."""
    return step()


def drive(steps: Steps[T], do: Callable[[Any], Any] = call) -> T:
    """Run ``steps`` to its result on the caller's thread, carrying out each step with ``do``."""
    value: Any = None
    error: Exception | None = None
    while True:
        try:
            step = steps.throw(error) if error is not None else steps.send(value)
        except StopIteration as stop:
            return stop.value
        try:
            value, error = do(step), None
        except Exception as exc:  # thrown into the steps, where their own handlers decide
            value, error = None, exc


async def drive_async(steps: Steps[T], do: Callable[[Any], Any] = call) -> T:
    """``drive`` on the event loop: what ``do`` returns is awaited when it is awaitable."""
    value: Any = None
    error: Exception | None = None
    direct = do is call  # a callable step called in place: one Python call less per step
    while True:
        try:
            step = steps.throw(error) if error is not None else steps.send(value)
        except StopIteration as stop:
            return stop.value
        try:
            value = step() if direct else do(step)
            if type(value) is CoroutineType or inspect.isawaitable(value):  # the common case checked inline first
                value = await value
            error = None
        except Exception as exc:  # thrown into the steps, where their own handlers decide
            value, error = None, exc
