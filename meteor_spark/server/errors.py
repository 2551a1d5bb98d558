"""Errors of the embedded grid, each carrying the Hazelcast error code and Java class name it travels as.

The engine raises these; the protocol layer encodes them as Hazelcast error responses (message type 0), which the
official client turns into its own exception classes (``StaleSequenceError``, ``IllegalArgumentError``, ...).
``ERROR_CLASSES`` (code -> class) is derived from the classes, never kept by hand.
"""

from __future__ import annotations


class ServerError(Exception):
    """Base of every error the member answers with. ``code`` and ``java_class`` are what the client sees."""

    code: int = 18
    java_class: str = "com.hazelcast.core.HazelcastException"


class IllegalArgument(ServerError):
    code = 23
    java_class = "java.lang.IllegalArgumentException"


class StaleSequence(ServerError):
    code = 51
    java_class = "com.hazelcast.ringbuffer.StaleSequenceException"


class IllegalMonitorState(ServerError):
    code = 26
    java_class = "java.lang.IllegalMonitorStateException"


class IllegalState(ServerError):
    code = 27
    java_class = "java.lang.IllegalStateException"


class NullPointer(ServerError):
    code = 37
    java_class = "java.lang.NullPointerException"


class UnsupportedOperation(ServerError):
    code = 61
    java_class = "java.lang.UnsupportedOperationException"


class DistributedObjectDestroyed(ServerError):
    code = 14
    java_class = "com.hazelcast.spi.exception.DistributedObjectDestroyedException"


class ClassCast(ServerError):
    code = 10
    java_class = "java.lang.ClassCastException"


class HazelcastSerialization(ServerError):
    code = 21
    java_class = "com.hazelcast.nio.serialization.HazelcastSerializationException"


class InstanceNotActive(ServerError):
    code = 19
    java_class = "com.hazelcast.core.HazelcastInstanceNotActiveException"


class Authentication(ServerError):
    code = 3
    java_class = "com.hazelcast.client.AuthenticationException"


class InvalidConfiguration(ServerError, ValueError):
    """A bad config, from a client (dynamic config) or from whoever starts the member (``except ValueError`` works)."""

    code = 32
    java_class = "com.hazelcast.config.InvalidConfigurationException"


class ProtocolError(Exception):
    """A malformed frame or message: the connection that sent it is closed (never the member)."""


_CLASSES: list[type[ServerError]] = [ServerError, *ServerError.__subclasses__()]
ERROR_CLASSES: dict[int, type[ServerError]] = {cls.code: cls for cls in _CLASSES}
