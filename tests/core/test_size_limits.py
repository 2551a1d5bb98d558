"""A record bigger than the grid's frame limit is refused at the publisher, before anything is sent.

Without the check, the client sends a frame the member must reject: the connection drops (with every other call on
it), an idempotent publisher retries, and the caller finally learns nothing but a timeout.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import replace

import pyarrow as pa
import pytest

from meteor_spark import SizeLimitError
from meteor_spark.errors import ConfigError
from meteor_spark.format.records import Record, encode_batch
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.settings import DEFAULT_MAX_FRAME_BYTES, EMBEDDED_MAX_FRAME_BYTES, ITEM_FRAME_OVERHEAD
from meteor_spark.grid.streams import StreamConfig, lane_bounds
from meteor_spark.producer.publisher import Publisher

MB = 1 << 20


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _PeakRss:
    """The largest resident set seen while the block runs (sampled every millisecond)."""

    def __init__(self) -> None:
        self.peak = _rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, _rss_bytes())

    def __enter__(self) -> _PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_bytes())


def test_a_300_mb_record_is_refused_at_once_and_the_publisher_and_grid_go_on(grid: Grid, unique_name: str) -> None:
    with Publisher(grid, StreamConfig(unique_name, lanes=2)) as pub:
        pub.publish(b"before")
        before = _rss_bytes()
        big = b"x" * (300 * MB)
        with _PeakRss() as rss:
            started = time.monotonic()
            with pytest.raises(SizeLimitError) as refused:
                pub.publish(big)
            elapsed = time.monotonic() - started
        growth = rss.peak - before
        message = str(refused.value)
        print(
            f"\n300 MB record: SizeLimitError after {elapsed * 1000:.1f} ms, client RSS growth {growth / MB:.0f} MB "
            f"(the record itself: 300 MB); {message}"
        )
        assert elapsed < 1.0
        assert growth < 400 * MB
        assert f"{300 * MB:,}" in message and f"{DEFAULT_MAX_FRAME_BYTES:,}" in message
        assert unique_name in message

        # Every way in refuses it the same way, naming the record.
        with pytest.raises(SizeLimitError, match="the record"):
            pub.publish_async(Record(big, key=b"k"))
        with pytest.raises(SizeLimitError, match=r"record 1 \(0-based\) of the 2 given to publish_many"):
            pub.publish_many([b"small", big])
        with pytest.raises(SizeLimitError, match=r"record 0 \(0-based\) of the 2 given to publish_many"):
            pub.publish_many([Record(big), Record(b"small")])
        table = pa.table({"value": pa.array([b"small", big], pa.binary())})
        with pytest.raises(SizeLimitError, match=r"row 1 \(0-based\) of the 2 given to publish_arrow"):
            pub.publish_arrow(table)
        del big, table

        # The same publisher and connection go on: nothing was queued, nothing dropped.
        assert pub.publish(b"after") >= 0
        pub.flush(30)
        assert pub.metrics()["failed_records"] == 0
        assert pub.records_sent == 2
    assert sum(end - head for head, end in lane_bounds(grid, pub.info).values()) == 2
    with Publisher(grid, unique_name) as again:
        assert again.publish(b"a new publisher on the same client") >= 0


def test_the_limit_is_configurable_and_a_record_at_the_limit_is_stored(
    grid_settings: GridSettings, unique_name: str
) -> None:
    settings = replace(grid_settings, max_frame_bytes=4 * MB)
    with Grid(settings) as small, Publisher(small, StreamConfig(unique_name), max_batch_bytes=MB) as pub:
        limit = settings.max_record_bytes
        assert limit == 4 * MB - ITEM_FRAME_OVERHEAD
        key, headers = b"k" * 10, (("h", b"v" * 10),)
        value = b"v" * (limit - len(key) - 11)
        assert pub.publish(Record(value, key=key, headers=headers)) >= 0
        with pytest.raises(SizeLimitError, match=f"{limit + 1:,} bytes"):
            pub.publish(Record(value + b"!", key=key, headers=headers))
        with pytest.raises(SizeLimitError):
            pub.publish_many([b"y" * (limit + 1)])
        assert pub.publish(b"still fine") >= 0


def test_a_lone_record_item_fits_in_the_frame_it_is_checked_against() -> None:
    # A frame is the 6-byte frame header, the 8-byte serialized-data header and the ring item.
    for value_bytes in (0, 1, 1000, MB):
        record = Record(b"v" * value_bytes, key=b"key", headers=(("name", b"value"), ("other", b"")))
        item = encode_batch([record], producer_id=1, producer_seq=1)
        data = value_bytes + 3 + len("name") + len("value") + len("other")
        assert 6 + 8 + len(item) <= data + ITEM_FRAME_OVERHEAD


def test_the_setting_is_an_option_and_checked(grid: Grid, unique_name: str) -> None:
    assert GridSettings.from_options({"hazelcast.maxFrameBytes": "1048576"}).max_frame_bytes == MB
    assert GridSettings().max_frame_bytes == DEFAULT_MAX_FRAME_BYTES == EMBEDDED_MAX_FRAME_BYTES
    for bad in ("lots", "0", "-5", str(1 << 31)):
        with pytest.raises(ConfigError, match="maxFrameBytes"):
            GridSettings.from_options({"hazelcast.maxFrameBytes": bad})
    with pytest.raises(ConfigError, match=r"max_frame_bytes|maxFrameBytes"):
        GridSettings(max_frame_bytes=True)
    # A publisher whose full items could not fit in one frame is refused when it is made.
    settings = replace(grid.settings, max_frame_bytes=MB)
    with pytest.raises(ConfigError, match="max_batch_bytes"):
        _publisher_on(settings, unique_name)


def _publisher_on(settings: GridSettings, name: str) -> None:
    with Grid(settings) as small:
        Publisher(small, StreamConfig(name), max_batch_bytes=MB).close()
