"""The decisions of request/reply, shared by the threaded ``meteor_spark.consumer.request_reply`` and the asyncio
``meteor_spark.aio.request_reply``: the headers a request and its reply carry, the reply stream's name, what a
reply means to the requester, what a handler's outcome becomes, and the errors' wording. Pure: no grid, no threads,
no event loop, so both clients speak the same protocol and answer each other (an asyncio requester, a threaded
responder, and the reverse).
"""

from __future__ import annotations

import logging
import uuid

from meteor_spark.errors import RequestError, RequestTimeoutError
from meteor_spark.format.records import Record, as_record
from meteor_spark.validate import check_number

logger = logging.getLogger("meteor_spark.consumer.request_reply")

__all__ = [
    "CORRELATION_ID",
    "ERROR",
    "REPLY_TO",
    "check_request_timeout",
    "closed_error",
    "error_reply",
    "header",
    "log_handler_failure",
    "log_malformed",
    "new_correlation_id",
    "outgoing_request",
    "reply_failure",
    "reply_outcome",
    "reply_record",
    "reply_stream_name",
    "request_route",
    "timeout_error",
]

CORRELATION_ID = "meteor.correlation_id"
REPLY_TO = "meteor.reply_to"
ERROR = "meteor.error"


def header(record: Record, name: str) -> bytes | None:
    """The value of the record's first header called ``name``, or None."""
    for key, value in record.headers:
        if key == name:
            return value
    return None


def check_request_timeout(timeout_ms: float) -> float:
    """A request's timeout in milliseconds (>= 1), or ``ConfigError`` naming ``timeout_ms``."""
    return check_number("timeout_ms", timeout_ms, 1, float("inf"), what="(milliseconds)")


def reply_stream_name(request_stream: str) -> str:
    """A requester's own reply stream: ``<request stream>.reply.<random>`` (one per requester, deleted by close)."""
    return f"{request_stream}.reply.{uuid.uuid4().hex[:16]}"


def new_correlation_id() -> bytes:
    """A request's correlation id: random, so requesters never need to agree on one."""
    return uuid.uuid4().hex.encode()


def outgoing_request(request: Record | bytes | str, correlation_id: bytes, reply_to: bytes) -> Record:
    """The record published for a request: its own value, key, headers, timestamp and lane, with the correlation id
    and the reply stream replacing any the caller set."""
    rec = as_record(request)
    headers = tuple(h for h in rec.headers if h[0] not in (CORRELATION_ID, REPLY_TO))
    headers += ((CORRELATION_ID, correlation_id), (REPLY_TO, reply_to))
    return Record(rec.value, rec.key, headers, rec.timestamp_ms, lane=rec.lane)


def request_route(request: Record) -> tuple[bytes, bytes] | None:
    """A request's correlation id and reply stream, or None when it lacks either (not answerable)."""
    correlation_id = header(request, CORRELATION_ID)
    reply_to = header(request, REPLY_TO)
    if correlation_id is None or reply_to is None:
        return None
    return correlation_id, reply_to


def reply_record(out: Record | bytes | str, correlation_id: bytes) -> Record:
    """A handler's answer as the reply record: its value, key, headers and timestamp, with the request's
    correlation id."""
    rec = as_record(out)
    headers = tuple(h for h in rec.headers if h[0] != CORRELATION_ID) + ((CORRELATION_ID, correlation_id),)
    return Record(rec.value, rec.key, headers, rec.timestamp_ms)


def error_reply(exc: BaseException, correlation_id: bytes) -> Record:
    """The error reply of a handler that raised: the exception's message as value, its type in ``meteor.error``."""
    return Record(str(exc).encode(), headers=((CORRELATION_ID, correlation_id), (ERROR, type(exc).__name__.encode())))


def reply_failure(reply: Record, correlation_id: bytes, request_stream: str) -> RequestError | None:
    """What a reply makes of its request: None for an answer, ``RequestError`` (the responder's error type and
    message) for an error reply."""
    error = header(reply, ERROR)
    if error is None:
        return None
    return RequestError(
        f"the responder of stream {request_stream!r} failed on request {correlation_id.decode(errors='replace')}: "
        f"{error.decode(errors='replace')}: {reply.value.decode(errors='replace')}"
    )


def reply_outcome(reply: Record, reply_stream: str, request_stream: str) -> tuple[bytes, RequestError | None] | None:
    """A reply read from the requester's stream: its correlation id and what it means (``reply_failure``); None
    for a record without a correlation id, logged and dropped."""
    correlation_id = header(reply, CORRELATION_ID)
    if correlation_id is None:
        logger.warning(
            "reply stream %r: a record without %s at offset %d; dropped", reply_stream, CORRELATION_ID, reply.offset
        )
        return None
    return correlation_id, reply_failure(reply, correlation_id, request_stream)


def timeout_error(correlation_id: bytes, request_stream: str) -> RequestTimeoutError:
    """The error of a request whose reply did not come within its timeout, naming the request."""
    return RequestTimeoutError(
        f"no reply to request {correlation_id.decode()} on stream {request_stream!r} within its timeout; is a "
        f"responder running? (the request may still be answered; the reply would be dropped)"
    )


def closed_error(request_stream: str, *, waiting: bool) -> RequestError:
    """The error of a request on a closed requester: one still waiting when it closed, or one made after."""
    if waiting:
        return RequestError(f"the requester of stream {request_stream!r} was closed")
    return RequestError(f"the requester of stream {request_stream!r} is closed; create a new one")


def log_malformed(request_stream: str, request: Record) -> None:
    """A responder's warning for a request without its routing headers (it is not answered)."""
    logger.warning(
        "stream %r: the request at offset %d of lane %d has no %s or %s header; not answered",
        request_stream,
        request.offset,
        request.lane,
        CORRELATION_ID,
        REPLY_TO,
    )


def log_handler_failure(request_stream: str, correlation_id: bytes) -> None:
    """A responder's error log (with the traceback being handled) for a handler that raised."""
    logger.exception(
        "stream %r: the handler failed on request %s", request_stream, correlation_id.decode(errors="replace")
    )
