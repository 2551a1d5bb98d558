"""A Receiver: polls a subscriber on a background thread and hands each record (or batch) to a callback.

Made by ``Subscriber.attach_receiver``; kept apart from the subscriber because it only uses its public ``poll``
and ``confirm``. With ``auto_confirm_interval_ms`` it confirms, per lane, up to the last record whose callback
finished (``meteor_spark.consumer.auto_confirm`` has the semantics).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from meteor_spark.consumer.auto_confirm import AutoConfirm
from meteor_spark.errors import ConfigError, FencedError, MeteorError
from meteor_spark.format.records import Record, RecordBatch

if TYPE_CHECKING:  # pragma: no cover
    from meteor_spark.consumer.subscriber import Subscriber
__all__ = ["ErrorHandler", "Receiver", "RecordHandler"]

logger = logging.getLogger(__name__)

#: ``callback(record)`` for a Receiver (or ``callback(batch)`` with ``per_batch=True``); what it returns is ignored,
#: so a callback that answers with a value (``lambda r: publisher.publish_async(...)``) fits as well.
RecordHandler = Callable[[Any], object]
#: ``on_error(error, record_or_None)``: told about callback and poll failures of a Receiver.
ErrorHandler = Callable[[BaseException, Record | None], None]


class Receiver:
    """Polls a subscriber on a background thread and hands each record (or batch) to a callback.

    A callback that raises does not stop the receiver: the error goes to ``on_error(error, record)`` (default: logged
    with its traceback) and is counted in ``errors``. Poll failures (grid errors, data loss) are reported the same
    way, with ``record=None``, and polling resumes after a short pause.

    ``auto_confirm_interval_ms`` (grouped subscribers): before each poll, once that many ms have passed since the
    last auto-confirm, and when the receiver closes, confirm every lane up to the last record whose callback
    finished (returned, or raised and went to ``on_error``). Records of a batch the receiver stopped in before
    handing them to the callback are not confirmed: the lane's next reader gets them again (at-least-once).
    """

    def __init__(
        self,
        subscriber: Subscriber,
        callback: RecordHandler,
        poll_timeout_ms: float = 100,
        *,
        on_error: ErrorHandler | None = None,
        per_batch: bool = False,
        auto_confirm_interval_ms: int | None = None,
    ) -> None:
        if not callable(callback):
            raise ConfigError(f"the receiver callback must be callable, got {callback!r}")
        if isinstance(poll_timeout_ms, bool) or not isinstance(poll_timeout_ms, (int, float)) or poll_timeout_ms <= 0:
            raise ConfigError(f"poll_timeout_ms must be a number > 0, got {poll_timeout_ms!r}")
        if auto_confirm_interval_ms is not None and subscriber.group is None:
            raise ConfigError(
                "auto_confirm_interval_ms needs a grouped subscriber: an ungrouped one has no stored offsets to "
                "confirm; give the subscriber a group, or leave auto_confirm_interval_ms unset"
            )
        self._auto_confirm = None if auto_confirm_interval_ms is None else AutoConfirm(auto_confirm_interval_ms)
        self._finished: dict[int, int] = {}  # lane -> offset of the last record whose callback finished
        self._finished_lock = threading.Lock()
        self._subscriber = subscriber
        self._callback = callback
        self._timeout_ms = poll_timeout_ms
        self._on_error = on_error
        self._per_batch = per_batch
        self._stop = threading.Event()
        self.delivered = 0
        self.errors = 0
        self._thread = threading.Thread(target=self._run, name=f"meteor-receiver-{subscriber.stream}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._auto_confirm is not None and self._auto_confirm.due():
                try:
                    self.confirm_finished()
                except Exception as exc:  # a grid failure: reported, retried before the next poll
                    self._report(exc, None)
                else:
                    self._auto_confirm.done()
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
                self._finish_batch(batch)
                self.delivered += len(batch)
                continue
            for record in batch:
                if self._stop.is_set():
                    break
                try:
                    self._callback(record)
                except Exception as exc:  # a callback error never ends the receiver
                    self._report(exc, record)
                with self._finished_lock:
                    self._finished[record.lane] = record.offset
                self.delivered += 1

    def _finish_batch(self, batch: RecordBatch) -> None:
        with self._finished_lock:
            self._finished.update(batch.last_offsets())

    def confirm_finished(self) -> None:
        """Confirm, per lane, up to the last record whose callback finished (grouped subscribers). A lane this
        member lost meanwhile is logged and dropped: its new holder reads those records again."""
        with self._finished_lock:
            todo, self._finished = self._finished, {}
        for lane, offset in sorted(todo.items()):
            try:
                self._subscriber.confirm(offset, lane=lane)
            except (FencedError, ConfigError) as exc:  # lost (or no longer read here): delivered again elsewhere
                logger.warning("receiver of stream %r: lane %d not confirmed: %s", self._subscriber.stream, lane, exc)
            except MeteorError:
                with self._finished_lock:  # a grid failure: kept for the next attempt
                    self._finished.setdefault(lane, offset)
                raise

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
        """Stop after the record being delivered; waits for the thread (unless called from the callback). With
        ``auto_confirm_interval_ms``, then confirms what the callback finished."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        if self._auto_confirm is not None and not self._thread.is_alive():
            try:
                self.confirm_finished()
            except MeteorError as exc:
                self._report(exc, None)

    def __enter__(self) -> Receiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
