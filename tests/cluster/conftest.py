"""The cluster tier's grid: two real Hazelcast members on loopback (tests/real_members.py), joined by TCP-IP.

One cluster serves the tier; each test leaves it with both members up and its partitions settled. A SIGKILLed
member is noticed at once on loopback (its connections are refused, so the survivor removes it within a second), so
``hazelcast/member.xml``'s heartbeat timeout (10 s) is never waited for and the members run that file unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from meteor_spark.grid.client import Grid
from tests.cluster.cluster_faults import member_count
from tests.real_members import HazelcastCluster


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HazelcastCluster]:
    with HazelcastCluster(tmp_path_factory.mktemp("cluster"), size=2) as members:
        yield members


@pytest.fixture
def cluster_grid(cluster: HazelcastCluster) -> Iterator[Grid]:
    """A client given the whole member list (``"a,b"``), as an application would be, once both members are in."""
    with Grid.connect(cluster.members, cluster_name=cluster.cluster_name) as grid:
        assert member_count(grid) == 2, grid.members()
        yield grid
