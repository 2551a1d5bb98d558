"""A lane's oldest sequence read while its first records arrive: never past them.

``oldest_in`` answers an empty ring with ``tail + 1``. Read after the empty answer, that tail can already count
records appended in between, and ``tail + 1`` then lies past them: a group member taking up an empty lane at
EARLIEST started there, confirmed that position at once (``GroupMember.initial_offset``), and the lane's first
records were never delivered to anyone. The cluster failover test met it about once in ten runs (its publisher
starts as the group members take their lanes up). Here the race is made certain: the ring's first empty answer to
``read_many(0, 0, 1)`` appends a real record before it returns, on whichever grid the suite runs against.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.grid.client import Grid, ReadBatch, Ring
from meteor_spark.grid.reading import oldest_in, oldest_steps
from meteor_spark.grid.steps import drive
from meteor_spark.grid.streams import StreamConfig, open_stream
from meteor_spark.groups import admin
from meteor_spark.producer.publisher import Publisher
from meteor_spark.testing import wait_until


class ArrivingRing:
    """A ring whose first empty answer to ``read_many(0, 0, 1)`` is followed by ``arrive()`` before it returns:
    records appended between a read that found the ring empty and the caller's next call."""

    def __init__(self, ring: Ring, arrive: Callable[[], object]) -> None:
        self.ring = ring
        self.arrive: Callable[[], object] | None = arrive

    def read_many(self, start: int, min_count: int, max_count: int) -> ReadBatch:
        batch = self.ring.read_many(start, min_count, max_count)
        if self.arrive is not None and (start, min_count, max_count) == (0, 0, 1) and not batch.sequences:
            arrive, self.arrive = self.arrive, None
            arrive()
        return batch

    def tail(self) -> int:
        return self.ring.tail()


@pytest.fixture
def ring(grid: Grid, unique_name: str) -> Iterator[Ring]:
    ring = grid.ring(f"{unique_name}.ring")
    yield ring
    ring.destroy()


def test_oldest_of_an_empty_ring_is_not_past_a_record_appended_meanwhile(ring: Ring) -> None:
    arriving = ArrivingRing(ring, lambda: ring.add(b"first"))
    assert oldest_in(arriving) == 0  # type: ignore[arg-type]  # the wrapper answers what oldest_in asks
    assert ring.tail() == 0


def test_shared_members_oldest_steps_are_not_past_a_record_appended_meanwhile(ring: Ring) -> None:
    arriving = ArrivingRing(ring, lambda: ring.add(b"first"))
    assert drive(oldest_steps(arriving)) == 0
    assert oldest_in(ring) == 0


def test_oldest_of_a_ring_that_stays_empty_is_its_end(ring: Ring) -> None:
    assert oldest_in(ring) == ring.tail() + 1 == 0


def test_a_group_member_taking_an_empty_lane_up_as_its_first_record_arrives_delivers_it(
    grid: Grid, unique_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = StreamConfig(unique_name, lanes=1)
    info = open_stream(grid, config)
    publisher = Publisher(grid, config)
    armed: list[bool] = []
    read_many = Ring.read_many

    def racing_read_many(self: Ring, start: int, min_count: int, max_count: int) -> Any:
        """The lane's first empty take-up read is answered only after the first record was stored."""
        batch = read_many(self, start, min_count, max_count)
        take_up = (start, min_count, max_count) == (0, 0, 1) and self.name == info.ring_names[0]
        if armed and take_up and not batch.sequences:
            armed.clear()
            publisher.publish(b"first")
        return batch

    monkeypatch.setattr(Ring, "read_many", racing_read_many)
    got: list[bytes] = []
    with publisher, Subscriber(grid, unique_name, group="g", member_id="m", initial_offset_scheme="earliest") as sub:
        armed.append(True)
        got.extend(bytes(r.value) for r in sub.poll(0))  # takes the lane up: the record arrives during it
        assert not armed, "the take-up did not meet an empty lane"
        publisher.publish(b"second")

        def both_read() -> bool:
            got.extend(bytes(r.value) for r in sub.poll(100))
            return b"second" in got

        wait_until(both_read, 30, message="the second record delivered")
        sub.confirm()
        confirmed = {state.lane: state.confirmed for state in admin.group_state(grid, info, "g")}
    assert got == [b"first", b"second"], f"delivered {got}; the group's offset is {confirmed}"
    assert confirmed == {0: 2 << 16}
