"""How a group member keeps its lanes: the background work of a ``GroupMember`` (``LaneBalancer``, its base class).

The protocol is described in ``meteor_spark.groups.exclusive`` (acquire, fence, renew, expiry, liveness, balancing).
The renewal work itself (heartbeat, renewing held leases, the target assignment from the live members, giving up
surplus lanes, taking and fencing the lanes the member should hold) is ``meteor_spark.groups.member_steps``', shared
with the asyncio member; ``LaneBalancer`` runs it on the member's background thread. Here too: the members' settings
(``MemberSettings``, checked once for both kinds of member) and their default ids.
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
from dataclasses import dataclass
from typing import Any

from meteor_spark.errors import ConfigError, unknown_option
from meteor_spark.grid import transactions
from meteor_spark.grid.client import Grid
from meteor_spark.grid.steps import drive
from meteor_spark.groups.member_steps import MemberSteps
from meteor_spark.groups.protocol import balance

__all__ = ["WANTS", "LaneBalancer", "MemberSettings", "balance", "default_member_id"]

#: Kinds of members: ``balanced`` shares the lanes; ``all`` (the Spark driver) holds every lane it can.
WANTS = ("balanced", "all")


def default_member_id() -> str:
    """``<host>-<pid>-<random>``: unique per member object, readable in tools."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class MemberSettings:
    group: str
    member_id: str
    lease_ms: int
    renew_every_ms: int
    want: str

    @classmethod
    def parse(
        cls, group: str, member_id: str | None, lease_ms: int, renew_every_ms: int | None, want: str
    ) -> MemberSettings:
        if not isinstance(group, str) or not group:
            raise ConfigError(f"group {group!r} is not a group name; give a non-empty string")
        if member_id is not None and (not isinstance(member_id, str) or not member_id):
            raise ConfigError(f"member_id {member_id!r} is not a member id; give a non-empty string or None")
        if isinstance(lease_ms, bool) or not isinstance(lease_ms, int) or lease_ms < 10:
            raise ConfigError(f"lease_ms={lease_ms!r} is invalid; give whole milliseconds >= 10 (default 5000)")
        renew = max(1, lease_ms // 3) if renew_every_ms is None else renew_every_ms
        if isinstance(renew, bool) or not isinstance(renew, int) or not 0 < renew < lease_ms:
            raise ConfigError(
                f"renew_every_ms={renew_every_ms!r} is invalid for lease_ms={lease_ms}: renew more often than the "
                f"lease lasts, e.g. renew_every_ms={max(1, lease_ms // 3)} (the default, lease_ms / 3)"
            )
        if want not in WANTS:
            raise unknown_option("want value", str(want), WANTS)
        return cls(group, member_id or default_member_id(), lease_ms, renew, want)


class LaneBalancer(MemberSteps):
    """The background work of a ``GroupMember`` on its thread (see the module docs); every attribute is the
    ``GroupMember``'s."""

    _grid: Grid
    _stop: threading.Event
    _thread: threading.Thread | None
    _RUNNER = "thread"

    def __repr__(self) -> str:
        return (
            f"GroupMember(stream={self.stream!r}, group={self.group!r}, member_id={self.member_id!r}, "
            f"want={self._settings.want!r}, assignment={self.assignment()!r})"
        )

    def _stopping(self) -> bool:
        return self._stop.is_set()

    def _joining(self) -> bool:
        return self._thread is None

    def _pause(self, seconds: float) -> bool:
        return self._stop.wait(seconds)

    def _txn_state(self, key: str) -> Any:
        return transactions.state_of(self._grid, key)

    def _txn_abort(self, key: str, reason: str) -> Any:
        return transactions.abort(self._grid, key, reason)

    def _drop_heartbeat(self, key: str) -> None:
        self._members.delete(key)

    def _run(self) -> None:
        drive(self._run_steps())

    def _tick(self) -> None:
        drive(self._tick_steps())

    def _announce_safely(self, change: str) -> None:
        drive(self._announce_steps(change))
