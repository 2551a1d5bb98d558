"""``publish_async``'s hot path: a plain value queued on the sticky lane in one Python frame.

A plain value is ``bytes`` published without a callback, topic or message id, outside any trace context, by a
publisher that needs nothing else for it (no serializer, no topic gate). ``publish_async`` runs a million times a
second, and for such a value its checks and the accumulator's append were most of the publishing thread's work:
done as a publisher method calling an accumulator method they cost a second frame and a dozen attribute reads per
record, 13 % of that thread's CPU (1.31 against 1.15 us per 100-byte record). ``plain_publisher`` makes one function
doing both, its constants held in closure cells, which such a publisher installs as its ``publish_async``; any other
call goes to the general method, which handles every case (a plain value in a trace context, an oversized one...).

What the append does is ``Accumulator.append``'s for such a value, inlined: the lock is taken with ``acquire`` /
``release`` (a ``with`` block costs twice as much), the future is made without running ``RecordFuture.__init__``, the
value goes into a segment of plain values (``Segment.plain``) whose stamps stay ``time_ns()`` readings (divided to
milliseconds per piece when it is encoded), and an idle lane's call is claimed under the lock and sent by the
publishing thread (``Accumulator.send_now``) once the lock is released. A full buffer or a closing publisher goes
through ``Accumulator.admit`` as ever.
"""

from __future__ import annotations

from collections.abc import Callable
from time import time_ns
from typing import Any

from meteor_spark.producer.accumulator import Accumulator
from meteor_spark.producer.futures import PublishCallback, RecordFuture

__all__ = ["PublishAsync", "plain_publisher"]

#: ``Publisher.publish_async``'s signature: ``(record, callback=None, *, topic=None, message_id=None)``.
PublishAsync = Callable[..., RecordFuture]


def plain_publisher(
    acc: Accumulator, max_record_bytes: int, context_now: Callable[[], Any], general: PublishAsync
) -> PublishAsync:
    """A ``publish_async`` that queues plain values of up to ``max_record_bytes`` in ``acc`` itself and hands every
    other call to ``general`` (the publisher's method). ``context_now()`` is true while a trace context is current:
    the value may then be traced, which ``general`` does."""
    acquire = acc.lock.acquire
    release = acc.lock.release
    lanes = acc.lanes
    new_future = object.__new__

    def publish_async(
        record: Any,
        callback: PublishCallback | None = None,
        *,
        topic: str | None = None,
        message_id: str | None = None,
    ) -> RecordFuture:
        if type(record) is not bytes or callback is not None or topic is not None or message_id is not None:
            return general(record, callback, topic=topic, message_id=message_id)
        size = len(record)
        if size > max_record_bytes or context_now():
            return general(record)  # refused with the general path's error, or traced
        stamp = time_ns()
        acquire()
        try:
            if acc.outstanding >= acc.admit_at:
                acc.admit(1)
            else:
                acc.outstanding += 1
            state = lanes[acc.sticky]
            segments = state.segments
            segment = segments[-1] if segments else None
            if segment is None or not segment.plain or not segment.open:
                segment = state.open_plain()
            future = new_future(RecordFuture)
            future._segment = segment
            future._index = index = segment.n
            segment.values.append(record)
            segment.stamps.append(stamp)
            segment.n = index + 1
            queued = state.queued
            if queued and state.in_flight:
                state.queued = queued = queued + 1
                state.queued_bytes = queued_bytes = state.queued_bytes + size
                if (
                    (queued_bytes >= acc.ahead_bytes or queued >= acc.ahead_records)
                    and not acc.sender_nudged
                    and state.ahead is None
                    and not state.encoding
                ):
                    acc.nudge_sender()  # a whole call waits behind the one in flight: the sender encodes it ahead
                return future
            if not acc.queued(state, 1, size):
                return future
            call = acc.claim(state)
        finally:
            release()
        acc.send_now(call)
        return future

    publish_async.__doc__ = general.__doc__
    return publish_async
