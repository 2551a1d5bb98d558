"""Stopping a source runner's readers when Spark ends the runner (SIGTERM) or its process exits.

A Python streaming source lives in a runner process that Spark ends with SIGTERM when the query stops; group leases
and registrations held there must be released then, not left to expire, so every reader registers here once.
"""

from __future__ import annotations

import atexit
import threading
from typing import Any, Protocol

from meteor_spark import compat

_STOP_HOOKS: list[Any] = []
_stopping = threading.Event()


class _Stoppable(Protocol):
    def stop(self) -> None: ...


def install_stop_hooks(reader: _Stoppable) -> None:
    """Make ``stop()`` run when Spark ends the source runner (SIGTERM) or the process exits."""
    if not _STOP_HOOKS:
        atexit.register(_run_stop_hooks)
        compat.stop_source_runner_on_sigterm(_run_stop_hooks, already_stopping=_stopping.is_set)
    _STOP_HOOKS.append(reader)


def _run_stop_hooks() -> None:
    _stopping.set()
    while _STOP_HOOKS:
        _STOP_HOOKS.pop().stop()
