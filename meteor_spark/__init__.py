"""meteor-spark: Kafka-like message streaming inside a Hazelcast in-memory data grid, for Python and Spark.

The public surface is listed in ``__all__``; names are imported lazily so that ``import meteor_spark`` stays cheap
and never imports ``pyspark`` unless the Spark connector is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "Grid": "meteor_spark.grid",
    "GridSettings": "meteor_spark.grid",
    "EmbeddedGrid": "meteor_spark.server",
    "StreamConfig": "meteor_spark.streams",
    "Record": "meteor_spark.records",
    "RecordBatch": "meteor_spark.records",
    "Publisher": "meteor_spark.publisher",
    "Subscriber": "meteor_spark.subscriber",
    "Receiver": "meteor_spark.subscriber",
    "InitialOffsetScheme": "meteor_spark.subscriber",
    "MeteorDataSource": "meteor_spark.spark.datasource",
    "register": "meteor_spark.spark.datasource",
    "MeteorError": "meteor_spark.errors",
    "ConfigError": "meteor_spark.errors",
    "DataLossError": "meteor_spark.errors",
    "GridError": "meteor_spark.errors",
    "GridConnectionError": "meteor_spark.errors",
}

__all__ = sorted(_EXPORTS) + ["__version__"]

if TYPE_CHECKING:  # pragma: no cover
    from meteor_spark.errors import (  # noqa: F401
        ConfigError,
        DataLossError,
        GridConnectionError,
        GridError,
        MeteorError,
    )
    from meteor_spark.grid import Grid, GridSettings  # noqa: F401
    from meteor_spark.publisher import Publisher  # noqa: F401
    from meteor_spark.records import Record, RecordBatch  # noqa: F401
    from meteor_spark.server import EmbeddedGrid  # noqa: F401
    from meteor_spark.spark.datasource import MeteorDataSource, register  # noqa: F401
    from meteor_spark.streams import StreamConfig  # noqa: F401
    from meteor_spark.subscriber import InitialOffsetScheme, Receiver, Subscriber  # noqa: F401


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'meteor_spark' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
