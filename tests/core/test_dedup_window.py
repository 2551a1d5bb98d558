"""Message-id deduplication windows (``StreamConfig(dedup_window_ms=...)``): a repeated id is refused within the
window, naming the first copy's offset, whichever publisher or process sent it; accepted after the window and on
another stream; records without an id are not checked."""

from __future__ import annotations

import json
import time

import pytest

from meteor_spark import Publisher, StreamConfig, Subscriber
from meteor_spark.errors import DuplicateMessageError, MeteorError
from meteor_spark.format.records import Record
from meteor_spark.grid import transactions
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.producer.dedup import PENDING, WRITTEN, dedup_map_name
from meteor_spark.testing import wait_until
from tests.core.processes import Child

WINDOW_MS = 60_000


def read_all(grid: Grid, stream: str, count: int) -> list[Record]:
    out: list[Record] = []
    with Subscriber(grid, stream, initial_offset_scheme="earliest") as sub:
        wait_until(lambda: out.extend(sub.poll(timeout_ms=100)) or len(out) >= count, timeout_s=20)
        assert not sub.poll(timeout_ms=200)
    return out


def test_a_repeated_id_is_refused_naming_the_first_offset(grid: Grid, unique_name: str) -> None:
    with Publisher(grid, StreamConfig(unique_name, lanes=3, dedup_window_ms=WINDOW_MS)) as pub:
        first = pub.publish(b"a", message_id="order-1")
        with pytest.raises(DuplicateMessageError) as refused:
            pub.publish(Record(b"again", key=b"other-key"), message_id="order-1")
        assert (refused.value.message_id, refused.value.stream, refused.value.first_offset) == (
            "order-1",
            unique_name,
            first,
        )
        assert "'order-1'" in str(refused.value) and f"offset {first}" in str(refused.value)
        pub.publish(b"no id")
        pub.publish(b"no id")  # records without an id are never checked
        pub.publish(b"b", message_id="order-2")
        assert pub.metrics()["duplicates_refused"] == 1
    assert [r.value for r in read_all(grid, unique_name, 4)].count(b"again") == 0


def test_publish_many_claims_all_ids_and_refuses_a_repeat_inside_the_call(grid: Grid, unique_name: str) -> None:
    with Publisher(grid, StreamConfig(unique_name, lanes=2, dedup_window_ms=WINDOW_MS)) as pub:
        offsets = pub.publish_many([Record(b"%d" % i, message_id=f"m{i}") for i in range(20)] + [b"plain"]).result(10)
        with pytest.raises(DuplicateMessageError, match=r"appears twice .* \(records 0 and 2"):
            pub.publish_many([Record(b"x", message_id="n1"), Record(b"y"), Record(b"z", message_id="n1")])
        with pytest.raises(DuplicateMessageError) as refused:
            pub.publish_many([Record(b"new", message_id="n2"), Record(b"old", message_id="m7")])
        assert refused.value.first_offset == offsets[7]
        # all or nothing: the call's own claims were given back, so its new id is free
        pub.publish(b"n1", message_id="n1")
        pub.publish(b"n2", message_id="n2")
    assert len(read_all(grid, unique_name, 23)) == 23


def test_another_stream_accepts_the_id(grid: Grid, unique_name: str) -> None:
    with (
        Publisher(grid, StreamConfig(unique_name, dedup_window_ms=WINDOW_MS)) as one,
        Publisher(grid, StreamConfig(unique_name + "-b", dedup_window_ms=WINDOW_MS)) as two,
    ):
        one.publish(b"x", message_id="shared-id")
        two.publish(b"x", message_id="shared-id")
        with pytest.raises(DuplicateMessageError):
            two.publish(b"x", message_id="shared-id")


def test_the_id_is_accepted_again_after_the_window_and_its_entry_is_gone(grid: Grid, unique_name: str) -> None:
    window_ms = 1500
    claims = grid.map(dedup_map_name(unique_name))
    with Publisher(grid, StreamConfig(unique_name, dedup_window_ms=window_ms)) as pub:
        pub.publish(b"1", message_id="ttl-id")
        with pytest.raises(DuplicateMessageError):
            pub.publish(b"2", message_id="ttl-id")
        wait_until(lambda: claims.get("ttl-id") is None, timeout_s=20, interval_s=0.1)
        pub.publish(b"3", message_id="ttl-id")
        wait_until(lambda: '"written"' in (claims.get("ttl-id") or ""), timeout_s=10)
        with pytest.raises(DuplicateMessageError):
            pub.publish(b"4", message_id="ttl-id")
    # the map holds the ids of one window at most: the entry written after the update expires too (a real member
    # removes expired entries in a background task every few seconds: slower under load)
    wait_until(lambda: claims.get("ttl-id") is None, timeout_s=20, interval_s=0.1)
    wait_until(lambda: claims.size() == 0, timeout_s=90, interval_s=0.2)
    assert [r.value for r in read_all(grid, unique_name, 2)] == [b"1", b"3"]


CHILD = """
import sys
from meteor_spark import Grid, Publisher
members, cluster, stream = sys.argv[1:4]
with Grid.connect(members, cluster_name=cluster) as grid, Publisher(grid, stream) as pub:
    print(pub.publish(b"from-child", message_id="cross-process"), flush=True)
"""


def test_a_second_process_is_refused_naming_the_first_process_offset(
    grid: Grid, grid_settings: GridSettings, unique_name: str, children: list[Child]
) -> None:
    Publisher(grid, StreamConfig(unique_name, lanes=2, dedup_window_ms=WINDOW_MS)).close()
    child = Child(CHILD, grid_settings.members[0], grid_settings.cluster_name, unique_name)
    children.append(child)
    offset = int(child.read_line(60))
    with Publisher(grid, unique_name) as pub, pytest.raises(DuplicateMessageError) as refused:
        pub.publish(b"from-parent", message_id="cross-process")
    assert refused.value.first_offset == offset
    assert [r.value for r in read_all(grid, unique_name, 1)] == [b"from-child"]


def test_a_claim_left_pending_over_a_stored_record_refuses_the_copy_at_once(grid: Grid, unique_name: str) -> None:
    """A publisher that stored its record and exited before marking the claim written (its process ended, or
    was killed between the write and the mark) leaves a pending claim with a long lease: the copy is refused at
    once, from the record found in the lane, not after waiting for the lease (which outlived a 60 s window in a
    loaded CI run, and the copy was then accepted)."""
    claims = grid.map(dedup_map_name(unique_name))
    with Publisher(grid, StreamConfig(unique_name, lanes=2, dedup_window_ms=WINDOW_MS)) as first:
        offset = first.publish(b"first", message_id="left-pending")
    written = json.loads(claims.get("left-pending") or "{}")
    assert written["state"] == WRITTEN, "close() waits for the claim to be marked written"
    pending = {k: v for k, v in written.items() if k != "offset"} | {"state": PENDING}
    claims.put("left-pending", json.dumps(pending))
    started = time.monotonic()
    with Publisher(grid, unique_name) as second, pytest.raises(DuplicateMessageError) as refused:
        second.publish(b"copy", message_id="left-pending")
    waited = time.monotonic() - started
    print(f"\npending claim over a stored record: copy refused after {waited:.2f} s (lease {pending['lease']} ms)")
    assert refused.value.first_offset == offset and waited < 10
    assert [r.value for r in read_all(grid, unique_name, 1)] == [b"first"]


def test_claims_of_an_aborted_transaction_or_an_earlier_attempt_are_taken_over(grid: Grid, unique_name: str) -> None:
    config = StreamConfig(unique_name, lanes=2, dedup_window_ms=WINDOW_MS)
    with Publisher(grid, config, transactional=True) as aborted:
        transactions.begin(grid, f"{unique_name}/t1", aborted.producer_id, 60_000, stream=unique_name)
        aborted.publish(b"aborted", message_id="x")
    transactions.abort(grid, f"{unique_name}/t1", "the test aborts it")
    with Publisher(grid, unique_name) as plain:
        plain.publish(b"after-abort", message_id="x")  # the aborted copy never counts: taken over
        assert plain.metrics()["dedup_takeovers"] == 1
        with pytest.raises(DuplicateMessageError):
            plain.publish(b"again", message_id="x")
    # a retried attempt of the same work (same owner, a new producer) takes its earlier attempt's claim over
    with Publisher(grid, unique_name, dedup_owner="job/1#0") as first_attempt:
        first_attempt.publish(b"attempt-1", message_id="y")
    with Publisher(grid, unique_name, dedup_owner="job/1#0") as second_attempt:
        second_attempt.publish(b"attempt-2", message_id="y")
    with Publisher(grid, unique_name, dedup_owner="job/1#1") as sibling, pytest.raises(DuplicateMessageError):
        sibling.publish(b"sibling", message_id="y")


def test_an_unreadable_claim_names_the_map_and_the_way_out(grid: Grid, unique_name: str) -> None:
    grid.map(dedup_map_name(unique_name)).put("odd", "not json")
    with Publisher(grid, StreamConfig(unique_name, dedup_window_ms=WINDOW_MS)) as pub:
        with pytest.raises(MeteorError, match=r"unreadable claim in map 'meteor\.dedup::.*Remove the entry"):
            pub.publish(b"x", message_id="odd")
        assert pub.records_sent == 0
