"""Stopping a source runner's readers when Spark ends the runner (SIGTERM) or its process exits.

A Python streaming source lives in a runner process that Spark ends with SIGTERM when the query stops; group leases
and registrations held there must be released then, not left to expire, so every reader registers here once. A
SIGKILLed runner releases nothing: its leases expire after ``groupLeaseMs``.

The SIGTERM handler (``compat.stop_source_runner_on_sigterm``) only raises ``SystemExit``: the runner's main thread
unwinds out of whatever it was doing, releasing the locks it held, and the runner's ``finally: reader.stop()``
releases; ``atexit`` stops the readers still registered when the process ends another way. Both the handler and a
reader's ``stop()`` (calling ``stopping()`` first) set ``_stopping``, after which SIGTERMs are ignored: a second one
(Spark sends two), or one arriving while the release is under way (the runner found its socket closed and entered
its ``finally`` before the signal came), cannot abort it.
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
        compat.stop_source_runner_on_sigterm(_stopping)
    _STOP_HOOKS.append(reader)


def stopping() -> None:
    """Say that this process is stopping its readers (the first thing a reader's ``stop()`` does): SIGTERMs are
    ignored from now on. The runner calls ``stop()`` only on its way out, so nothing is left for a SIGTERM to end."""
    _stopping.set()


def _run_stop_hooks() -> None:
    stopping()
    while _STOP_HOOKS:
        _STOP_HOOKS.pop().stop()
