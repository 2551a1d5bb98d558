"""The member process's event loop (``--event-loop``): uvloop when installed, asyncio's own on request, and a clear
error for a choice that cannot run."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from meteor_spark.grid.client import Grid, GridSettings, Ring
from meteor_spark.server.event_loop import EVENT_LOOPS, loop_factory, loop_name, uvloop_available
from meteor_spark.server.member import READY_LINE

pytestmark = pytest.mark.embedded_only


def test_asyncio_is_asyncio_and_auto_takes_uvloop_when_installed() -> None:
    loop = loop_factory("asyncio")()
    try:
        assert loop_name(loop) == "asyncio"
    finally:
        loop.close()
    loop = loop_factory("auto")()
    try:
        assert loop_name(loop) == ("uvloop" if uvloop_available() else "asyncio")
    finally:
        loop.close()
    assert EVENT_LOOPS == ("auto", "asyncio", "uvloop")


def test_an_unknown_choice_names_the_option_and_the_choices() -> None:
    with pytest.raises(ValueError, match=r"--event-loop 'tokio': not one of auto, asyncio, uvloop"):
        loop_factory("tokio")


@pytest.mark.parametrize("choice", ["asyncio", "uvloop"])
def test_a_member_process_serves_rings_and_maps_on_either_loop(choice: str) -> None:
    if choice == "uvloop" and not uvloop_available():
        pytest.skip("uvloop is not installed (the 'member' extra)")
    argv = [sys.executable, "-m", "meteor_spark.server", "--port", "0", "--event-loop", choice, "--exit-with-parent"]
    member = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert member.stdout is not None
        ready = READY_LINE.match(member.stdout.readline().decode().strip())
        assert ready is not None, "the member printed no ready line"
        with Grid(GridSettings(members=(ready["address"],), cluster_name=ready["cluster"])) as grid:
            ring = grid.ring("event-loop")
            future = ring.read_many_async(0, 1, 10)  # parked until the add below
            assert ring.add(b"x" * 100_000) == 0
            assert [bytes(item) for item in Ring.to_batch(future.result()).items] == [b"x" * 100_000]
            grid.map("event-loop").put("k", "v")
            assert grid.map("event-loop").get("k") == "v"
    finally:
        member.terminate()
        _, err = member.communicate(timeout=30)
    assert member.returncode == 0
    assert f"event loop: {choice}" in err.decode()


def test_uvloop_when_missing_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # an import of it raises ImportError
    with pytest.raises(ValueError, match=r"--event-loop uvloop: uvloop cannot be imported .*meteor-spark\[member\]"):
        loop_factory("uvloop")
    assert loop_factory("asyncio") is asyncio.new_event_loop
