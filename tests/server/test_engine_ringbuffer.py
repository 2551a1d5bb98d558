"""Ring buffer semantics without sockets (Hazelcast ArrayRingbuffer / RingbufferContainer / ReadManyOperation)."""

from __future__ import annotations

import re

import pytest

from meteor_spark.server.engine import Engine, ManualClock
from meteor_spark.server.engine.configs import match_pattern
from meteor_spark.server.engine.ringbuffer import (
    FAIL,
    OVERWRITE,
    WOULD_BLOCK,
    ReadManyState,
    Ringbuffer,
    RingConfig,
    RingConfigs,
    check_read_many_arguments,
)
from meteor_spark.server.errors import IllegalArgument, InvalidConfiguration, StaleSequence


def ring(capacity: int = 10, ttl_s: int = 0, clock: ManualClock | None = None) -> Ringbuffer:
    clock = clock or ManualClock()
    return Ringbuffer("r", RingConfig("r", capacity=capacity, ttl_s=ttl_s), clock.monotonic_ms)


def read(r: Ringbuffer, start: int, min_count: int, max_count: int) -> ReadManyState:
    state = ReadManyState(start, min_count, max_count)
    r.read_many(state)
    return state


def test_empty_ring_sequences() -> None:
    r = ring()
    assert (r.head_sequence(), r.tail_sequence(), r.size(), r.capacity) == (0, -1, 0, 10)


def test_add_returns_increasing_sequences_and_overwrites_the_oldest() -> None:
    r = ring(capacity=3)
    assert [r.add(bytes([i])) for i in range(5)] == [0, 1, 2, 3, 4]
    assert (r.head_sequence(), r.tail_sequence(), r.size()) == (2, 4, 3)
    assert r.read_one(2) == b"\x02"


def test_add_all_returns_the_last_sequence_and_tail_for_an_empty_list() -> None:
    r = ring()
    assert r.add_all([b"a", b"b", b"c"]) == 2
    assert r.add_all([]) == 2


def test_fail_policy_never_fails_without_ttl() -> None:
    r = ring(capacity=2)
    assert [r.add(b"x", FAIL) for _ in range(4)] == [0, 1, 2, 3]
    assert r.add_all([b"y"] * 2, FAIL) == 5
    assert r.remaining_capacity() == 2
    # Hazelcast compares the batch with remainingCapacity(), which is the capacity without TTL.
    assert r.add_all([b"z"] * 3, FAIL) == -1


def test_fail_policy_with_ttl_refuses_when_full_until_items_expire() -> None:
    clock = ManualClock()
    r = ring(capacity=2, ttl_s=10, clock=clock)
    assert r.add(b"a", FAIL) == 0
    assert r.add(b"b", FAIL) == 1
    assert r.remaining_capacity() == 0
    assert r.add(b"c", FAIL) == -1
    assert r.add_all([b"c"], FAIL) == -1
    assert r.tail_sequence() == 1, "a refused write changes nothing"
    clock.advance(10_000)
    assert r.remaining_capacity() == 2
    assert r.add_all([b"c", b"d"], FAIL) == 3


def test_overwrite_policy_with_ttl_overwrites_when_full() -> None:
    r = ring(capacity=2, ttl_s=10)
    assert [r.add(b"x", OVERWRITE) for _ in range(3)] == [0, 1, 2]
    assert r.head_sequence() == 1


def test_ttl_expires_items_from_the_head() -> None:
    clock = ManualClock()
    r = ring(capacity=10, ttl_s=5, clock=clock)
    r.add(b"a")
    clock.advance(3000)
    r.add(b"b")
    clock.advance(2000)
    assert (r.head_sequence(), r.tail_sequence(), r.size()) == (1, 1, 1)
    clock.advance(3000)
    assert (r.head_sequence(), r.tail_sequence(), r.size()) == (2, 1, 0)
    with pytest.raises(StaleSequence):
        r.read_one(1)
    assert r.add(b"c") == 2


def test_read_one_errors_and_blocking() -> None:
    r = ring(capacity=2)
    for item in (b"a", b"b", b"c"):
        r.add(item)
    assert r.read_one(3) is WOULD_BLOCK
    with pytest.raises(IllegalArgument, match=re.escape("sequence:4 is too large. The current tailSequence is:2")):
        r.read_one(4)
    with pytest.raises(
        StaleSequence,
        match=re.escape(
            "sequence:0 is too small and data store is disabled. The current headSequence is:1 tailSequence is:2"
        ),
    ):
        r.read_one(0)


def test_read_many_clamps_below_head_and_reads_up_to_max() -> None:
    r = ring(capacity=2)
    for i in range(5):
        r.add(bytes([i]))
    state = read(r, 0, 1, 10)
    assert state.done
    assert (state.items, state.sequences, state.next_sequence) == ([b"\x03", b"\x04"], [3, 4], 5)


def test_read_many_min_zero_with_nothing_returns_next_sequence_zero() -> None:
    r = ring()
    r.add(b"a")
    state = read(r, 10, 0, 10)
    assert state.done and state.items == [] and state.next_sequence == 0


def test_read_many_waits_for_min_count_and_keeps_what_it_collected() -> None:
    r = ring()
    r.add(b"a")
    state = ReadManyState(0, 3, 10)
    assert not r.read_many(state)
    assert state.items == [b"a"]
    r.add(b"b")
    assert not r.read_many(state)
    r.add_all([b"c", b"d"])
    assert r.read_many(state)
    assert (state.items, state.sequences, state.next_sequence, state.read_count) == (
        [b"a", b"b", b"c", b"d"],
        [0, 1, 2, 3],
        4,
        4,
    )


def test_read_many_above_tail_clamps_to_tail_plus_one_and_waits() -> None:
    r = ring()
    r.add(b"a")
    state = ReadManyState(50, 1, 10)
    assert not r.read_many(state)
    assert state.sequence == 1
    r.add(b"b")
    assert r.read_many(state) and state.items == [b"b"] and state.sequences == [1]


def test_read_many_wraps_around_the_array() -> None:
    r = ring(capacity=4)
    for i in range(6):
        r.add(bytes([i]))
    state = read(r, 2, 1, 4)
    assert state.items == [b"\x02", b"\x03", b"\x04", b"\x05"]


@pytest.mark.parametrize(
    "args,message",
    [
        ((-1, 0, 1), "startSequence -1"),
        ((0, -1, 1), "minCount"),
        ((0, 5, 4), "maxCount should be"),
        ((0, 0, 1001), "larger than 1000"),
    ],
)
def test_read_many_argument_checks(args: tuple[int, int, int], message: str) -> None:
    with pytest.raises(IllegalArgument, match=message):
        check_read_many_arguments(*args)


def test_unknown_overflow_policy() -> None:
    with pytest.raises(IllegalArgument, match="overflowPolicy 7"):
        ring().add(b"a", 7)


def test_every_mutation_notifies_the_ring_waiters() -> None:
    engine = Engine(clock=ManualClock())
    woken: list[str] = []
    engine.waiters.register(("ring", "r"), lambda: woken.append("add"))
    engine.rings.get("r").add(b"x")
    engine.waiters.register(("ring", "r"), lambda: woken.append("add_all"))
    engine.rings.get("r").add_all([b"y"])
    engine.waiters.register(("ring", "r"), lambda: woken.append("destroy"))
    engine.rings.destroy("r")
    assert woken == ["add", "add_all", "destroy"]


def test_destroy_recreates_an_empty_ring() -> None:
    engine = Engine(clock=ManualClock())
    engine.rings.get("r").add(b"x")
    engine.proxies.create("hz:impl:ringbufferService", "r")
    assert engine.proxies.destroy("hz:impl:ringbufferService", "r")
    assert engine.rings.get("r").tail_sequence() == -1


def test_config_patterns_follow_hazelcast_matching() -> None:
    assert (
        match_pattern(["meteor.stream::*", "meteor.stream::orders.*"], "meteor.stream::orders.0")
        == "meteor.stream::orders.*"
    )
    assert match_pattern(["a*", "ab"], "ab") == "ab"
    assert match_pattern(["*.x"], "y.x") == "*.x"
    assert match_pattern(["a*"], "b") is None
    assert match_pattern(["exact"], "exact@partition-key") == "exact"
    with pytest.raises(InvalidConfiguration, match="duplicate"):
        match_pattern(["ab*", "*yz"], "abyz")


def test_ring_configs_apply_to_new_rings_and_conflicts_are_refused() -> None:
    engine = Engine(clock=ManualClock(), ring_configs=[RingConfig("meteor.stream::o.*", capacity=3, ttl_s=7)])
    r = engine.rings.get("meteor.stream::o.0")
    assert (r.capacity, r.ttl_ms) == (3, 7000)
    assert engine.rings.get("other").capacity == 10_000
    configs = engine.rings.configs
    assert configs.add(RingConfig("meteor.stream::o.*", capacity=3, ttl_s=7)) is False
    with pytest.raises(InvalidConfiguration, match="as there is already a conflicting configuration"):
        configs.add(RingConfig("meteor.stream::o.*", capacity=4, ttl_s=7))


def test_invalid_configs_name_the_problem() -> None:
    with pytest.raises(InvalidConfiguration, match="capacity must be >= 1, got 0"):
        RingConfig("x", capacity=0)
    with pytest.raises(InvalidConfiguration, match="inMemoryFormat"):
        RingConfig("x", in_memory_format="NATIVE")
    with pytest.raises(InvalidConfiguration, match="more than one"):
        RingConfig("a*b*")
    assert RingConfigs().find("anything").capacity == 10_000


class MemoryStore:
    """A RingStore for the seam: keeps everything, like a data directory would."""

    def __init__(self, tail: int = -1, items: list[bytes] | None = None) -> None:
        self.items: dict[int, bytes] = {}
        self.recovered = (tail, items or [])
        self.destroyed = False

    def append(self, sequence: int, item: bytes) -> None:
        self.items[sequence] = item

    async def commit(self) -> None:
        return None

    def load(self, sequence: int) -> bytes | None:
        return self.items.get(sequence)

    def next_stored(self, sequence: int, below: int) -> int | None:
        return min((s for s in self.items if sequence <= s < below), default=None)

    def recover(self, capacity: int) -> tuple[int, list[bytes]]:
        return self.recovered

    def destroy(self) -> None:
        self.destroyed = True


def test_store_sees_every_item_and_serves_reads_below_head() -> None:
    store = MemoryStore()
    r = Ringbuffer("r", RingConfig("r", capacity=2), ManualClock().monotonic_ms, store=store)
    for i in range(5):
        r.add(bytes([i]))
    assert sorted(store.items) == [0, 1, 2, 3, 4]
    assert r.read_one(0) == b"\x00"
    state = read(r, 1, 1, 10)
    assert state.sequences == [1, 2, 3, 4] and state.next_sequence == 5


def test_store_recovery_restores_head_and_tail() -> None:
    store = MemoryStore(tail=9, items=[b"8", b"9"])
    r = Ringbuffer("r", RingConfig("r", capacity=5), ManualClock().monotonic_ms, store=store)
    assert (r.head_sequence(), r.tail_sequence()) == (8, 9)
    assert r.read_one(9) == b"9"
    assert r.add(b"10") == 10


@pytest.mark.parametrize("capacity", [1, 3, 5])
def test_add_all_leaves_the_ring_as_adding_each_item_does(capacity: int) -> None:
    # add_all of a ring without TTL or store places a call's items with list operations: growing, reaching the
    # capacity within a call, overwriting across the end of the slots, and calls longer than the capacity.
    batched, single = ring(capacity), ring(capacity)
    produced = 0
    for size in [0, 1, 2, 4, 1, 7, 3, 5, 2, 6, 1, 3, 0, 4]:
        items = [f"item{produced + index}".encode() for index in range(size)]
        produced += size
        expected = single.tail
        for item in items:
            expected = single.add(item)
        assert batched.add_all(items) == expected
        assert (batched.head, batched.tail, batched.size()) == (single.head, single.tail, single.size())
        for sequence in range(single.head, single.tail + 1):
            assert batched.read_one(sequence) == single.read_one(sequence)
        state = ReadManyState(batched.head, 0, capacity)
        batched.read_many(state)
        assert state.items == [single.read_one(sequence) for sequence in range(single.head, single.tail + 1)]
