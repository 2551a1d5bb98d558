"""Exactly once through a consumer group in Spark: a grouped meteor source feeding a transactional meteor sink in
the same query commits the group's offsets in each micro-batch's transaction (``groupOffsets``), so a new query
with a fresh checkpoint, started from the group, reads on exactly after the last committed batch."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from spark_helpers import grid_options, make_stream, put_items, read_values, values_items

from meteor_spark.errors import ConfigError, FencedError, TransactionAbortedError
from meteor_spark.format.item_header import item_producer
from meteor_spark.format.offsets import first_offset_of, sequence_of
from meteor_spark.grid import transactions
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.streams import open_stream
from meteor_spark.groups.exclusive import GroupMember
from meteor_spark.groups.store import OFFSETS_MAP, read_offset
from meteor_spark.producer.publisher import Publisher
from meteor_spark.spark import group_handoff
from meteor_spark.spark.options import SinkOptions
from meteor_spark.testing import committed_values, wait_until

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SCRIPT = Path(__file__).with_name("group_eos_script.py")
PER_ITEM = 2


def _group_records(grid: Grid, stream: str, group: str, lane: int) -> int:
    """Records of ``lane`` before the group's offset (every item holds ``PER_ITEM`` records)."""
    stored = read_offset(grid.map(OFFSETS_MAP), stream, group, lane)
    return 0 if stored is None or stored.offset is None else sequence_of(stored.offset) * PER_ITEM


def _committed_transactions(grid: Grid, sink_id: str) -> list[transactions.TxnState]:
    entries = grid.map(transactions.TXNS_MAP).entries()
    states = [transactions.TxnState.parse(key, text) for key, text in entries.items() if key.startswith(sink_id)]
    return [state for state in states if state.state == transactions.COMMITTED]


def _query(spark: Any, settings: GridSettings, source: str, target: str, group: str, checkpoint: Path) -> Any:
    return (
        spark.readStream.format("meteor")
        .options(**grid_options(settings))
        .option("stream", source)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "2")
        .option("group", group)
        .option("groupLeaseMs", "3000")
        .load()
        .writeStream.format("meteor")
        .options(**grid_options(settings))
        .option("checkpointLocation", str(checkpoint))
        .option("transactionTimeoutMs", "10000")
    )


def test_a_new_checkpoint_resumes_from_the_group_exactly_once(
    spark: Any, grid: Grid, grid_settings: GridSettings, unique_name: str, tmp_path: Path
) -> None:
    source, target, group = f"{unique_name}-in", f"{unique_name}-out", "eos"
    info = make_stream(grid, source, lanes=2)
    make_stream(grid, target, lanes=2)
    published = [r.value for lane in (0, 1) for r in put_items(grid, info, lane, values_items(f"l{lane}", 12, 2))]

    first = _query(spark, grid_settings, source, target, group, tmp_path / "cp1").trigger(processingTime="0 seconds")
    running = first.start(target)
    try:
        wait_until(
            lambda: sum(len(v) for v in read_values(grid, target).values()) >= 8,
            timeout_s=180,
            message="the first query to write a few batches",
        )
    finally:
        running.stop()
    # What the group's offsets say was processed is exactly what read_committed readers of the output see: the
    # offsets moved in the batches' transactions, not one batch later when the source confirms.
    stopped = Counter(v.split(b"-")[0] for v in committed_values(grid, target))
    assert 0 < sum(stopped.values()) < len(published)
    for lane in (0, 1):
        assert stopped[f"l{lane}".encode()] == _group_records(grid, source, group, lane), (lane, stopped)
    # Each committed batch's transaction names the group's offsets entries it moved (one decision for both).
    batches = _committed_transactions(grid, str(tmp_path / "cp1"))
    assert batches and all(state.offsets for state in batches), batches

    # A new query, a fresh checkpoint, the same group: it reads on exactly after the last committed batch.
    _query(spark, grid_settings, source, target, group, tmp_path / "cp2").trigger(availableNow=True).start(
        target
    ).awaitTermination()
    committed = committed_values(grid, target)
    lost = len(set(published) - set(committed))
    duplicated = sum((Counter(committed) - Counter(published)).values())
    print(f"[eos] stop + new checkpoint from the group: {len(published)} records, lost {lost}, duplicated {duplicated}")
    assert Counter(committed) == Counter(published)
    assert [_group_records(grid, source, group, lane) for lane in (0, 1)] == [24, 24]


def test_group_offsets_options_are_checked_at_start() -> None:
    base = {"stream": "out", "checkpointLocation": "/tmp/cp"}
    assert SinkOptions.parse(base).group_offsets == "auto"
    assert SinkOptions.parse({**base, "groupOffsets": "TRUE"}).group_offsets == "true"
    assert SinkOptions.parse({**base, "transactional": "false"}).group_offsets == "false"
    with pytest.raises(ConfigError, match="groupOffsets=true' needs transactional=true"):
        SinkOptions.parse({**base, "groupOffsets": "true", "transactional": "false"})
    with pytest.raises(ConfigError, match=re.escape("'groupOffsets': expected auto | true | false, got 'yes'")):
        SinkOptions.parse({**base, "groupOffsets": "yes"})


def _stale_run(grid: Grid, source: str, target: str, group: str) -> tuple[GroupMember, str, int, tuple[Any, ...]]:
    """A run of a query that read lane 0 of ``group`` (3 items) and published its batch in a transaction not
    committed yet: its member, the transaction, the producer, the lanes its read tasks recorded."""
    stale = GroupMember(grid, open_stream(grid, source), group, member_id="stale-run", lease_ms=3000, want="all")
    stale.start()
    wait_until(lambda: 0 in stale.assignment(), timeout_s=30, message="the stale run to hold lane 0")
    lanes = (group_handoff.LaneHandoff(source, group, 0, first_offset_of(3), stale.assignment()[0], "stale-run"),)
    group_handoff.record(grid, lanes, "query-1", "run-1", 5)
    txn = f"{target}/query-1/5/run-1"
    with Publisher(grid, target, transactional=True) as publisher:
        transactions.begin(grid, txn, publisher.producer_id, 30_000, stream=target)
        publisher.publish_many([b"from-the-stale-run"] * 4)
        publisher.flush()
        producer = publisher.producer_id
    return stale, txn, producer, lanes


def _take_over(grid: Grid, source: str, group: str, stale: GroupMember) -> GroupMember:
    stale.close()
    holder = GroupMember(grid, open_stream(grid, source), group, member_id="new-holder", lease_ms=3000, want="all")
    holder.start()
    wait_until(lambda: 0 in holder.assignment(), timeout_s=30, message="the new holder to take lane 0 over")
    return holder


def test_a_batch_whose_lane_was_taken_over_is_aborted_and_fails(
    grid: Grid, grid_settings: GridSettings, unique_name: str
) -> None:
    from pyspark.sql.types import BinaryType, StructField, StructType

    from meteor_spark.spark.writer import MeteorCommitMessage, MeteorStreamWriter

    source, target, group = f"{unique_name}-in", f"{unique_name}-out", "fenced"
    make_stream(grid, source, lanes=1)
    make_stream(grid, target, lanes=1)
    put_items(grid, open_stream(grid, source), 0, values_items("in", 3, PER_ITEM))
    stale, txn, producer, _ = _stale_run(grid, source, target, group)
    holder = _take_over(grid, source, group, stale)
    try:
        given = {"stream": target, "checkpointLocation": target, "groupOffsets": "true"}
        options = SinkOptions.parse({**given, **grid_options(grid_settings)})
        writer = MeteorStreamWriter(options, StructType([StructField("value", BinaryType())]), False)
        message = MeteorCommitMessage(5, "query-1", 4, False, (), txn, (producer,), run="run-1")
        with pytest.raises(FencedError) as caught:
            writer.commit([message], 5)
        print(f"[eos] stale run's commit: {caught.value}")
        assert "micro-batch 5: transaction" in str(caught.value) and "aborted" in str(caught.value)
        assert "member 'stale-run' read the records with epoch" in str(caught.value)
        assert transactions.state_of(grid, txn).state == transactions.ABORTED  # type: ignore[union-attr]
        assert committed_values(grid, target) == []
        assert holder.confirmed(0) is None  # the group's offset did not move: the new holder reads the 3 items
    finally:
        holder.close()


def test_offsets_staged_before_the_takeover_abort_the_stale_runs_transaction(grid: Grid, unique_name: str) -> None:
    source, target, group = f"{unique_name}-in", f"{unique_name}-out", "fenced"
    make_stream(grid, source, lanes=1)
    make_stream(grid, target, lanes=1)
    put_items(grid, open_stream(grid, source), 0, values_items("in", 3, PER_ITEM))
    stale, txn, producer, lanes = _stale_run(grid, source, target, group)
    keys = group_handoff.stage(grid, txn, lanes, 5)
    holder = _take_over(grid, source, group, stale)  # its fencing aborts the open transaction holding the offset
    try:
        with pytest.raises(TransactionAbortedError, match="was taken over while the transaction held its offset"):
            transactions.commit(grid, txn, [producer], offsets=keys)
        assert committed_values(grid, target) == []
        assert holder.confirmed(0) is None
    finally:
        holder.close()


# -- the driver SIGKILLed and restarted with a new checkpoint ------------------------------------------------------

#: Each kill aimed inside a batch's open transaction; the second kills a run that itself took the group over from a
#: killed run (its lanes after the lease expired, its open transaction aborted by timeout or by the takeover).
KILLS = 2


def _driver(
    settings: GridSettings, source: str, target: str, checkpoint: Path, mode: str, *more: str
) -> subprocess.Popen:
    args = [sys.executable, str(SCRIPT), ",".join(settings.members), settings.cluster_name]
    # A session of its own, so the whole driver (Python and its JVM) can be killed as one process group.
    return subprocess.Popen(
        [*args, source, target, str(checkpoint), "killed", mode, *more],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )


def _open_transaction_at_end(grid: Grid, stream: str) -> str | None:
    """A transaction still open whose item ends one of the lanes of ``stream``, else None."""
    info = open_stream(grid, stream)
    for lane, name in enumerate(info.ring_names):
        ring = grid.ring(name)
        tail = ring.tail()
        if tail < 0:
            continue
        producer = item_producer(ring.read_many(tail, 1, 1).items[0], stream=stream, lane=lane, sequence=tail)
        key = transactions.transaction_of_producer(grid, producer.producer_id) if producer.transactional else None
        state = None if key is None else transactions.state_of(grid, key)
        if state is not None and state.state == transactions.OPEN:
            return key
    return None


def _poll_briefly(probe: Callable[[], str | None], seconds: float) -> str | None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = probe()
        if found is not None:
            return found
    return None


def _written(grid: Grid, stream: str) -> int:
    return sum(len(values) for values in read_values(grid, stream).values())


@pytest.mark.fault
@pytest.mark.once
@pytest.mark.timeout(1200)  # three driver runs; each starts a JVM and waits out the killed run's lease
def test_driver_killed_twice_restarted_from_the_group_with_new_checkpoints_is_exactly_once(
    grid: Grid, grid_settings: GridSettings, unique_name: str, tmp_path: Path
) -> None:
    source, target = f"{unique_name}-in", f"{unique_name}-out"
    info = make_stream(grid, source, lanes=2)
    make_stream(grid, target, lanes=2)
    items = 30
    published = [r.value for lane in (0, 1) for r in put_items(grid, info, lane, values_items(f"l{lane}", items, 2))]
    began = time.monotonic()
    killed_inside = 0  # kills that left a batch's records stored under a transaction not decided yet
    for kill in range(KILLS):
        written = _written(grid, target)
        driver = _driver(grid_settings, source, target, tmp_path / f"cp{kill}", "forever")
        try:
            wait_until(
                lambda: _written(grid, target) >= written + 4 or driver.poll() is not None,
                timeout_s=180,
                interval_s=0.2,
                message=f"driver run {kill + 1} to write a few batches",
            )
            assert driver.poll() is None, "the driver exited before it was killed"
            aimed = _poll_briefly(lambda: _open_transaction_at_end(grid, target), seconds=5)
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
            state = None if aimed is None else transactions.state_of(grid, aimed)
            killed_inside += state is not None and state.state == transactions.OPEN
        finally:
            if driver.poll() is None:
                os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
    written_before = _written(grid, target)
    assert written_before < len(published), "killed too late to test anything; publish more"

    final = _driver(grid_settings, source, target, tmp_path / "cp-final", "available-now")
    try:
        out, _ = final.communicate(timeout=300)
    finally:
        if final.poll() is None:
            os.killpg(final.pid, signal.SIGKILL)
            final.wait()
    assert final.returncode == 0 and "DONE" in out
    committed = committed_values(grid, target)
    lost = len(set(published) - set(committed))
    duplicated = sum((Counter(committed) - Counter(published)).values())
    print(
        f"[fault] grouped meteor -> meteor, driver SIGKILLed and restarted with a NEW checkpoint each time: "
        f"{len(published)} records; read_committed {len(committed)}: lost {lost}, duplicated {duplicated}, "
        f"kills {KILLS} ({killed_inside} inside an open transaction); written before the final run "
        f"{written_before}, raw {_written(grid, target)}; {time.monotonic() - began:.0f} s",
        flush=True,
    )
    assert lost == 0 and duplicated == 0
    assert killed_inside >= 1, "no kill landed inside a batch's open transaction: the window this test is for"
    assert [_group_records(grid, source, "killed", lane) for lane in (0, 1)] == [items * 2, items * 2]


@pytest.mark.fault
@pytest.mark.once
def test_a_stopped_query_whose_lanes_were_taken_over_cannot_commit_its_batch(
    grid: Grid, grid_settings: GridSettings, unique_name: str, tmp_path: Path
) -> None:
    """A batch held between its read and its commit while the driver is SIGSTOPped past its lease: another member
    takes the lanes over; resumed, the batch's commit is refused (FencedError), its transaction aborted, and the
    group's offsets say exactly what read_committed readers of the output see."""
    source, target = f"{unique_name}-in", f"{unique_name}-out"
    info = make_stream(grid, source, lanes=2)
    make_stream(grid, target, lanes=2)
    for lane in (0, 1):
        put_items(grid, info, lane, values_items(f"l{lane}", 20, PER_ITEM))
    flags = tmp_path / "flags"
    flags.mkdir()
    driver = _driver(grid_settings, source, target, tmp_path / "cp", "held", str(flags))
    holder = GroupMember(grid, info, "killed", member_id="new-holder", lease_ms=2000, want="all")
    try:
        wait_until(lambda: _written(grid, target) >= 4 or driver.poll() is not None, timeout_s=180)
        assert driver.poll() is None, "the driver exited early"
        (flags / "hold").touch()
        wait_until(lambda: (flags / "reached").exists(), timeout_s=120, message="a batch to be held")
        os.killpg(driver.pid, signal.SIGSTOP)
        holder.start()
        wait_until(lambda: len(holder.assignment()) == 2, timeout_s=60, message="the new holder to take both lanes")
        os.killpg(driver.pid, signal.SIGCONT)
        (flags / "go").touch()
        out, _ = driver.communicate(timeout=180)
        message = next((line for line in out.splitlines() if line.startswith("FAILED:")), "")
        fenced = message[message.find("FencedError: micro-batch") :].split(" | ")[0]
        print(f"[fault] stale query's commit: {fenced}")
        assert driver.returncode != 0 and "FencedError: micro-batch" in fenced and "aborted" in fenced, out[-2000:]
        assert "refused: member" in fenced and "another member took it over" in fenced, fenced
        committed = Counter(v.split(b"-")[0] for v in committed_values(grid, target))
        offsets = [
            0 if (o := holder.known_offsets([lane])[lane]) is None else sequence_of(o) * PER_ITEM for lane in (0, 1)
        ]
        assert [committed[b"l0"], committed[b"l1"]] == offsets, (committed, offsets)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGCONT)
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
        holder.close()
