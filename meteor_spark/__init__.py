"""meteor-spark: Kafka-like message streaming inside a Hazelcast in-memory data grid, for Python and Spark.

The public surface is listed in ``__all__``; names are imported lazily so that ``import meteor_spark`` stays cheap
and never imports ``pyspark`` unless the Spark connector is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from meteor_spark import _moved

__version__ = "0.1.0"

_EXPORTS = {
    "Grid": "meteor_spark.grid.client",
    "GridSettings": "meteor_spark.grid.client",
    "EmbeddedGrid": "meteor_spark.server",
    "StreamConfig": "meteor_spark.grid.streams",
    "ensure_stream": "meteor_spark.grid.ensure",
    "EnsureResult": "meteor_spark.grid.ensure",
    "Record": "meteor_spark.format.records",
    "RecordBatch": "meteor_spark.format.records",
    "Publisher": "meteor_spark.producer.publisher",
    "Subscriber": "meteor_spark.consumer.subscriber",
    "Receiver": "meteor_spark.consumer.subscriber",
    "InitialOffsetScheme": "meteor_spark.consumer.subscriber",
    "GroupMember": "meteor_spark.groups.exclusive",
    "Requester": "meteor_spark.consumer.request_reply",
    "Responder": "meteor_spark.consumer.request_reply",
    "SharedSubscriber": "meteor_spark.consumer.shared_subscriber",
    "SharedRecord": "meteor_spark.consumer.shared_groups",
    "TransactionalPublisher": "meteor_spark.consumer.transactional",
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
    "DuplicateMessageError": "meteor_spark.errors",
    "SizeLimitError": "meteor_spark.errors",
    "SerializationError": "meteor_spark.errors",
    "DeserializationError": "meteor_spark.errors",
    "IncompatibleSchemaError": "meteor_spark.errors",
    "RequestError": "meteor_spark.errors",
    "RequestTimeoutError": "meteor_spark.errors",
    "RedriveError": "meteor_spark.errors",
}

__all__ = sorted(_EXPORTS) + ["__version__"]

if TYPE_CHECKING:  # pragma: no cover
    from meteor_spark.consumer.request_reply import Requester, Responder  # noqa: F401
    from meteor_spark.consumer.shared_groups import SharedRecord  # noqa: F401
    from meteor_spark.consumer.shared_subscriber import SharedSubscriber  # noqa: F401
    from meteor_spark.consumer.subscriber import InitialOffsetScheme, Receiver, Subscriber  # noqa: F401
    from meteor_spark.consumer.transactional import TransactionalPublisher  # noqa: F401
    from meteor_spark.errors import (  # noqa: F401
        ArgumentTypeError,
        ConfigError,
        DataLossError,
        DeserializationError,
        DuplicateMessageError,
        FencedError,
        FormatError,
        GridConnectionError,
        GridError,
        GridOperationError,
        GroupError,
        IncompatibleSchemaError,
        LaneTruncatedError,
        MeteorError,
        NotAssignedError,
        OffsetOutOfRangeError,
        PublisherClosedError,
        PublishTimeoutError,
        RedriveError,
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
    from meteor_spark.format.records import Record, RecordBatch  # noqa: F401
    from meteor_spark.grid.client import Grid, GridSettings  # noqa: F401
    from meteor_spark.grid.ensure import EnsureResult, ensure_stream  # noqa: F401
    from meteor_spark.grid.streams import StreamConfig  # noqa: F401
    from meteor_spark.groups.exclusive import GroupMember  # noqa: F401
    from meteor_spark.producer.publisher import Publisher  # noqa: F401
    from meteor_spark.server import EmbeddedGrid  # noqa: F401
    from meteor_spark.spark.datasource import MeteorDataSource, register  # noqa: F401


#: Submodules reachable as attributes of the package without importing them first, as the docs write them
#: (``meteor_spark.config.spark_conf()`` after ``import meteor_spark``); each is imported on first access.
#: The layers are reachable the same way; so are the modules' paths from before the layers (with a warning).
_SUBMODULES = frozenset({"config", "errors", "testing", "spark", "format", "grid", "producer", "groups", "consumer"})

_moved.install()


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES or f"meteor_spark.{name}" in _moved.MOVED:
        return importlib.import_module(f"meteor_spark.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'meteor_spark' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
