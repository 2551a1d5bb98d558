"""The distributed-object registry: which (service, name) proxies exist, and who listens to their creation.

``create_proxy`` is idempotent and fires CREATED once; ``destroy_proxy`` fires DESTROYED and tells the owning service
to drop the object's data (services register a destroy callback per service name).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

CREATED = "CREATED"
DESTROYED = "DESTROYED"

#: Listener callback: (name, service_name, event_type).
ObjectListener = Callable[[str, str, str], None]


@dataclass
class ProxyRegistry:
    objects: dict[tuple[str, str], None] = field(default_factory=dict)  # insertion-ordered set of (service, name)
    listeners: dict[object, ObjectListener] = field(default_factory=dict)
    destroyers: dict[str, Callable[[str], object]] = field(default_factory=dict)

    def create(self, service_name: str, name: str) -> bool:
        """Register the object; True (and a CREATED event) the first time."""
        key = (service_name, name)
        if key in self.objects:
            return False
        self.objects[key] = None
        self._fire(name, service_name, CREATED)
        return True

    def destroy(self, service_name: str, name: str) -> bool:
        """Forget the object and drop its data; True (and a DESTROYED event) if it was registered.

        The data is dropped even when no proxy was registered (a client may destroy what another created before a
        member restart), as Hazelcast does.
        """
        destroyer = self.destroyers.get(service_name)
        if destroyer is not None:
            destroyer(name)
        existed = self.objects.pop((service_name, name), "missing") is None
        if existed:
            self._fire(name, service_name, DESTROYED)
        return existed

    def list(self) -> list[tuple[str, str]]:
        """(service name, object name) of every registered object, oldest first."""
        return list(self.objects)

    def on_destroy(self, service_name: str, destroyer: Callable[[str], object]) -> None:
        """Let a service drop an object's data when its proxy is destroyed."""
        self.destroyers[service_name] = destroyer

    def add_listener(self, key: object, listener: ObjectListener) -> None:
        self.listeners[key] = listener

    def remove_listener(self, key: object) -> bool:
        return self.listeners.pop(key, None) is not None

    def _fire(self, name: str, service_name: str, event_type: str) -> None:
        for listener in list(self.listeners.values()):
            try:
                listener(name, service_name, event_type)
            except Exception:  # a dead connection's listener must not break object creation for others
                logger.exception("distributed-object listener failed on %s %s/%s", event_type, service_name, name)
