"""Async request/reply (``meteor_spark.aio.request_reply``) against the real client and real TCP: the asyncio and
threaded halves answer each other both ways, concurrent requests are matched to their replies, a timeout names its
request, error replies, option errors and the reply stream's life.

Each test runs its coroutine with ``asyncio.run`` (no pytest-asyncio needed).
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import pytest

from meteor_spark.aio import AsyncGrid, AsyncRequester, AsyncResponder
from meteor_spark.consumer.request_reply import CORRELATION_ID, REPLY_TO, Requester, Responder, header
from meteor_spark.errors import ConfigError, RequestError, RequestTimeoutError
from meteor_spark.format.records import Record
from meteor_spark.grid.client import Grid, GridSettings
from meteor_spark.grid.streams import STREAMS_MAP, StreamConfig


def _run(coroutine: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coroutine, 60))


def test_async_requester_and_threaded_responder(grid: Grid, grid_settings: GridSettings, unique_name: str) -> None:
    seen: list[Record] = []

    def handler(request: Record) -> Record:
        seen.append(request)
        if request.value == b"bad":
            raise ValueError("cannot price 'bad'")
        return Record(request.value.upper(), key=b"k", headers=(("x-served-by", b"threaded"),))

    async def main() -> None:
        async with AsyncRequester(grid_settings, unique_name, timeout_ms=10_000) as requester:
            reply = await requester.request(Record(b"hello", headers=(("x-trace", b"1"),)))
            assert (reply.value, reply.key, header(reply, "x-served-by")) == (b"HELLO", b"k", b"threaded")
            assert header(reply, CORRELATION_ID) == header(seen[0], CORRELATION_ID) is not None
            assert header(seen[0], REPLY_TO) == requester.reply_stream.encode()
            assert header(seen[0], "x-trace") == b"1"
            with pytest.raises(RequestError, match=r"failed on request .*: ValueError: cannot price 'bad'"):
                await requester.request(b"bad")
            assert requester.pending == 0

    with Responder(grid, StreamConfig(unique_name, lanes=2), handler):
        _run(main())


def test_threaded_requester_and_async_responder(grid: Grid, grid_settings: GridSettings, unique_name: str) -> None:
    stop = asyncio.Event

    async def handler(request: Record) -> Record:
        if request.value == b"bad":
            raise KeyError("no such sku")
        await asyncio.sleep(0)  # an awaiting handler
        return Record(request.value[::-1], headers=(("x-served-by", b"asyncio"),))

    results: dict[str, Any] = {}

    async def main() -> None:
        done = stop()
        async with AsyncResponder(grid_settings, StreamConfig(unique_name, lanes=2), handler) as responder:

            def ask() -> None:
                with Requester(grid, unique_name) as requester:
                    results["reply"] = requester.request(b"abc", timeout_ms=10_000)
                    with pytest.raises(RequestError, match="KeyError") as caught:
                        requester.request(b"bad", timeout_ms=10_000)
                    results["error"] = caught.value

            thread = asyncio.get_running_loop().run_in_executor(None, ask)
            thread.add_done_callback(lambda _: done.set())
            await done.wait()
            await thread
            assert (responder.answered, responder.failed, responder.malformed) == (2, 1, 0)

    _run(main())
    reply = results["reply"]
    assert (reply.value, header(reply, "x-served-by")) == (b"cba", b"asyncio")
    assert not isinstance(results["error"], RequestTimeoutError)


def test_concurrent_async_requests_each_get_their_own_reply(grid_settings: GridSettings, unique_name: str) -> None:
    async def upper(request: Record) -> bytes:
        return request.value.upper()

    async def main() -> None:
        async with (
            await AsyncGrid.start(grid_settings) as shared,
            AsyncResponder(shared, StreamConfig(unique_name, lanes=4), upper),
            AsyncRequester(shared, unique_name, timeout_ms=20_000) as requester,
        ):
            asks = [requester.request(Record(f"req-{i}".encode(), key=str(i).encode())) for i in range(200)]
            replies = await asyncio.gather(*asks)
            assert [r.value for r in replies] == [f"REQ-{i}".encode() for i in range(200)]
            futures = [await requester.request_async(f"f-{i}") for i in range(50)]
            assert [(await f).value for f in futures] == [f"F-{i}".encode() for i in range(50)]
            assert requester.pending == 0 and requester.late_replies == 0

    _run(main())


def test_no_reply_in_time_is_a_timeout_naming_the_request(grid_settings: GridSettings, unique_name: str) -> None:
    async def main() -> None:
        release = asyncio.Event()

        async def slow(request: Record) -> bytes:
            if request.value in (b"q", b"held"):
                await asyncio.wait_for(release.wait(), 20)
            return request.value

        async with (
            AsyncResponder(grid_settings, StreamConfig(unique_name), slow),
            AsyncRequester(grid_settings, unique_name) as requester,
        ):
            started = time.monotonic()
            with pytest.raises(RequestTimeoutError) as caught:
                await requester.request(b"q", timeout_ms=200)
            waited = time.monotonic() - started
            assert 0.2 <= waited < 5, waited
            assert isinstance(caught.value, TimeoutError)
            assert re.search(rf"no reply to request [0-9a-f]{{32}} on stream '{unique_name}' within", str(caught.value))
            assert requester.pending == 0
            release.set()
            assert (await requester.request(b"next", timeout_ms=10_000)).value == b"next"
            assert requester.late_replies == 1  # the reply to "q", read before the one to "next", and dropped
            release.clear()
            with pytest.raises(asyncio.TimeoutError):  # the caller gives up (cancelled by wait_for)
                await asyncio.wait_for(requester.request(b"held", timeout_ms=10_000), 0.3)
            assert requester.pending == 0  # a cancelled caller's request is forgotten at once
            release.set()

    _run(main())


def test_asyncio_and_threaded_responders_share_a_group(
    grid: Grid, grid_settings: GridSettings, unique_name: str
) -> None:
    async def main() -> tuple[int, int]:
        config = StreamConfig(unique_name, lanes=2)
        async with AsyncResponder(grid_settings, config, lambda r: b"async:" + r.value, group="pricing") as mine:
            with Responder(grid, config, lambda r: b"threaded:" + r.value, group="pricing") as theirs:
                deadline = time.monotonic() + 20
                while not (mine.lanes and theirs.lanes):  # balanced: one lane each
                    assert time.monotonic() < deadline, (mine.lanes, theirs.lanes)
                    await asyncio.sleep(0.02)
                assert sorted(mine.lanes + theirs.lanes) == [0, 1]
                async with AsyncRequester(grid_settings, unique_name, timeout_ms=10_000) as requester:
                    replies = await asyncio.gather(
                        *(requester.request(Record(f"q{n}".encode(), key=f"k{n}".encode())) for n in range(40))
                    )
                assert [r.value.split(b":")[1] for r in replies] == [f"q{n}".encode() for n in range(40)]
                by = {side: sum(r.value.startswith(side.encode()) for r in replies) for side in ("async", "threaded")}
                assert by["async"] == mine.answered and by["threaded"] == theirs.answered
                return by["async"], by["threaded"]

    answered_async, answered_threaded = _run(main())
    print(f"group of responders: 40 requests, asyncio answered {answered_async}, threaded {answered_threaded}")
    assert answered_async > 0 and answered_threaded > 0


def test_option_errors_and_the_reply_stream_life(grid: Grid, grid_settings: GridSettings, unique_name: str) -> None:
    with pytest.raises(ConfigError, match="timeout_ms"):
        AsyncRequester(grid_settings, unique_name, timeout_ms=0)
    with pytest.raises(ConfigError, match="capacity"):
        AsyncRequester(grid_settings, unique_name, reply_capacity=0)
    with pytest.raises(ConfigError, match="handler must be callable"):
        AsyncResponder(grid_settings, unique_name, b"not callable")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="max_reply_publishers"):
        AsyncResponder(grid_settings, unique_name, lambda r: r.value, max_reply_publishers=0)

    async def main() -> tuple[str, asyncio.Future[Record], AsyncRequester]:
        requester = await AsyncRequester(grid_settings, StreamConfig(unique_name)).start()
        assert grid.map(STREAMS_MAP).get(requester.reply_stream) is not None
        future = await requester.request_async(b"nobody answers", timeout_ms=60_000)
        await requester.close()
        with pytest.raises(RequestError, match="was closed"):
            await future
        with pytest.raises(RequestError, match="is closed"):
            await requester.request(b"after close")
        return requester.reply_stream, future, requester

    reply_stream, _, _ = _run(main())
    assert grid.map(STREAMS_MAP).get(reply_stream) is None
