"""The two hand-offs of a round trip built on bare locks: the subscriber's ``Wakeup`` and the client futures'
event (``meteor_spark.compat_ring._LightEvent``); both keep ``threading.Event``'s behaviour, waiters on other
threads included. No grid needed."""

from __future__ import annotations

import threading
import time

import hazelcast.future

import meteor_spark.grid.client  # noqa: F401  (installs the futures' event)
from meteor_spark.compat_ring import _LightEvent
from meteor_spark.consumer.wakeup import Wakeup
from meteor_spark.testing import wait_until


def test_wakeup_behaves_as_an_event() -> None:
    flag = Wakeup()
    assert not flag.is_set()
    started = time.monotonic()
    assert flag.wait(0.05) is False  # times out while clear
    assert time.monotonic() - started >= 0.04
    assert flag.wait(-1) is False  # a negative timeout returns at once
    flag.set()
    flag.set()  # a second set is a no-op, not an error
    assert flag.is_set()
    assert flag.wait(10) and flag.wait(10)  # stays set across waits
    flag.clear()
    flag.clear()
    assert not flag.is_set()


def test_wakeup_wakes_every_waiter_on_other_threads() -> None:
    flag = Wakeup()
    woken: list[bool] = []
    waiters = [threading.Thread(target=lambda: woken.append(flag.wait(30)), daemon=True) for _ in range(3)]
    for waiter in waiters:
        waiter.start()
    flag.set()
    for waiter in waiters:
        waiter.join(30)
    assert woken == [True, True, True]


def test_client_futures_use_the_light_event_and_keep_their_behaviour() -> None:
    future: hazelcast.future.Future[int] = hazelcast.future.Future()
    event = future._event
    assert isinstance(event, _LightEvent)
    seen: list[int] = []
    future.add_done_callback(lambda f: seen.append(f.result()))
    results: list[int] = []
    waiters = [threading.Thread(target=lambda: results.append(future.result()), daemon=True) for _ in range(3)]
    for waiter in waiters:
        waiter.start()
    wait_until(lambda: event._waiter is not None, timeout_s=10, message="a waiter blocked on the future")
    assert not future.done()
    future.set_result(7)
    for waiter in waiters:
        waiter.join(30)
    assert results == [7, 7, 7] and seen == [7]
    future.add_done_callback(lambda f: seen.append(f.result() + 1))  # done already: runs at once
    assert seen == [7, 8]
    failed: hazelcast.future.Future[int] = hazelcast.future.Future()
    failed.set_exception(ValueError("no"))
    assert isinstance(failed.exception(), ValueError) and failed.done() and not failed.is_success()
