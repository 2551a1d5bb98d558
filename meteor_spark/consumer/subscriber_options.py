"""A subscriber's options, checked once: ``SubscriberOptions.parse`` raises the ``ConfigError`` (or
``ArgumentTypeError``) naming a bad one before anything is asked of the grid.

Shared by the threaded ``Subscriber`` and the asyncio ``AsyncSubscriber`` (``meteor_spark.aio``), so both accept
and refuse exactly the same values with the same words.
"""

from __future__ import annotations

from dataclasses import dataclass

from meteor_spark.errors import ArgumentTypeError, ConfigError
from meteor_spark.format.avro import AvroValues, is_typed_setting
from meteor_spark.format.corrupt import CorruptItemPolicy
from meteor_spark.format.offsets import InitialOffsetScheme
from meteor_spark.format.serializers import Deserializer, deserializer
from meteor_spark.grid.client import MAX_BATCH_ITEMS
from meteor_spark.grid.item_gate import parse_isolation
from meteor_spark.validate import MAX_TIMEOUT_MS, check_int, check_text


@dataclass(frozen=True)
class SubscriberOptions:
    """The checked options of a subscriber (see ``Subscriber`` for each one's meaning)."""

    isolation: str
    value_deserializer: Deserializer | None
    key_deserializer: Deserializer | None
    scheme: InitialOffsetScheme
    corrupt_policy: CorruptItemPolicy
    max_poll_records: int
    max_items_per_read: int
    max_bytes_per_read: int
    group: str | None
    member_id: str | None
    lease_ms: int
    skip_data_loss: bool
    auto_confirm_interval_ms: int | None

    def check_stream(self, stream: str) -> None:
        """The options against the stream opened: its dead letters may not go to the stream itself."""
        if self.corrupt_policy.dead_letter_stream == stream:
            raise ConfigError(
                f"dead_letter_stream={stream!r} is the stream being read: refused items would be read again; "
                f"name another stream"
            )

    @classmethod
    def parse(
        cls,
        *,
        group: str | None = None,
        initial_offset_scheme: InitialOffsetScheme | str = InitialOffsetScheme.AUTO,
        skip_data_loss: bool = False,
        max_poll_records: int = 10_000,
        max_items_per_read: int = 100,
        max_bytes_per_read: int = 1 << 20,
        lease_ms: int = 5000,
        member_id: str | None = None,
        on_corrupt: str | None = None,
        dead_letter_stream: str | None = None,
        value_deserializer: str | Deserializer | AvroValues | None = None,
        key_deserializer: str | Deserializer | None = None,
        auto_confirm_interval_ms: int | None = None,
        isolation: str | None = None,
    ) -> SubscriberOptions:
        """Check every option, in the order the threaded subscriber always checked them."""
        checked_isolation = parse_isolation(isolation)
        # a typed stream's codec ("avro", AvroValues) needs the stream and the grid: the client resolves it
        value = None
        if not isinstance(value_deserializer, AvroValues) and not is_typed_setting(value_deserializer):
            value = deserializer(value_deserializer, "value_deserializer")
        key = deserializer(key_deserializer, "key_deserializer")
        scheme = InitialOffsetScheme.parse(initial_offset_scheme)
        policy = CorruptItemPolicy.parse(on_corrupt, dead_letter_stream)
        check_int("max_poll_records", max_poll_records, 1, 1 << 31)
        check_int("max_items_per_read", max_items_per_read, 1, MAX_BATCH_ITEMS)
        check_int("max_bytes_per_read", max_bytes_per_read, 1, 1 << 31)
        if group is not None:
            check_text("group", group, what="(a group name, or None for an ungrouped subscriber)")
        if member_id is not None:
            check_text("member_id", member_id, what="(or None for a generated one)")
        check_int("lease_ms", lease_ms, 1, MAX_TIMEOUT_MS)
        if not isinstance(skip_data_loss, bool):
            raise ArgumentTypeError(f"skip_data_loss must be True or False, got {skip_data_loss!r}")
        if group is None and scheme is InitialOffsetScheme.NONE:
            raise ConfigError(
                "initial_offset_scheme NONE needs a group: an ungrouped subscriber has no stored offset to start "
                "from; use EARLIEST or LATEST, or give the subscriber a group"
            )
        if auto_confirm_interval_ms is not None and group is None:
            raise ConfigError(
                "auto_confirm_interval_ms needs a group: an ungrouped subscriber has no stored offsets to confirm; "
                "give the subscriber a group, or leave auto_confirm_interval_ms unset"
            )
        return cls(
            checked_isolation,
            value,
            key,
            scheme,
            policy,
            max_poll_records,
            max_items_per_read,
            max_bytes_per_read,
            group,
            member_id,
            lease_ms,
            skip_data_loss,
            auto_confirm_interval_ms,
        )
