"""Auto-confirm (Kafka's enable.auto.commit): grouped subscribers and receivers confirm on their own, at most every
``auto_confirm_interval_ms``, at the next poll and on close; a SIGKILLed member re-delivers only the unconfirmed
tail."""

from __future__ import annotations

import json
import threading
import time

import pytest

from meteor_spark.consumer.auto_confirm import AutoConfirm
from meteor_spark.consumer.receiver import Receiver
from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.errors import ConfigError
from meteor_spark.format.offsets import first_offset_of, make_offset
from meteor_spark.format.records import Record
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.streams import StreamConfig, StreamInfo, open_stream
from meteor_spark.groups.admin import group_state
from meteor_spark.producer.publisher import Publisher
from meteor_spark.testing import wait_until
from tests.core.processes import Child

LEASE_MS = 1500
HOUR_MS = 3_600_000


def _confirmed(grid: Grid, info: StreamInfo, group: str = "g") -> dict[int, int | None]:
    return {state.lane: state.confirmed for state in group_state(grid, info, group)}


def _stream(grid: Grid, name: str, values: list[str], lanes: int = 1, per_item: int = 1) -> StreamInfo:
    info = open_stream(grid, StreamConfig(name, lanes=lanes, capacity=1000))
    with Publisher(grid, name, max_batch_records=per_item) as publisher:
        publisher.publish_many([Record(v.encode(), lane=i % lanes) for i, v in enumerate(values)]).result(30)
    return info


def _poll_some(sub: Subscriber, timeout_s: float = 10.0) -> list[str]:
    return [r.value.decode() for r in wait_until(lambda: sub.poll(50), timeout_s, message="a non-empty poll")]


def test_the_auto_confirm_clock_is_due_at_most_once_per_interval() -> None:
    now = [100.0]
    auto = AutoConfirm(500, clock=lambda: now[0])
    assert not auto.due()
    now[0] += 0.499
    assert not auto.due()
    now[0] += 0.001
    assert auto.due()
    auto.done()
    assert not auto.due() and auto.confirms == 1
    now[0] += 0.5
    assert auto.due()
    with pytest.raises(ConfigError, match=r"auto_confirm_interval_ms must be an integer in \[0, "):
        AutoConfirm(-1)
    with pytest.raises(ConfigError, match="auto_confirm_interval_ms"):
        AutoConfirm(True)


def test_auto_confirm_needs_a_group(grid: Grid, unique_name: str) -> None:
    with pytest.raises(ConfigError, match="auto_confirm_interval_ms needs a group"):
        Subscriber(grid, StreamConfig(unique_name), auto_confirm_interval_ms=1000)
    with (
        Subscriber(grid, StreamConfig(unique_name)) as ungrouped,
        pytest.raises(ConfigError, match="auto_confirm_interval_ms needs a grouped subscriber"),
    ):
        Receiver(ungrouped, lambda _r: None, auto_confirm_interval_ms=1000)


def test_each_poll_confirms_what_the_previous_polls_handed_out(grid: Grid, unique_name: str) -> None:
    info = _stream(grid, unique_name, [f"r{i}" for i in range(6)])  # one record per ring item
    with Subscriber(
        grid, unique_name, group="g", lease_ms=LEASE_MS, max_poll_records=2, auto_confirm_interval_ms=0
    ) as sub:
        assert _poll_some(sub) == ["r0", "r1"]
        assert _confirmed(grid, info)[0] == first_offset_of(0)  # handed out, not confirmed yet: the next poll does it
        assert _poll_some(sub) == ["r2", "r3"]
        assert _confirmed(grid, info)[0] == first_offset_of(2)  # no confirm() call
        assert _poll_some(sub) == ["r4", "r5"]
        assert _confirmed(grid, info)[0] == first_offset_of(4)
    assert _confirmed(grid, info)[0] == first_offset_of(6)  # close confirms the last batch


def test_no_confirm_before_the_interval_has_passed_and_close_confirms(grid: Grid, unique_name: str) -> None:
    info = _stream(grid, unique_name, [f"r{i}" for i in range(8)], lanes=2)
    sub = Subscriber(
        grid, unique_name, group="g", lease_ms=LEASE_MS, max_poll_records=1, auto_confirm_interval_ms=HOUR_MS
    )
    got: list[str] = []
    for _ in range(8):
        got.extend(_poll_some(sub))
    for _ in range(5):
        assert len(sub.poll(10)) == 0
    assert sorted(got) == [f"r{i}" for i in range(8)]
    # 13 polls, none of them an hour after the last confirm
    assert _confirmed(grid, info) == {0: first_offset_of(0), 1: first_offset_of(0)}
    sub.close()
    assert _confirmed(grid, info) == {0: first_offset_of(4), 1: first_offset_of(4)}


def test_a_receiver_stopped_mid_batch_confirms_only_what_its_callback_finished(grid: Grid, unique_name: str) -> None:
    info = open_stream(grid, StreamConfig(unique_name, capacity=1000))
    seen: list[str] = []
    handed = threading.Event()
    sub = Subscriber(grid, unique_name, group="g", lease_ms=LEASE_MS, auto_confirm_interval_ms=HOUR_MS)

    def handle(record: Record) -> None:
        seen.append(record.value.decode())
        if record.value == b"r3":
            receiver.close()  # from the callback: the receiver stops after this record
            handed.set()

    receiver = sub.attach_receiver(handle, poll_timeout_ms=20, auto_confirm_interval_ms=HOUR_MS)
    _stream(grid, unique_name, [f"r{i}" for i in range(8)], per_item=8)  # one ring item, one batch; published
    assert handed.wait(10)  # after `receiver` is bound, which the callback uses
    wait_until(lambda: not receiver.is_alive(), message="the receiver thread ended")
    assert _confirmed(grid, info)[0] == first_offset_of(0)
    sub.close()  # closes the receiver: it confirms what its callback finished, not the whole batch
    assert seen == ["r0", "r1", "r2", "r3"]
    assert _confirmed(grid, info)[0] == make_offset(0, 4)
    with Subscriber(grid, unique_name, group="g", lease_ms=LEASE_MS) as next_one:
        assert _poll_some(next_one) == ["r4", "r5", "r6", "r7"]


def test_a_receiver_confirms_finished_records_at_its_next_poll(grid: Grid, unique_name: str) -> None:
    info = _stream(grid, unique_name, [f"r{i}" for i in range(4)])
    seen: list[str] = []
    with Subscriber(grid, unique_name, group="g", lease_ms=LEASE_MS) as sub:
        receiver = sub.attach_receiver(
            lambda r: seen.append(r.value.decode()), poll_timeout_ms=20, auto_confirm_interval_ms=0
        )
        wait_until(lambda: _confirmed(grid, info)[0] == first_offset_of(4), message="all four confirmed")
        assert seen == ["r0", "r1", "r2", "r3"]
        receiver.close()


# The child reads in group "g" with auto-confirm at every poll and never calls confirm(); it reports what each poll
# handed out, then idles until it is killed.
AUTO_CONFIRM_CHILD = r"""
import json, sys, threading
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.testing import wait_until

address, cluster, stream = sys.argv[1:4]
grid = Grid(GridSettings(members=(address,), cluster_name=cluster))
sub = Subscriber(grid, stream, group="g", member_id="child", lease_ms=600, initial_offset_scheme="earliest",
                 max_poll_records=3, auto_confirm_interval_ms=0)
polls = []
def more():
    batch = sub.poll(100)
    if batch:
        polls.append([r.value.decode() for r in batch])
    return sum(map(len, polls)) >= 9
wait_until(more, 30)
print(json.dumps(polls), flush=True)
threading.Event().wait()
"""


@pytest.mark.fault
def test_a_sigkilled_auto_confirming_member_redelivers_only_its_unconfirmed_tail(
    grid: Grid, grid_settings: GridSettings, unique_name: str, children: list[Child]
) -> None:
    published = [f"r{i}" for i in range(16)]
    info = _stream(grid, unique_name, published)
    child = Child(AUTO_CONFIRM_CHILD, grid_settings.members[0], grid_settings.cluster_name, info.name)
    children.append(child)
    polls: list[list[str]] = json.loads(child.read_line())
    child.kill()
    killed_at = time.monotonic()
    handed_out = [v for batch in polls for v in batch]
    tail = polls[-1]  # handed out by the last poll; no poll came after it to confirm it

    with Subscriber(grid, info.name, group="g", member_id="survivor", lease_ms=600) as survivor:
        received: list[str] = []
        expected = len(published) - len(handed_out) + len(tail)
        wait_until(
            lambda: received.extend(r.value.decode() for r in survivor.poll(100)) or len(received) >= expected,
            30,
            message=f"{expected} records",
        )
        takeover_s = time.monotonic() - killed_at
        assert len(survivor.poll(200)) == 0
    redelivered = sorted(set(received) & set(handed_out), key=lambda v: int(v[1:]))
    lost = sorted(set(published) - set(handed_out) - set(received))
    print(
        f"[fault] sigkill auto-confirming member: polls={len(polls)}, handed_out={len(handed_out)}, "
        f"redelivered={len(redelivered)}, unconfirmed_tail={len(tail)}, lost={len(lost)}, "
        f"takeover_s={takeover_s:.2f}",
        flush=True,
    )
    assert lost == []
    assert redelivered == tail  # exactly the last poll's records come again, nothing confirmed before them
    assert received == tail + [v for v in published if v not in handed_out]


def test_deactivate_confirms_what_was_handed_out(grid: Grid, unique_name: str) -> None:
    info = _stream(grid, unique_name, [f"r{i}" for i in range(3)])
    with Subscriber(grid, unique_name, group="g", lease_ms=LEASE_MS, auto_confirm_interval_ms=HOUR_MS) as sub:
        got: list[bytes] = []
        wait_until(lambda: got.extend(r.value for r in sub.poll(50)) or len(got) >= 3, 10)
        sub.deactivate()
        assert _confirmed(grid, info)[0] == first_offset_of(3)


def test_a_rebalance_moves_a_lane_away_and_auto_confirm_goes_on_with_the_others(grid: Grid, unique_name: str) -> None:
    info = _stream(grid, unique_name, [f"r{i}" for i in range(8)], lanes=2)  # r0 r2 r4 r6 lane 0, the rest lane 1
    first = Subscriber(
        grid, unique_name, group="g", lease_ms=LEASE_MS, member_id="a", max_poll_records=8, auto_confirm_interval_ms=0
    )
    got = []
    wait_until(lambda: got.extend(_values_of(first.poll(50))) or len(got) >= 8, 10, message="all 8 records")
    second = Subscriber(grid, unique_name, group="g", lease_ms=LEASE_MS, member_id="b")
    try:
        assert second.member is not None and first.member is not None
        wait_until(
            lambda: len(second.member.assignment()) == 1 and len(first.member.assignment()) == 1,
            20,
            message="one lane each",
        )
        moved = next(iter(second.member.assignment()))
        kept = 1 - moved
        first.poll(50)  # auto-confirms: the kept lane moves; the moved lane is logged as lost, not raised
        confirmed = _confirmed(grid, info)
        assert confirmed[kept] == first_offset_of(4)
        # The 8 records may have come in two polls (one lane's read answered first): the second poll then confirmed
        # the first batch, so the moved lane may have moved to the group before the rebalance. Its new holder gets
        # exactly what the group had not confirmed of it.
        moved_values = [f"r{2 * k + moved}" for k in range(4)]
        tail = [v for k, v in enumerate(moved_values) if first_offset_of(k) >= (confirmed[moved] or 0)]
        again: list[str] = []
        wait_until(lambda: again.extend(_values_of(second.poll(50))) or len(again) >= len(tail), 10, message="the tail")
        again.extend(_values_of(second.poll(100)))  # nothing more
        assert sorted(again) == sorted(tail)
        assert sorted(got) == sorted(f"r{i}" for i in range(8))
    finally:
        second.close()
        first.close()


def _values_of(batch: object) -> list[str]:
    return [r.value.decode() for r in batch]  # type: ignore[attr-defined]
