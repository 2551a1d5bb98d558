"""Error responses: a ``ServerError`` becomes message type 0 with a ``List<ErrorHolder>``.

The first holder is the exception itself, later holders its cause chain (``__cause__``). The official client turns
the error code into its own exception class and shows ``"<java class>: <message>"``.
"""

from __future__ import annotations

from meteor_spark.server.errors import ServerError
from meteor_spark.server.protocol.codecs import list_of, p
from meteor_spark.server.protocol.message_codec import encode_response, message
from meteor_spark.server.protocol.structs import ERROR_HOLDER, ErrorHolder

#: Errors travel as message type 0; a request type of -1 makes the derived ``response_type`` exactly 0.
ERROR_RESPONSE = message("Client.error", -1, response=(p("error_holders", list_of(ERROR_HOLDER)),))


def error_holders(error: BaseException) -> list[ErrorHolder]:
    holders: list[ErrorHolder] = []
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ServerError):
            code, java_class = current.code, current.java_class
        else:
            code, java_class = ServerError.code, ServerError.java_class
        text = str(current) or None
        # No stack trace: a Java member sends its own, which means nothing to a Python user either.
        holders.append(ErrorHolder(code, java_class, text, []))
        current = current.__cause__
    return holders


def encode_error(correlation_id: int, error: BaseException) -> list[bytes | bytearray | memoryview]:
    """Byte chunks of the error response to ``correlation_id``."""
    return encode_response(ERROR_RESPONSE, correlation_id, error_holders=error_holders(error))
