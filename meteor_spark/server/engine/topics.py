"""Topic: publish delivers each message to every registration on the topic, in publish order.

Delivery is synchronous on the member's loop, so messages of one publisher reach every listener in the order they
were published (Hazelcast guarantees per-publisher order). The publish time is the member's wall clock in ms.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from meteor_spark.server.engine.clock import Clock
from meteor_spark.server.engine.listeners import Listeners

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TopicMessage:
    topic: str
    item: bytes
    publish_time: int


class Topics:
    """Every topic's listener registrations. Not thread-safe."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._listeners: Listeners[Callable[[TopicMessage], None]] = Listeners()

    def add_listener(self, name: str, sink: Callable[[TopicMessage], None]) -> uuid.UUID:
        return self._listeners.add(name, sink)

    def remove_listener(self, name: str, registration_id: uuid.UUID) -> bool:
        return self._listeners.remove(name, registration_id)

    def publish(self, name: str, item: bytes) -> None:
        self.publish_all(name, (item,))

    def publish_all(self, name: str, items: Iterable[bytes]) -> None:
        registrations = self._listeners.of(name)
        if not registrations:
            return
        now = self._clock.now_ms()
        for item in items:
            message = TopicMessage(name, item, now)
            for registration_id, sink in registrations:
                try:
                    sink(message)
                except Exception:  # one broken subscriber connection must not stop delivery to the others
                    log.exception("topic listener %s on %r failed", registration_id, name)

    def destroy(self, name: str) -> None:
        self._listeners.drop(name)
