"""A member of a shared group: ``SharedSubscriber`` acquires records and hands them out (the poll loop).

The group's semantics (acquisitions, timeouts, delivery counts, dead letters, guarantees) are described in
``meteor_spark.consumer.shared_groups``, which also holds the member's side of the group's state (``SharedBookkeeping``:
lane entries, settings, settling). The poll loop's steps
(acquire per lane with one compare-and-set, read and cache ring items, pass over undecodable ones, deserialize, hand
out) are ``meteor_spark.consumer.shared_acquire``'s, shared with the asyncio member; here they run on the caller's
thread (``meteor_spark.grid.steps.drive``), with the waiting and the member's lifecycle.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from typing import Any

from meteor_spark.consumer.refusals import Refusals, dead_letter_publisher
from meteor_spark.consumer.shared_acquire import member_choices
from meteor_spark.consumer.shared_polling import SharedPolling
from meteor_spark.consumer.topics import refuse_on_ephemeral
from meteor_spark.format.avro import AvroValues
from meteor_spark.format.offsets import InitialOffsetScheme
from meteor_spark.format.records import Record, RecordBatch
from meteor_spark.format.serializers import Deserializer, deserializer
from meteor_spark.grid.client import Grid
from meteor_spark.grid.steps import drive
from meteor_spark.grid.streams import StreamConfig, StreamInfo, open_stream
from meteor_spark.grid.typed_values import value_deserializer_for
from meteor_spark.groups.shared_state import SHARE_MAP
from meteor_spark.metrics import attach as attach_metrics
from meteor_spark.metrics import registry_of as metrics_registry

logger = logging.getLogger(__name__)

__all__ = ["SharedSubscriber"]


class SharedSubscriber(SharedPolling):
    """A member of a shared group (see the module docs); not a ``Subscriber`` (no positions: records are settled one
    by one), as Kafka's ``KafkaShareConsumer`` is not a ``KafkaConsumer``. ``Subscriber(..., shared=True)`` is the
    deprecated spelling of this constructor.

    Args:
        grid: the grid connection.
        stream: a ``StreamConfig`` (created when missing) or the name of an existing stream.
        group: the shared group's name.
        initial_offset_scheme: where a lane starts when the group has no entry for it yet (AUTO = EARLIEST).
        max_poll_records: records acquired by one ``poll`` at most.
        max_items_per_read: ring items asked for by one read.
        member_id: this member's id (default ``<host>-<pid>-<random>``); shown in the entries' tokens.
        acquisition_timeout_ms: how long a poll's records stay acquired (default 30 s).
        max_deliveries: deliveries after which an unacknowledged record is dead-lettered (default 5 with a
            ``dead_letter_stream``; without one, None: never given up on).
        dead_letter_stream: where records past ``max_deliveries`` and rejected records go (opened by name,
            created with the default configuration when missing).
        dead_letter_after: records an available record (released, timed out, or nacked with a delay) may fall
            behind the most recently acquired one of its lane before it is archived to ``dead_letter_stream``
            (None: never; needs ``dead_letter_stream``; ``meteor_spark.groups.redelivery``).
        acquisition_timeout_ms, max_deliveries, dead_letter_stream, dead_letter_after: group settings (see the
            module docs): None takes the group's (or, for its first member, the defaults).
        on_corrupt: what this member does with an undecodable ring item or a record its deserializers refuse
            (``meteor_spark.format.corrupt``): ``"error"`` (default: ``FormatError`` / ``DeserializationError``; the
            lane stops at it), ``"skip"`` (passed over, counted, marked done for the group) or ``"dead_letter"`` (to the
            group's ``dead_letter_stream`` first).
        value_deserializer, key_deserializer: as ``Subscriber``'s (``"json"``, ``"str"``, ``"bytes"`` or a
            callable).
        metrics: True (prometheus_client's default registry) or a ``CollectorRegistry``: export this member's
            counters (delivered, acknowledged, released, rejected, dead-lettered, refused, renewed, passed over)
            and the records it holds (``meteor_spark.metrics``; needs the ``metrics`` extra).
        skip_data_loss: a lane truncated and refilled under the group's position (a member restart lost its tail)
            is reset to its oldest record, delivered again and counted, instead of ``LaneTruncatedError``
            (``meteor_spark.consumer.shared_takeup``). Overwritten records still raise ``DataLossError``.

    Attributes:
        delivered_records: records handed out (a redelivery counts again).
        acked_records, released_records, rejected_records: records settled by this member.
        dead_lettered_records: records this member published to the dead-letter stream (max_deliveries,
            dead_letter_after or reject); distance_dead_letters: those of them archived by ``dead_letter_after``.
        delayed_records: records this member nacked with a delay.
        refused_records: records this member tried to settle after losing them (``FencedError``).
        renewed_records: records whose lock this member renewed.
        truncated_lanes, truncations: lanes this member reset after a truncation (``(lane, position, oldest)``).
        refusals: undecodable items and refused records passed over (``corrupt_items``, ``undecodable_records``).
    """

    def __init__(
        self,
        grid: Grid,
        stream: StreamConfig | str,
        *,
        group: str | None = None,
        initial_offset_scheme: InitialOffsetScheme | str = InitialOffsetScheme.AUTO,
        max_poll_records: int = 10_000,
        max_items_per_read: int = 100,
        member_id: str | None = None,
        acquisition_timeout_ms: int | None = None,
        max_deliveries: int | None = None,
        dead_letter_stream: str | None = None,
        dead_letter_after: int | None = None,
        on_corrupt: str | None = None,
        value_deserializer: str | Deserializer | AvroValues | None = None,
        key_deserializer: str | Deserializer | None = None,
        metrics: Any = None,
        skip_data_loss: bool = False,
        **others: Any,
    ) -> None:
        choices = member_choices("SharedSubscriber", locals())
        registry = metrics_registry(metrics)
        self._grid = grid
        self.info: StreamInfo = open_stream(grid, stream)
        refuse_on_ephemeral(self.info, "a shared group (acknowledged records)")
        self._set_up(choices, grid.map(SHARE_MAP), [grid.ring(name) for name in self.info.ring_names])
        settings = drive(self._settings_steps(choices))
        self._value_deserializer = value_deserializer_for(grid, self.info, value_deserializer)
        self._key_deserializer = deserializer(key_deserializer, "key_deserializer")
        self._poll_lock = threading.Lock()
        self._wakeup = threading.Event()
        self._wakers: dict[int, Any] = {}
        self._closed = False
        target = settings.dead_letter_stream
        self._dead_letters = None if target is None else dead_letter_publisher(grid, target)
        self.refusals = Refusals(None, self.stream, self.corrupt_policy)
        self._detach_metrics = attach_metrics(registry, self)

    def _publish_letters(self, records: list[Record]) -> None:
        """Dead letters published with the member's ``Publisher``, returning once the grid acknowledged them."""
        assert self._dead_letters is not None
        self._dead_letters.publish_many(records).result()

    # ------------------------------------------------------------------------------------------------ polling

    def poll(self, timeout_ms: float = 0) -> RecordBatch:
        """Acquire records available now, or the first to become available within ``timeout_ms``, and hand them
        out (``SharedRecord``s, each with its ``delivery_count``); empty when none came. Settle each with ``ack``,
        ``nack`` or ``reject`` within ``acquisition_timeout_ms``.

        Raises:
            DataLossError: records of the window were overwritten in the ring before they were settled.
            FormatError: a ring item cannot be decoded.
            GridError: the grid failed (nothing was acquired by the failing step).
        """
        self._check_poll(timeout_ms)
        deadline = time.monotonic() + timeout_ms / 1000.0
        with self._poll_lock:
            return drive(self._poll_steps(deadline))

    # ------------------------------------------------------------------------------------------------ waiting

    def _wait(self, seconds: float) -> None:
        self._wakeup.wait(seconds)

    def _park(self, lane: int, sequence: int) -> Any:
        future = self._rings[lane].read_many_async(sequence, 1, 1)
        future.add_done_callback(lambda _f: self._wakeup.set())
        return future

    # ------------------------------------------------------------------------------------------------ settling

    def ack(self, records: Record | Iterable[Record]) -> None:
        """Acknowledge records (a record, a batch or any iterable of records this member holds): done, never
        delivered again.

        Raises:
            ConfigError: a record this member does not hold (never handed out to it, or settled already);
                nothing was written.
            FencedError: some records' acquisition timed out and they were released or taken by another member:
                nothing was written for those (the others were acknowledged); they are processed again elsewhere.
        """
        drive(self._ack(records))

    def nack(self, records: Record | Iterable[Record], *, delay_ms: int = 0) -> None:
        """Release records for redelivery (to any member), delivery count kept: at once, or with ``delay_ms`` no
        earlier than that from now (wall clock, stored in the lane's entry: it holds when this member dies; the
        lane's other records are handed out meanwhile). Errors as ``ack``.

        Raises:
            ConfigError: ``delay_ms`` negative, not an integer, or above ``redelivery.MAX_NACK_DELAY_MS``; nothing
                was written.
        """
        drive(self._nack(records, delay_ms))

    def reject(self, records: Record | Iterable[Record]) -> None:
        """Give up on records: published to the dead-letter stream at once, then marked done; errors as ``ack``.

        Raises:
            ConfigError: no ``dead_letter_stream``, or a record this member does not hold.
        """
        drive(self._reject(records))

    def renew(self, records: Record | Iterable[Record]) -> None:
        """Renew the lock of records this member holds (Kafka's RENEW, KIP-1222): they stay acquired by this member
        for another ``acquisition_timeout_ms`` from now, delivery count unchanged. For a record whose processing
        takes longer than the lock: renew it before the lock ends, then settle it as usual. One compare-and-set
        per lane.

        Raises:
            ConfigError: a record this member does not hold; nothing was written.
            FencedError: some records' lock had already ended and they were released or taken by another member:
                nothing was written for those (the others were renewed); they are processed again elsewhere.
        """
        drive(self._renew(records))

    def settle_spans(self, lane: int, spans: list[tuple[int, int, str]], state: str) -> list[tuple[int, int]]:
        """Settle the records ``[first, end)`` acquired under ``token`` (``(first, end, token)`` each, from
        ``hand_over``, possibly by an earlier member) to ``DONE`` or ``AVAILABLE``, with one compare-and-set; this
        member forgets them. Returns the ranges refused: not held by that acquisition any more (settled already,
        or timed out and released or taken by another member)."""
        return drive(self._settle_spans(lane, spans, state))

    # ------------------------------------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Release every record still held (available to other members at once), close the dead-letter publisher.
        Settle what was processed first: released records are delivered again."""
        if self._closed:
            return
        self._closed = True
        self._wakeup.set()
        try:
            drive(self._release_held())
        finally:
            if self._detach_metrics is not None:
                self._detach_metrics()
            self.refusals.close()
            if self._dead_letters is not None:
                self._dead_letters.close()

    def __enter__(self) -> SharedSubscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SharedSubscriber(stream={self.stream!r}, group={self.group!r}, member={self.member_id!r})"
