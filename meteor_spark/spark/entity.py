"""A streaming query as a consuming entity of the ephemeral streams it reads (source runner only).

What "at most once" means for a Spark query reading an ephemeral stream:

- While its source runner runs, the query is one entity (``query/<member id>``) of each ephemeral stream it reads:
  it registers its ``topics`` patterns (default ``#``) in the stream's registry (``meteor_spark.grid.subscriptions``)
  and a background thread renews the entry, so publishers keep the records it matches. Records published while no
  source runner of the query runs are kept only if another entity matches them.
- A new query starts at the lanes' ends as read just before it registered (``startingOffsets`` must be ``latest``,
  the default), so every record published once its entry is visible is its; a restarted query resumes from its
  checkpoint and reads what the lanes still hold from there.
- Spark's own recovery stands: a micro-batch that fails is read again from the same offsets, so rows reach the sink
  once per successful batch as with any source. What is at most once is the stream's side: a record dropped for
  lack of a matching entity, or overwritten in the ring, is gone; nothing is acknowledged or redelivered.
- ``group`` is refused with an ephemeral stream: a group's offsets are the acknowledgement an ephemeral stream does
  not have.
"""

from __future__ import annotations

import logging
import threading

from meteor_spark.errors import ConfigError, MeteorError
from meteor_spark.grid.client import Grid
from meteor_spark.grid.streams import StreamInfo
from meteor_spark.grid.subscriptions import DEFAULT_SUBSCRIPTION_TTL_MS, Subscription, SubscriptionLease
from meteor_spark.spark.options import OffsetSpec, SourceOptions

logger = logging.getLogger(__name__)


class QueryEntity:
    """The registry entries of one source runner, one per ephemeral stream read, renewed on a daemon thread."""

    def __init__(self, grid: Grid, options: SourceOptions, member_id: str) -> None:
        self._grid = grid
        self._options = options
        self._subscription = Subscription(f"query/{member_id}", member_id, options.topics or ("#",))
        self._leases: dict[str, SubscriptionLease] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def open(self, info: StreamInfo) -> None:
        """Register on ``info``'s stream when it is ephemeral (after checking the options that contradict it)."""
        if not info.config.ephemeral:
            return
        options = self._options
        if options.group is not None:
            raise ConfigError(
                f"option 'group' with stream {info.name!r}: the stream is ephemeral (at-most-once, no "
                f"acknowledgement); a query reading it is an entity of its own, so remove option 'group'"
            )
        if options.starting.spec is not OffsetSpec.LATEST or options.starting_time is not None:
            raise ConfigError(
                f"startingOffsets / startingTimestamp with stream {info.name!r}: the stream is ephemeral, so a query "
                f"starts at the lanes' ends (nothing published before it subscribed is its); remove the option"
            )
        with self._lock:
            self._leases[info.name] = SubscriptionLease(
                self._grid, info.name, self._subscription, DEFAULT_SUBSCRIPTION_TTL_MS
            )
            if self._thread is None:
                self._thread = threading.Thread(target=self._renew, name="meteor-query-entity", daemon=True)
                self._thread.start()
        logger.info("query registered on ephemeral stream %r with topics %s", info.name, self._subscription.topics)

    def forget(self, name: str) -> None:
        """Stop renewing ``name``'s entry (the stream was deleted)."""
        with self._lock:
            self._leases.pop(name, None)

    def _renew(self) -> None:
        while not self._stop.wait(DEFAULT_SUBSCRIPTION_TTL_MS / 3000.0 / 2):
            with self._lock:
                leases = list(self._leases.values())
            for lease in leases:
                try:
                    lease.renew_if_due()
                except MeteorError as exc:  # the next round tries again; the TTL leaves two more
                    logger.warning("could not renew the query's registration: %s", exc)

    def close(self) -> None:
        """Leave every registry now."""
        self._stop.set()
        with self._lock:
            leases, self._leases = list(self._leases.values()), {}
        for lease in leases:
            lease.close()
