"""Group members in other processes: SIGKILLed (lanes taken over at the confirmed offsets, nothing lost) and
SIGSTOPped past their lease (a zombie: every confirm it tries after waking up is refused)."""

from __future__ import annotations

import itertools
import json
import os
import signal
import time

import pytest

from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.format.offsets import make_offset
from meteor_spark.format.records import Record
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.streams import StreamConfig, StreamInfo, open_stream
from meteor_spark.groups.exclusive import GroupMember
from meteor_spark.producer.publisher import Publisher
from meteor_spark.testing import wait_until
from tests.core.processes import Child

# The child joins the group first (so it holds every lane), confirms one offset per lane, reports, then idles with
# its renewal thread running until it is killed.
MEMBER_CHILD = r"""
import json, sys, threading
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.groups.exclusive import GroupMember
from meteor_spark.format.offsets import make_offset
from meteor_spark.producer.publisher import Publisher
from meteor_spark.format.records import Record
from meteor_spark.grid.streams import open_stream

address, cluster, stream, group = sys.argv[1:5]
grid = Grid(GridSettings(members=(address,), cluster_name=cluster))
member = GroupMember(grid, open_stream(grid, stream), group, member_id="child", lease_ms=600)
member.start()
confirmed = {}
for lane in member.assignment():
    member.confirm(lane, make_offset(10 + lane, lane))
    confirmed[lane] = member.confirmed(lane)
print(json.dumps(confirmed), flush=True)
threading.Event().wait()
"""


# The child subscribes in group "g" (it starts first, so it reads both lanes), confirms what its first polls
# delivered, reads a few more records WITHOUT confirming them, reports both, then idles until it is killed.
SUBSCRIBER_CHILD = r"""
import json, sys, threading
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.testing import wait_until
from tests.core.processes import Child

address, cluster, stream, group = sys.argv[1:5]
grid = Grid(GridSettings(members=(address,), cluster_name=cluster))
sub = Subscriber(grid, stream, group=group, member_id="child", lease_ms=600, initial_offset_scheme="earliest",
                 max_poll_records=3)
confirmed, unconfirmed = [], []
wait_until(lambda: confirmed.extend(r.value.decode() for r in sub.poll(100)) or len(confirmed) >= 4, 30)
sub.confirm()
wait_until(lambda: unconfirmed.extend(r.value.decode() for r in sub.poll(100)) or len(unconfirmed) >= 2, 30)
print(json.dumps({"confirmed": confirmed, "unconfirmed": unconfirmed}), flush=True)
threading.Event().wait()
"""


# The zombie: confirms what its first polls delivered, reads more WITHOUT confirming, reports, then waits for a
# line on stdin (the parent SIGSTOPs it meanwhile and SIGCONTs it after another member took its lanes over and
# confirmed). Then it tries to confirm in every way a subscriber can, and reports what became of each attempt.
ZOMBIE_CHILD = r"""
import json, sys
from meteor_spark.errors import FencedError, MeteorError
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.testing import wait_until
from tests.core.processes import Child

address, cluster, stream, group, lease_ms = sys.argv[1:6]
grid = Grid(GridSettings(members=(address,), cluster_name=cluster))
sub = Subscriber(grid, stream, group=group, member_id="zombie", lease_ms=int(lease_ms),
                 initial_offset_scheme="earliest", max_poll_records=3)
confirmed, delivered = [], []
wait_until(lambda: confirmed.extend(sub.poll(100)) or len(confirmed) >= 4, 30)
sub.confirm()
wait_until(lambda: delivered.extend(sub.poll(100)) or len(delivered) >= 2, 30)
print(json.dumps({"confirmed": [r.value.decode() for r in confirmed],
                  "delivered": [r.value.decode() for r in delivered]}), flush=True)
sys.stdin.readline()
outcomes = []
def attempt(confirm):
    try:
        confirm()
        outcomes.append("accepted")
    except FencedError:
        outcomes.append("fenced")
    except MeteorError as exc:
        outcomes.append(type(exc).__name__ + ": " + str(exc))
last = {}
for record in delivered:
    last[record.lane] = record
for record in last.values():
    attempt(lambda: sub.confirm(record))
attempt(sub.confirm)
sub.poll(300)  # the subscriber notices that its lanes are gone
attempt(sub.confirm)
print(json.dumps(outcomes), flush=True)
sys.stdin.readline()
"""


@pytest.fixture
def child_args(grid_settings: GridSettings) -> tuple[str, str]:
    return grid_settings.members[0], grid_settings.cluster_name


@pytest.fixture
def stream4(grid: Grid, unique_name: str) -> StreamInfo:
    return open_stream(grid, StreamConfig(unique_name, lanes=4, capacity=100))


def test_sigkilled_member_process_lanes_are_taken_over_at_the_confirmed_offsets(
    grid: Grid, stream4: StreamInfo, child_args: tuple[str, str], children: list[Child]
) -> None:
    child = Child(MEMBER_CHILD, *child_args, stream4.name, "g")
    children.append(child)
    confirmed = {int(lane): offset for lane, offset in json.loads(child.read_line()).items()}
    assert confirmed == {lane: make_offset(10 + lane, lane) for lane in range(4)}

    # want="all": a standby that never takes a live lease (a balanced one would get half the lanes handed over).
    survivor = GroupMember(grid, stream4, "g", member_id="survivor", lease_ms=600, want="all")
    survivor.start()
    try:
        assert survivor.assignment() == {}  # the child's leases are live: nothing is stolen
        child.kill()  # no close(), no release: the leases just stop being renewed
        wait_until(lambda: len(survivor.assignment()) == 4, 20, message="survivor holds all 4 lanes")
        assert {lane: survivor.confirmed(lane) for lane in range(4)} == confirmed
        for lane in range(4):
            assert survivor.is_current(lane)
            survivor.confirm(lane, make_offset(20, 0))
    finally:
        survivor.close()


def _figures(name: str, **figures: object) -> None:
    """The fault tier's one-line summary (visible with ``-s``, and in the captured output of a failure)."""
    print(f"[fault] {name}: " + ", ".join(f"{key}={value}" for key, value in figures.items()), flush=True)


@pytest.mark.fault
def test_sigkilled_subscriber_process_is_replaced_and_its_unconfirmed_records_are_redelivered(
    grid: Grid, unique_name: str, child_args: tuple[str, str], children: list[Child]
) -> None:
    info = open_stream(grid, StreamConfig(unique_name, lanes=2, capacity=100))
    published = [f"r{i}" for i in range(12)]
    with Publisher(grid, info.name, max_batch_records=2) as publisher:  # several items per lane
        publisher.publish_many([Record(v.encode(), lane=i % 2) for i, v in enumerate(published)]).result(30)

    child = Child(SUBSCRIBER_CHILD, *child_args, info.name, "g")
    children.append(child)
    report = json.loads(child.read_line())
    confirmed, unconfirmed = report["confirmed"], report["unconfirmed"]
    child.kill()
    killed_at = time.monotonic()

    lease_ms = 600
    with Subscriber(grid, info.name, group="g", member_id="survivor", lease_ms=lease_ms) as survivor:
        assert survivor.member is not None
        wait_until(lambda: len(survivor.member.assignment()) == 2, 20, message="survivor holds both lanes")
        takeover_s = time.monotonic() - killed_at
        received: list[str] = []
        expected = len(published) - len(confirmed)
        wait_until(
            lambda: received.extend(r.value.decode() for r in survivor.poll(100)) or len(received) >= expected,
            30,
            message=f"{expected} records redelivered",
        )
        assert len(survivor.poll(200)) == 0  # and nothing more
        lost = sorted(set(published) - set(confirmed) - set(received))
        duplicated = len(received) - len(set(received)) + len(set(confirmed) & set(received))
        _figures(
            "sigkill group member",
            lost=len(lost),
            duplicated=duplicated,
            takeover_s=f"{takeover_s:.2f}",
            lease_s=lease_ms / 1000,
            redelivered_unconfirmed=len(set(unconfirmed) & set(received)),
        )
        assert lost == [] and duplicated == 0
        assert takeover_s <= lease_ms / 1000 + 1.0
        # Everything after the confirmed offsets, each once, per lane in publish order; nothing confirmed again.
        assert sorted(received, key=lambda v: int(v[1:])) == [v for v in published if v not in confirmed]
        for lane in (0, 1):
            lane_values = [v for v in received if int(v[1:]) % 2 == lane]
            assert lane_values == sorted(lane_values, key=lambda v: int(v[1:]))
        assert set(unconfirmed) <= set(received)  # read but not confirmed: at least once
        survivor.confirm()
        assert {lane: survivor.member.confirmed(lane) for lane in (0, 1)} == survivor.positions()


@pytest.mark.fault
def test_a_sigstopped_zombie_member_cannot_confirm_after_waking_up(
    grid: Grid, unique_name: str, child_args: tuple[str, str], children: list[Child]
) -> None:
    from meteor_spark.groups.admin import group_state

    info = open_stream(grid, StreamConfig(unique_name, lanes=2, capacity=100))
    published = [f"r{i}" for i in range(16)]
    with Publisher(grid, info.name, max_batch_records=2) as publisher:
        publisher.publish_many([Record(v.encode(), lane=i % 2) for i, v in enumerate(published)]).result(30)
    lease_ms = 1000

    def offsets() -> dict[int, int | None]:
        return {state.lane: state.confirmed for state in group_state(grid, info, "g")}

    zombie = Child(ZOMBIE_CHILD, *child_args, info.name, "g", str(lease_ms))
    children.append(zombie)
    report = json.loads(zombie.read_line())
    os.kill(zombie.process.pid, signal.SIGSTOP)
    stopped_at = time.monotonic()
    samples = [offsets()]

    with Subscriber(grid, info.name, group="g", member_id="survivor", lease_ms=lease_ms) as survivor:
        assert survivor.member is not None
        wait_until(lambda: len(survivor.member.assignment()) == 2, 20, message="survivor holds both lanes")
        takeover_s = time.monotonic() - stopped_at
        received: list[str] = []
        expected = len(published) - len(report["confirmed"])
        wait_until(
            lambda: received.extend(r.value.decode() for r in survivor.poll(100)) or len(received) >= expected,
            30,
            message=f"{expected} records after the zombie's confirmed offsets",
        )
        survivor.confirm()
        after_takeover = offsets()
        samples.append(after_takeover)

        os.kill(zombie.process.pid, signal.SIGCONT)
        zombie.write_line("go")
        deadline = time.monotonic() + 60
        while not zombie.has_line(0.02):  # sample the group's offsets while the zombie tries to confirm
            samples.append(offsets())
            assert time.monotonic() < deadline, "the zombie reported nothing"
        outcomes = json.loads(zombie.read_line())
        samples.append(offsets())
        final = offsets()

    refused = sum(outcome == "fenced" for outcome in outcomes)
    backwards = sum(
        1
        for before, after in itertools.pairwise(samples)
        for lane, was in before.items()
        if was is not None and ((now := after[lane]) is None or now < was)
    )
    lost = sorted(set(published) - set(report["confirmed"]) - set(received))
    _figures(
        "sigstopped zombie",
        confirms_tried=len(outcomes),
        refused=refused,
        accepted=outcomes.count("accepted"),
        offsets_backwards=backwards,
        takeover_s=f"{takeover_s:.2f}",
        lost=len(lost),
        final_offsets=json.dumps(final, sort_keys=True),
    )
    assert outcomes and all(outcome == "fenced" for outcome in outcomes), outcomes
    assert backwards == 0 and final == after_takeover
    assert lost == [] and set(report["delivered"]) <= set(received)
    assert takeover_s <= lease_ms / 1000 + 1.0
