"""Message handlers. Importing this package registers every handler module in ``registry.HANDLERS``; the handler
modules import ``registry``, never this package, so the registry stays below them."""

from __future__ import annotations

from meteor_spark.server.handlers import (  # noqa: F401 - imported for their @handles registrations
    atomic,
    cluster,
    cp,
    dynamic_config,
    flake_id,
    map,
    ringbuffer,
    topic,
)
from meteor_spark.server.handlers.registry import HANDLERS, HandlerEntry


def supported_messages() -> list[HandlerEntry]:
    """Every registered handler, by message type (for docs and tests)."""
    return [HANDLERS[key] for key in sorted(HANDLERS)]
