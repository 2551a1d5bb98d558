"""Message handlers. Importing this package registers every handler module in ``registry.HANDLERS``."""

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
