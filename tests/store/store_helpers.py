"""What the store tests share besides fixtures: the member configuration and jars, the ring capacity the members
are configured with, a client's settings for a cluster."""

from __future__ import annotations

from pathlib import Path

from meteor_spark.grid.client import GridSettings
from tests.real_members import ROOT, HazelcastCluster

STORE_XML = ROOT / "hazelcast" / "member-store.xml"
STORE_TARGET = ROOT / "hazelcast" / "store" / "target"
STORE_JAR = STORE_TARGET / "meteor-hazelcast-store.jar"

#: Ring items per lane in the store tests: small, so the rings' heads move past the history the tests read. The
#: members' static ring configuration and the tests' StreamConfig both use it.
CAPACITY = 16


def settings_of(cluster: HazelcastCluster) -> GridSettings:
    """Client settings for every member of ``cluster``."""
    return GridSettings(members=tuple(cluster.addresses), cluster_name=cluster.cluster_name)


def driver_jar(name: str) -> Path:
    """The JDBC driver jar ``name`` (``postgresql``, ``h2``) that ``hazelcast/build-store`` copied into target/lib."""
    jars = sorted((STORE_TARGET / "lib").glob(f"{name}-*.jar"))
    assert jars, f"no {name} JDBC driver in {STORE_TARGET / 'lib'}: run `bash hazelcast/build-store`"
    return jars[-1]
