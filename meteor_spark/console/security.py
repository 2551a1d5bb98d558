"""Who may use the console and what it may do.

* Binding: loopback (127.0.0.0/8, ::1, localhost) by default. Any other address exposes the console to the
  network, so it then needs a token: the one given (``--token`` / ``METEOR_CONSOLE_TOKEN``, at least
  ``MIN_TOKEN_CHARS`` characters), or one generated and printed once at start.
* Requests: with a token, every request must carry it: the ``Authorization: Bearer`` or ``X-Meteor-Token``
  header, or the cookie a ``?token=`` login sets (HttpOnly, SameSite=Strict; the login redirects to the same path
  without the token, so it stays out of history and any log). Anything else is a 401. Compared in constant time.
* Actions (redrive): only when started with ``--allow-actions`` (else 403), only by POST, and only with the
  ``X-Meteor-Action`` header, which a page of another origin cannot add without a CORS preflight the console
  never answers: a console on loopback without a token is not redriven by any web page the browser opens.
* A console bound to loopback answers only requests addressed to a loopback host name (the Host header), so a
  DNS-rebinding page cannot read it through a name that resolves to 127.0.0.1.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import re
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qsl, urlencode

from meteor_spark.errors import ConfigError

#: A given token shorter than this is refused for a non-loopback bind (a generated one has 43 characters).
MIN_TOKEN_CHARS = 16
COOKIE = "meteor_console_token"
_TOKEN_CHARS = re.compile(r"[A-Za-z0-9._~+/=-]+")
ACTION_HEADER = "x-meteor-action"
LOOPBACK_NAMES = ("localhost",)

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``, brackets allowed) names this machine only."""
    name = host.strip("[]").lower()
    if name in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Access:
    """The console's access rules: the token asked for (None: none), whether actions are allowed, and whether the
    bind is loopback (then Host headers must be loopback names too)."""

    token: str | None
    allow_actions: bool
    loopback: bool
    generated: bool = False

    @classmethod
    def decide(cls, host: str, token: str | None, allow_actions: bool) -> Access:
        """The rules for binding ``host`` with ``token`` (from --token or the environment; None when neither).

        Raises:
            ConfigError: an empty token, or one shorter than ``MIN_TOKEN_CHARS`` for a non-loopback bind.
        """
        loopback = is_loopback(host)
        if token is not None and not token.strip():
            raise ConfigError("--token / METEOR_CONSOLE_TOKEN is empty: give a token, or leave both unset")
        if token is not None and not _TOKEN_CHARS.fullmatch(token):
            raise ConfigError(
                "--token / METEOR_CONSOLE_TOKEN may hold letters, digits and - . _ ~ + / = only (it travels in a "
                "cookie and a header); `python -c 'import secrets; print(secrets.token_urlsafe(32))'` makes one"
            )
        if token is not None and not loopback and len(token) < MIN_TOKEN_CHARS:
            raise ConfigError(
                f"--token has {len(token)} characters: binding {host} (not loopback) exposes the console to the "
                f"network, give at least {MIN_TOKEN_CHARS} (or leave it unset and one is generated)"
            )
        if token is None and not loopback:
            return cls(secrets.token_urlsafe(32), allow_actions, loopback, generated=True)
        return cls(token, allow_actions, loopback)

    def accepts(self, headers: dict[str, str]) -> bool:
        """Whether a request with these headers (lower-case names) carries the token (always, without one)."""
        if self.token is None:
            return True
        offered = headers.get("x-meteor-token")
        auth = headers.get("authorization", "")
        if offered is None and auth.lower().startswith("bearer "):
            offered = auth[7:].strip()
        if offered is None:
            cookie: SimpleCookie = SimpleCookie()
            try:
                cookie.load(headers.get("cookie", ""))
            except Exception:
                return False
            morsel = cookie.get(COOKIE)
            offered = None if morsel is None else morsel.value
        return offered is not None and hmac.compare_digest(offered.encode(), self.token.encode())

    def host_allowed(self, headers: dict[str, str]) -> bool:
        """A loopback console answers only requests addressed to a loopback name (DNS rebinding)."""
        if not self.loopback:
            return True
        host = headers.get("host", "")
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        return is_loopback(name)


async def _reply(send: Send, status: int, body: dict[str, Any], extra: list[tuple[bytes, bytes]] = ()) -> None:  # type: ignore[assignment]
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


class AccessMiddleware:
    """Applies ``Access`` to every HTTP request before the routes see it (pure ASGI: no framework needed)."""

    def __init__(self, app: App, access: Access) -> None:
        self.app = app
        self.access = access

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
        if not self.access.host_allowed(headers):
            await _reply(send, 403, {"error": "the console answers requests to a loopback host name only"})
            return
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        if self.access.token is not None and "token" in query:
            given = query.pop("token")
            if not hmac.compare_digest(given.encode(), self.access.token.encode()):
                await _reply(send, 401, {"error": "wrong token"})
                return
            location = scope.get("path", "/") + (f"?{urlencode(query)}" if query else "")
            cookie = f"{COOKIE}={self.access.token}; HttpOnly; SameSite=Strict; Path=/"
            await _reply(
                send,
                303,
                {"login": "ok"},
                [(b"location", location.encode()), (b"set-cookie", cookie.encode())],
            )
            return
        if not self.access.accepts(headers):
            await _reply(
                send,
                401,
                {
                    "error": "this console asks for its token: open it once with ?token=TOKEN, or send the header "
                    "'Authorization: Bearer TOKEN'"
                },
                [(b"www-authenticate", b"Bearer")],
            )
            return
        await self.app(scope, receive, send)


def check_action(access: Access, method: str, headers: dict[str, str]) -> tuple[int, str] | None:
    """None when an action request may run; else the status and why not (403: read-only or not from the page)."""
    if not access.allow_actions:
        return 403, "the console is read-only: start it with --allow-actions to redrive dead letters"
    if method != "POST" or ACTION_HEADER not in headers:
        return 403, f"actions are POST requests with the {ACTION_HEADER} header (the console's page sends them)"
    return None
