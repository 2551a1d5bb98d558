"""Member faults on a real two-member Hazelcast cluster: SIGKILL one member, wait until the survivor owns every
partition, restart it on the same port and wait until it has rejoined and the partition table has settled.

Settled means the master (always the survivor here: the oldest member) logged that every migration task of the
repartitioning after the rejoin completed, and the client's partition table shows both members as owners. Killing
the other member before that would lose the partitions whose backup was not copied back yet: a legitimate loss
with ``backup_count=1``, not a fault of the client. Every step polls with a deadline and is timed; the figures are
printed by the tests.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from meteor_spark.grid.client import Grid
from meteor_spark.testing import wait_until
from tests.real_members import HazelcastCluster

#: What the master's MigrationManager logs (INFO) when a repartitioning finished, backups included.
MIGRATIONS_DONE = "All migration tasks have been completed"


def partition_owners(grid: Grid) -> dict[str, int]:
    """Partitions per owner address, as this client's partition table has them (``none``: not known yet,
    ``gone``: a member the client no longer lists)."""
    client = grid.client
    addresses = {m.uuid: f"{m.address.host}:{m.address.port}" for m in client.cluster_service.get_members()}
    partitions = client.partition_service
    counts: Counter[str] = Counter()
    for partition in range(partitions.get_partition_count()):
        owner = partitions.get_partition_owner(partition)
        counts["none" if owner is None else addresses.get(owner, "gone")] += 1
    return dict(sorted(counts.items()))


def owner_of(grid: Grid, name: str) -> str:
    """The address of the member owning the partition of the object ``name`` (a lane's ring buffer)."""
    client = grid.client
    addresses = {m.uuid: f"{m.address.host}:{m.address.port}" for m in client.cluster_service.get_members()}
    owner = client.partition_service.get_partition_owner(client.partition_service.get_partition_id(name))
    return addresses.get(owner, "none")


def member_count(grid: Grid) -> int:
    return len(grid.client.cluster_service.get_members())


def _migrations_done(log: Path) -> int:
    try:
        return log.read_text(errors="replace").count(MIGRATIONS_DONE)
    except FileNotFoundError:
        return 0


@dataclass
class Failover:
    """One member SIGKILLed and restarted, step by step (seconds) with the partition table around it."""

    killed: str
    survivor: str
    owners_before: dict[str, int]
    killed_at: float = 0.0  # time.monotonic() of the SIGKILL, to place a workload's own timings against it
    takeover_s: float = 0.0
    owners_alone: dict[str, int] = field(default_factory=dict)
    restart_s: float = 0.0
    rejoin_s: float = 0.0
    settle_s: float = 0.0
    owners_after: dict[str, int] = field(default_factory=dict)

    def describe(self) -> str:
        return (
            f"killed {self.killed}: survivor {self.survivor} owned every partition after {self.takeover_s:.2f} s "
            f"(owners before {self.owners_before}, alone {self.owners_alone}); restarted in {self.restart_s:.1f} s, "
            f"rejoined (client sees 2 members) {self.rejoin_s:.1f} s later, migrations settled {self.settle_s:.1f} s "
            f"later (owners after {self.owners_after})"
        )


def kill_and_rejoin(cluster: HazelcastCluster, grid: Grid, index: int, timeout_s: float = 180.0) -> Failover:
    """SIGKILL member ``index``, wait for the takeover, restart it, wait for the rejoin and settled partitions."""
    victim, survivor = cluster.member(index), cluster.member(1 - index)
    failover = Failover(victim.address, survivor.address, partition_owners(grid))
    started = failover.killed_at = time.monotonic()
    victim.kill()
    alone = {survivor.address: grid.client.partition_service.get_partition_count()}
    wait_until(
        lambda: partition_owners(grid) == alone,
        timeout_s,
        0.05,
        message=f"{survivor.address} to own every partition after {victim.address} was killed",
    )
    failover.takeover_s = time.monotonic() - started
    failover.owners_alone = partition_owners(grid)
    done_before = _migrations_done(survivor.log_path)
    started = time.monotonic()
    restarted = cluster.restart(index)
    failover.restart_s = time.monotonic() - started
    started = time.monotonic()
    wait_until(lambda: member_count(grid) == 2, timeout_s, 0.05, message=f"{restarted.address} to rejoin")
    failover.rejoin_s = time.monotonic() - started
    started = time.monotonic()

    def settled() -> bool:
        owners = partition_owners(grid)
        return (
            _migrations_done(survivor.log_path) > done_before
            and owners.get(survivor.address, 0) > 0
            and owners.get(restarted.address, 0) > 0
        )

    wait_until(settled, timeout_s, 0.1, message=f"the repartitioning after {restarted.address} rejoined")
    failover.settle_s = time.monotonic() - started
    failover.owners_after = partition_owners(grid)
    print(f"[fault] {failover.describe()}", flush=True)
    return failover
