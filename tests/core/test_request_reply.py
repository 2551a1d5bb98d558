"""Request/reply over two streams (``meteor_spark.consumer.request_reply``): round trip, concurrent requests of one
requester, timeouts, error replies, and the reply stream's life."""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Any

import pytest

from meteor_spark.consumer.request_reply import CORRELATION_ID, REPLY_TO, Requester, Responder, header
from meteor_spark.errors import RequestError, RequestTimeoutError
from meteor_spark.format.records import Record
from meteor_spark.grid.client import Grid
from meteor_spark.grid.streams import STREAMS_MAP, StreamConfig
from meteor_spark.testing import wait_until


def _upper(request: Record) -> bytes:
    return request.value.upper()


def test_a_request_gets_its_reply(grid: Grid, unique_name: str) -> None:
    requests = StreamConfig(unique_name, lanes=2)
    seen: list[Record] = []

    def handler(request: Record) -> Record:
        seen.append(request)
        return Record(request.value.upper(), key=b"k", headers=(("x-served-by", b"test"),))

    with Responder(grid, requests, handler), Requester(grid, unique_name) as requester:
        reply = requester.request(Record(b"hello", headers=(("x-trace", b"1"),)), timeout_ms=10_000)
        assert (reply.value, reply.key, header(reply, "x-served-by")) == (b"HELLO", b"k", b"test")
        assert reply.stream == requester.reply_stream
        assert header(reply, CORRELATION_ID) == header(seen[0], CORRELATION_ID) is not None
        assert header(seen[0], REPLY_TO) == requester.reply_stream.encode()
        assert header(seen[0], "x-trace") == b"1"  # the request's own headers travel too
        assert requester.pending == 0


def test_concurrent_requests_of_one_requester_each_get_their_own_reply(grid: Grid, unique_name: str) -> None:
    requests = StreamConfig(unique_name, lanes=4)
    with Responder(grid, requests, _upper), Requester(grid, unique_name) as requester:
        futures = [requester.request_async(f"req-{i}".encode(), timeout_ms=20_000) for i in range(200)]
        replies = [f.result(30) for f in futures]
        assert [r.value for r in replies] == [f"REQ-{i}".encode() for i in range(200)]

        # ... and from many threads at once
        def ask(i: int) -> bytes:
            return requester.request(f"t-{i}", timeout_ms=20_000).value

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            assert list(pool.map(ask, range(64))) == [f"T-{i}".encode() for i in range(64)]


def test_no_reply_in_time_is_a_request_timeout(grid: Grid, unique_name: str) -> None:
    release = threading.Event()

    def slow(request: Record) -> bytes:
        if request.value == b"q":
            release.wait(20)
        return request.value

    with Responder(grid, StreamConfig(unique_name), slow), Requester(grid, unique_name) as requester:
        with pytest.raises(RequestTimeoutError, match=r"no reply to request .* within its timeout") as caught:
            requester.request(b"q", timeout_ms=200)
        assert isinstance(caught.value, TimeoutError)
        assert requester.pending == 0
        release.set()
        assert requester.request(b"next", timeout_ms=10_000).value == b"next"  # not the late reply to "q"
        assert requester.late_replies == 1  # read before the reply to "next", and dropped


def test_a_handler_that_raises_sends_an_error_reply(grid: Grid, unique_name: str) -> None:
    def picky(request: Record) -> bytes:
        if request.value == b"bad":
            raise ValueError("cannot price 'bad'")
        return b"ok"

    with Responder(grid, StreamConfig(unique_name), picky) as responder, Requester(grid, unique_name) as requester:
        with pytest.raises(RequestError, match=r"failed on request .*: ValueError: cannot price 'bad'") as caught:
            requester.request(b"bad", timeout_ms=10_000)
        assert not isinstance(caught.value, RequestTimeoutError)
        assert requester.request(b"good", timeout_ms=10_000).value == b"ok"  # the responder goes on
        assert (responder.failed, responder.answered) == (1, 2)


def test_requests_without_headers_are_counted_not_answered(grid: Grid, unique_name: str) -> None:
    from meteor_spark.producer.publisher import Publisher

    with Responder(grid, StreamConfig(unique_name), _upper) as responder, Publisher(grid, unique_name) as pub:
        pub.publish(b"no headers", timeout_s=10)
        wait_until(lambda: responder.malformed == 1, timeout_s=10, message="the malformed request, counted")
        assert responder.answered == 0


def test_grouped_responders_share_the_requests(grid: Grid, unique_name: str) -> None:
    requests = StreamConfig(unique_name, lanes=2)
    served: dict[str, int] = {"a": 0, "b": 0}

    def serving(name: str) -> Any:
        def handler(request: Record) -> bytes:
            served[name] += 1
            return name.encode()

        return handler

    group = f"{unique_name}-g"
    with (
        Responder(grid, requests, serving("a"), group=group, initial_offset_scheme="earliest") as a,
        Responder(grid, requests, serving("b"), group=group, initial_offset_scheme="earliest") as b,
        Requester(grid, unique_name) as requester,
    ):
        wait_until(lambda: len(a.lanes) == len(b.lanes) == 1, timeout_s=30, message="one lane per responder")
        futures = [requester.request_async(Record(b"q", key=f"{i}".encode()), timeout_ms=30_000) for i in range(40)]
        replies = [f.result(40) for f in futures]
        assert len(replies) == 40 and sum(served.values()) == 40  # each request answered exactly once
        assert served["a"] > 0 and served["b"] > 0


def test_close_fails_waiting_requests_and_deletes_the_reply_stream(grid: Grid, unique_name: str) -> None:
    requester = Requester(grid, StreamConfig(unique_name))
    reply_stream = requester.reply_stream
    assert grid.map(STREAMS_MAP).get(reply_stream) is not None
    future = requester.request_async(b"nobody answers", timeout_ms=60_000)
    requester.close()
    with pytest.raises(RequestError, match="was closed"):
        future.result(5)
    assert grid.map(STREAMS_MAP).get(reply_stream) is None
    with pytest.raises(RequestError, match="is closed"):
        requester.request_async(b"after close")
