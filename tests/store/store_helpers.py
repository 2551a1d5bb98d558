"""What the store tests share besides fixtures: the ring capacity the members are configured with, a client's
settings for a cluster."""

from __future__ import annotations

from meteor_spark.grid import GridSettings
from tests.real_members import HazelcastCluster

#: Ring items per lane in the store tests: small, so the rings' heads move past the history the tests read. The
#: members' static ring configuration and the tests' StreamConfig both use it.
CAPACITY = 16


def settings_of(cluster: HazelcastCluster) -> GridSettings:
    """Client settings for every member of ``cluster``."""
    return GridSettings(members=tuple(cluster.addresses), cluster_name=cluster.cluster_name)
