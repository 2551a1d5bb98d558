"""Group offsets confirmed inside a transaction (consume-transform-produce): applied exactly when the transaction
commits, rolled forward by a new holder after a crash between commit and apply, never applied for an aborted or
fenced transaction, and the committed transaction kept by the sweep until its staged offsets are applied."""

from __future__ import annotations

import time

import pytest

from meteor_spark.consumer.subscriber import Subscriber
from meteor_spark.consumer.transactional import TransactionalPublisher
from meteor_spark.errors import FencedError, TransactionAbortedError
from meteor_spark.format.offsets import make_offset
from meteor_spark.grid import transactions
from meteor_spark.grid.client import Grid
from meteor_spark.grid.streams import StreamConfig, StreamInfo, open_stream
from meteor_spark.grid.txn_retention import STAGED_OFFSETS_MAP
from meteor_spark.groups.exclusive import GroupMember
from meteor_spark.groups.store import OFFSETS_MAP, lane_key, read_offset
from meteor_spark.producer.publisher import Publisher
from meteor_spark.testing import wait_until


def _streams(grid: Grid, name: str, records: int) -> tuple[StreamInfo, StreamInfo]:
    source = open_stream(grid, StreamConfig(f"{name}-a", lanes=1))
    target = open_stream(grid, StreamConfig(f"{name}-b", lanes=1))
    with Publisher(grid, source.name) as publisher:
        for n in range(records):
            publisher.publish(f"{n}".encode())
    return source, target


def _committed_values(grid: Grid, stream: str) -> list[str]:
    """Every record of ``stream`` a read_committed reader delivers (read to the lanes' ends)."""
    values: list[str] = []
    with Subscriber(grid, stream, initial_offset_scheme="earliest", isolation="read_committed") as reader:
        wait_until(lambda: values.extend(r.value.decode() for r in reader.poll(50)) or not any(reader.lag().values()))
        values.extend(r.value.decode() for r in reader.poll(50))
    return values


def _poll(sub: Subscriber, count: int) -> list[str]:
    got: list[str] = []
    wait_until(lambda: got.extend(r.value.decode() for r in sub.poll(50)) or len(got) >= count)
    return got


def test_offsets_staged_in_a_transaction_move_when_it_commits(grid: Grid, unique_name: str) -> None:
    source, target = _streams(grid, unique_name, 10)
    with (
        Subscriber(grid, source.name, group="g", initial_offset_scheme="earliest", max_poll_records=10) as sub,
        TransactionalPublisher(grid, target.name) as txn,
    ):
        for value in _poll(sub, 10):
            txn.publish(f"t{value}".encode())
        staged = txn.send_offsets(sub)
        stored = read_offset(grid.map(OFFSETS_MAP), source.name, "g", 0)
        assert stored is not None and stored.txn is not None and stored.txn.offset == staged[0]
        assert stored.offset != staged[0], "a staged offset is not in force before the commit"
        with Subscriber(grid, target.name, initial_offset_scheme="earliest", isolation="read_committed") as early:
            assert list(early.poll(300)) == [], "the open transaction's records are not delivered"
        txn.commit()
        stored = read_offset(grid.map(OFFSETS_MAP), source.name, "g", 0)
        assert stored is not None and stored.offset == staged[0] and stored.txn is None
    assert _committed_values(grid, target.name) == [f"t{n}" for n in range(10)]


def test_an_aborted_transaction_moves_no_offset_and_rewinds_the_subscriber(grid: Grid, unique_name: str) -> None:
    source, target = _streams(grid, unique_name, 6)
    with (
        Subscriber(grid, source.name, group="g", initial_offset_scheme="earliest", max_poll_records=6) as sub,
        TransactionalPublisher(grid, target.name) as txn,
    ):
        first = _poll(sub, 6)
        for value in first:
            txn.publish(value.encode())
        txn.send_offsets(sub)
        txn.abort()
        stored = read_offset(grid.map(OFFSETS_MAP), source.name, "g", 0)
        assert stored is not None and stored.offset == make_offset(0, 0) and stored.txn is None
        assert _poll(sub, 6) == first, "the aborted transaction's input is delivered again"
        for value in first:
            txn.publish(value.encode())
        txn.send_offsets(sub)
        txn.commit()
    assert _committed_values(grid, target.name) == first


def _staged_commit(grid: Grid, member: GroupMember, key: str, offset: int, *, commit: bool) -> None:
    """Stage ``offset`` on lane 0 in transaction ``key`` (a made-up producer), committing it when asked, but never
    applying it: a process that died right after the commit."""
    transactions.begin(grid, key, 777_000_001, 60_000, stream=member.stream)
    member.stage(0, offset, key)
    if commit:
        transactions.commit(grid, key, [777_000_001], offsets=[lane_key(member.stream, member.group, 0)])


def test_a_new_holder_rolls_a_committed_transactions_offset_forward(grid: Grid, unique_name: str) -> None:
    """A crash between the commit and applying its offsets: the next holder starts after them."""
    source, _ = _streams(grid, unique_name, 3)
    first = GroupMember(grid, source, "g", lease_ms=2000)
    first.start()
    first.confirm(0, make_offset(0, 0))
    _staged_commit(grid, first, f"{unique_name}/t1", make_offset(2, 0), commit=True)
    first.close()  # releases the lease; the staged offset is not applied
    with GroupMember(grid, source, "g", lease_ms=2000) as second:
        assert second.confirmed(0) == make_offset(2, 0)
        stored = read_offset(grid.map(OFFSETS_MAP), source.name, "g", 0)
        assert stored is not None and stored.txn is None


def test_a_new_holder_aborts_the_open_transaction_of_the_previous_one(grid: Grid, unique_name: str) -> None:
    """A zombie: its transaction is aborted by the takeover, its commit fails, it can stage nothing more."""
    source, _ = _streams(grid, unique_name, 3)
    zombie = GroupMember(grid, source, "g", lease_ms=2000)
    zombie.start()
    zombie.confirm(0, make_offset(0, 0))
    key = f"{unique_name}/t1"
    _staged_commit(grid, zombie, key, make_offset(2, 0), commit=False)
    zombie._stop.set()  # stops renewing (a paused process): its lease expires
    zombie._thread.join()  # type: ignore[union-attr]
    with GroupMember(grid, source, "g", lease_ms=2000) as successor:
        wait_until(lambda: 0 in successor.assignment(), 10)
        assert successor.confirmed(0) == make_offset(0, 0)
        state = transactions.state_of(grid, key)
        assert state is not None and state.state == transactions.ABORTED
        with pytest.raises(TransactionAbortedError):
            transactions.commit(grid, key, [777_000_001])
        with pytest.raises(FencedError):
            zombie.stage(0, make_offset(3, 0), f"{unique_name}/t2")
        assert successor.confirmed(0) == make_offset(0, 0)
    zombie.close()


def test_the_sweep_keeps_a_committed_transaction_until_its_offsets_are_applied(grid: Grid, unique_name: str) -> None:
    assert STAGED_OFFSETS_MAP == OFFSETS_MAP
    source, _ = _streams(grid, unique_name, 3)
    later = int(time.time() * 1000) + transactions.ABORTED_RETENTION_MS + 1
    with GroupMember(grid, source, "g", lease_ms=2000) as member:
        member.confirm(0, make_offset(0, 0))
        key = f"{unique_name}/t1"
        _staged_commit(grid, member, key, make_offset(1, 0), commit=True)
        transactions.sweep(grid, now_ms=later)
        assert transactions.state_of(grid, key) is not None, "kept while its offset is staged"
        member.apply_staged(0, key)
        assert member.confirmed(0) == make_offset(1, 0)
        transactions.sweep(grid, now_ms=later)
        assert transactions.state_of(grid, key) is None, "removed once applied (it wrote no records)"


def test_abort_after_a_commit_whose_answer_was_lost_completes_it(grid: Grid, unique_name: str) -> None:
    """The commit landed but its caller never heard (the grid answered too late): ``abort()`` finds it committed,
    applies its offsets and rewinds nothing; a later rewind starts after them."""
    source, target = _streams(grid, unique_name, 5)
    with (
        Subscriber(grid, source.name, group="g", initial_offset_scheme="earliest", max_poll_records=5) as sub,
        TransactionalPublisher(grid, target.name) as txn,
    ):
        for value in _poll(sub, 5):
            txn.publish(value.encode())
        staged = txn.send_offsets(sub)
        key = txn.transaction
        assert key is not None
        txn._publisher.flush()  # type: ignore[union-attr]
        transactions.commit(grid, key, [txn._publisher.producer_id])  # type: ignore[union-attr]
        txn.abort()
        assert (txn.committed, txn.aborted) == (1, 0)
        assert sub.member.confirmed(0) == staged[0]
        assert sub.rewind() == {0: staged[0]}
        assert list(sub.poll(200)) == []
    assert _committed_values(grid, target.name) == [str(n) for n in range(5)]


def test_a_rewind_counts_a_committed_transactions_offset_not_applied_yet(grid: Grid, unique_name: str) -> None:
    source, _ = _streams(grid, unique_name, 4)
    with Subscriber(grid, source.name, group="g", initial_offset_scheme="earliest", max_poll_records=4) as sub:
        assert len(_poll(sub, 4)) == 4
        _staged_commit(grid, sub.member, f"{unique_name}/t1", make_offset(2, 0), commit=True)
        assert sub.rewind() == {0: make_offset(2, 0)}
        assert _poll(sub, 2) == ["2", "3"]
