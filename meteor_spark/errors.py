"""The one error tree of meteor-spark.

Every error the library raises on purpose is a ``MeteorError``::

    MeteorError
    ├── ConfigError (also ValueError)        bad or unknown option/argument; names it, the value and the fix
    │   ├── ArgumentTypeError (also TypeError) an argument of the wrong type (str where bytes are needed, ...)
    │   └── StreamConfigConflictError        two parties disagree on a stream's stored configuration
    ├── GridError                            talking to the grid failed
    │   ├── GridConnectionError              cluster unreachable, authentication refused, timed out
    │   └── GridOperationError               the member answered with an error (carries the Hazelcast code)
    ├── StreamNotFoundError (also LookupError) a stream opened by name has no metadata in the grid
    ├── DataLossError                        records were overwritten (or quarantined) before they were read
    │   └── LaneTruncatedError               a lane lost its tail (a member restart) and was refilled under a
    │                                        stored position: the item before it is not the one it was taken after
    ├── OffsetOutOfRangeError (also ValueError) a position lies past a lane's end (never written there)
    ├── FormatError (also ValueError)        a ring item is not a valid record batch (corrupt, truncated)
    │   └── UnsupportedFormatVersionError    written by a newer format version than this reader knows
    ├── SerializationError (also ValueError) a publisher's value/key serializer failed on a record
    ├── DeserializationError (also ValueError) a subscriber's value/key deserializer failed on a stored record
    ├── GroupError                           subscriber-group protocol violations
    │   ├── NotAssignedError                 the operation needs a lane this member does not hold
    │   └── FencedError                      a deposed holder tried to move an offset (its epoch is stale)
    ├── RedriveError                         a dead-letter redrive cannot go on safely (another one is running,
    │                                        or a step a dead one left cannot be settled)
    ├── PublisherClosedError                 publish after close()
    ├── PublishTimeoutError                  a publish did not complete in time: back-pressure, a flush/close
    │                                        deadline, or (idempotent publisher) delivery_timeout_ms
    ├── DuplicateMessageError (also ValueError) a record's message id was already published on the stream
    │                                        within its deduplication window (names id, stream, first offset)
    ├── RequestError                         a request got an error reply (the responder's handler raised)
    │   └── RequestTimeoutError (also TimeoutError) no reply within the request's timeout
    └── SizeLimitError (also ValueError)     data beyond a hard size limit (a record over the grid's frame limit,
                                             refused before sending; one Arrow binary column: 2 GiB)

The embedded grid (``meteor_spark.server``) has its own error classes carrying Hazelcast error codes; those
travel to clients as Hazelcast error responses and come back as ``GridOperationError``.

Hazelcast client errors are translated into this tree in exactly one place: ``meteor_spark.grid.client``.
"""

from __future__ import annotations

from collections.abc import Iterable
from difflib import get_close_matches
from typing import Any


class MeteorError(Exception):
    """Root of every error meteor-spark raises on purpose."""


class ConfigError(MeteorError, ValueError):
    """An option or argument is unknown or invalid. The message names it, the value seen and the fix."""


class ArgumentTypeError(ConfigError, TypeError):
    """An argument has the wrong type (e.g. ``str`` where ``bytes`` are needed). Both ``except TypeError`` and
    ``except ConfigError`` catch it."""


class StreamConfigConflictError(ConfigError):
    """The configuration asked for does not match the stream's configuration stored in the grid.

    Attributes:
        differences: when ``ensure_stream`` refused, every setting that differed with its fate
            (``meteor_spark.grid.ensure.StreamDifference`` values); empty otherwise.
    """

    differences: tuple[Any, ...] = ()


class GridError(MeteorError):
    """Talking to the grid failed."""


class GridConnectionError(GridError):
    """The grid could not be reached, refused our credentials, or did not answer in time."""


class GridOperationError(GridError):
    """The grid answered an operation with an error.

    Attributes:
        code: the Hazelcast error code when known (e.g. 51 StaleSequence), else None.
    """

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class StreamNotFoundError(MeteorError, LookupError):
    """A stream opened by name alone has no metadata in the grid."""


class DataLossError(MeteorError):
    """Records a reader still needed are gone: overwritten in the ring before they were read, or (on a persistent
    member) found damaged on disk and quarantined.

    Attributes:
        stream: stream name.
        lane: lane number.
        requested: the offset (or ring sequence) the reader asked for.
        oldest_available: the oldest offset (or ring sequence) the lane still holds.
    """

    def __init__(self, stream: str, lane: int, requested: int, oldest_available: int, unit: str = "offset") -> None:
        super().__init__(
            f"data loss on stream {stream!r} lane {lane}: requested {unit} {requested} is no longer available "
            f"(overwritten in the ring, or damaged on disk and quarantined by a persistent member); the oldest "
            f"available {unit} is {oldest_available}. Raise the stream's capacity or read faster; "
            f"to skip the lost records and go on, opt in to skipping (Subscriber(..., skip_data_loss=True) or "
            f"the Spark option failOnDataLoss=false)."
        )
        self.stream = stream
        self.lane = lane
        self.requested = requested
        self.oldest_available = oldest_available


class StreamDeletedError(DataLossError):
    """A stream a pattern query read (Spark option ``streamPattern``) was deleted before the query read all of it
    (Kafka's "partition deleted" data loss)."""

    def __init__(self, stream: str, lane: int, requested: int, end: int) -> None:
        MeteorError.__init__(
            self,
            f"data loss on stream {stream!r} lane {lane}: the stream was deleted while the query read it, with ring "
            f"sequences {requested}..{end - 1} unread. To log such deletions and go on, set the Spark option "
            f"failOnDataLoss=false.",
        )
        self.stream = stream
        self.lane = lane
        self.requested = requested
        self.oldest_available = end


class LaneTruncatedError(DataLossError):
    """A lane lost records a stored position was taken after, and new records took their sequences.

    What a member restart leaves after losing a ring log's tail (fsync ``interval`` or ``never`` and a machine
    crash), or a grid restarted without a store: the lane starts again below a group's confirmed offset, new records
    refill the lost sequences, and a reader resuming at the old offset would silently pass over as many new records.
    It is caught by the item mark stored with the position (``meteor_spark.grid.item_marks``): the item just before the
    position is no longer the one the position was taken after (Kafka's leader-epoch check, KIP-320).

    Attributes:
        stream, lane: where.
        requested: the stored position (a record offset, or a ring sequence for Spark).
        oldest_available: the oldest position the lane still holds.
        mark_sequence: the ring sequence of the item the position was validated against.
    """

    def __init__(
        self,
        stream: str,
        lane: int,
        requested: int,
        oldest_available: int,
        mark_sequence: int,
        *,
        unit: str = "offset",
        whose: str = "the stored position",
        fix: str = "",
    ) -> None:
        MeteorError.__init__(
            self,
            f"stream {stream!r} lane {lane} was truncated and refilled under {whose} ({unit} {requested}): the ring "
            f"item at sequence {mark_sequence}, the one the position was taken after, now holds other records (a "
            f"member restarted and lost the lane's last records, or the grid restarted without persistence), so "
            f"records written since then sit below the position and reading on would silently skip them. "
            + (
                fix
                or "Seek the lane to the position to read from (the oldest available is "
                f"{unit} {oldest_available}), or opt in to skipping (skip_data_loss=True), which re-reads the lane "
                "from its oldest record and counts the truncation."
            ),
        )
        self.stream = stream
        self.lane = lane
        self.requested = requested
        self.oldest_available = oldest_available
        self.mark_sequence = mark_sequence


class OffsetOutOfRangeError(MeteorError, ValueError):
    """A position lies past the end of its lane: nothing was ever written there (Kafka's OffsetOutOfRange).

    Raised, never skipped: a reader positioned past the end would silently pass over every record written up to
    that position. It happens with a typo in a start position, or when a lane was truncated or re-created (a
    stream deleted and created again, a grid restarted without persistence) under a stored position.

    Attributes:
        stream: stream name.
        lane: lane number.
        position: the position asked for.
        end: one past the last position the lane holds (the valid range is ``[oldest, end]``).
        unit: ``"offset"`` (record offsets) or ``"sequence"`` (ring sequences).
    """

    def __init__(
        self, stream: str, lane: int, position: int, oldest: int, end: int, unit: str = "offset", hint: str = ""
    ) -> None:
        super().__init__(
            f"stream {stream!r} lane {lane}: {unit} {position} is past the end of the lane; valid {unit}s are "
            f"{oldest} to {end} ({end} = the next one to be written). "
            + (
                hint
                or "Was the stream deleted and re-created, or the grid restarted without persistence? "
                "Start from earliest or latest, or seek to a position inside the range."
            )
        )
        self.stream = stream
        self.lane = lane
        self.position = position
        self.oldest = oldest
        self.end = end
        self.unit = unit


class FormatError(MeteorError, ValueError):
    """A ring item is not a valid record batch."""


class UnsupportedFormatVersionError(FormatError):
    """A record batch was written with a newer format version than this reader understands."""


class SerializationError(MeteorError, ValueError):
    """A publisher's ``value_serializer`` / ``key_serializer`` failed; the message names the record's position in
    the call. Nothing of that call was queued."""


class DeserializationError(MeteorError, ValueError):
    """A subscriber's ``value_deserializer`` / ``key_deserializer`` failed on a stored record (named by stream,
    lane and offset); the record's bytes are intact."""


class IncompatibleSchemaError(ConfigError):
    """A new schema version of a typed stream breaks its compatibility rule; ``problems`` name the fields that
    break it (``meteor_spark.grid.schemas``). Nothing was registered."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = list(problems or [])


class GroupError(MeteorError):
    """Subscriber-group protocol violation."""


class RedriveError(MeteorError):
    """A redrive of a dead-letter stream cannot go on safely (another redrive changed its progress, or a step a
    dead redrive left cannot be settled); the message says what was sent and what to do."""


class NotAssignedError(GroupError):
    """The operation needs a lane this group member does not currently hold."""


class FencedError(GroupError):
    """A holder whose lease epoch is stale tried to move a confirmed offset; the write was refused."""


class TransactionAbortedError(MeteorError):
    """A transaction was aborted (timed out, fenced by a newer run, or aborted by Spark) before it could commit
    or register another producer: its records are never delivered to ``read_committed`` readers."""


class PublisherClosedError(MeteorError):
    """The publisher was closed; it accepts no more records."""


class PublishTimeoutError(MeteorError):
    """A publish did not complete in time: the bounded buffer stayed full past the back-pressure deadline, a flush
    or close deadline passed, or an idempotent publisher's retries reached ``delivery_timeout_ms`` (the message
    then says whether the records may have been stored)."""


class DuplicateMessageError(MeteorError, ValueError):
    """A record's ``message_id`` was already used on a stream with a deduplication window (``StreamConfig``
    ``dedup_window_ms``) within that window: the record is refused, nothing of it was queued.

    Attributes:
        message_id: the id refused.
        stream: the stream's name.
        first_offset: the offset of the record published first with that id; None when it is not known (the
            first copy was refused within one ``publish_many`` call, or was written by ``publish_arrow``, which
            does not report per-record offsets).
    """

    def __init__(
        self, message_id: str, stream: str, first_offset: int | None, detail: str = "", text: str | None = None
    ) -> None:
        self.message_id = message_id
        self.stream = stream
        self.first_offset = first_offset
        self._detail = detail
        where = "at an offset not recorded" if first_offset is None else f"at offset {first_offset}"
        if text is None:
            text = (
                f"message id {message_id!r} was already published on stream {stream!r} {where}, within the "
                f"stream's deduplication window{detail}; this copy was refused (nothing of it was stored)"
            )
        self._text = text
        super().__init__(text)

    def __reduce__(self) -> tuple[type, tuple[str, str, int | None, str, str]]:
        return (type(self), (self.message_id, self.stream, self.first_offset, self._detail, self._text))


class RequestError(MeteorError):
    """A request of ``meteor_spark.consumer.request_reply`` failed: the responder's handler raised (the message carries
    its
    error), or the requester was closed while the request waited."""


class RequestTimeoutError(RequestError, TimeoutError):
    """No reply came within the request's timeout (the request may still be answered later; the reply is then
    dropped)."""


class SizeLimitError(MeteorError, ValueError):
    """Data exceeds a hard size limit: a record bigger than one frame of the grid (``GridSettings.max_frame_bytes``,
    refused by the publisher before anything is sent, since the member would drop the connection on it), or more
    than 2 GiB of values in one Arrow binary column. The message names the size, the limit and the way out."""


def unknown_option(kind: str, name: str, known: Iterable[str]) -> ConfigError:
    """Build the error for an unknown option, suggesting the closest known name."""
    known = sorted(known)
    by_lower = {k.lower(): k for k in known}
    close = get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.6)
    hint = f" (did you mean {by_lower[close[0]]!r}?)" if close else ""
    return ConfigError(f"unknown {kind} {name!r}{hint}; known {kind}s: {', '.join(known)}")
