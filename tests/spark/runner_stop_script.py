"""A grouped ``MeteorStreamReader`` in a process shaped like Spark's streaming source runner (``try: <calls>
finally: reader.stop()`` in the main thread), which Spark's SIGTERM reaches at a chosen moment; run by
``test_runner_stop``. Prints one line: how the runner's main ended (the exception's name and exit code).

Moments (``WHEN``):

- ``idle``: between calls (the runner waits for the JVM's next call);
- ``in-lock``: while the main thread holds the group member's lock (a batch inside ``GroupMember.assignment()``);
- ``twice``: in the lock, and again as the runner's ``finally`` calls ``reader.stop()`` (Spark sends two);
- ``in-release``: while the runner's ``finally`` releases the leases, after the JVM closed the runner's socket
  (the runner saw the closed socket before the signal came).

The signal goes to the main thread with ``pthread_kill``, so its handler runs at that exact point. The process
then ends without its ``atexit`` hooks: the runner's own ``finally`` must have released the leases.

Usage: runner_stop_script.py MEMBERS CLUSTER STREAM MEMBER_ID WHEN
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable

from meteor_spark.spark.datasource import SOURCE_SCHEMA
from meteor_spark.spark.options import SourceOptions
from meteor_spark.spark.reader import MeteorStreamReader


def sigterm_from_spark() -> None:
    """Spark's SIGTERM, to the calling (main) thread: its handler runs before this returns."""
    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)


def sigterm_before(call: Callable[[], None]) -> Callable[[], None]:
    """``call``, with Spark's SIGTERM arriving just before it runs."""

    def with_a_sigterm_first() -> None:
        sigterm_from_spark()
        call()

    return with_a_sigterm_first


def main() -> None:
    members, cluster, stream, member_id, when = sys.argv[1:6]
    options = {
        "hazelcast.members": members,
        "hazelcast.clusterName": cluster,
        "stream": stream,
        "group": "g",
        "groupMemberId": member_id,
        "groupLeaseMs": "60000",  # far longer than the test: only a release frees the lanes
        "startingOffsets": "earliest",
    }
    reader = MeteorStreamReader(SourceOptions.parse(options), SOURCE_SCHEMA)
    try:
        try:
            reader.initialOffset()  # the first driver-side call: takes the group's lanes, installs the stop hooks
            member = next(iter(reader._driver().members.values()))
            if when == "idle":
                sigterm_from_spark()
            elif when in ("in-lock", "twice"):
                if when == "twice":  # the second SIGTERM as the runner's finally calls stop()
                    reader.stop = sigterm_before(reader.stop)  # type: ignore[method-assign]
                with member._lock:
                    sigterm_from_spark()
            elif when == "in-release":
                member.close = sigterm_before(member.close)  # type: ignore[method-assign]  # as the release starts
                raise EOFError("the JVM closed the runner's socket")
            raise AssertionError(f"the SIGTERM at {when!r} did not end the runner")
        finally:
            reader.stop()
    except BaseException as exc:  # as the runner does: it reports the error to the JVM and exits
        print(type(exc).__name__, getattr(exc, "code", ""), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
