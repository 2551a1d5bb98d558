"""``PublishFuture``: the future of a plain value's ``publish_async`` answers as an asyncio future does, for await,
the asyncio helpers, callbacks and cancellation, its outcome read from its run's ``RunOutcomes`` (settled here by
hand, as a lane's calls settle it)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from meteor_spark.aio.record_future import PublishFuture, RunOutcomes
from meteor_spark.errors import GridOperationError


def _futures(loop: asyncio.AbstractEventLoop, n: int) -> tuple[RunOutcomes, list[PublishFuture]]:
    values = [b"v%d" % i for i in range(n)]
    outcomes = RunOutcomes(loop, values)
    futures = []
    for index in range(n):
        future = PublishFuture()
        future._outcomes, future._index = outcomes, index
        futures.append(future)
    return outcomes, futures


def test_outcomes_await_helpers_and_callbacks() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        outcomes, futures = _futures(loop, 6)
        assert asyncio.isfuture(futures[0]) and futures[0].get_loop() is loop and not futures[0].done()
        with pytest.raises(asyncio.InvalidStateError):
            futures[0].result()
        seen: list[Any] = []
        futures[1].add_done_callback(seen.append)
        futures[1].add_done_callback(print)
        assert futures[1].remove_done_callback(print) == 1
        gathered = asyncio.ensure_future(asyncio.gather(*futures[:3]))
        awaited = asyncio.ensure_future(_await(futures[3]))
        await asyncio.sleep(0)
        outcomes.stored(None, 0, 4, 100)  # the first call: records 0..3 at offsets 100..103
        assert await gathered == [100, 101, 102] and await awaited == 103 and seen == [futures[1]]
        error = GridOperationError("refused")
        outcomes.failed(error, 4, 5)
        outcomes.failed(error, 5)  # to the run's end (a publisher closed)
        assert futures[4].exception() is error and futures[5].done() and outcomes.values == ()
        with pytest.raises(GridOperationError):
            await futures[4]
        # typeshed types asyncio.wait for asyncio.Future only; asyncio takes any future (asyncio.isfuture)
        done, pending = await asyncio.wait(futures)  # type: ignore[type-var]
        assert len(done) == 6 and not pending
        late: list[Any] = []
        futures[0].add_done_callback(late.append)  # already done: called soon, as asyncio's
        await asyncio.sleep(0)
        assert late == [futures[0]] and "result=100" in repr(futures[0])

    asyncio.run(scenario())


def test_cancelling_the_future_or_its_awaiting_task() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        outcomes, futures = _futures(loop, 3)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(futures[0], 0.01)  # wait_for cancels it on timeout
        assert futures[0].cancelled() and futures[0].done() and not futures[0].cancel()
        task = asyncio.ensure_future(_await(futures[1]))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert futures[1].cancelled()
        outcomes.stored(None, 0, 3, 7)  # the records are stored all the same
        assert await futures[2] == 9 and futures[1].cancelled() and not outcomes.waiters
        with pytest.raises(asyncio.CancelledError):
            futures[0].result()

    asyncio.run(scenario())


async def _await(future: PublishFuture) -> int:
    return await future
