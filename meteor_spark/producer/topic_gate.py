"""A publisher's gate on an ephemeral stream: records whose topic no live entity wants are dropped, and counted.

At-most-once streams store only what some consuming entity will read (``meteor_spark.grid.subscriptions``). The
gate asks the publisher's copy of the registry about each record's topic before it is queued. A dropped record is
never an error: its future completes at once with ``NOT_STORED`` (-1), its callback gets ``(NOT_STORED, None)``
on the publisher's completion thread, and ``Publisher.metrics()["dropped_records"]`` (Prometheus
``meteor_publisher_dropped_records_total``) counts it. Bulk publishes drop row by row: ``publish_many``'s offsets
hold ``NOT_STORED`` for the dropped records, ``publish_arrow``'s count is of the rows stored.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import pyarrow as pa

from meteor_spark.errors import ConfigError
from meteor_spark.format.records import Record
from meteor_spark.format.routing import TOPIC_HEADER
from meteor_spark.grid.client import Grid
from meteor_spark.grid.subscriptions import DEFAULT_REFRESH_MS, NOT_STORED, SubscriptionView
from meteor_spark.producer.futures import BulkFuture, Outcomes, PublishCallback, RecordFuture, call_back
from meteor_spark.validate import check_int

# One settled outcome shared by every dropped record's future: record 0 "stored" at offset NOT_STORED.
_DROPPED = Outcomes(threading.Lock())
_DROPPED.singles = True
_DROPPED.outcomes = [(0, 1, NOT_STORED, None)]


def dropped_future() -> RecordFuture:
    """A publish future already completed with ``NOT_STORED``."""
    return RecordFuture(_DROPPED, 0)


def topic_of(record: Any) -> str:
    """The topic of a record as the publisher holds it (a plain value has none)."""
    return record.topic if isinstance(record, Record) else ""


def check_refresh_ms(refresh_ms: int | None) -> None:
    """``subscription_refresh_ms``'s range, checked before the stream is opened."""
    if refresh_ms is not None:
        check_int("subscription_refresh_ms", refresh_ms, 1, 3_600_000)


def refuse_refresh_on_persistent(info: Any, refresh_ms: int | None) -> None:
    """``ConfigError`` for ``subscription_refresh_ms`` on a stream (``info``: its ``StreamInfo``) that is not
    ephemeral: its publishers read no registry."""
    if refresh_ms is not None and not info.config.ephemeral:
        raise ConfigError(
            f"subscription_refresh_ms: stream {info.name!r} is not ephemeral, so its publishers keep every "
            f"record and read no registry; leave it unset"
        )


class TopicGate:
    """Drops what no live entity of an ephemeral stream wants; counts it in ``dropped``."""

    def __init__(self, grid: Grid, stream: str, refresh_ms: int | None = None) -> None:
        self.view = SubscriptionView(grid, stream, DEFAULT_REFRESH_MS if refresh_ms is None else refresh_ms)
        self.dropped = 0

    def wants(self, record: Any) -> bool:
        """Whether some live entity wants ``record`` (nothing is counted: the caller checks the record first)."""
        return self.view.wants(topic_of(record))

    def drop(self, callback: PublishCallback | None, later: Callable[[Callable[[], None]], None]) -> RecordFuture:
        """Count a dropped record; its future. ``callback`` runs through ``later`` (the completion thread)."""
        self.dropped += 1
        if callback is not None:
            later(lambda: call_back(callback, NOT_STORED, None))
        return dropped_future()

    def split(self, records: list[Any]) -> list[int]:
        """The positions of the records some entity wants (nothing counted: see ``count``)."""
        return [position for position, record in enumerate(records) if self.wants(record)]

    def count(self, dropped: int) -> None:
        """Count records of a bulk publish dropped, once the publish was accepted."""
        self.dropped += dropped

    def rows_wanted(self, batch: pa.RecordBatch | pa.Table) -> tuple[pa.RecordBatch | pa.Table, int]:
        """The rows of an Arrow bulk some entity wants, by the ``meteor.topic`` entry of their ``headers``, and
        how many were left out (not counted yet: see ``count``)."""
        n = batch.num_rows
        if "headers" in batch.schema.names:
            topics = [_topic_in(headers) for headers in batch.column("headers").to_pylist()]
        else:
            topics = [""] * n
        mask = [self.view.wants(topic) for topic in topics]
        kept = sum(mask)
        return (batch if kept == n else batch.filter(pa.array(mask, pa.bool_()))), n - kept


def _topic_in(headers: list[dict[str, Any]] | None) -> str:
    for entry in headers or ():
        if entry.get("key") == TOPIC_HEADER:
            value = entry.get("value")
            return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value or "")
    return ""


def merged_bulk(size: int, kept: list[int], inner: BulkFuture) -> BulkFuture:
    """``publish_many``'s future over ``size`` records when only those at ``kept`` were queued (``inner``): the
    offsets in order, ``NOT_STORED`` for the dropped ones."""
    outer = BulkFuture("list", size)

    def done(future: Future[Any]) -> None:
        error = future.exception()
        if error is not None:
            outer.fail(error)
            return
        offsets = [NOT_STORED] * size
        for position, offset in zip(kept, future.result(), strict=True):
            offsets[position] = offset
        outer.set_result(offsets)

    inner.add_done_callback(done)
    return outer
