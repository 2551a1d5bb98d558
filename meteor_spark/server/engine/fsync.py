"""The fsync policy (``EngineConfig.fsync``, documented for users in ``docs/persistence.md``).

- ``always``: an operation is acknowledged only after an fsync that started after its write. Writers that arrive
  while an fsync runs share the next one (group commit), so the cost is one fsync per batch of concurrent writes,
  not per write.
- ``interval``: writes reach the OS before the acknowledgement (a killed process loses nothing); a background
  thread fsyncs every ``fsync_interval_ms``, so a machine crash may lose that last interval.
- ``never``: writes reach the OS before the acknowledgement; the OS decides when they reach the disk.

Kept apart from the logs because every log of a member (each ring's, the map log) shares one ``Syncer``: that is
what lets one fsync round cover all of them.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import threading
from pathlib import Path

log = logging.getLogger(__name__)


class Syncer:
    """Makes written data durable according to the fsync policy; ``commit()`` is what handlers await.

    ``always``: a background thread runs fsync rounds; each round fsyncs every file written since the previous round
    and then completes every commit requested before the round started (group commit).
    """

    def __init__(self, policy: str, interval_ms: int) -> None:
        # ``policy`` and ``interval_ms`` come validated from ``EngineConfig``.
        self.policy = policy
        self.interval_ms = interval_ms
        self._cond = threading.Condition()
        self._dirty: set[int] = set()
        self._requested = 0
        self._waiters: list[tuple[int, asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._closing = False
        self._fsync_lock = threading.Lock()
        self._failure: OSError | None = None
        self._thread: threading.Thread | None = None
        self.fsyncs = 0  # successful fsync calls, for the member's metrics
        if policy != "never":
            self._thread = threading.Thread(target=self._run, name=f"meteor-fsync-{policy}", daemon=True)
            self._thread.start()

    def written(self, fd: int) -> None:
        """Note that ``fd`` has data the next fsync round must cover (called right after the write)."""
        if self.policy == "never":
            return
        with self._cond:
            self._dirty.add(fd)

    async def commit(self) -> None:
        """Return once everything written so far is as durable as the policy promises.

        Raises:
            OSError: an fsync failed; the write is not acknowledged (the member keeps refusing until restarted,
                because after a failed fsync the kernel may have dropped the data: retrying would lie).
        """
        if self._failure is not None:
            raise self._failure
        if self.policy != "always":
            return
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._cond:
            self._requested += 1
            self._waiters.append((self._requested, loop, future))
            self._cond.notify()
        await future

    def forget(self, fd: int) -> None:
        """Stop syncing ``fd`` (about to be closed); waits for a running fsync round so none touches a closed (or
        reused) descriptor. Its data is fsynced now unless the policy is ``never``."""
        with self._fsync_lock:
            with self._cond:
                self._dirty.discard(fd)
            if self.policy != "never" and self._failure is None:
                self._sync({fd})

    def _run(self) -> None:
        while True:
            with self._cond:
                if self.policy == "always":
                    while not self._waiters and not self._closing:
                        self._cond.wait()
                else:
                    self._cond.wait(self.interval_ms / 1000.0)
                if self._closing and not self._waiters and not self._dirty:
                    return
                dirty, self._dirty = self._dirty, set()
                waiters, self._waiters = self._waiters, []
            # Outside the condition, so writers on the loop never wait for a disk. A descriptor closed (after
            # ``forget``, which fsyncs it) between the snapshot and here fails with EBADF, or belongs to a newer file
            # by then; either is harmless.
            with self._fsync_lock:
                failure = self._sync(dirty)
            for _, loop, future in waiters:
                loop.call_soon_threadsafe(_settle, future, failure)

    def _sync(self, fds: set[int]) -> OSError | None:
        for fd in fds:
            try:
                os.fsync(fd)
                self.fsyncs += 1
            except OSError as exc:
                if exc.errno == errno.EBADF:
                    continue
                log.error("fsync failed (%s); refusing further writes until the member restarts", exc)
                self._failure = exc
                return exc
        return None

    def close(self) -> None:
        """Stop the thread after a last fsync of what it still has to cover (``always`` / ``interval``)."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join()


def _settle(future: asyncio.Future[None], failure: OSError | None) -> None:
    if future.done():
        return
    if failure is None:
        future.set_result(None)
    else:
        future.set_exception(failure)


def fsync_dir(path: Path) -> None:
    """Make a file's creation or rename durable (its directory entry)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
