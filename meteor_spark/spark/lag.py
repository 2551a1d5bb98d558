"""How far a meteor streaming query is behind, from its progress report.

The source reports the lanes' latest positions through ``reportLatestOffset``, so every ``query.lastProgress``
source entry carries ``endOffset`` (where the last batch stopped) and ``latestOffset`` (the lanes' ends when that
batch was planned). ``lag_from_progress`` turns them into ring items behind per lane, exactly, plus Kafka-style
min/max/avg. Records behind are **estimated** (items behind x the records per item of the last batch) and named
so; ``count_records_behind`` counts them exactly by reading the unread items' headers from the grid. The items a
batch read come from its start and end offsets, or, for a query's first batch (whose progress has no start offset),
from the count the source records in that batch's end offset; the source's bookkeeping key (``@meteor``) is never
taken for a stream.

Per lane the report holds the same ``LaneLag`` a group's ``lag_report`` gives (``meteor_spark.groups.admin``), with
``records_estimate`` filled in.

Why a helper and not the progress's ``metrics`` map: Kafka's source fills ``sources[].metrics`` with
``avgOffsetsBehindLatest`` / ``maxOffsetsBehindLatest`` / ``minOffsetsBehindLatest`` through the JVM interface
``ReportsSourceMetrics``. PySpark's Python Data Source API (4.2, 4.3) has no way to do the same: the
``DataSourceStreamReader`` methods are ``initialOffset``, ``latestOffset``, ``getDefaultReadLimit``,
``reportLatestOffset``, ``partitions``, ``read``, ``commit`` and ``stop``, and the source runner
(``pyspark/sql/streaming/python_streaming_source_runner.py``) answers only the calls 884-892 for those (initial
offset, latest offset, partitions, commit, supported features, AvailableNow, admission control, default read limit,
latest offset report); none carries metrics, so the progress's ``metrics`` map of a Python source stays empty.
``kafka_metrics(report)`` gives the same three figures (in ring items) from ``lastProgress``, and
``QueryLagCollector`` exports them to Prometheus.

Example::

    report = lag_from_progress(query.lastProgress)
    print(report.items_behind, report.lanes, kafka_metrics(report))
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from meteor_spark.errors import ConfigError, DataLossError
from meteor_spark.format.offsets import first_offset_of
from meteor_spark.grid.reading import count_records
from meteor_spark.grid.streams import open_stream
from meteor_spark.groups.admin import LaneLag
from meteor_spark.metrics import require_prometheus
from meteor_spark.spark.source_offset import SparkOffset

if TYPE_CHECKING:  # pragma: no cover
    from meteor_spark.grid.client import Grid


@dataclass(frozen=True)
class LagReport:
    """Lag of one progress report over every meteor source of the query.

    Attributes:
        batch_id: the micro-batch the progress report describes.
        lanes: per lane, in stream then lane order.
        records_per_item: records per ring item in the last batch (``numInputRows`` / items read), or None.
    """

    batch_id: int | None
    lanes: tuple[LaneLag, ...]
    records_per_item: float | None

    @property
    def items_behind(self) -> int:
        return sum(lane.items_behind for lane in self.lanes)

    @property
    def records_behind_estimate(self) -> float | None:
        if self.records_per_item is None:
            return None
        return self.items_behind * self.records_per_item

    @property
    def min_items_behind(self) -> int:
        return min((lane.items_behind for lane in self.lanes), default=0)

    @property
    def max_items_behind(self) -> int:
        return max((lane.items_behind for lane in self.lanes), default=0)

    @property
    def avg_items_behind(self) -> float:
        return self.items_behind / len(self.lanes) if self.lanes else 0.0


def lag_from_progress(progress: Mapping[str, Any] | str) -> LagReport:
    """The lag described by a streaming query progress (``query.lastProgress``, a dict or its JSON).

    Sources that are not meteor sources are ignored; meteor sources without a ``latestOffset`` (no batch planned
    yet) contribute no lanes.

    Raises:
        ConfigError: ``progress`` is not a progress report.
    """
    if isinstance(progress, str):
        progress = json.loads(progress)
    if not isinstance(progress, Mapping) or "sources" not in progress:
        raise ConfigError(
            f"lag_from_progress expects a streaming query progress (query.lastProgress), got {type(progress).__name__}"
        )
    lanes: list[LaneLag] = []
    items_read = 0
    rows = 0
    for source in progress.get("sources") or ():
        end = _offset(source.get("endOffset"))
        latest = _offset(source.get("latestOffset"))
        if end is None or latest is None:
            continue
        start = _offset(source.get("startOffset"))
        if start is not None:
            # Items lost to overwriting inside the batch's range were never read (failOnDataLoss=false).
            items_read += start.total_items_to(end) - max(0, end.skipped_items - start.skipped_items)
        elif end.batch_items is not None:
            items_read += end.batch_items  # a query's first batch: Spark reports no start offset for it
        rows += int(source.get("numInputRows") or 0)
        ends = end.as_dict()
        lanes.extend(
            LaneLag(
                lane,
                first_offset_of(ends.get((stream, lane), 0)),
                sequence,
                max(0, sequence - ends.get((stream, lane), 0)),
                stream=stream,
            )
            for stream, lane, sequence in latest.positions
        )
    per_item = rows / items_read if items_read else None
    if per_item is not None:
        lanes = [replace(lag, records_estimate=lag.items_behind * per_item) for lag in lanes]
    batch_id = progress.get("batchId")
    return LagReport(None if batch_id is None else int(batch_id), tuple(lanes), per_item)


def kafka_metrics(report: LagReport) -> dict[str, str]:
    """The figures Kafka's source reports in ``sources[].metrics``, under Kafka's names, in ring items (a meteor
    Spark offset is a ring item); like Kafka's, the values are strings. Empty when the report has no lanes."""
    if not report.lanes:
        return {}
    return {
        "avgOffsetsBehindLatest": f"{report.avg_items_behind:.1f}",
        "maxOffsetsBehindLatest": str(report.max_items_behind),
        "minOffsetsBehindLatest": str(report.min_items_behind),
    }


class QueryLagCollector:
    """A prometheus_client collector over a running ``StreamingQuery``: at each scrape it turns
    ``query.lastProgress`` into ``meteor_query_lag_items{query, stream, lane}`` and
    ``meteor_query_lag_items_{avg,max,min}{query}`` (Kafka's avg/max/minOffsetsBehindLatest).

    Example::

        registry = prometheus_client.CollectorRegistry()
        QueryLagCollector(query).register(registry)
        meteor_spark.metrics.start_http_server(9108, registry=registry)
    """

    def __init__(self, query: Any, name: str | None = None) -> None:
        self._query = query
        self._name = name or query.name or str(query.id)
        self._core = require_prometheus().core

    def register(self, registry: Any = None) -> QueryLagCollector:
        """Add this collector to ``registry`` (default: prometheus_client's); returns it."""
        (registry or require_prometheus().REGISTRY).register(self)
        return self

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Any:
        progress = self._query.lastProgress
        report = lag_from_progress(progress) if progress else LagReport(None, (), None)
        core = self._core
        lanes = core.GaugeMetricFamily(
            "meteor_query_lag_items",
            "Ring items between a query's last batch and the lane's end.",
            labels=("query", "stream", "lane"),
        )
        for lane in report.lanes:
            lanes.add_metric((self._name, lane.stream, str(lane.lane)), lane.items_behind)
        yield lanes
        if report.lanes:
            for stat, value in (
                ("avg", report.avg_items_behind),
                ("max", report.max_items_behind),
                ("min", report.min_items_behind),
            ):
                family = core.GaugeMetricFamily(
                    f"meteor_query_lag_items_{stat}",
                    f"Ring items behind the lanes' ends, {stat} over the lanes.",
                    labels=("query",),
                )
                family.add_metric((self._name,), value)
                yield family


def count_records_behind(grid: Grid, report: LagReport, *, max_items: int = 1000) -> dict[tuple[str, int], int]:
    """Exact records behind per (stream, lane), reading the unread items from the grid (at most ``max_items``
    per lane; lanes further behind, or already overwritten, are left out)."""
    counts: dict[tuple[str, int], int] = {}
    for lane in report.lanes:
        if lane.items_behind > max_items:
            continue
        info = open_stream(grid, lane.stream)
        try:
            counts[(lane.stream, lane.lane)] = count_records(grid, info, lane.lane, lane.processed, lane.next_sequence)
        except DataLossError:
            continue  # some of them were overwritten: there is no exact count any more
    return counts


def _offset(value: Any) -> SparkOffset | None:
    if value is None:
        return None
    try:
        return SparkOffset.from_json(json.loads(value) if isinstance(value, str) else value)
    except (ConfigError, ValueError):
        return None
