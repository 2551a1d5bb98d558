"""Who consumes an ephemeral stream: the registry of consuming entities, one grid map per stream.

An ephemeral stream stores a record only when some consuming entity's topic patterns match it; everything else is
dropped at the publisher and counted. The entities live in the IMap ``meteor.subscriptions::<stream>``: one entry
per reading member (an ungrouped ``Subscriber`` is an entity of its own; the members of a group share the entity
``group/<name>``), key ``<entity>|<member>``, value the entity and its patterns as JSON, put with a TTL
(``Hazelcast IMap.put(key, value, ttl)``) that the member renews while it polls (``SubscriptionLease``). A member
that dies, or stops polling, drops out when its TTL runs out, so the map holds only live members and stays bounded
by them. Publishers read the map at most every ``refresh_ms`` (``SubscriptionView``): an entity that registers is
seen by a publisher within that interval; records published before that may be dropped for it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass

from meteor_spark.errors import GridError
from meteor_spark.format.routing import TopicMatcher
from meteor_spark.grid.client import Grid

logger = logging.getLogger(__name__)

SUBSCRIPTIONS_MAP_PREFIX = "meteor.subscriptions::"
#: How long a member stays registered without renewing (it renews three times per TTL while it polls).
DEFAULT_SUBSCRIPTION_TTL_MS = 10_000
#: The shortest TTL: a Hazelcast member keeps an entry's times in whole seconds, so an entry may expire up to a
#: second early; three seconds leave a renewal every second its place.
MIN_SUBSCRIPTION_TTL_MS = 3_000
#: How old a publisher's copy of the registry may get before it reads the map again.
DEFAULT_REFRESH_MS = 1_000
#: The publish future's result (and callback offset) for a record no entity wanted: it was not stored.
NOT_STORED = -1


def subscriptions_map(stream: str) -> str:
    """The name of the grid map holding ``stream``'s consuming entities."""
    return f"{SUBSCRIPTIONS_MAP_PREFIX}{stream}"


@dataclass(frozen=True)
class Subscription:
    """One live member of a consuming entity: the entity (``subscriber/<member>`` or ``group/<name>``), the member
    and the topic patterns it reads."""

    entity: str
    member: str
    topics: tuple[str, ...]

    def encode(self) -> str:
        return json.dumps({"v": 1, "entity": self.entity, "member": self.member, "topics": list(self.topics)})

    @staticmethod
    def decode(text: str) -> Subscription | None:
        """The entry, or None for one this version cannot read (skipped: it matches nothing)."""
        try:
            raw = json.loads(text)
            return Subscription(str(raw["entity"]), str(raw["member"]), tuple(str(t) for t in raw["topics"]))
        except (ValueError, KeyError, TypeError):
            return None


def live_subscriptions(grid: Grid, stream: str) -> list[Subscription]:
    """The members registered on ``stream`` now (their TTL not run out), sorted by entity and member."""
    return parse_subscriptions(grid.map(subscriptions_map(stream)).entries())


def parse_subscriptions(entries: dict[str, str]) -> list[Subscription]:
    """The registry map's entries as subscriptions (unreadable ones left out), sorted by entity and member."""
    found = [Subscription.decode(text) for text in entries.values()]
    return sorted((s for s in found if s is not None), key=lambda s: (s.entity, s.member))


class RenewalSchedule:
    """When a reading member's registry entry is put again: its key, text and TTL, renewed once a third of the TTL
    has passed. The decisions of ``SubscriptionLease`` and of the asyncio reader's lease (``meteor_spark.aio.topics``),
    which only make the grid calls."""

    def __init__(self, subscription: Subscription, ttl_ms: int) -> None:
        self.subscription = subscription
        self.key = f"{subscription.entity}|{subscription.member}"
        self.text = subscription.encode()
        self.ttl_s = ttl_ms / 1000.0
        self._every_s = self.ttl_s / 3.0
        self._next = 0.0

    def due(self) -> bool:
        """Whether the entry must be put again now."""
        return time.monotonic() >= self._next

    def renewed(self) -> None:
        """The entry was just put with a fresh TTL."""
        self._next = time.monotonic() + self._every_s

    def seconds_to_renewal(self) -> float:
        """How long a waiting poll may sleep before the entry needs renewing."""
        return max(0.0, self._next - time.monotonic())


class SubscriptionLease(RenewalSchedule):
    """A reading member's entry in the registry, renewed while it polls (``renew_if_due``), removed on ``close``."""

    def __init__(self, grid: Grid, stream: str, subscription: Subscription, ttl_ms: int) -> None:
        super().__init__(subscription, ttl_ms)
        self._map = grid.map(subscriptions_map(stream))
        self.renew_if_due()

    def renew_if_due(self) -> None:
        """Put the entry again with a fresh TTL when a third of it has passed (one grid call then, none else)."""
        if self.due():
            self._map.set(self.key, self.text, ttl_s=self.ttl_s)
            self.renewed()

    def close(self) -> None:
        """Leave the registry now (publishers notice within their refresh interval); a failure is logged, the TTL
        removes the entry anyway."""
        try:
            self._map.remove(self.key)
        except GridError as exc:
            logger.warning("could not remove subscription %r (it expires with its TTL): %s", self.key, exc)


class SubscriptionView:
    """A publisher's copy of an ephemeral stream's registry: whether any live entity wants a topic.

    The copy is read again when older than ``refresh_ms`` (one ``entrySet`` on the publishing thread); verdicts
    per topic are kept by one ``TopicMatcher`` over every live pattern, rebuilt with each read.
    """

    def __init__(self, grid: Grid, stream: str, refresh_ms: int = DEFAULT_REFRESH_MS) -> None:
        self._grid = grid
        self.stream = stream
        self._refresh_s = refresh_ms / 1000.0
        self._lock = threading.Lock()
        self._matcher: TopicMatcher | None = None
        self._read_at = float("-inf")
        self.entities = 0

    def wants(self, topic: str) -> bool:
        """Whether some live entity's patterns match ``topic`` (False when none is registered)."""
        if time.monotonic() - self._read_at >= self._refresh_s:
            self.refresh()
        matcher = self._matcher
        return matcher is not None and matcher.matches(topic)

    def refresh(self) -> None:
        """Read the registry now."""
        with self._lock:
            live = live_subscriptions(self._grid, self.stream)
            patterns = sorted({p for s in live for p in s.topics})
            self._matcher = TopicMatcher(patterns) if patterns else None
            self.entities = len({s.entity for s in live})
            self._read_at = time.monotonic()
