"""The console's ASGI application: pages and JSON endpoints over one grid connection (Starlette; ``starlette`` is
the ``console`` extra, imported only here and by ``meteor console``).

Handlers are plain functions: Starlette runs them on its thread pool, so the grid's blocking calls never stall
the event loop. A grid error becomes a JSON error (404 for an unknown stream, 400 for a bad parameter, 502 for
the grid failing) or an error page; the message is the library's own, which names no credentials.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from importlib import resources
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from meteor_spark.console import pages
from meteor_spark.console.history import LagHistory, Rates
from meteor_spark.console.readmodel import (
    dead_letters_view,
    group_view,
    groups_index,
    open_transactions,
    streams_view,
)
from meteor_spark.console.sampler import Sampler
from meteor_spark.console.security import Access, AccessMiddleware, check_action
from meteor_spark.console.tail import TailFilter, parse_cursor, tail
from meteor_spark.errors import ConfigError, MeteorError, RedriveError, StreamNotFoundError
from meteor_spark.grid.client import Grid
from meteor_spark.grid.streams import open_stream

_STATIC = {"console.js": "text/javascript", "console.css": "text/css"}


def _status_of(exc: MeteorError) -> int:
    if isinstance(exc, StreamNotFoundError):
        return 404
    if isinstance(exc, ConfigError):
        return 400
    if isinstance(exc, RedriveError):
        return 409  # another redrive of the same stream got there first: pressing again later settles it
    return 502


class Console:
    """The state behind the routes: the grid, the access rules, the lag history and rates, the sampler."""

    def __init__(self, grid: Grid, access: Access, *, sample_s: float = 2.0, history_points: int = 300) -> None:
        self.grid = grid
        self.access = access
        self.history = LagHistory(points=history_points)
        self.rates = Rates()
        self.sampler = Sampler(grid, self.history, self.rates, sample_s)

    # ---------------------------------------------------------------------------------------------- JSON

    def _json(self, build: Callable[[], Any]) -> Response:
        try:
            return JSONResponse(build())
        except MeteorError as exc:
            return JSONResponse({"error": str(exc)}, status_code=_status_of(exc))

    def api_streams(self, request: Request) -> Response:
        return self._json(lambda: streams_view(self.grid, self.rates))

    def api_groups(self, request: Request) -> Response:
        return self._json(lambda: groups_index(self.grid))

    def api_group(self, request: Request) -> Response:
        stream, group = request.path_params["stream"], request.path_params["group"]
        return self._json(lambda: group_view(self.grid, stream, group, self.history))

    def api_tail(self, request: Request) -> Response:
        def build() -> Any:
            info = open_stream(self.grid, request.path_params["stream"], create=False)
            q = request.query_params
            selection = TailFilter.parse(info, q.get("key"), q.get("topic"), q.get("lane"))
            return tail(self.grid, info, parse_cursor(info, q.get("cursor")), selection)

        return self._json(build)

    def api_dlq(self, request: Request) -> Response:
        return self._json(lambda: dead_letters_view(self.grid, request.path_params["stream"]))

    def api_txns(self, request: Request) -> Response:
        return self._json(lambda: open_transactions(self.grid))

    def api_redrive(self, request: Request) -> Response:
        """The one action: redrive every dead letter of the stream not redriven yet (once each, as ``meteor dlq
        redrive`` does)."""
        from meteor_spark.consumer.redrive import RedriveFilter, redrive

        refused = check_action(self.access, request.method, {k.lower(): v for k, v in request.headers.items()})
        if refused is not None:
            return JSONResponse({"error": refused[1]}, status_code=refused[0])

        def build() -> Any:
            info = open_stream(self.grid, request.path_params["stream"], create=False)
            report = redrive(self.grid, info, RedriveFilter())
            return {
                "stream": info.name,
                "matched": report.matched,
                "already": report.already,
                "redriven": report.redriven,
                "no_source": report.no_source,
                "not_redrivable": report.not_redrivable,
                "per_source": report.per_source,
            }

        return self._json(build)

    # --------------------------------------------------------------------------------------------- pages

    def _page(self, title: str, build: Callable[[], str]) -> Response:
        try:
            return HTMLResponse(build())
        except MeteorError as exc:
            return HTMLResponse(pages.error_page(title, str(exc), self.access), status_code=_status_of(exc))

    def page_streams(self, request: Request) -> Response:
        return self._page("Streams", lambda: pages.streams_page(streams_view(self.grid, self.rates), self.access))

    def page_stream(self, request: Request) -> Response:
        name = request.path_params["stream"]

        def build() -> str:
            rows = [s for s in streams_view(self.grid, self.rates) if s["name"] == name]
            if not rows:
                open_stream(self.grid, name, create=False)  # raises StreamNotFoundError naming the stream
            return pages.stream_page(rows[0], self.access)

        return self._page(f"Stream {name}", build)

    def page_groups(self, request: Request) -> Response:
        return self._page("Groups", lambda: pages.groups_page(groups_index(self.grid), self.access))

    def page_group(self, request: Request) -> Response:
        stream, group = request.path_params["stream"], request.path_params["group"]
        return self._page(
            f"Group {group}", lambda: pages.group_page(group_view(self.grid, stream, group, self.history), self.access)
        )

    def page_dlq_index(self, request: Request) -> Response:
        return self._page(
            "Dead letters", lambda: pages.dlq_index_page(streams_view(self.grid, self.rates), self.access)
        )

    def page_dlq(self, request: Request) -> Response:
        name = request.path_params["stream"]
        return self._page(
            f"Dead letters of {name}", lambda: pages.dlq_page(dead_letters_view(self.grid, name), self.access)
        )

    def page_txns(self, request: Request) -> Response:
        return self._page("Open transactions", lambda: pages.txns_page(open_transactions(self.grid), self.access))

    def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in _STATIC:
            return JSONResponse({"error": f"no static file {name!r}"}, status_code=404)
        text = resources.files("meteor_spark.console").joinpath("static", name).read_text("utf-8")
        return Response(text, media_type=_STATIC[name], headers={"cache-control": "no-cache"})

    def routes(self) -> list[Route]:
        return [
            Route("/", self.page_streams),
            Route("/streams/{stream}", self.page_stream),
            Route("/groups", self.page_groups),
            Route("/groups/{stream}/{group}", self.page_group),
            Route("/dlq", self.page_dlq_index),
            Route("/dlq/{stream}", self.page_dlq),
            Route("/txns", self.page_txns),
            Route("/static/{name}", self.static),
            Route("/api/streams", self.api_streams),
            Route("/api/groups", self.api_groups),
            Route("/api/groups/{stream}/{group}", self.api_group),
            Route("/api/tail/{stream}", self.api_tail),
            Route("/api/dlq/{stream}", self.api_dlq),
            Route("/api/dlq/{stream}/redrive", self.api_redrive, methods=["GET", "POST"]),
            Route("/api/txns", self.api_txns),
        ]


def build_app(console: Console) -> Starlette:
    """The ASGI app: the routes behind the access middleware; the sampler runs while the app is served."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        console.sampler.start()
        try:
            yield
        finally:
            console.sampler.stop()

    return Starlette(
        routes=console.routes(),
        middleware=[Middleware(AccessMiddleware, access=console.access)],
        lifespan=lifespan,
    )
