"""A transaction's stored record (``TxnState``) and the names of the transaction maps and states, apart from the
steps that change them (``meteor_spark.grid.transactions``, ``meteor_spark.grid.txn_decisions``), which both use."""

from __future__ import annotations

import json
from dataclasses import dataclass

from meteor_spark.errors import MeteorError

__all__ = [
    "ABORTED",
    "ABORTED_RETENTION_MS",
    "BATCHES_MAP",
    "COMMITTED",
    "KEEP_BATCHES",
    "LEGACY_RETENTION_MS",
    "OPEN",
    "OPEN_MAP",
    "PRODUCERS_MAP",
    "SWEPT_KEY",
    "TXNS_MAP",
    "TxnState",
]

TXNS_MAP = "meteor.txns"
PRODUCERS_MAP = "meteor.txn.producers"
BATCHES_MAP = "meteor.txn.batches"
OPEN_MAP = "meteor.txn.open"

OPEN = "open"
COMMITTED = "committed"
ABORTED = "aborted"

#: How long an aborted transaction's record is kept (a late commit or task attempt is told it was aborted).
ABORTED_RETENTION_MS = 600_000
#: Committed transactions stored before their lanes were recorded (no ``lanes``) are removed this long after their
#: deadline (Kafka's ``transactional.id.expiration.ms`` default, 7 days).
LEGACY_RETENTION_MS = 7 * 24 * 3600 * 1000
#: Batch ids of each sink and query kept in ``meteor.txn.batches``.
KEEP_BATCHES = 100
#: The sweep marker's key in ``meteor.txn.producers`` (producer ids are decimal: never this).
SWEPT_KEY = "@swept"


@dataclass(frozen=True)
class TxnState:
    """One transaction record as stored.

    Attributes:
        key: the transaction key.
        state: ``open``, ``committed`` or ``aborted``.
        deadline_ms: wall-clock ms after which readers abort the transaction if still open.
        producers: committed: the producer ids whose records count; empty otherwise.
        reason: why it was aborted (empty otherwise).
        decided_ms: wall-clock ms of the decision (0: open, or decided by an older version).
        lanes: committed: ``(stream, lane, after, last)`` for every lane the transaction may have items in: ring
            sequences ``(after, last]`` (see the module docs); None when not recorded (older versions).
        offsets: committed: the ``meteor.group.offsets`` keys of the group offsets staged in the transaction.
    """

    key: str
    state: str
    deadline_ms: int
    producers: frozenset[int] = frozenset()
    reason: str = ""
    decided_ms: int = 0
    lanes: tuple[tuple[str, int, int, int], ...] | None = None
    offsets: tuple[str, ...] = ()

    @property
    def decided(self) -> bool:
        return self.state != OPEN

    def delivers(self, producer_id: int) -> bool:
        """Whether a ``read_committed`` reader delivers the records of ``producer_id`` (decided transactions)."""
        return self.state == COMMITTED and producer_id in self.producers

    def to_json(self) -> str:
        document = {
            "state": self.state,
            "deadline_ms": self.deadline_ms,
            "producers": sorted(self.producers),
            "reason": self.reason,
        }
        if self.decided_ms:
            document["decided_ms"] = self.decided_ms
        if self.lanes is not None:
            document["lanes"] = [list(lane) for lane in self.lanes]
        if self.offsets:
            document["offsets"] = list(self.offsets)
        return json.dumps(document, sort_keys=True, separators=(",", ":"))

    @classmethod
    def parse(cls, key: str, text: str) -> TxnState:
        try:
            data = json.loads(text)
            lanes = data.get("lanes")
            return cls(
                key,
                str(data["state"]),
                int(data["deadline_ms"]),
                frozenset(int(p) for p in data.get("producers", ())),
                str(data.get("reason", "")),
                int(data.get("decided_ms", 0)),
                None if lanes is None else tuple((str(s), int(n), int(a), int(b)) for s, n, a, b in lanes),
                tuple(str(k) for k in data.get("offsets", ())),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise MeteorError(
                f"transaction {key!r} in map {TXNS_MAP!r} has an unreadable value {text!r} ({exc}); "
                f"was it written by another program?"
            ) from None
