"""A lane truncated and refilled under a shared group's position is caught, never a silent skip.

A member restart that loses a ring's tail hands the lost sequences out again to new records; a shared group's entry
still has ``next`` past them, so fresh acquisitions would start above the new records that took them. The entry
carries the mark of the item of the last record handed out (``meteor_spark.consumer.shared_takeup``): a member
taking the lane up (its first look, or its first after a lost connection) compares it with the item now there.

The live-grid test destroys the lane's ring and refills it (a member that starts later; runs on a real Hazelcast
member too); the fault test SIGKILLs a persistent embedded member under two connected members, cuts whole records
off its ring log (as a lost unflushed tail) and restarts it on the same port.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest

from meteor_spark.consumer.shared_subscriber import SharedSubscriber
from meteor_spark.errors import ArgumentTypeError, DataLossError, LaneTruncatedError
from meteor_spark.format.offsets import first_offset_of
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.item_marks import ItemMark, mark_of
from meteor_spark.grid.streams import StreamConfig, open_stream
from meteor_spark.groups.shared_state import SHARE_MAP, LaneShare, Span
from meteor_spark.groups.store import lane_key
from meteor_spark.producer.publisher import Publisher
from meteor_spark.testing import wait_until
from tests.ring_logs import cut_records

RECORDS = 50


def _config(name: str) -> StreamConfig:
    return StreamConfig(name, lanes=1, max_batch_records=1, linger_ms=0)  # one record per ring item


def _publish(grid: Grid, config: StreamConfig, prefix: str, count: int = RECORDS) -> None:
    with Publisher(grid, config) as pub:
        for i in range(count):
            pub.publish(f"{prefix}-{i}".encode())


def _drain(members: list[SharedSubscriber], want: int, seen: list[bytes], timeout_s: float = 20) -> None:
    """Poll every member in turn, acknowledging what it got, until ``seen`` holds ``want`` records."""

    wait_until(lambda: _drain_once(members, seen) or len(seen) >= want, timeout_s, message=f"{want} records")


def _drain_once(members: list[SharedSubscriber], seen: list[bytes]) -> bool:
    """One poll of every member, acknowledging what it got; False (for ``wait_until``)."""
    for member in members:
        batch = member.poll(20)
        seen.extend(r.value for r in batch)
        member.ack(batch)
    return False


def _entry(grid: Grid, stream: str) -> LaneShare:
    text = grid.map(SHARE_MAP).get(lane_key(stream, "q", 0))
    assert text is not None
    return LaneShare.decode(text, "test")


def test_entries_without_a_mark_still_decode_and_steps_keep_the_mark() -> None:
    old = '{"next":327680,"spans":[[262144,327680,"r",2]],"start":262144,"v":1}'
    assert LaneShare.decode(old, "here") == LaneShare(262144, 327680, (Span(262144, 327680, "r", 2),))
    marked = LaneShare(262144, 327680, (Span(262144, 327680, "r", 2),), ItemMark(4, 77))
    assert '"mark":[4,77]' in marked.encode() and LaneShare.decode(marked.encode(), "here") == marked
    acquired = marked.acquire([(262144, 327680, 3)], "t", 393216)
    assert acquired.mark == ItemMark(4, 77) and acquired.marked(ItemMark(5, 1)).mark == ItemMark(5, 1)
    settled, _ = acquired.settle([(262144, 393216)], "t", "d")
    assert (settled.start, settled.mark) == (393216, ItemMark(4, 77))
    assert acquired.marked(None) is acquired


def test_acquiring_fresh_records_stores_the_mark_of_the_last_item(grid: Grid, unique_name: str) -> None:
    config = _config(unique_name)
    _publish(grid, config, "old", 3)
    with pytest.raises(ArgumentTypeError, match="skip_data_loss must be True or False"):
        SharedSubscriber(grid, unique_name, group="q", skip_data_loss="yes")  # type: ignore[arg-type]
    with SharedSubscriber(grid, unique_name, group="q", initial_offset_scheme="earliest") as member:
        seen: list[bytes] = []
        _drain([member], 3, seen)
    ring = grid.ring(open_stream(grid, unique_name).ring_names[0])
    entry = _entry(grid, unique_name)
    assert (entry.next, entry.mark) == (first_offset_of(3), mark_of(ring.read_many(2, 0, 1).items[0], 2))


def test_a_member_starting_on_a_refilled_lane(grid: Grid, unique_name: str) -> None:
    """Read and acknowledged 50; the lane comes back empty (no store) and 51 new records refill it: a member that
    starts now gets ``LaneTruncatedError``; two members with ``skip_data_loss`` deliver all 51, counted once."""
    config = _config(unique_name)
    _publish(grid, config, "old")
    with SharedSubscriber(grid, unique_name, group="q", initial_offset_scheme="earliest") as member:
        _drain([member], RECORDS, [])
    grid.ring(open_stream(grid, unique_name).ring_names[0]).destroy()
    _publish(grid, config, "new", RECORDS + 1)  # one more than were lost: the lane ends past the group's position
    new = [f"new-{i}".encode() for i in range(RECORDS + 1)]

    with SharedSubscriber(grid, unique_name, group="q") as member:
        with pytest.raises(LaneTruncatedError, match=r"lane 0 was truncated and refilled under shared group 'q'") as e:
            member.poll(100)
        assert isinstance(e.value, DataLossError) and e.value.requested == first_offset_of(RECORDS)
        assert e.value.stream == unique_name and e.value.lane == 0 and e.value.mark_sequence == RECORDS - 1
        assert "skip_data_loss=True" in str(e.value) and "forget_groups" in str(e.value)
        with pytest.raises(LaneTruncatedError):
            member.poll(0)  # it stays until the group is told what to do
    assert _entry(grid, unique_name).next == first_offset_of(RECORDS)  # nothing written

    members = [SharedSubscriber(grid, unique_name, group="q", skip_data_loss=True) for _ in range(2)]
    try:
        seen: list[bytes] = []
        _drain(members, RECORDS + 1, seen)
        counted = sum(m.truncated_lanes for m in members)
        assert sorted(seen) == sorted(new) and counted == 1
        assert [t for m in members for t in m.truncations] == [(0, first_offset_of(RECORDS), 0)]
        assert sum(m.metrics()["truncated_lanes"] for m in members) == 1
    finally:
        for member in members:
            member.close()
    print(
        f"refilled lane under a shared group: a member starting later -> LaneTruncatedError; with skip_data_loss: "
        f"{len(set(seen) & set(new))} of {len(new)} new records delivered, 0 skipped, "
        f"{len(seen) - len(set(seen))} duplicated, {counted} truncation counted by 2 members"
    )


@pytest.mark.embedded_only
@pytest.mark.fault
@pytest.mark.parametrize("skip", [False, True], ids=["error", "skip"])
def test_shared_members_connected_across_a_member_restart_that_cuts_the_ring_log_tail(
    tmp_path: Path, skip: bool
) -> None:
    """Two members read and acknowledge 50 records; the member is SIGKILLed, its ring log loses the last 10 records
    and it restarts on the same port; 50 new records take sequences 40..89. The members stay connected (the client
    reconnects on its own): without the check they would acquire from 50 on and never deliver new-0..new-9."""
    from meteor_spark.server import EmbeddedGrid

    lost = 10
    new = [f"new-{i}".encode() for i in range(RECORDS)]
    member = EmbeddedGrid(port=0, process=True, data_dir=tmp_path / "data", fsync="never").start()
    grids: list[Grid] = []
    members: list[SharedSubscriber] = []
    try:
        settings = GridSettings(members=(member.address,), cluster_name=member.cluster_name, connect_timeout_s=60)
        grids = [Grid(settings) for _ in range(2)]
        config = _config("orders")
        _publish(grids[0], config, "old")
        members = [
            SharedSubscriber(g, "orders", group="q", initial_offset_scheme="earliest", skip_data_loss=skip)
            for g in grids
        ]
        first: list[bytes] = []
        _drain(members, RECORDS, first)
        assert sorted(first) == sorted(f"old-{i}".encode() for i in range(RECORDS))
        losses = [g.connection_losses for g in grids]
        member.kill()
        cut_records(next((tmp_path / "data" / "rings").glob("meteor.stream*orders*.log")), lost)
        started = time.monotonic()
        member.restart()
        _publish(grids[0], config, "new")  # waits for the client to reconnect
        wait_until(lambda: all(g.connection_losses > n for g, n in zip(grids, losses, strict=True)), 20)
        after: list[bytes] = []
        if not skip:
            for each in members:
                with pytest.raises(LaneTruncatedError, match="shared group 'q'") as caught:
                    wait_until(lambda m=each: after.extend(r.value for r in m.poll(20)) or False, 20)  # type: ignore[misc]
                assert caught.value.requested == first_offset_of(RECORDS)
            took = time.monotonic() - started
            later = SharedSubscriber(grids[1], "orders", group="q")  # a member starting after the restart
            with pytest.raises(LaneTruncatedError):
                later.poll(100)
            later.close()
            assert after == []
            outcome = "LaneTruncatedError on both members and on one starting later"
        else:
            wait_until(lambda: _drain_once(members, after) or sum(m.truncated_lanes for m in members) > 0, 20)
            took = time.monotonic() - started
            _drain(members, RECORDS - lost + RECORDS, after)
            counted = sum(m.truncated_lanes for m in members)
            assert counted == 1 and set(new) <= set(after)
            assert Counter(after) == Counter([f"old-{i}".encode() for i in range(RECORDS - lost)] + new)
            outcome = f"{counted} truncation counted, reset to the oldest record"
        delivered_new = len(set(new) & set(after))
        silently_skipped = RECORDS - delivered_new if skip else 0
        assert silently_skipped == 0
        duplicated = sum(1 for value in after if value in set(first))
    finally:
        for each in members:
            each.close()
        for g in grids:
            g.close()
        member.stop()
    print(
        f"shared group, 2 connected members, restart cut {lost} of {RECORDS} acknowledged records, {RECORDS} new "
        f"(skip_data_loss={skip}): {outcome}; delivered after the restart {len(after)} ({delivered_new} of "
        f"{RECORDS} new), lost (silently skipped) {silently_skipped}, duplicated {duplicated} (old records "
        f"delivered again), restart to detection {took:.2f} s"
    )
