"""Differential fidelity: the embedded member against a real Hazelcast 5.7.0 member, the fakeredis way.

One real member (``tests/real_members.py``, started from ``hazelcast/member.xml``) and one embedded member
(``EmbeddedGrid(process=True)``) each get an official-client connection; every scenario below runs the same calls
against both and returns a plain value (tuples, dicts, error class and message), and the two values must be equal.
Scenarios cover every grid operation meteor-spark uses (``meteor_spark/grid/client.py``) and every server error it
relies on (StaleSequence, InvalidConfiguration, DistributedObjectDestroyed, the CP refusal), plus the neighbours a user
reaching the grid directly would hit. A value is normalized only where the real member is legitimately random
(uuids, clock readings); each normalization is written next to the value it touches.

``KNOWN_DIFFERENCES`` (from ``meteor_spark.server.fidelity``, the same list ``docs/supported-protocol.md`` shows)
names every scenario allowed to differ, with the reason; a difference not listed fails, and so does a listed one
that has disappeared. The last test prints ``fidelity: N identical of M compared``.
"""

from __future__ import annotations

import functools
import itertools
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hazelcast.client import HazelcastClient
from hazelcast.proxy.map import BlockingMap
from hazelcast.serialization.api import IdentifiedDataSerializable

from meteor_spark.compat import add_ringbuffer_config_request, invoke
from meteor_spark.server import EmbeddedGrid
from meteor_spark.server.fidelity import CP_UNSAFE_VERSION, KNOWN_DIFFERENCES, MIMICKED_VERSION
from meteor_spark.testing import wait_until
from tests.real_members import HazelcastMember

pytestmark = pytest.mark.real_members

Scenario = Callable[[Any, str], Any]
SCENARIOS: dict[str, Scenario] = {}
UNSAFE_SCENARIOS: dict[str, Scenario] = {}
COMPARED: dict[str, bool] = {}
"""Scenario name -> whether both members answered alike (filled as the tests run, summed by the last test)."""

LONG_MAX = (1 << 63) - 1
DEADLINE_S = 30.0
"""Longest wait for a TTL or a background expiry: Hazelcast's expiry task samples every 5 s."""


def scenario(fn: Scenario) -> Scenario:
    SCENARIOS[fn.__name__.removeprefix("scenario_")] = fn
    return fn


def unsafe_scenario(fn: Scenario) -> Scenario:
    """A CP scenario for the embedded member in ``cp_mode="unsafe"`` against a real Hazelcast 4.x-5.4 member
    (``CP_UNSAFE_VERSION``), whose CP "unsafe mode" that option reproduces."""
    UNSAFE_SCENARIOS[fn.__name__.removeprefix("scenario_")] = fn
    return fn


def error_of(exc: BaseException) -> tuple[Any, ...]:
    """An error as comparable data: the client's class, the server's Java class and message (the client renders
    ``Exception from server: <java class>: <message>\\n <stack trace>``; the stack trace is the member's own code,
    so it is dropped), and the classes of the cause chain."""
    text = str(exc.args[0]) if exc.args else str(exc)
    prefix = "Exception from server: "
    if text.startswith(prefix):
        text = text[len(prefix) :].split("\n \tat ")[0].split("\n ")[0].rstrip()
    # A Java object's default toString ends in its identity hash code, a number that changes every run.
    text = re.sub(r"@[0-9a-f]{1,8} -> ", "@<identity hash> -> ", text)
    causes: list[str] = []
    cause = getattr(exc, "cause", None)
    while cause is not None and len(causes) < 5:
        causes.append(type(cause).__name__)
        cause = getattr(cause, "cause", None)
    return ("error", type(exc).__name__, text, tuple(causes))


def attempt(call: Callable[[], Any]) -> Any:
    """``("ok", value)`` or the error as data."""
    try:
        return ("ok", call())
    except Exception as exc:
        return error_of(exc)


def clock_value(value: int) -> Any:
    """A clock reading (ms since the epoch) as data: -1/0/Long.MAX_VALUE are meaningful and kept; any other value
    is a real member's clock and becomes ``"now"`` when within a minute of this machine's clock (else kept)."""
    if value in (-1, 0, LONG_MAX):
        return value
    return "now" if abs(value - time.time() * 1000) < 600_000 else value


def add_ring_config(client: Any, name: str, capacity: int, ttl_s: int = 0, backups: int = 1) -> Any:
    """The product's own DynamicConfig.addRingbufferConfig request (``Grid.add_ring_config``)."""
    return attempt(lambda: invoke(client, add_ringbuffer_config_request(name, capacity, backups, 0, ttl_s)))


def ring_state(rb: Any) -> dict[str, Any]:
    return {
        "capacity": rb.capacity(),
        "head": rb.head_sequence(),
        "tail": rb.tail_sequence(),
        "size": rb.size(),
        "remaining": rb.remaining_capacity(),
    }


def read_result(rb: Any, start: int, min_count: int, max_count: int, flt: Any = None) -> Any:
    def read() -> Any:
        got = rb.read_many(start, min_count, max_count, flt)
        return (
            list(got),
            [got.get_sequence(i) for i in range(len(got))],
            got.read_count,
            got.next_sequence_to_read_from,
        )

    return attempt(read)


# ---------------------------------------------------------------------------------------------------------- rings


@scenario
def scenario_ring_default_config(c: Any, n: str) -> Any:
    """A ring with no config of its own: Hazelcast's default ring (capacity 10000, no TTL)."""
    rb = c.get_ringbuffer(n).blocking()
    return ring_state(rb)


@scenario
def scenario_ring_add_and_add_all(c: Any, n: str) -> Any:
    rb = c.get_ringbuffer(n).blocking()
    first = rb.add("a")
    last = rb.add_all(["b", "c", "d"])
    empty = attempt(lambda: rb.add_all([]))
    return {"first": first, "last": last, "add_all([])": empty, "state": ring_state(rb)}


@scenario
def scenario_ring_read_many(c: Any, n: str) -> Any:
    """Reads within, across and past the ring's bounds, as the subscriber and the stream tools issue them."""
    rb = c.get_ringbuffer(n).blocking()
    rb.add_all([f"v{i}" for i in range(10)])
    return {
        "all": read_result(rb, 0, 1, 100),
        "middle": read_result(rb, 3, 0, 4),
        "at_tail_plus_1": read_result(rb, 10, 0, 5),
        "past_tail": read_result(rb, 12, 0, 5),
        "negative_start": read_result(rb, -1, 0, 5),
        "min_over_max": read_result(rb, 0, 5, 2),
        "max_1000": read_result(rb, 0, 0, 1000),
    }


@scenario
def scenario_ring_read_many_empty(c: Any, n: str) -> Any:
    rb = c.get_ringbuffer(n).blocking()
    return {"min0": read_result(rb, 0, 0, 10), "state": ring_state(rb)}


@scenario
def scenario_ring_read_many_filter_not_a_function(c: Any, n: str) -> Any:
    """A filter must be a Java IFunction; a string (or a number) reaches the member as a plain value."""
    rb = c.get_ringbuffer(n).blocking()
    rb.add_all(["a", "b"])
    return {
        "string": read_result(rb, 0, 0, 10, "not a function"),
        "int": read_result(rb, 0, 0, 10, 7),
        "float": read_result(rb, 0, 0, 10, 1.5),
        "bool": read_result(rb, 0, 0, 10, True),
        "list": read_result(rb, 0, 0, 10, ["a"]),
        "bytes": read_result(rb, 0, 0, 10, bytearray(b"ab")),
    }


class _UnknownFilter(IdentifiedDataSerializable):
    """A filter of a factory the member does not know: what a Python client can send as a "function"."""

    def get_factory_id(self) -> int:
        return 4242

    def get_class_id(self) -> int:
        return 1

    def write_data(self, output: Any) -> None:
        output.write_int(1)

    def read_data(self, inp: Any) -> None:
        inp.read_int()


@scenario
def scenario_ring_read_many_filter_unknown_class(c: Any, n: str) -> Any:
    rb = c.get_ringbuffer(n).blocking()
    rb.add("a")
    return read_result(rb, 0, 0, 10, _UnknownFilter())


@scenario
def scenario_ring_overwrite_and_stale(c: Any, n: str) -> Any:
    """A small ring overwritten past its capacity: head moves, a read below the head is stale (read_one) or
    clamped to the head (read_many), FAIL is refused only when items still live (TTL)."""
    config = add_ring_config(c, n, capacity=3)
    rb = c.get_ringbuffer(n).blocking()
    seqs = [rb.add(f"v{i}") for i in range(5)]
    return {
        "config": config,
        "seqs": seqs,
        "state": ring_state(rb),
        "read_one_stale": attempt(lambda: rb.read_one(0)),
        "read_one_head": attempt(lambda: rb.read_one(2)),
        "read_one_past": attempt(lambda: rb.read_one(9)),
        "read_many_stale": read_result(rb, 0, 0, 3),  # the client refuses a max count above the capacity
        "fail_policy_no_ttl": attempt(lambda: rb.add("x", 1)),
    }


@scenario
def scenario_ring_ttl_expiry(c: Any, n: str) -> Any:
    """A ring with a 1 s TTL: FAIL refuses while items live, items expire, the head moves past them."""
    config = add_ring_config(c, n, capacity=3, ttl_s=1)
    rb = c.get_ringbuffer(n).blocking()
    added = rb.add_all(["a", "b", "c"], 1)
    refused = rb.add("d", 1)
    full = ring_state(rb)
    wait_until(lambda: rb.size() == 0, timeout_s=DEADLINE_S, message="ring items to expire")
    after = ring_state(rb)
    accepted = rb.add("e", 1)
    return {
        "config": config,
        "added": added,
        "refused": refused,
        "full": full,
        "expired": after,
        "read_expired": read_result(rb, 0, 0, 3),
        "accepted": accepted,
    }


@scenario
def scenario_ring_destroy_while_reading(c: Any, n: str) -> Any:
    rb = c.get_ringbuffer(n)
    rb.add("a").result()
    waiting = rb.read_many(1, 1, 10)
    time.sleep(0.5)  # the read must be parked on the member before the destroy (no state to poll from a client)
    rb.destroy()
    wait_until(waiting.done, timeout_s=DEADLINE_S, message="the parked read to end")
    outcome = attempt(waiting.result)
    again = c.get_ringbuffer(n).blocking()
    return {"parked_read": outcome, "recreated": ring_state(again), "read_recreated": read_result(again, 0, 0, 5)}


@scenario
def scenario_ring_read_many_parks(c: Any, n: str) -> Any:
    """The subscriber's long poll: a read at the tail with a minimum count waits until that many items exist."""
    rb = c.get_ringbuffer(n)
    rb.add("before").result()
    waiting = rb.read_many(1, 2, 10)
    rb.add("one").result()
    time.sleep(0.2)  # nothing to poll: the read must still be parked after one of the two items it waits for
    parked = waiting.done()
    rb.add_all(["two", "three"]).result()
    wait_until(waiting.done, timeout_s=DEADLINE_S, message="the parked read_many to end")
    got = waiting.result()
    return {"parked_after_one": parked, "items": list(got), "next": got.next_sequence_to_read_from}


@scenario
def scenario_ring_read_one_parks(c: Any, n: str) -> Any:
    rb = c.get_ringbuffer(n)
    waiting = rb.read_one(0)
    time.sleep(0.2)  # nothing to poll: the read is parked until an add
    parked = waiting.done()
    rb.add("x").result()
    wait_until(waiting.done, timeout_s=DEADLINE_S, message="the parked read_one to end")
    return {"parked": parked, "value": attempt(waiting.result)}


# ----------------------------------------------------------------------------------------------------------- maps


@scenario
def scenario_map_basic_operations(c: Any, n: str) -> Any:
    m = c.get_map(n).blocking()
    steps: dict[str, Any] = {
        "put_new": m.put("k", "v1"),
        "put_old": m.put("k", "v2"),
        "get": m.get("k"),
        "get_missing": m.get("nope"),
        "put_if_absent_present": m.put_if_absent("k", "x"),
        "put_if_absent_new": m.put_if_absent("k2", "w"),
        "replace_if_same_wrong": m.replace_if_same("k", "v1", "v3"),
        "replace_if_same_right": m.replace_if_same("k", "v2", "v3"),
        "replace_if_same_missing": m.replace_if_same("none", "a", "b"),
        "set": m.set("k3", "z"),
        "get_all": sorted(m.get_all(["k", "k2", "k3", "nope"]).items()),
        "get_all_empty": m.get_all([]),
        "size": m.size(),
        "keys": sorted(m.key_set()),
        "entries": sorted(m.entry_set()),
        "contains": (m.contains_key("k"), m.contains_key("nope")),
        "remove": m.remove("k"),
        "remove_missing": m.remove("k"),
        "remove_if_same_wrong": m.remove_if_same("k2", "nope"),
        "remove_if_same_right": m.remove_if_same("k2", "w"),
        "delete": m.delete("k3"),
        "delete_missing": m.delete("k3"),
        "size_after": m.size(),
    }
    m.put("c", "1")
    m.clear()
    steps["cleared"] = m.size()
    return steps


def entry_view(view: Any) -> Any:
    if view is None:
        return None
    return {
        "key": view.key,
        "value": view.value,
        # the cost is the member's estimate of the entry's heap bytes: its own object layout, not behaviour
        "cost_positive": view.cost > 0,
        "creation_time": clock_value(view.creation_time),
        "expiration_time": clock_value(view.expiration_time),
        "hits": view.hits,
        "last_access_time": clock_value(view.last_access_time),
        "last_stored_time": clock_value(view.last_stored_time),
        "last_update_time": clock_value(view.last_update_time),
        "version": view.version,
        "ttl": view.ttl,
        "max_idle": view.max_idle,
    }


@scenario
def scenario_map_entry_views(c: Any, n: str) -> Any:
    m = c.get_map(n).blocking()
    m.put("plain", "v")
    m.put("plain", "v2")
    m.get("plain")
    m.put("ttl", "v", ttl=100)
    m.set("set_ttl", "v")
    changed = m.set_ttl("set_ttl", 200)
    return {
        "plain": entry_view(m.get_entry_view("plain")),
        "ttl": entry_view(m.get_entry_view("ttl")),
        "set_ttl": (changed, entry_view(m.get_entry_view("set_ttl"))),
        "set_ttl_missing": m.set_ttl("nope", 5),
        "missing": entry_view(m.get_entry_view("nope")),
    }


@scenario
def scenario_map_product_config_entry_view(c: Any, n: str) -> Any:
    """A map under ``meteor.*`` (member.xml's map config, the embedded member's built-in equivalent)."""
    m = c.get_map(f"meteor.{n}").blocking()
    m.put("k", "v")
    m.put_if_absent("t", "v", ttl=50)
    return {"k": entry_view(m.get_entry_view("k")), "t": entry_view(m.get_entry_view("t"))}


@scenario
def scenario_map_ttl_expiry(c: Any, n: str) -> Any:
    m = c.get_map(n).blocking()
    m.put("short", "v", ttl=1)
    m.set("stay", "v")
    present = m.get("short")
    wait_until(lambda: m.get("short") is None, timeout_s=DEADLINE_S, message="the map entry to expire")
    return {"present": present, "after": (m.get("short"), m.size(), sorted(m.key_set()))}


def _listen(m: Any, events: list[Any], include_value: bool) -> str:
    def record(kind: str) -> Callable[[Any], None]:
        return lambda e: events.append((kind, e.key, e.value, e.old_value, e.event_type))

    return m.add_entry_listener(
        include_value=include_value,
        added_func=record("added"),
        updated_func=record("updated"),
        removed_func=record("removed"),
        expired_func=record("expired"),
        evicted_func=record("evicted"),
    )


@scenario
def scenario_map_listeners(c: Any, n: str) -> Any:
    """The product's listener (values off) and one with values, through add/update/remove/delete/expiry."""
    m = c.get_map(n).blocking()
    bare: list[Any] = []
    full: list[Any] = []
    bare_id = _listen(m, bare, include_value=False)
    _listen(m, full, include_value=True)
    expected = 0

    def step(call: Callable[[], Any]) -> None:
        nonlocal expected
        call()
        expected += 1
        wait_until(lambda: len(bare) >= expected and len(full) >= expected, timeout_s=DEADLINE_S)

    step(lambda: m.put("a", "1"))
    step(lambda: m.put("a", "2"))
    step(lambda: m.set("b", "1"))
    step(lambda: m.put_if_absent("c", "1"))
    step(lambda: m.replace_if_same("c", "1", "2"))
    step(lambda: m.remove("a"))
    step(lambda: m.delete("b"))
    step(lambda: m.put("t", "x", ttl=1))
    wait_until(lambda: m.get("t") is None, timeout_s=DEADLINE_S)
    expected += 1
    wait_until(lambda: len(bare) >= expected and len(full) >= expected, timeout_s=DEADLINE_S, message="EXPIRED")
    removed = (m.remove_entry_listener(bare_id), m.remove_entry_listener(bare_id))
    return {"bare": bare, "full": full, "remove_listener": removed}


@scenario
def scenario_map_ttl_variants(c: Any, n: str) -> Any:
    """TTLs as the product passes them (seconds, possibly fractional) and their edge values. Entry views report
    whole seconds. (Sub-second TTLs are left out: when such an entry is gone depends on where in its second the
    real member's clock is.)"""
    m = c.get_map(n).blocking()
    m.put("fraction", "v", ttl=30.25)
    m.put("fraction2", "v", ttl=2.999)
    m.put("zero", "v", ttl=0)
    m.set("set", "v", ttl=3)
    m.put_if_absent("pia", "v", ttl=4)
    m.set("reset", "v", ttl=5)
    m.set_ttl("reset", 0)
    views = {key: m.get_entry_view(key) for key in ("fraction", "fraction2", "zero", "set", "pia", "reset")}
    return {key: None if view is None else view.ttl for key, view in views.items()}


@scenario
def scenario_map_listener_removal(c: Any, n: str) -> Any:
    m = c.get_map(n).blocking()
    registration = m.add_entry_listener(added_func=lambda e: None)
    return (m.remove_entry_listener(registration), m.remove_entry_listener(registration))


# ---------------------------------------------------------------------------------------------------------- topic


@scenario
def scenario_topic(c: Any, n: str) -> Any:
    topic = c.get_topic(n).blocking()
    received: list[Any] = []
    registration = topic.add_listener(received.append)
    for i in range(5):
        topic.publish(f"m{i}")
    topic.publish_all(["x", "y"])
    wait_until(lambda: len(received) >= 7, timeout_s=DEADLINE_S, message="7 topic messages")
    removed = (topic.remove_listener(registration), topic.remove_listener(registration))
    return {
        "messages": [message.message for message in received],
        "from_the_member": [message.member is not None for message in received],
        # the publish time is the member's clock
        "publish_times": sorted({clock_value(int(message.publish_time * 1000)) for message in received}),
        "remove_listener": removed,
    }


# -------------------------------------------------------------------------------------------------- atomics (CP)


@scenario
def scenario_atomic_long(c: Any, n: str) -> Any:
    """The CP subsystem: Hazelcast 5.7 open source refuses it (an Enterprise feature)."""
    proxy = attempt(lambda: c.cp_subsystem.get_atomic_long(n))
    if proxy[0] != "ok":
        return proxy
    counter = proxy[1].blocking()
    return attempt(lambda: (counter.get(), counter.add_and_get(2)))


@unsafe_scenario
def scenario_unsafe_atomic_long_operations(c: Any, n: str) -> Any:
    counter = c.cp_subsystem.get_atomic_long(n).blocking()
    steps = [
        counter.get(),
        counter.increment_and_get(),
        counter.add_and_get(10),
        counter.get_and_add(5),
        counter.get_and_increment(),
        counter.decrement_and_get(),
        counter.get_and_set(100),
        counter.set(7),
        counter.compare_and_set(6, 1),
        counter.compare_and_set(7, 1),
        counter.get(),
        counter.set(LONG_MAX),
        counter.increment_and_get(),
    ]
    alias = c.cp_subsystem.get_atomic_long(f"{n}@default").blocking().get()
    other_group = c.cp_subsystem.get_atomic_long(f"{n}@other").blocking().get()
    return {"steps": steps, "alias": alias, "other_group": other_group}


@unsafe_scenario
def scenario_unsafe_atomic_long_destroyed(c: Any, n: str) -> Any:
    counter = c.cp_subsystem.get_atomic_long(n).blocking()
    counter.set(5)
    counter.destroy()
    return {
        "same_proxy": attempt(counter.get),
        "new_proxy": attempt(lambda: c.cp_subsystem.get_atomic_long(n).blocking().increment_and_get()),
    }


@unsafe_scenario
def scenario_unsafe_atomic_long_function_not_a_function(c: Any, n: str) -> Any:
    counter = c.cp_subsystem.get_atomic_long(n).blocking()
    return {"apply": attempt(lambda: counter.apply("not a function")), "alter": attempt(lambda: counter.alter(7))}


# ------------------------------------------------------------------------------------------------------ flake ids


@scenario
def scenario_flake_ids(c: Any, n: str) -> Any:
    ids = [c.get_flake_id_generator(n).blocking().new_id() for _ in range(3)]
    epoch_ms = 1_514_764_800_000
    return {
        "node_id_bits": [i & 0xFFFF for i in ids],
        "increments": [b - a for a, b in itertools.pairwise(ids)],
        # the timestamp bits are the member's clock
        "timestamp": clock_value((ids[0] >> 22) + epoch_ms),
    }


# ------------------------------------------------------------------------------------------------- dynamic config


@scenario
def scenario_dynamic_ring_config(c: Any, n: str) -> Any:
    first = add_ring_config(c, n, capacity=7, ttl_s=5)
    same = add_ring_config(c, n, capacity=7, ttl_s=5)
    conflicting = add_ring_config(c, n, capacity=8, ttl_s=5)
    wildcard = add_ring_config(c, f"{n}.*", capacity=9)
    rb = c.get_ringbuffer(n).blocking()
    matched = c.get_ringbuffer(f"{n}.x").blocking()
    return {
        "first": first,
        "same": same,
        "conflicting": conflicting,
        "wildcard": wildcard,
        "exact": ring_state(rb),
        "matched": ring_state(matched),
    }


# ---------------------------------------------------------------------------------------------- cluster views


@scenario
def scenario_cluster_view(c: Any, n: str) -> Any:
    c.get_map(n).blocking().put("k", "v")  # a real member assigns its partitions at the first partition operation
    members = c.cluster_service.get_members()
    connection = c._connection_manager.get_random_connection()  # what the member said when the client authenticated
    return {
        "authentication_version": connection.server_version,
        "count": len(members),
        "versions": [(m.version.major, m.version.minor, m.version.patch) for m in members],
        "lite": [m.lite_member for m in members],
        "hosts": [m.address.host for m in members],
        "attributes": [m.attributes for m in members],
        "partition_count": c.partition_service.get_partition_count(),
        # the partition table reaches a client a little after it connects: wait for it rather than race it
        "partition_owner_is_the_member": wait_until(
            lambda: c.partition_service.get_partition_owner(0), timeout_s=DEADLINE_S, message="a partition table"
        )
        == members[0].uuid,
    }


@scenario
def scenario_distributed_objects(c: Any, n: str) -> Any:
    c.get_map(n).blocking().size()
    c.get_ringbuffer(n).blocking().size()
    mine = sorted((o.service_name, o.name) for o in c.get_distributed_objects() if o.name == n)
    c.get_map(n).blocking().destroy()
    after = sorted((o.service_name, o.name) for o in c.get_distributed_objects() if o.name == n)
    return {"created": mine, "after_destroy_map": after}


@scenario
def scenario_wrong_cluster_name(c: Any, n: str) -> Any:
    """A client presenting another cluster name is refused (the client then gives up: IllegalStateError)."""
    address = c._config.cluster_members[0]

    def connect() -> Any:
        other = HazelcastClient(cluster_members=[address], cluster_name="not-" + n, cluster_connect_timeout=2)
        other.shutdown()

    outcome = attempt(connect)
    return outcome[:2]  # the client's message lists the member's address


@scenario
def scenario_credentials_on_an_open_member(c: Any, n: str) -> Any:
    """A client presenting credentials to a member that has no security configured (``hazelcast/member.xml``; an
    embedded member without ``username``)."""
    address = c._config.cluster_members[0]

    def connect(username: str | None, password: str | None) -> Any:
        other = HazelcastClient(
            cluster_members=[address],
            cluster_name=c._config.cluster_name,
            creds_username=username,
            creds_password=password,
            cluster_connect_timeout=2,
        )
        try:
            blocking: BlockingMap[str, str] = other.get_map(n).blocking()
            return blocking.put("k", "v")
        finally:
            other.shutdown()

    cases = {"both": ("someone", "secret"), "username": ("someone", None), "password": (None, "secret")}
    cases["empty"] = ("", "")
    return {case: attempt(functools.partial(connect, *pair)) for case, pair in cases.items()}


# ---------------------------------------------------------------------------------------------------- fixtures


class Members:
    """Official-client connections to the real member and to the embedded member."""

    def __init__(self, real: Any, embedded: Any) -> None:
        self.real = real
        self.embedded = embedded


def _client(address: str, cluster_name: str) -> Any:
    return HazelcastClient(
        cluster_members=[address], cluster_name=cluster_name, cluster_connect_timeout=30, invocation_timeout=60
    )


@pytest.fixture(scope="module")
def members(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Members]:
    """A real 5.7.0 member and the embedded member as it starts by default."""
    workdir: Path = tmp_path_factory.mktemp("fidelity")
    real_member = HazelcastMember(workdir, version=MIMICKED_VERSION, heap="1g")
    with real_member as real, EmbeddedGrid(port=0, process=True) as embedded:
        yield from _clients(real, embedded)


@pytest.fixture(scope="module")
def unsafe_members(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Members]:
    """A real member of the last release line with CP unsafe mode, and the embedded member with ``cp_mode="unsafe"``."""
    workdir: Path = tmp_path_factory.mktemp("fidelity-unsafe")
    with (
        HazelcastMember(workdir, version=CP_UNSAFE_VERSION, heap="512m") as real,
        EmbeddedGrid(port=0, process=True, cp_mode="unsafe") as embedded,
    ):
        yield from _clients(real, embedded)


def _clients(real: HazelcastMember, embedded: EmbeddedGrid) -> Iterator[Members]:
    real_client = _client(real.address, real.cluster_name)
    try:
        embedded_client = _client(embedded.address, embedded.cluster_name)
        try:
            yield Members(real_client, embedded_client)
        finally:
            embedded_client.shutdown()
    finally:
        real_client.shutdown()


def _compare(members: Members, scenarios: dict[str, Scenario], name: str) -> None:
    object_name = f"fidelity-{name}"
    real = scenarios[name](members.real, object_name)
    embedded = scenarios[name](members.embedded, object_name)
    identical = real == embedded
    COMPARED[name] = identical
    if name in KNOWN_DIFFERENCES:
        assert not identical, (
            f"{name} is listed as a known difference ({KNOWN_DIFFERENCES[name]}) but both members now answer "
            f"{real!r}: remove it from meteor_spark/server/fidelity.py and regenerate docs/supported-protocol.md"
        )
    else:
        assert identical, f"{name}: the members differ\n  hazelcast: {real!r}\n  embedded:  {embedded!r}"


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_embedded_member_answers_like_hazelcast(members: Members, name: str) -> None:
    _compare(members, SCENARIOS, name)


@pytest.mark.parametrize("name", sorted(UNSAFE_SCENARIOS))
def test_cp_unsafe_mode_answers_like_hazelcast_before_5_5(unsafe_members: Members, name: str) -> None:
    _compare(unsafe_members, UNSAFE_SCENARIOS, name)


def test_known_differences_name_existing_scenarios() -> None:
    assert not set(SCENARIOS) & set(UNSAFE_SCENARIOS)
    assert set(KNOWN_DIFFERENCES) <= set(SCENARIOS) | set(UNSAFE_SCENARIOS), set(KNOWN_DIFFERENCES) - set(SCENARIOS)


def test_zz_fidelity_summary(capsys: pytest.CaptureFixture[str]) -> None:
    """Runs last in this file: the tally of what the scenario tests compared."""
    identical = sum(COMPARED.values())
    with capsys.disabled():
        print(f"\nfidelity: {identical} identical of {len(COMPARED)} compared")
    assert identical + len(set(COMPARED) & set(KNOWN_DIFFERENCES)) == len(COMPARED)
