"""Listener registrations per object name, shared by the services that push events (map entries, topic messages).

A registration is identified by the uuid the client later passes to remove it; the TCP shell removes a
connection's registrations when it closes (``Endpoint.on_close``), so the engine never tracks connections.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Generic, TypeVar

R = TypeVar("R")


class Listeners(Generic[R]):
    """Registrations (any value ``R``) by object name and registration id. Not thread-safe."""

    def __init__(self) -> None:
        self._by_name: dict[str, dict[uuid.UUID, R]] = {}
        #: The names with a registration (read only): ``name in listeners.names`` is the check a service makes on
        #: every write, without a method call, before it builds an event.
        self.names: Mapping[str, object] = self._by_name

    def add(self, name: str, registration: R) -> uuid.UUID:
        """Register ``registration`` on ``name``; its new registration id."""
        registration_id = uuid.uuid4()
        self._by_name.setdefault(name, {})[registration_id] = registration
        return registration_id

    def remove(self, name: str, registration_id: uuid.UUID) -> bool:
        """Drop a registration; False if ``name`` has no such registration (Hazelcast answers false too)."""
        registrations = self._by_name.get(name)
        if registrations is None or registrations.pop(registration_id, None) is None:
            return False
        if not registrations:
            del self._by_name[name]
        return True

    def __contains__(self, name: object) -> bool:
        """Whether ``name`` has any registration (lets a service skip building events nobody listens to)."""
        return name in self._by_name

    def of(self, name: str) -> list[tuple[uuid.UUID, R]]:
        """A snapshot of ``name``'s registrations (a listener may register or remove others while being called)."""
        registrations = self._by_name.get(name)
        return list(registrations.items()) if registrations else []

    def drop(self, name: str) -> None:
        """Forget every registration on ``name`` (the object was destroyed)."""
        self._by_name.pop(name, None)
