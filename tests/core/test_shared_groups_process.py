"""A shared group under a crash: four member processes on a two-lane stream, one SIGKILLed while it holds
records. Every record is acknowledged exactly once (or dead-lettered after max_deliveries), and the killed member's
records are redelivered to the others within the group's lock duration + 1 s: the group was created with a 2 s lock
and the surviving members give none (their own default would be 30 s), so the lock is the group's."""

from __future__ import annotations

import json
import select
import time
from collections import Counter

import pytest

from meteor_spark.consumer.shared_subscriber import SharedSubscriber
from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.format.corrupt import HEADER_DELIVERY_COUNT
from meteor_spark.format.records import Record
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.streams import StreamConfig, open_stream
from meteor_spark.producer.publisher import Publisher
from meteor_spark.testing import wait_until
from tests.core.processes import Child

ACQUISITION_TIMEOUT_MS = 2000
MAX_DELIVERIES = 5  # the shared group's default

# A member: polls, reports every record it processes ("P"), then releases the poison records (every 50th, from r7
# on: they always fail), acknowledges the others and reports the ack ("A") or the refusal ("F"). Work takes 20 ms a
# batch; the member to be killed ("slow") takes 300 ms, so it is killed holding one.
SHARED_CHILD = r"""
import json, sys, time
from meteor_spark.errors import FencedError
from meteor_spark.format.corrupt import HEADER_DELIVERY_COUNT
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.testing import wait_until
address, cluster, stream, dlq, name, timeout_ms = sys.argv[1:7]
grid = Grid(GridSettings(members=(address,), cluster_name=cluster))
member = Subscriber(grid, stream, group="q", shared=True, member_id=name, max_poll_records=5,
                    acquisition_timeout_ms=None if timeout_ms == "-" else int(timeout_ms),
                    dead_letter_stream=None if dlq == "-" else dlq, initial_offset_scheme="earliest")
def say(kind, records):
    print(json.dumps([kind, [[r.value.decode(), r.delivery_count] for r in records]]), flush=True)
while True:
    batch = member.poll(100)
    if not batch:
        continue
    say("P", batch)
    time.sleep(0.3 if name == "slow" else 0.02)  # the work this member does on a batch
    poison = [r for r in batch if int(r.value[1:]) % 50 == 7]  # never processed successfully: nacked each time
    good = [r for r in batch if int(r.value[1:]) % 50 != 7]
    try:
        member.nack(poison)
        member.ack(good)
        say("A", good)
    except FencedError:
        say("F", batch)
"""


@pytest.mark.fault
def test_four_members_one_sigkilled_every_record_acked_once_and_its_records_redelivered_in_time(
    grid: Grid, grid_settings: GridSettings, unique_name: str, children: list[Child]
) -> None:
    total = 2000
    published = [f"r{i}" for i in range(total)]
    info = open_stream(grid, StreamConfig(unique_name, lanes=2, capacity=1000))
    with Publisher(grid, info.name, max_batch_records=4) as publisher:
        publisher.publish_many([Record(v.encode(), lane=i % 2) for i, v in enumerate(published)]).result(30)
    dlq = unique_name + "-dlq"
    names = ["slow", "m1", "m2", "m3"]
    # The group's settings: stored by its first member; the killed one repeats them, the survivors give none.
    with Subscriber(
        grid, info.name, group="q", shared=True, acquisition_timeout_ms=ACQUISITION_TIMEOUT_MS, dead_letter_stream=dlq
    ) as creator:
        assert isinstance(creator, SharedSubscriber)
        assert creator.acquisition_timeout_ms == ACQUISITION_TIMEOUT_MS
    for name in names:
        dlq_arg, timeout_arg = (dlq, str(ACQUISITION_TIMEOUT_MS)) if name == "slow" else ("-", "-")
        children.append(
            Child(
                SHARED_CHILD,
                grid_settings.members[0],
                grid_settings.cluster_name,
                info.name,
                dlq_arg,
                name,
                timeout_arg,
            )
        )
    by_fd: dict[int, tuple[str, Child]] = {}
    for name, child in zip(names, children, strict=True):
        assert child.process.stdout is not None
        by_fd[child.process.stdout.fileno()] = (name, child)
    processed: Counter[str] = Counter()
    acked: Counter[str] = Counter()
    acked_by: Counter[str] = Counter()
    refused: Counter[str] = Counter()
    first_seen_after_kill: dict[str, float] = {}
    killed_at: float | None = None
    held_by_killed: set[str] = set()
    held_at_last_delivery: set[str] = set()
    slow_batches = 0
    deadline = time.monotonic() + 120

    poison = {v for v in published if int(v[1:]) % 50 == 7}
    while sum(acked.values()) < total - len(poison):
        assert time.monotonic() < deadline, f"acked {sum(acked.values())} of {total}"
        fds = [fd for fd, (name, _) in by_fd.items() if name != "slow" or killed_at is None]
        ready, _, _ = select.select(fds, [], [], 0.5)
        for fd in ready:
            name, child = by_fd[fd]
            assert child.process.stdout is not None
            line = child.process.stdout.readline()
            if not line:
                raise AssertionError(f"member {name} ended: {child.process.stderr.read()}")
            kind, records = json.loads(line)
            values = [value for value, _ in records]
            now = time.monotonic()
            if kind == "P":
                processed.update(values)
                if killed_at is not None:
                    for value in set(values) & (held_by_killed | held_at_last_delivery):
                        first_seen_after_kill.setdefault(value, now)
                if name == "slow" and killed_at is None:
                    slow_batches += 1
                    if slow_batches >= 2:  # mid-stream, while it works on this batch (not acknowledged yet)
                        children[0].kill()
                        killed_at = time.monotonic()
                        # A record at its last delivery is dead-lettered when its lock expires, not redelivered.
                        held_by_killed = {value for value, count in records if count < MAX_DELIVERIES}
                        held_at_last_delivery = {value for value, count in records if count >= MAX_DELIVERIES}
            elif kind == "A":
                acked.update(values)
                acked_by[name] += len(values)
            else:
                refused.update(values)

    letters: list[Record] = []
    with Subscriber(grid, dlq, initial_offset_scheme="earliest") as dead:
        wait_until(
            lambda: letters.extend(dead.poll(100)) or len(letters) >= len(poison),
            30,
            message=f"{len(poison)} dead letters",
        )
        letters.extend(dead.poll(200))
    dead_letters = Counter(r.value.decode() for r in letters)
    counts = {dict(r.headers)[HEADER_DELIVERY_COUNT] for r in letters}
    dead_lettered = len(letters)
    assert killed_at is not None
    redelivery_s = max(first_seen_after_kill.values()) - killed_at if first_seen_after_kill else float("inf")
    twice = sum(1 for value, count in processed.items() if count > 1 and value not in poison)
    print(
        f"[fault] shared group, 4 members / 2 lanes, one SIGKILLed: records={total}, acked={sum(acked.values())}, "
        f"acked_twice={sum(1 for c in acked.values() if c > 1)}, processed_twice={twice}, "
        f"refused_acks={sum(refused.values())}, poison={len(poison)}, dead_lettered={dead_lettered}, "
        f"held_by_killed={len(held_by_killed)} (+{len(held_at_last_delivery)} at their last delivery), "
        f"redelivery_s={redelivery_s:.2f} "
        f"acked_by={dict(sorted(acked_by.items()))} "
        f"(group lock {ACQUISITION_TIMEOUT_MS / 1000:g} s; survivors gave none)",
        flush=True,
    )
    # Each record acknowledged exactly once, or (the poison ones) dead-lettered once after max_deliveries (5).
    assert sorted(acked) == sorted(set(published) - poison) and set(acked.values()) == {1}
    assert sorted(dead_letters) == sorted(poison) and set(dead_letters.values()) == {1}
    assert counts == {str(MAX_DELIVERIES).encode()}
    assert all(acked_by[name] > 0 for name in names[1:])  # three live members on two lanes all got work
    assert held_at_last_delivery <= poison
    assert held_by_killed and set(first_seen_after_kill) == held_by_killed  # not those at their last delivery
    assert redelivery_s <= ACQUISITION_TIMEOUT_MS / 1000 + 1.0
