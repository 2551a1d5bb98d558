"""The console's pieces that need no grid: the bounded history and rates, the access rules (token, loopback, Host
header, actions), the access middleware over a bare ASGI app, the tail's cursor and filter checks, and the
command's refusals of bad flags."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest

from meteor_spark.cli.main import main
from meteor_spark.console.history import LagHistory, Rates
from meteor_spark.console.security import COOKIE, Access, AccessMiddleware, check_action, is_loopback
from meteor_spark.console.tail import TailFilter, format_cursor, parse_cursor
from meteor_spark.errors import ConfigError
from meteor_spark.grid.streams import StreamConfig, StreamInfo


def test_the_lag_history_keeps_a_bounded_number_of_points_and_series() -> None:
    history = LagHistory(points=3, series=2)
    for at in range(10):
        history.add("s", "g", 0, at, at * 2)
    assert [(p.at_ms, p.items) for p in history.of_group("s", "g")[0]] == [(7, 14), (8, 16), (9, 18)]
    history.add("s", "g", 1, 0, 1)
    history.add("s", "h", 0, 0, 1)  # a third series: the least recently sampled (s, g, 0) goes
    assert sorted(history.of_group("s", "g")) == [1] and len(history) == 2
    with pytest.raises(ConfigError, match="points"):
        LagHistory(points=1)


def test_rates_come_from_the_last_two_samples() -> None:
    rates = Rates(max_streams=1)
    rates.add("a", 1_000, 10)
    assert rates.per_second("a") is None  # one sample: no rate yet
    rates.add("a", 3_000, 50)
    assert rates.per_second("a") == 20.0
    rates.add("b", 0, 0)  # a second stream evicts the first
    assert rates.per_second("a") is None


def test_access_rules_for_loopback_and_other_binds() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("127.1.2.3") and is_loopback("[::1]") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.5") and not is_loopback("example.com")
    plain = Access.decide("127.0.0.1", None, False)
    assert plain.token is None and plain.accepts({}) and not plain.generated
    exposed = Access.decide("0.0.0.0", None, True)
    assert exposed.generated and exposed.token and len(exposed.token) >= 40
    with pytest.raises(ConfigError, match="--token has 5 characters"):
        Access.decide("0.0.0.0", "short", False)
    with pytest.raises(ConfigError, match="empty"):
        Access.decide("127.0.0.1", " ", False)
    with pytest.raises(ConfigError, match="letters, digits"):
        Access.decide("127.0.0.1", "a token; with=cookie syntax", False)
    token = "t" * 20
    given = Access.decide("10.0.0.1", token, False)
    assert given.accepts({"authorization": f"Bearer {token}"}) and given.accepts({"x-meteor-token": token})
    assert given.accepts({"cookie": f"other=1; {COOKIE}={token}"})
    assert not given.accepts({"authorization": "Bearer nope"}) and not given.accepts({"cookie": "garbage;;="})
    assert plain.host_allowed({"host": "127.0.0.1:8321"}) and plain.host_allowed({"host": "localhost"})
    assert plain.host_allowed({"host": "[::1]:8321"}) and not plain.host_allowed({"host": "evil.test:8321"})
    assert given.host_allowed({"host": "console.example:8321"})  # bound off loopback: any name
    assert check_action(plain, "POST", {"x-meteor-action": "redrive"}) == (
        403,
        "the console is read-only: start it with --allow-actions to redrive dead letters",
    )
    assert check_action(exposed, "POST", {"x-meteor-action": "redrive"}) is None
    assert check_action(exposed, "POST", {})[0] == 403  # type: ignore[index]
    assert check_action(exposed, "GET", {"x-meteor-action": "redrive"})[0] == 403  # type: ignore[index]


def _call(access: Access, path: str, query: str = "", headers: dict[str, str] | None = None) -> dict[str, Any]:
    """One request through the middleware in front of an app that answers 200; the status and headers sent."""
    sent: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: Any) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "path": path,
        "query_string": query.encode(),
        "headers": [(k.encode(), v.encode()) for k, v in {"host": "127.0.0.1:1", **(headers or {})}.items()],
    }
    asyncio.run(AccessMiddleware(app, access)(scope, receive, send))
    start = sent[0]
    return {"status": start["status"], "headers": {k.decode(): v.decode() for k, v in start["headers"]}}


def test_the_middleware_asks_for_the_token_and_logs_in_by_cookie() -> None:
    token = "a-token-long-enough-for-anywhere"
    access = Access.decide("127.0.0.1", token, False)
    assert _call(access, "/groups")["status"] == 401
    assert _call(access, "/groups", "token=wrong")["status"] == 401
    login = _call(access, "/groups", f"token={token}&x=1")
    assert login["status"] == 303 and login["headers"]["location"] == "/groups?x=1"  # the token left out
    cookie = login["headers"]["set-cookie"]
    assert cookie.startswith(f"{COOKIE}={token};") and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert _call(access, "/groups", headers={"cookie": cookie.split(";")[0]})["status"] == 200
    assert _call(access, "/", headers={"host": "rebound.example:80", "x-meteor-token": token})["status"] == 403
    assert _call(Access.decide("127.0.0.1", None, False), "/")["status"] == 200


def test_the_tail_checks_its_cursor_lane_and_topic() -> None:
    info = StreamInfo(StreamConfig("s", lanes=2), 0, 2, ("r0", "r1"))
    assert parse_cursor(info, None) is None and parse_cursor(info, "") is None
    assert parse_cursor(info, "0:5,1:7") == {0: 5, 1: 7}
    assert format_cursor({1: 7, 0: 5}) == "0:5,1:7"
    with pytest.raises(ConfigError, match="cursor"):
        parse_cursor(info, "zero:5")
    with pytest.raises(ConfigError, match="lane"):
        parse_cursor(info, "5:1")
    assert TailFilter.parse(info, "", "", "") == TailFilter()
    assert TailFilter.parse(info, "k", "orders.#", "1") == TailFilter("k", "orders.#", 1)
    with pytest.raises(ConfigError, match="lane 'x'"):
        TailFilter.parse(info, None, None, "x")
    with pytest.raises(ConfigError, match="a wildcard is a whole word"):
        TailFilter.parse(info, None, "orders.x*", None)


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--port", "70000"], "--port"),
        (["--sample-interval", "0"], "--sample-interval"),
        (["--history-points", "1"], "--history-points"),
        (["--host", "0.0.0.0", "--token", "short"], "--token has 5 characters"),
    ],
)
def test_the_command_refuses_bad_flags_by_name(
    flags: list[str], fragment: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("METEOR_CONSOLE_TOKEN", raising=False)
    assert main(["console", *flags]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("meteor console: error:") and fragment in lines[0], lines


def test_without_the_console_extra_the_command_names_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # as if uvicorn were not installed
    assert main(["console"]) == 1
    assert capsys.readouterr().err.strip() == (
        "meteor console: error: meteor console needs the console extra: pip install 'meteor-spark[console]'"
    )
