"""A lane truncated and refilled under a group's confirmed offset is caught, never a silent skip (issue 19, row 1).

A member restart that cuts a ring log's torn tail (fsync ``interval``/``never`` and a machine crash), or a grid
restarted without a store, hands the lost sequences out again to new records; a group whose offset was past them
would resume there and pass over as many new records. The offset carries a mark of the item it was taken after
(``meteor_spark.grid.item_marks``); resuming compares it with the item now at that sequence.

The live-grid tests destroy the lane's ring and refill it (works on a real Hazelcast member too); the fault test
SIGKILLs a persistent embedded member and cuts whole records off its ring log, as a lost unflushed tail does.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.errors import DataLossError, LaneTruncatedError
from meteor_spark.format.offsets import first_offset_of
from meteor_spark.format.records import Record
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.item_marks import CHANGED, GONE, PAST_END, SAME, ItemMark, check_mark, mark_of
from meteor_spark.grid.streams import StreamConfig, open_stream
from meteor_spark.groups.store import OFFSETS_MAP, ConfirmedOffset, read_offset
from meteor_spark.producer.publisher import Publisher
from meteor_spark.testing import wait_until
from tests.ring_logs import cut_records

LEASE_MS = 1500
RECORDS = 50


def _publish(grid: Grid, config: StreamConfig, prefix: str, count: int = RECORDS) -> None:
    with Publisher(grid, config) as pub:
        for i in range(count):
            pub.publish(f"{prefix}-{i}".encode())


def _read_all_and_confirm(grid: Grid, config: StreamConfig, count: int = RECORDS) -> list[bytes]:
    got: list[bytes] = []
    with Subscriber(grid, config, group="g", lease_ms=LEASE_MS, initial_offset_scheme="earliest") as sub:
        wait_until(lambda: got.extend(r.value for r in sub.poll(50)) or len(got) >= count, 10, message="first read")
        sub.confirm()
    return got


def _resume(
    grid: Grid, config: StreamConfig, *, skip: bool = False, want: int = RECORDS
) -> tuple[list[bytes], Subscriber]:
    """Resume the group; returns what it read (until ``want`` records or an error) and the subscriber (closed)."""
    got: list[bytes] = []
    sub = Subscriber(grid, config, group="g", lease_ms=LEASE_MS, skip_data_loss=skip)
    try:
        wait_until(lambda: got.extend(r.value for r in sub.poll(50)) or len(got) >= want, 10, message="resumed read")
        sub.confirm()
    finally:
        sub.close()
    return got, sub


def _config(name: str) -> StreamConfig:
    # One record per ring item: the figure (49 of 50 read) is per record, and each lost item is one record.
    return StreamConfig(name, lanes=1, max_batch_records=1, linger_ms=0)


def test_confirm_stores_the_mark_of_the_last_delivered_item(grid: Grid, unique_name: str) -> None:
    config = _config(unique_name)
    _publish(grid, config, "old", 3)
    _read_all_and_confirm(grid, config, 3)
    stored = read_offset(grid.map(OFFSETS_MAP), unique_name, "g", 0)
    assert stored is not None and stored.offset == first_offset_of(3)
    ring = grid.ring(open_stream(grid, unique_name).ring_names[0])
    assert stored.mark == mark_of(ring.read_many(2, 0, 1).items[0], 2)
    assert check_mark(ring, stored.mark) == (SAME, 2)
    assert check_mark(ring, ItemMark(2, stored.mark.crc ^ 1)) == (CHANGED, 2)
    assert check_mark(ring, ItemMark(9, 0)) == (PAST_END, 3)


def test_confirm_of_one_record_stores_the_mark_of_its_item(grid: Grid, unique_name: str) -> None:
    config = _config(unique_name)
    _publish(grid, config, "old", 3)
    records: list[Record] = []
    with Subscriber(grid, config, group="g", lease_ms=LEASE_MS, initial_offset_scheme="earliest") as sub:
        wait_until(lambda: records.extend(sub.poll(50)) or len(records) >= 3, 10, message="3 records")
        sub.confirm(records[1])
    stored = read_offset(grid.map(OFFSETS_MAP), unique_name, "g", 0)
    ring = grid.ring(open_stream(grid, unique_name).ring_names[0])
    assert stored is not None and stored.offset == first_offset_of(2)
    assert stored.mark == mark_of(ring.read_many(1, 0, 1).items[0], 1)


def test_entries_without_a_mark_still_decode_and_are_not_checked() -> None:
    old = '{"by":"m","epoch":3,"offset":1245184,"updated_ms":1,"v":1}'
    assert ConfirmedOffset.decode(old, "here") == ConfirmedOffset(3, 1245184, "m", 1)
    marked = ConfirmedOffset(3, 1245184, "m", 1, ItemMark(18, 77))
    assert ConfirmedOffset.decode(marked.encode(), "here") == marked
    assert '"mark":[18,77]' in marked.encode()


def test_a_group_resuming_on_a_refilled_lane_gets_lane_truncated_error(grid: Grid, unique_name: str) -> None:
    config = _config(unique_name)
    _publish(grid, config, "old")
    assert len(_read_all_and_confirm(grid, config)) == RECORDS
    info = open_stream(grid, unique_name)
    grid.ring(info.ring_names[0]).destroy()  # the lane comes back empty at sequence 0 (no store)
    _publish(grid, config, "new", RECORDS + 1)  # one more than were lost: the lane ends past the group's offset

    with Subscriber(grid, config, group="g", lease_ms=LEASE_MS) as sub:
        with pytest.raises(LaneTruncatedError, match=r"lane 0 was truncated and refilled under group 'g'") as caught:
            wait_until(lambda: len(sub.poll(50)) < 0, 10, message="the truncation error")
        assert isinstance(caught.value, DataLossError)
        assert caught.value.requested == first_offset_of(RECORDS)
        assert caught.value.mark_sequence == RECORDS - 1
        assert "seek" in str(caught.value) and "skip_data_loss" in str(caught.value)
        # The lane stays stopped at the error until the application decides: seek to the oldest record.
        sub.seek(caught.value.oldest_available, lane=0)
        got: list[bytes] = []
        wait_until(
            lambda: got.extend(r.value for r in sub.poll(50)) or len(got) >= RECORDS + 1, 10, message="after seek"
        )
    assert got == [f"new-{i}".encode() for i in range(RECORDS + 1)]
    print(
        f"refilled lane: group offset {RECORDS} items past a lane of {RECORDS + 1} new records -> "
        f"LaneTruncatedError; after seek to the oldest record: {len(got)} of {RECORDS + 1} new records read"
    )


def test_with_skip_data_loss_the_group_rereads_the_refilled_lane_and_counts_it(grid: Grid, unique_name: str) -> None:
    config = _config(unique_name)
    _publish(grid, config, "old")
    _read_all_and_confirm(grid, config)
    grid.ring(open_stream(grid, unique_name).ring_names[0]).destroy()
    _publish(grid, config, "new")  # exactly as many as were lost: the group's offset is the lane's end

    got, sub = _resume(grid, config, skip=True)
    assert got == [f"new-{i}".encode() for i in range(RECORDS)]
    assert (sub.truncated_lanes, sub.truncations) == (1, [(0, first_offset_of(RECORDS), 0)])
    # The group's offset moved with it: a member resuming now finds the same history, nothing counted again.
    _publish(grid, config, "more", 5)
    again, sub2 = _resume(grid, config, skip=True, want=5)
    assert again == [f"more-{i}".encode() for i in range(5)] and sub2.truncated_lanes == 0
    print(
        f"refilled lane with skip_data_loss: {len(got)} of {RECORDS} new records read, "
        f"{sub.truncated_lanes} truncation counted, 0 skipped"
    )


def test_same_history_and_overwritten_marks_are_not_truncation(grid: Grid, unique_name: str) -> None:
    config = StreamConfig(unique_name, lanes=1, max_batch_records=1, linger_ms=0, capacity=10)
    _publish(grid, config, "old", 5)
    _read_all_and_confirm(grid, config, 5)
    _publish(grid, config, "new", 3)
    got, _ = _resume(grid, config, want=3)
    assert got == [b"new-0", b"new-1", b"new-2"]
    # Overwrite the confirmed position's item and more: reading on is data loss, as before (not truncation).
    _publish(grid, config, "flood", 30)
    sub = Subscriber(grid, config, group="g", lease_ms=LEASE_MS)
    try:
        with pytest.raises(DataLossError) as caught:
            wait_until(lambda: len(sub.poll(50)) < 0, 10, message="data loss")
        assert not isinstance(caught.value, LaneTruncatedError)
    finally:
        sub.close()
    stored = read_offset(grid.map(OFFSETS_MAP), unique_name, "g", 0)
    assert stored is not None and stored.mark is not None and stored.mark.sequence == 7
    ring = grid.ring(open_stream(grid, unique_name).ring_names[0])
    assert check_mark(ring, stored.mark) == (GONE, ring.head())


@pytest.mark.embedded_only
@pytest.mark.fault
@pytest.mark.parametrize("fsync", ["never", "interval"])
@pytest.mark.parametrize("skip", [False, True], ids=["error", "skip"])
def test_member_restart_that_cuts_the_ring_log_tail(tmp_path: Path, fsync: str, skip: bool) -> None:
    """The issue's scenario: 50 published, read and confirmed; SIGKILL; the ring log loses its last records (what
    a machine crash under fsync interval/never leaves); restart; 50 new: the group must not silently skip them."""
    from meteor_spark.server import EmbeddedGrid

    lost = 10
    member = EmbeddedGrid(port=0, process=True, data_dir=tmp_path / "data", fsync=fsync).start()
    try:
        settings = GridSettings(members=(member.address,), cluster_name=member.cluster_name)
        config = _config("orders")
        with Grid(settings) as grid:
            _publish(grid, config, "old")
            assert len(_read_all_and_confirm(grid, config)) == RECORDS
        member.kill()
        ring_log = next((tmp_path / "data" / "rings").glob("meteor.stream*orders*.log"))
        cut_records(ring_log, lost)
        member.restart()
        with Grid(settings) as grid:
            ring = grid.ring(open_stream(grid, "orders").ring_names[0])
            assert ring.tail() == RECORDS - lost - 1  # the lost sequences will be handed out again
            _publish(grid, config, "new")
            new = [f"new-{i}".encode() for i in range(RECORDS)]
            if not skip:
                got: list[bytes] = []
                with (
                    Subscriber(grid, config, group="g", lease_ms=LEASE_MS) as sub,
                    pytest.raises(LaneTruncatedError) as caught,
                ):
                    wait_until(lambda: got.extend(r.value for r in sub.poll(50)) or False, 10, message="error")
                assert got == [] and caught.value.requested == first_offset_of(RECORDS)
                figures = f"0 of {RECORDS} new records delivered past the truncation, LaneTruncatedError raised"
            else:
                got, sub = _resume(grid, config, skip=True, want=RECORDS + RECORDS - lost)
                assert got == [f"old-{i}".encode() for i in range(RECORDS - lost)] + new
                assert sub.truncated_lanes == 1
                silently_skipped = len(set(new) - set(got))
                assert silently_skipped == 0
                figures = (
                    f"{len(set(new) & set(got))} of {RECORDS} new records read, {silently_skipped} skipped, "
                    f"{RECORDS - lost} surviving old records delivered again, 1 truncation counted"
                )
    finally:
        member.stop()
    print(f"fsync={fsync}: ring log cut by {lost} of {RECORDS} acknowledged, read and confirmed records; {figures}")


@pytest.mark.embedded_only
@pytest.mark.fault
@pytest.mark.parametrize("skip", [False, True], ids=["error", "skip"])
@pytest.mark.parametrize("reader", ["parked", "buffered"])
def test_a_reader_connected_across_a_member_restart_that_cuts_the_ring_log_tail(
    tmp_path: Path, reader: str, skip: bool
) -> None:
    """A subscriber that stays connected while its member is SIGKILLed, loses the ring log's last records and
    restarts: the client reconnects and retries on its own, so nothing resumes and no stored mark is checked.

    ``parked``: the reader has a read parked past the lost records (the client retries it after the restart).
    ``buffered``: its buffer is full (``max_poll_records`` 10 of 50 read), so its next read is only sent once the
    new records are there, at the old position, where it would silently pass over the 10 new records that took the
    lost sequences. The connection loss makes the next read verify the last item read first: the records read
    before are delivered, then ``LaneTruncatedError``, or with ``skip_data_loss`` the lane is read again from its
    oldest record, counted."""
    import time

    from meteor_spark.server import EmbeddedGrid

    lost = 10
    first = RECORDS if reader == "parked" else 10
    old = [f"old-{i}".encode() for i in range(RECORDS)]
    new = [f"new-{i}".encode() for i in range(RECORDS)]
    member = EmbeddedGrid(port=0, process=True, data_dir=tmp_path / "data", fsync="never").start()
    try:
        settings = GridSettings(members=(member.address,), cluster_name=member.cluster_name, connect_timeout_s=60)
        config = _config("orders")
        with Grid(settings) as grid:
            _publish(grid, config, "old")
            sub = Subscriber(
                grid, config, initial_offset_scheme="earliest", skip_data_loss=skip, max_poll_records=first
            )
            try:
                got: list[bytes] = []
                wait_until(
                    lambda: got.extend(r.value for r in sub.poll(50)) or len(got) >= first, 10, message="first read"
                )
                read_first = len(got)
                assert got == old[:read_first]
                # Every old item is read from the grid (buffered or delivered): nothing else is sent for the lane.
                assert sub._lanes[0].fetch_seq == RECORDS
                losses = grid.connection_losses
                member.kill()
                ring_log = next((tmp_path / "data" / "rings").glob("meteor.stream*orders*.log"))
                cut_records(ring_log, lost)
                started = time.monotonic()
                member.restart()
                _publish(grid, config, "new")  # waits for the client to reconnect
                assert grid.connection_losses > losses
                ring = grid.ring(open_stream(grid, "orders").ring_names[0])
                assert ring.tail() == 2 * RECORDS - lost - 1
                after: list[bytes] = []
                if not skip:
                    with pytest.raises(LaneTruncatedError, match="while it read across a lost connection") as caught:
                        wait_until(lambda: after.extend(r.value for r in sub.poll(50)) or False, 20, message="error")
                    assert after == old[read_first:] and caught.value.requested == first_offset_of(RECORDS)
                    figures = (
                        f"{len(after)} records read before delivered, 0 of {RECORDS} new records delivered past the "
                        f"truncation, LaneTruncatedError raised"
                    )
                else:
                    want = RECORDS - read_first + RECORDS - lost + RECORDS
                    wait_until(
                        lambda: after.extend(r.value for r in sub.poll(50)) or len(after) >= want, 20, message="again"
                    )
                    assert after == old[read_first:] + old[: RECORDS - lost] + new
                    assert (sub.truncated_lanes, sub.truncations) == (1, [(0, first_offset_of(RECORDS), 0)])
                    figures = (
                        f"{len(set(new) & set(after))} of {RECORDS} new records read, 0 skipped, {RECORDS - lost} "
                        f"surviving old records delivered again, 1 truncation counted"
                    )
                took = time.monotonic() - started
            finally:
                sub.close()
    finally:
        member.stop()
    print(
        f"{reader} reader across a restart (skip_data_loss={skip}): ring log cut by {lost} of {RECORDS} read "
        f"records; {figures}; restart to outcome {took:.2f} s"
    )


@pytest.mark.fault
@pytest.mark.slow
def test_a_reader_connected_across_a_real_member_restart_without_a_store(tmp_path: Path) -> None:
    """The same on a real Hazelcast 5.7.0 member restarted without a store: the lane starts again at sequence 0 and
    60 new records refill it past the reader's position (50). The reader's buffer is full (``max_poll_records``
    10), so its next read is sent only once the new records are there, where it would silently pass over the 50
    new records below its position: the records read before are delivered, then ``LaneTruncatedError``."""
    import time

    from tests.real_members import HazelcastMember, hazelcast_jar

    try:
        hazelcast_jar()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    member = HazelcastMember(tmp_path, heap="512m").start()
    try:
        settings = GridSettings(members=(member.address,), cluster_name=member.cluster_name, connect_timeout_s=120)
        config = _config("orders")
        with Grid(settings) as grid:
            _publish(grid, config, "old")
            sub = Subscriber(grid, config, initial_offset_scheme="earliest", max_poll_records=10)
            try:
                got: list[bytes] = []
                wait_until(lambda: got.extend(r.value for r in sub.poll(50)) or len(got) >= 10, 10, message="read")
                assert sub._lanes[0].fetch_seq == RECORDS  # every old item read; nothing else is sent for the lane
                member.kill()
                started = time.monotonic()
                member = HazelcastMember(tmp_path, port=member.port, heap="512m").start()
                _publish(grid, config, "new", RECORDS + 10)  # waits for the client to reconnect
                after: list[bytes] = []
                with pytest.raises(LaneTruncatedError, match="while it read across a lost connection"):
                    wait_until(lambda: after.extend(r.value for r in sub.poll(50)) or False, 30, message="error")
                took = time.monotonic() - started
                assert after == [f"old-{i}".encode() for i in range(len(got), RECORDS)]
            finally:
                sub.close()
    finally:
        member.kill()
    print(
        f"real member restarted without a store under a live reader: {len(after)} records read before delivered, "
        f"0 of {RECORDS + 10} new records delivered past the truncation, LaneTruncatedError; restart to outcome "
        f"{took:.2f} s"
    )
