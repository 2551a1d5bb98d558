"""Group offsets confirmed inside a transaction (Kafka's ``sendOffsetsToTransaction``, KIP-98 and KIP-447).

A consume-transform-produce loop publishes what it derived from records of a grouped lane, and the lane's next
offset, as one unit: ``read_committed`` readers of the output see the records exactly when the group's offset moves
past the input, never one without the other. The offset is *staged* in the lane's entry of
``meteor.group.offsets`` (``ConfirmedOffset.txn``: transaction key, offset, item mark) by a fenced compare-and-set
like a confirm, before the transaction commits; the commit (one compare-and-set in ``meteor.txns``,
``meteor_spark.grid.transactions``) is the one atomic point. After it the holder *applies* the staged offset (moves
``offset`` to it and drops ``txn``); whoever meets a staged offset first settles it with ``settle``:

* its transaction committed: the offset is rolled forward (a crash between commit and apply loses nothing);
* aborted, or removed (only aborted transactions, or committed ones nothing names any more, are removed: the
  transaction sweep keeps a committed one while a staged offset names it): the staged offset is dropped;
* still open: a new holder taking the lane over aborts it first (fencing the previous holder's transaction, so a
  zombie can never commit records whose input the new holder is about to read again); if the commit landed first,
  it is rolled forward.

Fencing: staging is refused (``FencedError``) once a newer epoch is on the entry, and a new holder settles the
staged offset in the same compare-and-set that stamps its epoch, so a zombie's transaction either committed before
the takeover (and the new holder starts after its offsets) or is aborted by it (its commit fails with
``TransactionAbortedError`` and nothing of it is delivered).

The fenced compare-and-set of an entry (``fenced_update``) and the two changes a transaction makes (``staging``,
``applying``) are functions of the stored entry and an epoch, not of a live ``GroupMember``: the holder uses them
(``GroupMember.stage`` / ``apply_staged``), and so does a process acting for it with the epoch it held when the
records were read (``stage_as`` / ``apply_as``: a Spark sink's commit, which runs in another process than the
query's source runner).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from meteor_spark.errors import FencedError, GroupError
from meteor_spark.grid import transactions
from meteor_spark.grid.client import Grid, GridMap
from meteor_spark.grid.item_marks import ItemMark
from meteor_spark.groups.leases import wall_ms
from meteor_spark.groups.store import MAX_CAS_ATTEMPTS, OFFSETS_MAP, ConfirmedOffset, StagedOffset, lane_key

#: What a fenced update changes: the stored entry -> the new one, None to leave it as it is.
Change = Callable[[ConfirmedOffset], "ConfirmedOffset | None"]
#: The same, given the state of the transaction of the offset staged on the entry (None: none, or removed).
StateChange = Callable[[ConfirmedOffset, "transactions.TxnState | None"], "ConfirmedOffset | None"]

logger = logging.getLogger(__name__)


def settle(grid: Grid, stored: ConfirmedOffset, where: str, *, abort_open: bool) -> ConfirmedOffset | None:
    """``stored`` with its staged offset settled: rolled forward (transaction committed) or dropped (aborted or
    removed). None when the transaction is still open and ``abort_open`` is False (the holder's own transaction).

    ``abort_open``: a new holder taking the lane over aborts the previous holder's open transaction first.
    """
    staged = stored.txn
    if staged is None:
        return stored
    state = transactions.state_of(grid, staged.key)
    if state is not None and not state.decided:
        if not abort_open:
            return None
        state = transactions.abort(
            grid, staged.key, f"fenced: {where} was taken over while the transaction held its offset"
        )
    return settled_with(stored, state, where)


def settled_with(stored: ConfirmedOffset, state: transactions.TxnState | None, where: str) -> ConfirmedOffset:
    """``stored`` with its staged offset settled by the state of its transaction, decided or removed (None):
    rolled forward when it committed, dropped otherwise (the asyncio member reads the state with awaited calls)."""
    if stored.txn is None:
        return stored
    if state is not None and state.state == transactions.COMMITTED:
        return rolled_forward(stored)
    logger.info("dropped the offset staged on %s by transaction %r (%s)", where, stored.txn.key, _outcome(state))
    return replace(stored, txn=None)


def rolled_forward(stored: ConfirmedOffset) -> ConfirmedOffset:
    """``stored`` with its staged offset applied (never moving the offset back) and ``txn`` dropped."""
    staged = stored.txn
    if staged is None:
        return stored
    if stored.offset is not None and staged.offset <= stored.offset:
        return replace(stored, txn=None)
    high = stored.high if stored.high is not None and stored.high > staged.offset else None
    return replace(stored, offset=staged.offset, mark=staged.mark, txn=None, high=high, not_before_ms=0)


def _outcome(state: transactions.TxnState | None) -> str:
    return "removed" if state is None else state.state


def fenced_write(
    text: str, key: str, *, epoch: int, by: str, change: Change, fenced: Callable[[ConfirmedOffset | None], FencedError]
) -> str | None:
    """One step of a fenced update of the offsets entry ``key`` stored as ``text``: the text to compare-and-set
    (``change(stored)`` stamped with ``epoch`` and writer ``by``), None when ``change`` leaves the entry; refused
    (``fenced(stored)`` raised) once a newer epoch is on it. Shared by ``fenced_update`` and the members' steps
    (``meteor_spark.groups.member_offsets``)."""
    stored = ConfirmedOffset.decode(text, f"{key} in map {OFFSETS_MAP!r}")
    if stored.epoch > epoch:
        raise fenced(stored)
    changed = change(stored)
    if changed is None:
        return None
    return replace(changed, epoch=epoch, by=by, updated_ms=wall_ms()).encode()


def contended(what: str, key: str) -> GroupError:
    return GroupError(f"{what} on {key} in map {OFFSETS_MAP!r} lost the compare-and-set {MAX_CAS_ATTEMPTS} times")


def fenced_update(
    offsets: GridMap,
    key: str,
    *,
    epoch: int,
    by: str,
    change: Change,
    fenced: Callable[[ConfirmedOffset | None], FencedError],
    what: str,
    text: str | None = None,
) -> str | None:
    """Compare-and-set the offsets entry ``key`` to ``change(stored)``, stamped with ``epoch`` and writer ``by``;
    refused (``fenced(stored)`` raised, None for a missing entry) once a newer epoch is on it. ``text``: the value
    the caller believes is stored (tried first, read again when the compare-and-set fails). Returns the text
    written, None when ``change`` left the entry as it was."""
    for _ in range(MAX_CAS_ATTEMPTS):
        if text is None:
            text = offsets.get(key)
        if text is None:
            raise fenced(None)
        new = fenced_write(text, key, epoch=epoch, by=by, change=change, fenced=fenced)
        if new is None:
            return None
        if offsets.replace_if_same(key, text, new):
            return new
        text = None
    raise contended(what, key)


def staging(grid: Grid, txn: str, offset: int, mark: ItemMark | None, where: str) -> Change:
    """The change ``GroupMember.stage`` makes: ``offset`` staged under ``txn``, after settling another
    transaction's staged offset (GroupError while that one is still open: one transaction at a time per lane)."""

    def change(stored: ConfirmedOffset) -> ConfirmedOffset | None:
        other = None
        if stored.txn is not None and stored.txn.key != txn:
            other = transactions.state_of(grid, stored.txn.key)
        return staged_onto(stored, txn, offset, mark, where, other)

    return change


def staged_onto(
    stored: ConfirmedOffset,
    txn: str,
    offset: int,
    mark: ItemMark | None,
    where: str,
    other: transactions.TxnState | None,
) -> ConfirmedOffset:
    """``stored`` with ``offset`` staged under ``txn``; another transaction's staged offset is settled first by
    ``other``, its state (GroupError while it is still open: one transaction at a time per lane)."""
    if stored.txn is not None and stored.txn.key != txn:
        if other is not None and not other.decided:
            raise GroupError(
                f"{where} has an offset staged by transaction {stored.txn.key!r}, still open; commit or abort "
                f"it before staging offsets in transaction {txn!r}"
            )
        stored = settled_with(stored, other, where)
    return replace(stored, txn=StagedOffset(txn, offset, mark))


def settling(txn: str | None, where: str) -> StateChange:
    """The change ``settle_staged`` makes, given the staged transaction's state: the offset staged (by ``txn``, or by
    any transaction when None) settled once its transaction is decided, left while it is open."""

    def change(stored: ConfirmedOffset, state: transactions.TxnState | None) -> ConfirmedOffset | None:
        staged = stored.txn
        if staged is None or (txn is not None and staged.key != txn) or (state is not None and not state.decided):
            return None
        return settled_with(stored, state, where)

    return change


def given(change: StateChange, state: transactions.TxnState | None) -> Change:
    """``change`` with the staged transaction's state read beforehand (by a member's steps, synchronously or
    awaited)."""
    return lambda stored: change(stored, state)


def applying(txn: str) -> Change:
    """The change after ``txn`` committed: its staged offset rolled forward (nothing when it is not staged)."""
    return lambda stored: rolled_forward(stored) if stored.txn is not None and stored.txn.key == txn else None


def stage_as(
    grid: Grid,
    stream: str,
    group: str,
    lane: int,
    offset: int,
    txn: str,
    *,
    epoch: int,
    member: str,
    mark: ItemMark | None,
) -> str:
    """``GroupMember.stage`` done by another process for ``member``, which held the lane with ``epoch`` when the
    records were read. Returns the entry's key (for ``transactions.commit(offsets=...)``).

    Raises:
        FencedError: a newer holder took the lane over since (its epoch is on the entry): the transaction must abort.
        GroupError: another transaction's staged offset on the lane is still open.
    """
    where = f"lane {lane} of stream {stream!r} in group {group!r}"
    key = lane_key(stream, group, lane)
    fenced_update(
        grid.map(OFFSETS_MAP),
        key,
        epoch=epoch,
        by=member,
        change=staging(grid, txn, offset, mark, where),
        fenced=lambda stored: _fenced("staging", where, member, epoch, stored),
        what="stage",
    )
    return key


def apply_as(grid: Grid, stream: str, group: str, lane: int, txn: str, *, epoch: int, member: str) -> None:
    """``GroupMember.apply_staged`` done by another process for ``member`` (epoch as in ``stage_as``). Fenced: a
    new holder settles the staged offset itself when it takes the lane over.

    Raises:
        FencedError: a newer holder took the lane over (it rolls the committed offset forward itself).
    """
    where = f"lane {lane} of stream {stream!r} in group {group!r}"
    fenced_update(
        grid.map(OFFSETS_MAP),
        lane_key(stream, group, lane),
        epoch=epoch,
        by=member,
        change=applying(txn),
        fenced=lambda stored: _fenced("applying", where, member, epoch, stored),
        what="apply",
    )


def _fenced(what: str, where: str, member: str, epoch: int, stored: ConfirmedOffset | None) -> FencedError:
    now = "has no offsets entry" if stored is None else f"carries epoch {stored.epoch} of {stored.by!r}"
    return FencedError(
        f"{what} an offset on {where} refused: member {member!r} read the records with epoch {epoch}, but the "
        f"lane {now}: another member took it over, and its records go to that holder; nothing was written"
    )
