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
    "GroupMember": "meteor_spark.groups",
    "Requester": "meteor_spark.request_reply",
    "Responder": "meteor_spark.request_reply",
    "SharedSubscriber": "meteor_spark.shared_subscriber",
    "SharedRecord": "meteor_spark.shared_groups",
    "MeteorDataSource": "meteor_spark.spark.datasource",
    "register": "meteor_spark.spark.datasource",
    # The whole error tree: a user catches what the library raises without knowing the module it lives in.
    "MeteorError": "meteor_spark.errors",
    "ConfigError": "meteor_spark.errors",
    "ArgumentTypeError": "meteor_spark.errors",
    "StreamConfigConflictError": "meteor_spark.errors",
    "GridError": "meteor_spark.errors",
    "GridConnectionError": "meteor_spark.errors",
    "GridOperationError": "meteor_spark.errors",
    "StreamNotFoundError": "meteor_spark.errors",
    "DataLossError": "meteor_spark.errors",
    "LaneTruncatedError": "meteor_spark.errors",
    "TransactionAbortedError": "meteor_spark.errors",
    "StreamDeletedError": "meteor_spark.errors",
    "OffsetOutOfRangeError": "meteor_spark.errors",
    "FormatError": "meteor_spark.errors",
    "UnsupportedFormatVersionError": "meteor_spark.errors",
    "GroupError": "meteor_spark.errors",
    "NotAssignedError": "meteor_spark.errors",
    "FencedError": "meteor_spark.errors",
    "PublisherClosedError": "meteor_spark.errors",
    "PublishTimeoutError": "meteor_spark.errors",
    "SizeLimitError": "meteor_spark.errors",
    "SerializationError": "meteor_spark.errors",
    "DeserializationError": "meteor_spark.errors",
    "RequestError": "meteor_spark.errors",
    "RequestTimeoutError": "meteor_spark.errors",
}

__all__ = sorted(_EXPORTS) + ["__version__"]

if TYPE_CHECKING:  # pragma: no cover
    from meteor_spark.errors import (  # noqa: F401
        ArgumentTypeError,
        ConfigError,
        DataLossError,
        DeserializationError,
        FencedError,
        FormatError,
        GridConnectionError,
        GridError,
        GridOperationError,
        GroupError,
        LaneTruncatedError,
        MeteorError,
        NotAssignedError,
        OffsetOutOfRangeError,
        PublisherClosedError,
        PublishTimeoutError,
        RequestError,
        RequestTimeoutError,
        SerializationError,
        SizeLimitError,
        StreamConfigConflictError,
        StreamDeletedError,
        StreamNotFoundError,
        TransactionAbortedError,
        UnsupportedFormatVersionError,
    )
    from meteor_spark.grid import Grid, GridSettings  # noqa: F401
    from meteor_spark.groups import GroupMember  # noqa: F401
    from meteor_spark.publisher import Publisher  # noqa: F401
    from meteor_spark.records import Record, RecordBatch  # noqa: F401
    from meteor_spark.request_reply import Requester, Responder  # noqa: F401
    from meteor_spark.server import EmbeddedGrid  # noqa: F401
    from meteor_spark.shared_groups import SharedRecord  # noqa: F401
    from meteor_spark.shared_subscriber import SharedSubscriber  # noqa: F401
    from meteor_spark.spark.datasource import MeteorDataSource, register  # noqa: F401
    from meteor_spark.streams import StreamConfig  # noqa: F401
    from meteor_spark.subscriber import InitialOffsetScheme, Receiver, Subscriber  # noqa: F401


#: Submodules reachable as attributes of the package without importing them first, as the README writes them
#: (``meteor_spark.config.spark_conf()`` after ``import meteor_spark``); each is imported on first access.
_SUBMODULES = frozenset({"config", "errors", "admin", "testing", "spark"})


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"meteor_spark.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'meteor_spark' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
