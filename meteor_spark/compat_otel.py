"""The private coupling to OpenTelemetry's API (opentelemetry-api): the current context in one C call.

A publisher asks for the current context on every ``publish_async`` (``meteor_spark.format.trace_context``): a record
published inside a span carries its context. The public ``opentelemetry.context.get_current()`` answers through two
Python calls (the module function, then its runtime context's ``get_current``) around one ``ContextVar.get``; at a
million records a second those two calls were a tenth of a record's cost. ``context_reader`` hands out that
``ContextVar``'s own ``get`` instead, when the runtime context is the API's default (``ContextVarsRuntimeContext``,
the one ``OTEL_PYTHON_CONTEXT`` selects unless it names another) and the installed API is a version this was checked
on; otherwise the public function. Version-guarded and checked like ``meteor_spark.compat``'s couplings
(``COUPLINGS``, ``problems``; ``tests/core/test_trace_context.py``); ``opentelemetry`` is imported only inside
functions (it is an optional extra).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from contextvars import ContextVar
from functools import cache
from typing import Any

from meteor_spark.compat import Coupling, installed_version

_OTEL = "opentelemetry-api"
#: opentelemetry-api versions the coupling was written and checked for.
_WRITTEN_FOR = ((1, 45), (1, 46))


def context_reader(get_current: Callable[[], Any]) -> Callable[[], Any]:
    """A callable answering what ``get_current`` (the API's ``opentelemetry.context.get_current``) answers: the
    default runtime context's ``ContextVar.get`` when it can be used, else ``get_current`` itself."""
    var = _default_context_var()
    return get_current if var is None else var.get


@cache
def _default_context_var() -> ContextVar[Any] | None:
    """The ``ContextVar`` the API keeps the current context in (None: another runtime context, or a version this
    was not checked on). Looked up once: the API reads ``OTEL_PYTHON_CONTEXT`` once, when it is imported."""
    found = installed_version(_OTEL)
    if found is None or not _WRITTEN_FOR[0] <= found < _WRITTEN_FOR[1]:
        return None
    from opentelemetry import context

    runtime = getattr(context, "_RUNTIME_CONTEXT", None)
    if type(runtime).__name__ != "ContextVarsRuntimeContext":
        return None
    var = getattr(runtime, "_current_context", None)
    return var if isinstance(var, ContextVar) else None


def _check_context_var() -> None:
    from opentelemetry import context
    from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext

    assert "_RUNTIME_CONTEXT.get_current()" in inspect.getsource(context.get_current), (
        "opentelemetry.context.get_current no longer answers from `_RUNTIME_CONTEXT.get_current()`"
    )
    assert "self._current_context.get()" in inspect.getsource(ContextVarsRuntimeContext.get_current), (
        "ContextVarsRuntimeContext.get_current no longer answers `self._current_context.get()`"
    )
    assert "self._current_context = ContextVar(" in inspect.getsource(ContextVarsRuntimeContext.__init__), (
        "ContextVarsRuntimeContext no longer keeps the context in the ContextVar `_current_context`"
    )


COUPLINGS: tuple[Coupling, ...] = (
    Coupling(
        "the current context read from the API's ContextVar (PublishTracing.current)",
        _OTEL,
        _WRITTEN_FOR,
        _check_context_var,
    ),
)


def problems() -> list[str]:
    """Every coupling to the OpenTelemetry API that no longer holds for the installed version."""
    return [problem for coupling in COUPLINGS for problem in coupling.problems()]
