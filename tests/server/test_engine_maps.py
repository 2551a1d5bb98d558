"""The map engine without sockets: Hazelcast IMap semantics driven by a ManualClock."""

from __future__ import annotations

import uuid

import pytest

from meteor_spark.server.engine import ManualClock, Waiters
from meteor_spark.server.engine.map_types import (
    LONG_MAX,
    EntryEvent,
    EntryEventType,
    LockOwner,
    MapConfig,
    MapConfigs,
    WouldBlock,
)
from meteor_spark.server.engine.maps import Maps
from meteor_spark.server.errors import IllegalMonitorState, InvalidConfiguration

ALICE = LockOwner(uuid.UUID(int=1), 7)
ALICE_OTHER_THREAD = LockOwner(uuid.UUID(int=1), 8)
BOB = LockOwner(uuid.UUID(int=2), 7)
ALL_EVENTS = (1 << 10) - 1


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def waiters() -> Waiters:
    return Waiters()


@pytest.fixture
def maps(clock: ManualClock, waiters: Waiters) -> Maps:
    return Maps(
        clock,
        waiters,
        MapConfigs((MapConfig("ttl-*", time_to_live_seconds=10), MapConfig("m", per_entry_stats_enabled=True))),
    )


@pytest.fixture
def events(maps: Maps) -> list[EntryEvent]:
    seen: list[EntryEvent] = []
    maps.add_listener("m", seen.append, flags=ALL_EVENTS)
    return seen


def test_put_get_return_previous_values(maps: Maps) -> None:
    assert maps.put("m", b"k", b"v1", ALICE) is None
    assert maps.put("m", b"k", b"v2", ALICE) == b"v1"
    assert maps.get("m", b"k") == b"v2"
    assert maps.get("m", b"missing") is None
    assert maps.get("other", b"k") is None


def test_cas_operations(maps: Maps) -> None:
    assert maps.put_if_absent("m", b"k", b"a", ALICE) is None
    assert maps.put_if_absent("m", b"k", b"b", ALICE) == b"a"
    assert maps.get("m", b"k") == b"a"
    assert maps.replace_if_same("m", b"k", b"wrong", b"c", ALICE) is False
    assert maps.replace_if_same("m", b"k", b"a", b"c", ALICE) is True
    assert maps.get("m", b"k") == b"c"
    assert maps.replace_if_same("m", b"absent", b"c", b"d", ALICE) is False
    assert maps.replace("m", b"absent", b"x", ALICE) is None
    assert maps.contains_key("m", b"absent") is False
    assert maps.replace("m", b"k", b"d", ALICE) == b"c"
    assert maps.remove_if_same("m", b"k", b"c", ALICE) is False
    assert maps.remove_if_same("m", b"k", b"d", ALICE) is True
    assert maps.contains_key("m", b"k") is False
    assert maps.remove("m", b"k", ALICE) is None


def test_bulk_and_views(maps: Maps) -> None:
    maps.put_all("m", [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")])
    assert maps.size("m") == 3
    assert not maps.is_empty("m")
    assert sorted(maps.key_set("m")) == [b"a", b"b", b"c"]
    assert sorted(maps.values("m")) == [b"1", b"2", b"3"]
    assert sorted(maps.entry_set("m")) == [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")]
    assert sorted(maps.get_all("m", [b"a", b"c", b"zz", b"a"])) == [(b"a", b"1"), (b"c", b"3")]
    assert maps.contains_value("m", b"2") and not maps.contains_value("m", b"9")
    maps.delete("m", b"a", ALICE)
    assert maps.size("m") == 2
    assert maps.clear("m") == 2
    assert maps.is_empty("m")


def test_ttl_rules(maps: Maps, clock: ManualClock, events: list[EntryEvent]) -> None:
    maps.put("m", b"k", b"v", ALICE, ttl_ms=1000)
    clock.advance(999)
    assert maps.get("m", b"k") == b"v"
    clock.advance(1)
    assert maps.get("m", b"k") is None
    assert maps.size("m") == 0
    assert events[-1] == EntryEvent("m", EntryEventType.EXPIRED, b"k", None, b"v")

    # A plain put resets the TTL to the map default (forever here).
    maps.put("m", b"k", b"v", ALICE, ttl_ms=1000)
    maps.put("m", b"k", b"v2", ALICE)
    clock.advance(5000)
    assert maps.get("m", b"k") == b"v2"

    # Negative TTL = map config default (10 s for "ttl-*"), 0 = forever even there.
    maps.put("ttl-x", b"k", b"v", ALICE, ttl_ms=-1)
    maps.put("ttl-x", b"forever", b"v", ALICE, ttl_ms=0)
    clock.advance(10_000)
    assert maps.get("ttl-x", b"k") is None
    assert maps.get("ttl-x", b"forever") == b"v"


def test_set_ttl_restarts_from_now(maps: Maps, clock: ManualClock) -> None:
    assert maps.set_ttl("m", b"absent", 100, ALICE) is False
    maps.put("m", b"k", b"v", ALICE, ttl_ms=1000)
    clock.advance(900)
    assert maps.set_ttl("m", b"k", 1000, ALICE) is True
    clock.advance(900)
    assert maps.get("m", b"k") == b"v"
    clock.advance(100)
    assert maps.get("m", b"k") is None
    assert maps.set_ttl("m", b"k", 1000, ALICE) is False
    maps.put("m", b"k2", b"v", ALICE, ttl_ms=10)
    assert maps.set_ttl("m", b"k2", 0, ALICE) is True
    clock.advance(10_000)
    assert maps.get("m", b"k2") == b"v"


def test_max_idle_counts_from_last_access(maps: Maps, clock: ManualClock) -> None:
    maps.put("m", b"k", b"v", ALICE, max_idle_ms=100)
    for _ in range(5):
        clock.advance(90)
        assert maps.get("m", b"k") == b"v"
    clock.advance(100)
    assert maps.contains_key("m", b"k") is False


def test_sweep_fires_expired_for_untouched_entries(maps: Maps, clock: ManualClock, events: list[EntryEvent]) -> None:
    maps.put("m", b"a", b"1", ALICE, ttl_ms=50)
    maps.put("m", b"b", b"2", ALICE)
    clock.advance(60)
    assert maps.sweep() == 1
    assert [e.event_type for e in events] == [EntryEventType.ADDED, EntryEventType.ADDED, EntryEventType.EXPIRED]


def test_entry_view_reports_times_hits_and_versions(maps: Maps, clock: ManualClock) -> None:
    created = clock.now_ms()
    maps.put("m", b"k", b"v", ALICE)
    clock.advance(10)
    maps.put("m", b"k", b"v2", ALICE)
    clock.advance(10)
    maps.get("m", b"k")
    maps.get("m", b"k")
    view = maps.get_entry_view("m", b"k")
    assert view is not None
    assert (view.key, view.value, view.version, view.hits) == (b"k", b"v2", 1, 2)
    assert view.creation_time == created
    assert view.last_update_time == created + 10
    assert view.last_access_time == created + 20
    assert view.expiration_time == LONG_MAX and view.ttl == LONG_MAX
    maps.put("m", b"t", b"v", ALICE, ttl_ms=500)
    view = maps.get_entry_view("m", b"t")
    # the view reports whole seconds, as Hazelcast's records keep them; expiry is still on the millisecond
    assert view is not None and view.ttl == 1000 and view.expiration_time == clock.now_ms() + 500
    assert maps.get_entry_view("m", b"absent") is None


def test_events_for_each_mutation(maps: Maps, events: list[EntryEvent]) -> None:
    maps.put("m", b"k", b"1", ALICE)
    maps.put("m", b"k", b"2", ALICE)
    maps.put_if_absent("m", b"k", b"3", ALICE)  # no event: present
    maps.remove("m", b"k", ALICE)
    maps.put("m", b"k", b"4", ALICE)
    maps.evict("m", b"k", ALICE)
    maps.put_all("m", [(b"a", b"1"), (b"b", b"2")])
    maps.clear("m")
    maps.clear("m")  # nothing to clear: no event
    assert events == [
        EntryEvent("m", EntryEventType.ADDED, b"k", b"1", None),
        EntryEvent("m", EntryEventType.UPDATED, b"k", b"2", b"1"),
        EntryEvent("m", EntryEventType.REMOVED, b"k", None, b"2"),
        EntryEvent("m", EntryEventType.ADDED, b"k", b"4", None),
        EntryEvent("m", EntryEventType.EVICTED, b"k", None, b"4"),
        EntryEvent("m", EntryEventType.ADDED, b"a", b"1", None),
        EntryEvent("m", EntryEventType.ADDED, b"b", b"2", None),
        EntryEvent("m", EntryEventType.CLEAR_ALL, None, None, None, 2),
    ]


def test_listener_filters_by_key_flags_and_include_value(maps: Maps) -> None:
    keyed: list[EntryEvent] = []
    added_only: list[EntryEvent] = []
    maps.add_listener("m", keyed.append, key=b"k", include_value=False, flags=ALL_EVENTS)
    registration = maps.add_listener("m", added_only.append, flags=EntryEventType.ADDED)
    maps.put("m", b"k", b"1", ALICE)
    maps.put("m", b"other", b"1", ALICE)
    maps.put("m", b"k", b"2", ALICE)
    assert keyed == [
        EntryEvent("m", EntryEventType.ADDED, b"k"),
        EntryEvent("m", EntryEventType.UPDATED, b"k"),
    ]
    assert [e.key for e in added_only] == [b"k", b"other"]
    assert maps.remove_listener("m", registration) is True
    assert maps.remove_listener("m", registration) is False
    maps.put("m", b"new", b"1", ALICE)
    assert len(added_only) == 2


def test_removed_listeners_hear_nothing_more(maps: Maps) -> None:
    seen: list[EntryEvent] = []
    registration = maps.add_listener("m", seen.append, flags=ALL_EVENTS)
    assert maps.remove_listener("m", registration) is True
    assert maps.remove_listener("m", registration) is False
    maps.put("m", b"k", b"v", ALICE)
    assert seen == []


def test_lock_ownership_reentrancy_and_reference_ids(maps: Maps) -> None:
    maps.lock("m", b"k", ALICE, -1, reference_id=1)
    maps.lock("m", b"k", ALICE, -1, reference_id=1)  # retry of the same request: not counted
    maps.lock("m", b"k", ALICE, -1, reference_id=2)
    assert maps.is_locked("m", b"k")
    for other in (BOB, ALICE_OTHER_THREAD):  # the owner is (client, thread): another thread of Alice waits too
        with pytest.raises(WouldBlock):
            maps.lock("m", b"k", other, -1, reference_id=1)
    with pytest.raises(IllegalMonitorState, match="not owner of the lock! -> Owner: "):
        maps.unlock("m", b"k", BOB, reference_id=5)
    maps.unlock("m", b"k", ALICE, reference_id=3)
    assert maps.is_locked("m", b"k")
    maps.unlock("m", b"k", ALICE, reference_id=4)
    assert not maps.is_locked("m", b"k")
    with pytest.raises(IllegalMonitorState, match="<not-locked>"):
        maps.unlock("m", b"k", ALICE, reference_id=6)
    assert maps.get("m", b"k") is None  # a lock can exist without an entry


def test_locked_key_blocks_other_owners_mutations_but_not_reads(maps: Maps, waiters: Waiters) -> None:
    maps.put("m", b"k", b"v", ALICE)
    maps.lock("m", b"k", ALICE, -1, reference_id=1)
    for attempt in (
        lambda: maps.put("m", b"k", b"x", BOB),
        lambda: maps.set("m", b"k", b"x", BOB),
        lambda: maps.put_if_absent("m", b"k", b"x", BOB),
        lambda: maps.replace("m", b"k", b"x", BOB),
        lambda: maps.replace_if_same("m", b"k", b"v", b"x", BOB),
        lambda: maps.remove("m", b"k", BOB),
        lambda: maps.remove_if_same("m", b"k", b"v", BOB),
        lambda: maps.delete("m", b"k", BOB),
        lambda: maps.set_ttl("m", b"k", 5, BOB),
        lambda: maps.evict("m", b"k", BOB),
    ):
        with pytest.raises(WouldBlock) as blocked:
            attempt()
        assert blocked.value.wait_key == Maps.wait_key("m", b"k")
        assert blocked.value.retry_at_ms is None
    assert maps.get("m", b"k") == b"v"
    assert maps.contains_key("m", b"k")
    assert maps.put("m", b"k", b"mine", ALICE) == b"v"
    maps.put_all("m", [(b"k", b"from-put-all")])  # putAll ignores locks
    assert maps.get("m", b"k") == b"from-put-all"

    woken: list[str] = []
    waiters.register(Maps.wait_key("m", b"k"), lambda: woken.append("k"))
    maps.unlock("m", b"k", ALICE, reference_id=2)
    assert woken == ["k"]
    assert maps.put("m", b"k", b"bob", BOB) == b"from-put-all"


def test_lease_expiry_releases_lock(maps: Maps, clock: ManualClock) -> None:
    maps.lock("m", b"k", ALICE, 100, reference_id=1)
    with pytest.raises(WouldBlock) as blocked:
        maps.lock("m", b"k", BOB, -1, reference_id=1)
    assert blocked.value.retry_at_ms == clock.monotonic_ms() + 100
    clock.advance(100)
    assert maps.is_locked("m", b"k") is False
    maps.lock("m", b"k", BOB, -1, reference_id=2)
    assert maps.lock_owner("m", b"k") == BOB


def test_force_unlock_and_disconnect_release_locks(maps: Maps, waiters: Waiters) -> None:
    maps.lock("m", b"a", ALICE, -1, reference_id=1)
    maps.lock("m", b"a", ALICE, -1, reference_id=2)
    maps.force_unlock("m", b"a")
    assert not maps.is_locked("m", b"a")
    maps.force_unlock("m", b"never-locked")  # never fails
    maps.lock("m", b"a", ALICE, -1, reference_id=3)
    maps.lock("n", b"b", ALICE_OTHER_THREAD, -1, reference_id=1)
    maps.lock("n", b"c", BOB, -1, reference_id=1)
    woken: list[bool] = []
    waiters.register(Maps.wait_key("n", b"b"), lambda: woken.append(True))
    assert maps.client_disconnected(uuid.UUID(int=1)) == 2
    assert woken == [True]
    assert not maps.is_locked("m", b"a") and not maps.is_locked("n", b"b") and maps.is_locked("n", b"c")


def test_clear_and_evict_all_skip_locked_keys(maps: Maps, events: list[EntryEvent]) -> None:
    maps.put_all("m", [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")])
    maps.lock("m", b"b", ALICE, -1, reference_id=1)
    assert maps.evict_all("m") == 2
    assert maps.key_set("m") == [b"b"]
    assert events[-1] == EntryEvent("m", EntryEventType.EVICT_ALL, None, None, None, 2)
    maps.put("m", b"a", b"1", ALICE)
    assert maps.clear("m") == 1
    assert maps.key_set("m") == [b"b"]


def test_destroy_drops_data_and_wakes_lock_waiters(maps: Maps, waiters: Waiters) -> None:
    maps.put("m", b"k", b"v", ALICE)
    maps.lock("m", b"k", ALICE, -1, reference_id=1)
    woken: list[bool] = []
    waiters.register(Maps.wait_key("m", b"k"), lambda: woken.append(True))
    maps.destroy("m")
    assert woken == [True]
    assert maps.get("m", b"k") is None and not maps.is_locked("m", b"k")


def test_config_wildcards() -> None:
    configs = MapConfigs(
        (
            MapConfig("default", time_to_live_seconds=1),
            MapConfig("meteor.*", max_idle_seconds=5),
            MapConfig("meteor.*s", time_to_live_seconds=9),
            MapConfig("meteor.offsets", time_to_live_seconds=3),
        )
    )
    assert configs.find("meteor.offsets").time_to_live_seconds == 3  # an exact name beats every pattern
    assert configs.find("meteor.groups").time_to_live_seconds == 9  # the longer literal part wins
    assert configs.find("meteor.group").max_idle_seconds == 5
    assert configs.find("other").time_to_live_seconds == 1
    assert MapConfigs().find("x") == MapConfig()
    assert configs.add(MapConfig("meteor.*", max_idle_seconds=5)) is False
    with pytest.raises(InvalidConfiguration, match="as there is already a conflicting configuration"):
        configs.add(MapConfig("meteor.*", max_idle_seconds=6))
    with pytest.raises(InvalidConfiguration, match="time_to_live_seconds=-1"):
        MapConfig("x", time_to_live_seconds=-1)
    with pytest.raises(InvalidConfiguration, match="more than one"):
        MapConfig("a*b*")
