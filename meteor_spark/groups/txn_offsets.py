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
"""

from __future__ import annotations

import logging
from dataclasses import replace

from meteor_spark.grid import transactions
from meteor_spark.grid.client import Grid
from meteor_spark.groups.store import ConfirmedOffset

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
    if state is not None and state.state == transactions.COMMITTED:
        return rolled_forward(stored)
    logger.info("dropped the offset staged on %s by transaction %r (%s)", where, staged.key, _outcome(state))
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
