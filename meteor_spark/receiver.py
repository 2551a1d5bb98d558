"""A Receiver: polls a subscriber on a background thread and hands each record (or batch) to a callback.

Made by ``Subscriber.receive``; kept apart from the subscriber because it only uses its public ``poll``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from meteor_spark.errors import ConfigError
from meteor_spark.records import Record

if TYPE_CHECKING:  # pragma: no cover
    from meteor_spark.subscriber import Subscriber

__all__ = ["ErrorHandler", "Receiver", "RecordHandler"]

logger = logging.getLogger(__name__)

#: ``callback(record)`` for a Receiver (or ``callback(batch)`` with ``per_batch=True``).
RecordHandler = Callable[[Any], None]
#: ``on_error(error, record_or_None)``: told about callback and poll failures of a Receiver.
ErrorHandler = Callable[[BaseException, Record | None], None]


class Receiver:
    """Polls a subscriber on a background thread and hands each record (or batch) to a callback.

    A callback that raises does not stop the receiver: the error goes to ``on_error(error, record)`` (default: logged
    with its traceback) and is counted in ``errors``. Poll failures (grid errors, data loss) are reported the same
    way, with ``record=None``, and polling resumes after a short pause.
    """

    def __init__(
        self,
        subscriber: Subscriber,
        callback: RecordHandler,
        poll_timeout_ms: float = 100,
        *,
        on_error: ErrorHandler | None = None,
        per_batch: bool = False,
    ) -> None:
        if not callable(callback):
            raise ConfigError(f"the receiver callback must be callable, got {callback!r}")
        if isinstance(poll_timeout_ms, bool) or not isinstance(poll_timeout_ms, (int, float)) or poll_timeout_ms <= 0:
            raise ConfigError(f"poll_timeout_ms must be a number > 0, got {poll_timeout_ms!r}")
        self._subscriber = subscriber
        self._callback = callback
        self._timeout_ms = poll_timeout_ms
        self._on_error = on_error
        self._per_batch = per_batch
        self._stop = threading.Event()
        self.delivered = 0
        self.errors = 0
        self._thread = threading.Thread(
            target=self._run, name=f"meteor-receiver-{subscriber.stream}", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                batch = self._subscriber.poll(self._timeout_ms)
            except Exception as exc:  # reported, then polling resumes
                if self._stop.is_set():
                    return
                self._report(exc, None)
                self._stop.wait(min(1.0, self._timeout_ms / 1000.0))
                continue
            if not batch:
                continue
            if self._per_batch:
                try:
                    self._callback(batch)
                except Exception as exc:  # a callback error never ends the receiver
                    self._report(exc, None)
                self.delivered += len(batch)
                continue
            for record in batch:
                try:
                    self._callback(record)
                except Exception as exc:  # a callback error never ends the receiver
                    self._report(exc, record)
                self.delivered += 1

    def _report(self, error: BaseException, record: Record | None) -> None:
        self.errors += 1
        if self._on_error is not None:
            try:
                self._on_error(error, record)
                return
            except Exception:
                logger.exception("the receiver's on_error handler raised")
        where = "" if record is None else f" at offset {record.offset} of lane {record.lane}"
        logger.error("receiver of stream %r: %s%s", self._subscriber.stream, error, where, exc_info=error)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def close(self, timeout_s: float | None = 10.0) -> None:
        """Stop after the record being delivered; waits for the thread (unless called from the callback)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def __enter__(self) -> Receiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
