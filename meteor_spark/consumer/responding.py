"""A responder's work as steps: the threaded ``Responder`` and the ``AsyncResponder`` share it.

``ResponderSteps`` is the base of both: the arguments' checks, the counters, and answering a batch of requests
(each request's route, the handler's reply or an error reply, the reply queued on a publisher per reply stream, a
group's batch confirmed once its replies are stored) with the publishers kept per reply stream (the least recently
used ones closed past ``max_reply_publishers``). Both are generators yielding each call (``meteor_spark.grid.steps``):
the threaded responder runs them with ``drive`` on its receiver thread, the asyncio one with ``drive_async`` on its
task, where a coroutine handler's reply is awaited. The protocol's decisions are ``request_rules``'.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from functools import partial
from typing import Any

from meteor_spark.consumer.request_rules import (
    error_reply,
    log_handler_failure,
    log_malformed,
    reply_record,
    request_route,
)
from meteor_spark.errors import ConfigError, StreamNotFoundError
from meteor_spark.format.records import Record, RecordBatch
from meteor_spark.grid.steps import Steps
from meteor_spark.validate import check_int

__all__ = ["ResponderSteps"]

logger = logging.getLogger("meteor_spark.consumer.request_reply")


class ResponderSteps:
    """What a responder does with a batch of requests (see the module docs); the shell reads the requests.

    Attributes:
        answered: requests answered (error replies included).
        failed: requests whose handler raised (answered with an error reply).
        malformed: requests without ``meteor.correlation_id`` / ``meteor.reply_to`` (not answered).
    """

    request_stream: str
    group: str | None
    _subscriber: Any  # the request stream's Subscriber / AsyncSubscriber

    def __init__(self, handler: Callable[[Record], Any], max_reply_publishers: int) -> None:
        if not callable(handler):
            raise ConfigError(f"the responder's handler must be callable, got {handler!r}")
        self._handler = handler
        self._max_publishers = check_int("max_reply_publishers", max_reply_publishers, 1, 1 << 16)
        self._publishers: OrderedDict[str, Any] = OrderedDict()
        self.answered = 0
        self.failed = 0
        self.malformed = 0

    # -- the shell's hooks ----------------------------------------------------------------------------------------

    def _open_publisher(self, stream: str) -> Any:
        """A publisher to reply stream ``stream`` (or an awaitable of it); ``StreamNotFoundError`` when it is gone."""
        raise NotImplementedError

    def _send_reply(self, publisher: Any, reply: Record) -> Any:
        """Queue ``reply`` on ``publisher``."""
        raise NotImplementedError

    # -- steps ------------------------------------------------------------------------------------------------------

    def _answer_steps(self, batch: RecordBatch) -> Steps[None]:
        """Answer each request of ``batch`` in order; a group's batch is confirmed once its replies are stored
        (the reply publishers flushed first)."""
        used: dict[str, None] = {}  # reply streams written, in order
        for request in batch:
            route = request_route(request)
            if route is None:
                self.malformed += 1
                log_malformed(self.request_stream, request)
                continue
            correlation_id, reply_to = route
            try:
                reply = reply_record((yield partial(self._handler, request)), correlation_id)
            except Exception as exc:
                self.failed += 1
                log_handler_failure(self.request_stream, correlation_id)
                reply = error_reply(exc, correlation_id)
            stream = reply_to.decode()
            publisher = yield from self._publisher_steps(stream)
            if publisher is None:
                continue
            yield partial(self._send_reply, publisher, reply)
            used[stream] = None
            self.answered += 1
        if self.group is not None and batch:
            for stream in used:
                publisher = self._publishers.get(stream)
                if publisher is not None:  # else closed past max_reply_publishers: its replies were flushed then
                    yield publisher.flush
            yield self._subscriber.confirm

    def _publisher_steps(self, stream: str) -> Steps[Any]:
        """The publisher to reply stream ``stream``, opened on first use; None (logged) when the stream is gone
        (its requester closed)."""
        publishers = self._publishers
        publisher = publishers.get(stream)
        if publisher is not None:
            publishers.move_to_end(stream)
            return publisher
        try:
            publisher = yield partial(self._open_publisher, stream)
        except StreamNotFoundError:
            logger.warning(
                "stream %r: reply stream %r does not exist (its requester closed); reply dropped",
                self.request_stream,
                stream,
            )
            return None
        publishers[stream] = publisher
        while len(publishers) > self._max_publishers:
            yield publishers.popitem(last=False)[1].close
        return publisher
