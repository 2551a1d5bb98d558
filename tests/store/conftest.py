"""The store tier: real Hazelcast members whose rings and maps are backed by the JDBC stores of ``hazelcast/store``.

``store_database`` is a throw-away PostgreSQL server (Debian's packages) for the whole session: its own data
directory under the session's temporary directory, its own port on 127.0.0.1, stopped by its PID at the end.
``store_cluster`` makes two-member clusters from ``hazelcast/member-store.xml`` with the store module and the
PostgreSQL driver on the members' classpath (built by ``hazelcast/build-store``), rings of ``CAPACITY`` items.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from store_helpers import CAPACITY, STORE_JAR, STORE_XML, driver_jar

from meteor_spark.testing import wait_until
from tests.real_members import ROOT, HazelcastCluster, free_port


@dataclass(frozen=True)
class Database:
    """A database the members reach: its JDBC URL, user, and its server's PID."""

    url: str
    user: str
    pid: int


def _postgres_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        raise RuntimeError(f"no PostgreSQL {name} under /usr/lib/postgresql: apt-get install -y postgresql")
    return found[-1]


def _as_server_user(command: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: as root, run it as the ``postgres`` user."""
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


def _run(command: list[str], what: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")


@pytest.fixture(scope="session")
def store_database() -> Iterator[Database]:
    # not under pytest's temporary directory: that one is private to this user, and the server runs as postgres
    base = Path(tempfile.mkdtemp(prefix="meteor-store-pg-"))
    data = base / "data"
    data.mkdir()
    if os.geteuid() == 0:
        server_user = pwd.getpwnam("postgres")
        for path in (base, data):
            os.chown(path, server_user.pw_uid, server_user.pw_gid)
    try:
        yield from _serve(base, data)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _serve(base: Path, data: Path) -> Iterator[Database]:
    user = "meteor"
    _run(
        _as_server_user([_postgres_bin("initdb"), "-D", str(data), "-U", user, "--auth=trust", "-E", "UTF8"]), "initdb"
    )
    port = free_port()
    log = base / "postgres.log"
    options = f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=on"
    _run(
        _as_server_user([_postgres_bin("pg_ctl"), "-D", str(data), "-l", str(log), "-o", options, "-w", "start"]),
        "pg_ctl start",
    )
    pid = int((data / "postmaster.pid").read_text().split()[0])
    try:
        yield Database(url=f"jdbc:postgresql://127.0.0.1:{port}/postgres", user=user, pid=pid)
    finally:
        # fast shutdown by the postmaster's PID: SIGINT; then wait for it to be gone
        os.kill(pid, signal.SIGINT)
        wait_until(lambda: not _alive(pid), timeout_s=60, message=f"PostgreSQL (pid {pid}) to stop")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="session")
def store_classpath() -> list[Path]:
    """The store module and the PostgreSQL driver, built when the sources are newer than the jar."""
    _run(["bash", str(ROOT / "hazelcast" / "build-store")], "hazelcast/build-store")
    return [STORE_JAR, driver_jar("postgresql")]


@pytest.fixture(scope="session")
def store_cluster(
    tmp_path_factory: pytest.TempPathFactory, store_database: Database, store_classpath: list[Path]
) -> Callable[[], HazelcastCluster]:
    """Makes (does not start) a two-member cluster of its own cluster name on the store configuration."""

    def make() -> HazelcastCluster:
        return HazelcastCluster(
            tmp_path_factory.mktemp("store-members"),
            size=2,
            cluster_name=f"store-{uuid.uuid4().hex[:8]}",
            config=STORE_XML,
            classpath=store_classpath,
            heap="512m",
            properties={
                "meteor.ring.capacity": str(CAPACITY),
                "meteor.store.jdbc-url": store_database.url,
                "meteor.store.jdbc-user": store_database.user,
            },
        )

    return make
