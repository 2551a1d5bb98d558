"""Topic: publish delivers each message to every registration on the topic, in publish order.

Delivery is synchronous on the member's loop, so messages of one publisher reach every listener in the order they
were published (Hazelcast guarantees per-publisher order). The publish time is the member's wall clock in ms.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Callable, Hashable, Iterable

from meteor_spark.server.engine import Clock

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TopicMessage:
    topic: str
    item: bytes
    publish_time: int


@dataclass(frozen=True)
class _Registration:
    registration_id: uuid.UUID
    owner: Hashable
    sink: Callable[[TopicMessage], None]


class Topics:
    """Every topic's listener registrations. Not thread-safe."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._listeners: dict[str, dict[uuid.UUID, _Registration]] = {}

    def add_listener(self, name: str, sink: Callable[[TopicMessage], None], owner: Hashable = None) -> uuid.UUID:
        registration = _Registration(uuid.uuid4(), owner, sink)
        self._listeners.setdefault(name, {})[registration.registration_id] = registration
        return registration.registration_id

    def remove_listener(self, name: str, registration_id: uuid.UUID) -> bool:
        listeners = self._listeners.get(name)
        if listeners is None or listeners.pop(registration_id, None) is None:
            return False
        if not listeners:
            del self._listeners[name]
        return True

    def remove_listeners_of(self, owner: Hashable) -> int:
        removed = 0
        for name in list(self._listeners):
            listeners = self._listeners[name]
            for registration_id in [r for r, reg in listeners.items() if reg.owner == owner]:
                del listeners[registration_id]
                removed += 1
            if not listeners:
                del self._listeners[name]
        return removed

    def listener_count(self, name: str) -> int:
        return len(self._listeners.get(name, {}))

    def publish(self, name: str, item: bytes) -> None:
        self.publish_all(name, (item,))

    def publish_all(self, name: str, items: Iterable[bytes]) -> None:
        listeners = self._listeners.get(name)
        if not listeners:
            return
        now = self._clock.now_ms()
        registrations = list(listeners.values())
        for item in items:
            message = TopicMessage(name, item, now)
            for registration in registrations:
                try:
                    registration.sink(message)
                except Exception:  # one broken subscriber connection must not stop delivery to the others
                    log.exception("topic listener %s on %r failed", registration.registration_id, name)

    def destroy(self, name: str) -> None:
        self._listeners.pop(name, None)
