"""Real Hazelcast members as test infrastructure: the released member jar (fetched from Maven Central into the local
Maven repository by ``hazelcast/fetch``, which ``.ci/dev`` runs), started from the checked-in ``hazelcast/member.xml``
on 127.0.0.1 and ended by PID, as Hazelcast's own clients' test suites do.

``HazelcastMember`` is one member process; ``HazelcastCluster`` is several that join each other (TCP-IP join on
loopback). Each member logs to a file in its directory; a member that does not start in time fails the test with
the tail of that log.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MEMBER_XML = ROOT / "hazelcast" / "member.xml"
DEFAULT_VERSION = "5.7.0"
OLDEST_VERSION = "5.3.8"


def maven_repository() -> Path:
    """The local Maven repository (``MAVEN_REPO`` overrides ``~/.m2/repository``)."""
    return Path(os.environ.get("MAVEN_REPO", Path.home() / ".m2" / "repository"))


def hazelcast_jar(version: str = DEFAULT_VERSION) -> Path:
    """The member jar of ``version`` in the local Maven repository.

    Raises:
        FileNotFoundError: not fetched yet; the message says how to fetch it.
    """
    jar = maven_repository() / "com" / "hazelcast" / "hazelcast" / version / f"hazelcast-{version}.jar"
    if not jar.is_file():
        raise FileNotFoundError(f"no Hazelcast {version} member jar at {jar}: run `bash hazelcast/fetch {version}`")
    return jar


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class HazelcastMember:
    """One real Hazelcast member process on 127.0.0.1.

    Args:
        workdir: where its log (``member-<port>.log``) goes.
        port: its port; None picks a free one.
        join: every member's ``host:port`` of the cluster it joins (itself alone when empty).
        version: the Hazelcast release to run.
        cluster_name: the cluster name clients must present.
        config: the member XML (``hazelcast/member.xml`` by default).
        classpath: further jars (e.g. a RingbufferStore / MapStore module).
        properties: further JVM system properties (``-Dname=value``).
        heap: the JVM's maximum heap.
    """

    def __init__(
        self,
        workdir: Path,
        port: int | None = None,
        join: Iterable[str] = (),
        version: str = DEFAULT_VERSION,
        cluster_name: str = "dev",
        config: Path = MEMBER_XML,
        classpath: Iterable[Path] = (),
        properties: Mapping[str, str] | None = None,
        heap: str = "2g",
    ) -> None:
        self.port = port or free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.version = version
        self.cluster_name = cluster_name
        self.log_path = Path(workdir) / f"member-{self.port}.log"
        members = ",".join(join) or self.address
        props = {
            "hazelcast.config": str(config),
            "meteor.cluster": cluster_name,
            "meteor.port": str(self.port),
            "meteor.members": members,
            **(properties or {}),
        }
        jars = [hazelcast_jar(version), *classpath]
        self.command = [
            "java",
            f"-Xmx{heap}",
            "-Xms256m",
            "-XX:+UseParallelGC",
            *(f"-D{name}={value}" for name, value in props.items()),
            "-cp",
            os.pathsep.join(str(jar) for jar in jars),
            "com.hazelcast.core.server.HazelcastMemberStarter",
        ]
        self.process: subprocess.Popen[bytes] | None = None
        self._log_start = 0

    def start(self, timeout_s: float = 90.0) -> HazelcastMember:
        """Start the process and wait until the member reports itself STARTED."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        self._log_start = log.tell()  # a restart on the same port appends: only this run's lines count
        self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, cwd=self.log_path.parent)
        log.close()
        mark = f"[127.0.0.1]:{self.port} is STARTED"
        deadline = time.monotonic() + timeout_s
        while mark not in self._log_text():
            if self.process.poll() is not None:
                code = self.process.returncode
                raise RuntimeError(f"Hazelcast member {self.address} exited ({code}):\n{self.tail()}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"Hazelcast member {self.address} did not start in {timeout_s:g} s:\n{self.tail()}")
            time.sleep(0.1)
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None, "the member was never started"
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL (after SIGCONT, so a stopped member can die) and reap."""
        if self.alive():
            assert self.process is not None
            os.kill(self.process.pid, signal.SIGCONT)
            self.process.kill()
            self.process.wait(timeout=30)

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM (Hazelcast's graceful shutdown hook), SIGKILL when it takes longer than ``timeout_s``."""
        if not self.alive():
            return
        assert self.process is not None
        self.process.terminate()
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self._log_text().splitlines()[-lines:])

    def _log_text(self) -> str:
        try:
            with self.log_path.open("rb") as log:
                log.seek(self._log_start)
                return log.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def __enter__(self) -> HazelcastMember:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill()


class HazelcastCluster:
    """``size`` real members on 127.0.0.1 that join each other (every port known up front, TCP-IP join).

    ``member(i)`` can be killed and ``restart(i)`` brings a new process up on the same port, which joins the
    survivors. ``members`` is the comma-separated address list a client takes (``Grid.connect``).
    """

    def __init__(self, workdir: Path, size: int = 2, **member_options: object) -> None:
        ports = [free_port() for _ in range(size)]
        self._workdir = Path(workdir)
        self._options = member_options
        self.addresses = [f"127.0.0.1:{port}" for port in ports]
        self._members = [self._new_member(port) for port in ports]

    def _new_member(self, port: int) -> HazelcastMember:
        return HazelcastMember(self._workdir, port=port, join=self.addresses, **self._options)  # type: ignore[arg-type]

    @property
    def members(self) -> str:
        return ",".join(self.addresses)

    @property
    def cluster_name(self) -> str:
        return self._members[0].cluster_name

    def member(self, index: int) -> HazelcastMember:
        return self._members[index]

    def start(self) -> HazelcastCluster:
        for member in self._members:
            member.start()
        return self

    def restart(self, index: int) -> HazelcastMember:
        """A new process on member ``index``'s port (the old one must be dead)."""
        assert not self._members[index].alive(), "restart a member only after killing or stopping it"
        self._members[index] = self._new_member(self._members[index].port)
        return self._members[index].start()

    def kill_all(self) -> None:
        for member in self._members:
            member.kill()

    def __enter__(self) -> HazelcastCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill_all()
