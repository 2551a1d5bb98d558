"""Offsets, initial offset schemes, StreamConfig validation, lane hashing (unit tests, no grid)."""

from __future__ import annotations

import pytest

from meteor_spark.errors import ConfigError
from meteor_spark.format.offsets import (
    MAX_RECORDS_PER_ITEM,
    InitialOffsetScheme,
    first_offset_of,
    index_of,
    make_offset,
    sequence_of,
)
from meteor_spark.format.partitioning import lane_for_key
from meteor_spark.grid.streams import StreamConfig, ring_name
from meteor_spark.producer.publisher import PublisherSettings


def test_offsets_pack_sequence_and_index_and_order_like_records() -> None:
    assert make_offset(0, 0) == 0
    assert make_offset(3, 5) == 3 * 65536 + 5
    assert (sequence_of(make_offset(123, 456)), index_of(make_offset(123, 456))) == (123, 456)
    assert make_offset(1, 0) > make_offset(0, MAX_RECORDS_PER_ITEM - 1)
    assert first_offset_of(7) == make_offset(7, 0)
    with pytest.raises(ConfigError, match="record index 65536"):
        make_offset(0, MAX_RECORDS_PER_ITEM)
    with pytest.raises(ConfigError, match="negative"):
        sequence_of(-1)


def test_initial_offset_scheme_parses_names_and_resolves_auto() -> None:
    assert InitialOffsetScheme.parse("Earliest") is InitialOffsetScheme.EARLIEST
    assert InitialOffsetScheme.parse(InitialOffsetScheme.NONE) is InitialOffsetScheme.NONE
    assert InitialOffsetScheme.AUTO.concrete(grouped=True) is InitialOffsetScheme.EARLIEST
    assert InitialOffsetScheme.AUTO.concrete(grouped=False) is InitialOffsetScheme.LATEST
    assert InitialOffsetScheme.LATEST.concrete(grouped=True) is InitialOffsetScheme.LATEST
    with pytest.raises(ConfigError, match="earliest, latest, none, auto"):
        InitialOffsetScheme.parse("oldest")


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"name": ""}, "stream name"),
        ({"name": "a b"}, "stream name"),
        ({"name": "s", "lanes": 0}, "lanes"),
        ({"name": "s", "lanes": 2000}, "lanes"),
        ({"name": "s", "capacity": 0}, "capacity"),
        ({"name": "s", "backup_count": 7}, "backup_count"),
        ({"name": "s", "async_backup_count": -1}, "async_backup_count"),
        ({"name": "s", "backup_count": 4, "async_backup_count": 3}, "at most 6"),
        ({"name": "s", "ttl_s": -1}, "ttl_s"),
        ({"name": "s", "compression": "gzip"}, "compression"),
        ({"name": "s", "max_batch_records": 65537}, "max_batch_records"),
        ({"name": "s", "max_batch_bytes": 0}, "max_batch_bytes"),
        ({"name": "s", "linger_ms": -1}, "linger_ms"),
        ({"name": "s", "lanes": True}, "lanes"),
    ],
)
def test_stream_config_rejects_bad_values_naming_the_field(kwargs, field) -> None:
    with pytest.raises(ConfigError, match=field):
        StreamConfig(**kwargs)


def test_stream_config_round_trips_and_rejects_unknown_keys_with_a_suggestion() -> None:
    config = StreamConfig("orders", lanes=4, capacity=100_000, linger_ms=2.5)
    assert StreamConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ConfigError, match="did you mean 'capacity'"):
        StreamConfig.from_dict({"name": "orders", "capacty": 5})
    other = StreamConfig("orders", lanes=2, capacity=100_000, linger_ms=9)
    assert config.layout_differences(other) == ["lanes: 4 asked, 2 stored"]


def test_lane_for_key_is_crc32_modulo_lanes_and_stable() -> None:
    # Fixed values: changing the hash would move keys to other lanes in running systems.
    assert [lane_for_key(k, 4) for k in (b"", b"a", b"customer-42", b"\x00\xff")] == [0, 3, 1, 2]
    assert lane_for_key(b"anything", 1) == 0
    assert ring_name("orders", 3) == "meteor.stream::orders.3"


def test_publisher_settings_validate_overrides() -> None:
    config = StreamConfig("s", linger_ms=5)
    settings = PublisherSettings.parse(config, {"max_batch_records": 10, "linger_ms": None})
    assert (settings.max_batch_records, settings.linger_ms) == (10, 5)
    with pytest.raises(ConfigError, match="max_buffered_records"):
        PublisherSettings.parse(config, {"max_buffered_records": 0})
    with pytest.raises(ConfigError, match="max_items_per_call"):
        PublisherSettings.parse(config, {"max_items_per_call": 5000})
    with pytest.raises(ConfigError, match="max_batch_records"):
        PublisherSettings.parse(config, {"max_batch_records": 0})


def test_backup_counts_are_layout_fields_and_old_metadata_names_still_read() -> None:
    from meteor_spark.grid.streams import metadata_json, parse_metadata

    config = StreamConfig("orders", backup_count=2, async_backup_count=1)
    assert config.layout_differences(StreamConfig("orders", backup_count=2)) == [
        "async_backup_count: 1 asked, 0 stored"
    ]
    assert parse_metadata("orders", metadata_json(config, 1)).config == config
    # metadata stored by an older meteor-spark spells the synchronous count "backups"
    old = '{"config":{"name":"orders","backups":3},"created_at_ms":1,"format_version":1,"metadata_version":1}'
    assert parse_metadata("orders", old).config.backup_count == 3
