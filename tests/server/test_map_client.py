"""IMap through the official ``hazelcast.HazelcastClient`` over TCP.

Runs against the ``grid_settings`` grid (the embedded member, or a real Hazelcast 5.x member with
``METEOR_TEST_HAZELCAST``), so every assertion is Hazelcast's documented behaviour.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import hazelcast
import pytest
from hazelcast.errors import IllegalMonitorStateError
from hazelcast.proxy.map import BlockingMap

from meteor_spark.grid.client import GridSettings, wait
from meteor_spark.server.engine.map_types import MapConfig
from meteor_spark.server.member import EmbeddedGrid
from meteor_spark.testing import wait_until

EVENT_TIMEOUT_S = 15.0  # Hazelcast's background expiry may take a few seconds to notice an entry nobody reads


def _result(future: Any, timeout_s: float = 10.0) -> Any:
    assert wait(future, timeout_s), f"no answer within {timeout_s} s"
    return future.result()


def _client(settings: GridSettings) -> Any:
    return hazelcast.HazelcastClient(**settings.client_config())


@pytest.fixture(scope="module")
def client(grid_settings: GridSettings) -> Iterator[Any]:
    c = _client(grid_settings)
    yield c
    c.shutdown()


@pytest.fixture(scope="module")
def other_client(grid_settings: GridSettings) -> Iterator[Any]:
    """A second client: a different lock owner (its own client uuid)."""
    c = _client(grid_settings)
    yield c
    c.shutdown()


@pytest.fixture
def m(client: Any, unique_name: str) -> Iterator[BlockingMap]:
    proxy = client.get_map(unique_name).blocking()
    yield proxy
    proxy.destroy()


def test_put_get_and_cas(m: BlockingMap) -> None:
    assert m.put("k", "v1") is None
    assert m.put("k", "v2") == "v1"
    assert m.get("k") == "v2"
    assert m.get("missing") is None
    assert m.put_if_absent("k", "x") == "v2"
    assert m.put_if_absent("n", "fresh") is None
    assert m.replace("absent", "x") is None and not m.contains_key("absent")
    assert m.replace("k", "v3") == "v2"
    assert m.replace_if_same("k", "wrong", "v4") is False
    assert m.replace_if_same("k", "v3", "v4") is True
    assert m.remove_if_same("k", "v3") is False
    assert m.remove_if_same("k", "v4") is True
    assert m.contains_key("k") is False
    assert m.remove("n") == "fresh"
    assert m.remove("n") is None
    m.set("s", "1")
    assert m.contains_value("1") and not m.contains_value("2")
    m.delete("s")
    assert m.is_empty()


def test_values_compare_by_serialized_bytes(m: BlockingMap) -> None:
    m.put("k", 1)
    assert m.replace_if_same("k", 1.0, 2) is False  # 1 and 1.0 serialize differently
    assert m.replace_if_same("k", 1, 2) is True
    payload = bytearray(b"\x00\xffbinary\x80")
    m.put("b", payload)
    assert m.get("b") == payload
    assert m.remove_if_same("b", bytearray(payload)) is True


def test_bulk_operations(m: BlockingMap) -> None:
    entries = {f"k{i}": f"v{i}" for i in range(50)}
    m.put_all(entries)
    assert m.size() == 50
    assert m.get_all(["k1", "k7", "nope"]) == {"k1": "v1", "k7": "v7"}
    assert sorted(m.key_set()) == sorted(entries)
    assert sorted(m.values()) == sorted(entries.values())
    assert dict(m.entry_set()) == entries
    m.clear()
    assert m.size() == 0 and m.is_empty()


def test_ttl_expires_and_hides_entries(m: BlockingMap) -> None:
    m.put("short", "v", ttl=0.3)
    m.put("long", "v", ttl=300)
    m.put("forever", "v")
    wait_until(lambda: m.get("short") is None, message="the 0.3 s TTL entry to expire")
    assert sorted(m.key_set()) == ["forever", "long"]
    assert m.size() == 2


def test_set_ttl_and_plain_put_resets_ttl(m: BlockingMap) -> None:
    m.put("k", "v", ttl=0.3)
    m.put("k", "v2")  # a write without TTL resets it to the map default: never
    m.put("t", "v")
    m.set_ttl("t", 0.3)
    wait_until(lambda: m.get("t") is None, message="set_ttl to expire the entry")
    assert m.get("k") == "v2"
    m.set_ttl("absent", 10)  # no effect, no error
    assert not m.contains_key("absent")


def test_entry_view(m: BlockingMap) -> None:
    m.put("k", "v")
    first = m.get_entry_view("k")
    m.put("k", "v2")
    m.get("k")
    view = m.get_entry_view("k")
    assert (view.key, view.value) == ("k", "v2")
    assert view.version > first.version
    # Hazelcast 5.x keeps no per-entry statistics unless the map has per-entry-stats-enabled: it reports -1.
    assert (view.hits, view.last_access_time, view.creation_time) == (-1, -1, -1)
    assert m.get_entry_view("absent") is None


@pytest.mark.embedded_only
def test_entry_view_with_per_entry_stats_enabled() -> None:
    with EmbeddedGrid(map_configs=(MapConfig("stats-*", per_entry_stats_enabled=True),)) as member:
        client = hazelcast.HazelcastClient(cluster_members=[member.address], cluster_name=member.cluster_name)
        try:
            stats: BlockingMap[str, str] = client.get_map("stats-on").blocking()
            stats.put("k", "v")
            stats.get("k")
            stats.get("k")
            view = stats.get_entry_view("k")
            assert view.hits == 2
            assert 0 < view.creation_time <= view.last_update_time <= view.last_access_time
            plain: BlockingMap[str, str] = client.get_map("plain").blocking()
            plain.put("k", "v")
            assert plain.get_entry_view("k").hits == -1
        finally:
            client.shutdown()


def test_lock_semantics(m: BlockingMap, other_client: Any) -> None:
    other = other_client.get_map(m.name).blocking()
    m.put("k", "v")
    m.lock("k")
    m.lock("k")  # reentrant
    assert m.is_locked("k") and other.is_locked("k")
    assert other.try_lock("k") is False
    assert other.try_lock("k", timeout=0.05) is False
    with pytest.raises(IllegalMonitorStateError):
        other.unlock("k")
    assert other.get("k") == "v"  # reads never wait
    assert other.try_put("k", "other", timeout=0.05) is False
    assert other.try_remove("k", timeout=0.05) is False
    assert m.put("k", "mine") == "v"  # the owner's writes proceed
    m.unlock("k")
    assert m.is_locked("k")
    m.unlock("k")
    assert not m.is_locked("k")
    with pytest.raises(IllegalMonitorStateError):
        m.unlock("k")
    assert other.try_lock("k") is True
    other.unlock("k")


def test_lock_from_another_thread_of_the_same_client_is_another_owner(m: BlockingMap) -> None:
    m.lock("k")
    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(m.try_lock("k")))
    thread.start()
    thread.join()
    assert result == [False]
    m.unlock("k")


def test_non_owner_write_waits_for_unlock(m: BlockingMap, other_client: Any) -> None:
    other = other_client.get_map(m.name)
    m.put("k", "v")
    m.lock("k")
    pending = other.put("k", "other")
    # Requests of one connection are answered in order: if the put had not waited, it would be done by now.
    assert other.get("k").result() == "v"
    assert not pending.done()
    m.unlock("k")
    assert _result(pending) == "v"
    assert m.get("k") == "other"


def test_try_lock_waits_until_released(m: BlockingMap, other_client: Any) -> None:
    other = other_client.get_map(m.name)
    m.lock("k")
    pending = other.try_lock("k", timeout=30)
    assert other.is_locked("k").result() is True
    assert not pending.done()
    m.unlock("k")
    assert _result(pending) is True
    other.unlock("k").result()


def test_lease_releases_lock(m: BlockingMap, other_client: Any) -> None:
    m.lock("k", lease_time=0.3)
    assert m.is_locked("k")
    assert other_client.get_map(m.name).blocking().try_lock("k", timeout=30) is True
    other_client.get_map(m.name).blocking().unlock("k")


def test_force_unlock(m: BlockingMap, other_client: Any) -> None:
    m.lock("k")
    m.lock("k")
    other_client.get_map(m.name).blocking().force_unlock("k")
    assert not m.is_locked("k")
    m.force_unlock("never-locked")


def test_clear_skips_locked_keys_and_put_all_ignores_locks(m: BlockingMap, other_client: Any) -> None:
    m.put_all({"a": "1", "b": "2"})
    m.lock("b")
    other = other_client.get_map(m.name).blocking()
    other.put_all({"b": "from-put-all"})
    assert m.get("b") == "from-put-all"
    other.clear()
    assert m.key_set() == ["b"]
    m.unlock("b")


def test_locks_are_released_when_the_client_leaves(m: BlockingMap, grid_settings: GridSettings) -> None:
    leaving = _client(grid_settings)
    leaving.get_map(m.name).blocking().lock("k")
    assert m.is_locked("k")
    leaving.shutdown()
    wait_until(lambda: not m.is_locked("k"), timeout_s=EVENT_TIMEOUT_S, message="the departed client's lock to go")


def test_entry_listener_events(m: BlockingMap) -> None:
    events: list[Any] = []
    registration = m.add_entry_listener(
        include_value=True,
        added_func=events.append,
        updated_func=events.append,
        removed_func=events.append,
        evicted_func=events.append,
        clear_all_func=events.append,
    )
    m.put("k", "1")
    m.put("k", "2")
    m.remove("k")
    m.put("e", "x")
    m.evict("e")
    m.put_all({"a": "1", "b": "2"})
    m.clear()
    wait_until(lambda: len(events) >= 8, timeout_s=EVENT_TIMEOUT_S, message="8 entry events")
    # Hazelcast orders events per key (partition), not across keys: "k"'s and "e"'s may interleave, and so may
    # put_all's and clear's with them (a real member under load delivered "e"'s added event before "k"'s updated
    # one, and in another run put_all's before "e"'s).
    assert len(events) == 8
    per_key = {key: [(e.event_type, e.value, e.old_value) for e in events if e.key == key] for key in ("k", "e")}
    assert per_key == {
        "k": [(1, "1", None), (4, "2", "1"), (2, None, "2")],
        "e": [(1, "x", None), (8, None, "x")],
    }
    rest = sorted((e.event_type, e.key or "", e.number_of_affected_entries) for e in events if e.key not in ("k", "e"))
    assert rest == [(1, "a", 1), (1, "b", 1), (64, "", 2)]
    assert all(e.uuid is not None for e in events)  # the member that fired the event
    assert m.remove_entry_listener(registration) is True
    assert m.remove_entry_listener(registration) is False


def test_key_listener_without_values(m: BlockingMap) -> None:
    events: list[Any] = []
    m.add_entry_listener(include_value=False, key="watched", added_func=events.append, updated_func=events.append)
    m.put("other", "1")
    m.put("watched", "1")
    m.put("watched", "2")
    wait_until(lambda: len(events) >= 2, timeout_s=EVENT_TIMEOUT_S, message="2 events on the watched key")
    assert [(e.event_type, e.key, e.value, e.old_value) for e in events] == [
        (1, "watched", None, None),
        (4, "watched", None, None),
    ]


def test_expiry_fires_expired_event(m: BlockingMap) -> None:
    expired: list[Any] = []
    m.add_entry_listener(include_value=True, expired_func=expired.append)
    m.put("k", "v", ttl=0.2)
    wait_until(lambda: m.get("k") is None, message="the entry to expire")
    wait_until(lambda: expired, timeout_s=EVENT_TIMEOUT_S, message="the EXPIRED event")
    assert (expired[0].event_type, expired[0].key, expired[0].old_value) == (16, "k", "v")


def test_negative_and_sub_millisecond_ttls_mean_never_expire(m: BlockingMap) -> None:
    m.put("forever", "v")
    m.put("negative", "v", ttl=-5)
    m.put("tiny", "v", ttl=0.0001)  # rounds to 0 ms on the wire
    m.put("short", "v", ttl=0.3)
    wait_until(lambda: "short" not in m.key_set(), message="the 0.3 s TTL entry to expire")
    assert sorted(m.key_set()) == ["forever", "negative", "tiny"]
    never = m.get_entry_view("forever").ttl
    assert m.get_entry_view("negative").ttl == never and m.get_entry_view("tiny").ttl == never


def test_entry_view_of_an_entry_with_ttl_and_max_idle(m: BlockingMap) -> None:
    m.put("k", "v", ttl=300, max_idle=200)
    view = m.get_entry_view("k")
    assert (view.ttl, view.max_idle) == (300_000, 200_000)
    assert view.last_update_time > 0  # Hazelcast 5.x reports real times for entries with a TTL
    assert view.creation_time <= view.last_update_time < view.expiration_time <= view.last_update_time + 300_000 + 1000


def test_max_idle_expires_entries_nobody_reads(m: BlockingMap) -> None:
    m.put("idle", "v", max_idle=0.3)
    m.put("kept", "v", max_idle=300)
    # key_set is a query: it does not count as an access, so the idle entry is left alone until it expires.
    wait_until(lambda: "idle" not in m.key_set(), message="the entry idle for 0.3 s to expire")
    assert m.get("idle") is None and m.get("kept") == "v"


def test_evict_and_evict_all_skip_locked_keys(m: BlockingMap, other_client: Any) -> None:
    m.put_all({"a": "1", "b": "2", "c": "3"})
    assert m.evict("a") is True
    assert m.evict("a") is False
    m.lock("b")
    other_client.get_map(m.name).blocking().evict_all()
    assert m.key_set() == ["b"]
    m.unlock("b")


def test_lock_on_a_key_that_is_not_in_the_map(m: BlockingMap, other_client: Any) -> None:
    m.lock("ghost")
    assert m.contains_key("ghost") is False
    assert other_client.get_map(m.name).blocking().is_locked("ghost") is True
    m.unlock("ghost")


def test_destroy_drops_the_data(client: Any, unique_name: str) -> None:
    proxy = client.get_map(unique_name).blocking()
    proxy.put("k", "v")
    proxy.destroy()
    assert client.get_map(unique_name).blocking().get("k") is None
