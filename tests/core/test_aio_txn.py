"""asyncio transactions (``AsyncTransactionalPublisher``) against the real client and real TCP: commit and abort seen
by a ``read_committed`` asyncio reader, consume-transform-produce with ``send_offsets`` where the asyncio loop process
is SIGKILLed mid-transaction and a survivor finishes the work (lost 0 / duplicated 0, printed), and a transaction
left open past its deadline aborted by an asyncio ``read_committed`` reader, and the asyncio sweep.
"""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Any

import pytest

from meteor_spark.aio import AsyncPublisher, AsyncSubscriber, AsyncTransactionalPublisher, txn_grid
from meteor_spark.errors import ConfigError, FencedError, GroupError, NotAssignedError, TransactionAbortedError
from meteor_spark.format.offsets import sequence_of
from meteor_spark.format.records import Record
from meteor_spark.grid import transactions
from meteor_spark.grid.aio_client import AsyncGrid
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.streams import StreamConfig, open_stream
from meteor_spark.groups.store import OFFSETS_MAP, read_offset
from meteor_spark.producer.publisher import Publisher
from tests.core.processes import Child


def _run(coroutine: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coroutine, 60))


async def _read_committed(settings: GridSettings, stream: str, expected: int, timeout_s: float = 20) -> list[str]:
    """Every record a read_committed asyncio reader gets from ``stream`` until ``expected`` came, and 200 ms more."""
    got: list[str] = []
    async with AsyncSubscriber(
        settings, stream, initial_offset_scheme="earliest", isolation="read_committed"
    ) as reader:
        deadline = time.monotonic() + timeout_s
        while len(got) < expected and time.monotonic() < deadline:
            got.extend(r.value.decode() for r in await reader.poll(100))
        got.extend(r.value.decode() for r in await reader.poll(200))
    return got


def test_options_and_commit_and_abort(grid_settings: GridSettings, unique_name: str) -> None:
    with pytest.raises(ConfigError, match="timeout_ms"):
        AsyncTransactionalPublisher(grid_settings, unique_name, timeout_ms=0)
    with pytest.raises(ConfigError, match="transactional is always True"):
        AsyncTransactionalPublisher(grid_settings, unique_name, transactional=True)

    async def scenario() -> list[str]:
        async with AsyncTransactionalPublisher(grid_settings, StreamConfig(unique_name, lanes=2)) as txn:
            await txn.publish(b"kept-1")
            await txn.publish_many([b"kept-2"])
            queued = await txn.publish_async(b"kept-3")  # stored by commit's flush at the latest
            key = txn.transaction
            await txn.commit()
            assert queued.done() and txn.transaction is None and txn.committed == 1
            await txn.publish(b"dropped")
            await txn.abort()
            assert txn.aborted == 1
            await txn.publish(b"dropped-on-close")  # close aborts an open transaction
            async with AsyncSubscriber(grid_settings, unique_name) as ungrouped:
                with pytest.raises(GroupError, match="send_offsets needs a subscriber group"):
                    await txn.send_offsets(ungrouped)
        assert key is not None
        return await _read_committed(grid_settings, unique_name, 3)

    assert sorted(_run(scenario())) == ["kept-1", "kept-2", "kept-3"]


# The loop: an asyncio member "loop" of group "g" reads A and writes "b:<value>" to B in transactions that also
# stage its offsets. After committing at least 20 records it stages one more transaction, says "staged" and waits
# (its leases renewed) to be SIGKILLed between send_offsets and commit.
LOOP_CHILD = r"""
import asyncio, sys
from meteor_spark.aio import AsyncSubscriber, AsyncTransactionalPublisher
from meteor_spark.grid.client import GridSettings

address, cluster, source, target = sys.argv[1:5]

async def main():
    settings = GridSettings(members=(address,), cluster_name=cluster)
    async with AsyncSubscriber(settings, source, group="g", member_id="loop", lease_ms=1000,
                               initial_offset_scheme="earliest", max_poll_records=4) as sub, \
               AsyncTransactionalPublisher(settings, target, timeout_ms=30000) as txn:
        done = 0
        while True:
            batch = await sub.poll(100)
            if not batch:
                continue
            await txn.publish_many([b"b:" + r.value for r in batch])
            await txn.send_offsets(sub)
            if done >= 20:
                print("staged", txn.transaction, flush=True)
                await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
            await txn.commit()
            done += len(batch)

asyncio.run(main())
"""


@pytest.mark.fault
def test_consume_transform_produce_survives_a_sigkill_mid_transaction(
    grid: Grid, grid_settings: GridSettings, unique_name: str, children: list[Child]
) -> None:
    source = open_stream(grid, StreamConfig(f"{unique_name}-a", lanes=2, capacity=500))
    target = open_stream(grid, StreamConfig(f"{unique_name}-b", lanes=2, capacity=500))
    total = 60
    with Publisher(grid, source.name, linger_ms=0) as publisher:
        publisher.publish_many([Record(str(n).encode(), lane=n % 2) for n in range(total)]).result(30)
    child = Child(LOOP_CHILD, grid_settings.members[0], grid_settings.cluster_name, source.name, target.name)
    children.append(child)
    word, open_key = child.read_line(60).split()
    assert word == "staged"
    child.kill()  # offsets staged, records written, transaction open: a crash mid-transaction
    killed_at = time.monotonic()

    async def survivor() -> float:
        async with (
            AsyncSubscriber(
                grid_settings, source.name, group="g", member_id="survivor", lease_ms=1000, max_poll_records=7
            ) as sub,
            AsyncTransactionalPublisher(grid_settings, target.name) as txn,
        ):
            takeover_s = -1.0
            deadline = time.monotonic() + 30
            while not _consumed(grid, source.name, source.ring_names) and time.monotonic() < deadline:
                batch = await sub.poll(100)
                if batch and takeover_s < 0:
                    takeover_s = time.monotonic() - killed_at
                try:
                    await txn.publish_many([b"b:" + r.value for r in batch])
                    await txn.send_offsets(sub)
                    await txn.commit()
                except (FencedError, NotAssignedError, TransactionAbortedError):
                    await txn.abort()
            return takeover_s

    takeover_s = _run(survivor())
    seen = collections.Counter(_run(_read_committed(grid_settings, target.name, total)))
    expected = {f"b:{n}" for n in range(total)}
    lost = len(expected - set(seen))
    duplicated = sum(count - 1 for count in seen.values() if count > 1)
    dead = transactions.state_of(grid, open_key)
    print(
        f"\n[fault] asyncio consume-transform-produce, SIGKILL mid-transaction: {total} records: lost {lost}, "
        f"duplicated {duplicated}, takeover_s {takeover_s:.2f}, the dead loop's transaction "
        f"{None if dead is None else dead.state} ({None if dead is None else dead.reason})",
        flush=True,
    )
    assert (lost, duplicated) == (0, 0)
    assert set(seen) == expected
    # the dead loop's open transaction was aborted by the survivor as it took the lanes over
    assert dead is not None and dead.state == transactions.ABORTED and "fenced" in dead.reason


def _consumed(grid: Grid, stream: str, rings: tuple[str, ...] | list[str]) -> bool:
    offsets = grid.map(OFFSETS_MAP)
    for lane, ring in enumerate(rings):
        stored = read_offset(offsets, stream, "g", lane)
        if stored is None or stored.offset is None or stored.txn is not None:
            return False
        if sequence_of(stored.offset) <= grid.ring(ring).tail():
            return False
    return True


def test_an_asyncio_read_committed_reader_aborts_a_transaction_open_past_its_deadline(
    grid: Grid, grid_settings: GridSettings, unique_name: str
) -> None:
    open_stream(grid, StreamConfig(unique_name, lanes=1))
    key = f"abandoned/{unique_name}"
    writer = Publisher(grid, unique_name, transactional=True, linger_ms=0)
    transactions.begin(grid, key, writer.producer_id, 300, stream=unique_name)
    writer.publish(b"never-committed")
    writer.close()  # the writer is gone without deciding: only a reader's timeout ends the transaction

    async def scenario() -> list[str]:
        async with AsyncPublisher(grid_settings, unique_name) as plain:
            await plain.publish(b"after")
        return await _read_committed(grid_settings, unique_name, 1, timeout_s=10)

    started = time.monotonic()
    got = _run(scenario())
    state = transactions.state_of(grid, key)
    print(f"\n[fault] abandoned transaction: aborted after {time.monotonic() - started:.2f} s, read {got}", flush=True)
    assert got == ["after"]
    assert state is not None and state.state == transactions.ABORTED and "timed out" in state.reason


def test_the_asyncio_sweep_removes_decided_transactions_by_the_threaded_rules(
    grid: Grid, grid_settings: GridSettings, unique_name: str
) -> None:
    async def scenario() -> tuple[str, str, int]:
        async with AsyncTransactionalPublisher(grid_settings, StreamConfig(unique_name, lanes=1)) as txn:
            await txn.publish(b"kept")
            committed = txn.transaction
            await txn.commit()
            await txn.publish(b"dropped")
            aborted = txn.transaction
            await txn.abort()
        agrid = await AsyncGrid.start(grid_settings)
        try:
            later = int(time.time() * 1000) + transactions.ABORTED_RETENTION_MS + 1
            removed = await txn_grid.sweep(agrid, now_ms=later)
        finally:
            await agrid.close()
        assert committed is not None and aborted is not None
        return committed, aborted, removed

    committed, aborted, removed = _run(scenario())
    assert removed >= 1
    assert transactions.state_of(grid, aborted) is None  # aborted, past its retention: removed
    assert transactions.state_of(grid, committed) is not None  # its record is still readable: kept
    producers = grid.map(transactions.PRODUCERS_MAP).entries()
    assert aborted not in producers.values() and committed in producers.values()
