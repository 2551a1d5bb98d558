"""A publisher process SIGKILLed between claiming a message id and writing its record (or between writing it and
marking the claim written): a retry with the same id by another publisher loses nothing and duplicates nothing.

The child stops itself at the exact step (it wraps its own publisher's dedup step and waits on stdin), prints
that it got there, and the test SIGKILLs it: a real process dying at a known point."""

from __future__ import annotations

import time

import pytest

from meteor_spark import Publisher, StreamConfig, Subscriber
from meteor_spark.errors import DuplicateMessageError
from meteor_spark.format.records import Record
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.testing import wait_until
from tests.core.processes import Child

CHILD = """
import sys
from meteor_spark import Grid, Publisher
members, cluster, stream, step = sys.argv[1:5]
grid = Grid.connect(members, cluster_name=cluster)
# a short lease (delivery_timeout_ms + max_block_ms + linger_ms = 1.5 s), so the retry does not wait long
pub = Publisher(grid, stream, delivery_timeout_ms=1000, max_block_ms=500, linger_ms=0)
dedup = pub._dedup
if step == "claim":
    claim_many = dedup.claim_many
    def claimed_then_stop(wanted):
        claims = claim_many(wanted)
        print("claimed", flush=True)
        sys.stdin.readline()  # SIGKILLed here: claimed, never written
        return claims
    dedup.claim_many = claimed_then_stop
else:
    def written_then_stop(claim, offset, error):
        print("written", offset, flush=True)
        sys.stdin.readline()  # SIGKILLed here: written, claim still pending
    dedup.settled = written_then_stop
pub.publish_async(b"from-child", message_id="order-77")
sys.stdin.readline()
"""

WINDOW_MS = 60_000

pytestmark = pytest.mark.fault


def copies(grid: Grid, stream: str, message_id: str) -> list[Record]:
    out: list[Record] = []
    with Subscriber(grid, stream, initial_offset_scheme="earliest") as sub:
        wait_until(lambda: out.extend(sub.poll(timeout_ms=100)) or out, timeout_s=20)
        while batch := sub.poll(timeout_ms=300):
            out.extend(batch)
    return [r for r in out if r.message_id == message_id]


def killed_child(grid_settings: GridSettings, stream: str, step: str, children: list[Child]) -> str:
    child = Child(CHILD, grid_settings.members[0], grid_settings.cluster_name, stream, step)
    children.append(child)
    line = child.read_line(60)
    child.kill()
    return line


@pytest.mark.parametrize("lanes", [1, 3])
def test_a_publisher_killed_after_claiming_leaves_an_id_a_retry_publishes_once(
    grid: Grid, grid_settings: GridSettings, unique_name: str, children: list[Child], lanes: int
) -> None:
    Publisher(grid, StreamConfig(unique_name, lanes=lanes, dedup_window_ms=WINDOW_MS)).close()
    assert killed_child(grid_settings, unique_name, "claim", children).startswith("claimed")
    started = time.monotonic()
    with Publisher(grid, unique_name) as retry:
        offset = retry.publish(b"retry", message_id="order-77")
        took = time.monotonic() - started
        assert retry.metrics()["dedup_takeovers"] == 1
        with pytest.raises(DuplicateMessageError) as refused:
            retry.publish(b"third", message_id="order-77")
        assert refused.value.first_offset == offset
    found = copies(grid, unique_name, "order-77")
    lost, duplicated = (0 if found else 1), max(0, len(found) - 1)
    print(f"\nkilled after claim ({lanes} lanes): lost {lost}, duplicated {duplicated}, retry took {took:.2f} s")
    assert (lost, duplicated) == (0, 0)
    assert [r.value for r in found] == [b"retry"]


def test_a_publisher_killed_after_writing_leaves_a_record_a_retry_finds(
    grid: Grid, grid_settings: GridSettings, unique_name: str, children: list[Child]
) -> None:
    Publisher(grid, StreamConfig(unique_name, lanes=2, dedup_window_ms=WINDOW_MS)).close()
    line = killed_child(grid_settings, unique_name, "write", children)
    assert line.startswith("written")
    child_offset = int(line.split()[1])
    started = time.monotonic()
    with Publisher(grid, unique_name) as retry, pytest.raises(DuplicateMessageError) as refused:
        retry.publish(b"retry", message_id="order-77")
    took = time.monotonic() - started
    assert refused.value.first_offset == child_offset
    assert "found in its lane" in str(refused.value)
    found = copies(grid, unique_name, "order-77")
    lost, duplicated = (0 if found else 1), max(0, len(found) - 1)
    print(f"\nkilled after write: lost {lost}, duplicated {duplicated}, retry refused after {took:.2f} s")
    assert (lost, duplicated) == (0, 0)
    assert [r.value for r in found] == [b"from-child"]
