"""build_app(config, backend): the Starlette app, its routes from the generated table, error
handling and middleware."""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import quote

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kiln import metrics
from kiln.api._generated.routes import ROUTES
from kiln.api.auth import ApiKeyMiddleware
from kiln.api.backend import Backend
from kiln.api.errors import ApiError
from kiln.api.handlers import HANDLERS, Endpoint
from kiln.api.request_logging import RequestLogMiddleware
from kiln.api.state import AppState
from kiln.config import ServerConfig

log = logging.getLogger("kiln.api")

REQUEST_ID = "x-request-id"


class _HttpMiddleware:
    """Passes anything but HTTP straight through; subclasses handle HTTP in ``http``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.http(scope, receive, send)

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        raise NotImplementedError


class RequestIdMiddleware(_HttpMiddleware):
    """Every response carries X-Request-Id: the client's (if sane) or a fresh one."""

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        rid = ""
        for key, value in scope.get("headers", []):
            if key == b"x-request-id":
                rid = value.decode("latin-1")
                break
        given = bool(rid) and len(rid) <= 200 and rid.isprintable()
        if not given:
            rid = uuid.uuid4().hex
        state = scope.setdefault("state", {})
        state["request_id"], state["request_id_given"] = rid, given

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [h for h in message.get("headers", []) if h[0] != b"x-request-id"]
                # a handler may have adopted the body's request_id (state.claim_request_id)
                sent = str(state.get("request_id") or rid)
                headers.append((b"x-request-id", _header_value(sent)))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_id)


def _header_value(text: str) -> bytes:
    """``text`` as a header value: as it is when it is printable ASCII, else its UTF-8
    percent-encoded (a body's request_id may hold any character; a header cannot)."""
    if text.isascii() and text.isprintable():
        return text.encode("ascii")
    return quote(text, safe="").encode("ascii")


class InternalErrorMiddleware(_HttpMiddleware):
    """An unexpected exception becomes the 500 envelope here, inside the request-id and metrics
    middleware, so the reply carries X-Request-Id and the connection stays usable (Starlette's
    own last-resort handler sits outside every middleware and re-raises to the server)."""

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def send_tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, send_tracked)
        except Exception:
            log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            if started:  # part of a response is out: nothing well-formed can follow
                raise
            err = _error_response(ApiError(500, "internal_error", "internal server error"),
                                  scope.get("path", ""))
            await err(scope, receive, send)


class MetricsMiddleware(_HttpMiddleware):
    """Counts requests by route template, method and status, and times them."""

    def __init__(self, app: ASGIApp, templates: list[tuple[re.Pattern[str], str]]) -> None:
        super().__init__(app)
        self.templates = templates

    def route_of(self, path: str) -> str:
        for pattern, template in self.templates:
            if pattern.fullmatch(path):
                return template
        return "other"

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self.route_of(scope.get("path", ""))
        started = time.perf_counter()
        status = 500

        async def send_counted(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_counted)
        finally:
            metrics.REQUESTS.labels(route=route, method=scope.get("method", ""), status=str(status)).inc()
            metrics.HTTP_LATENCY.labels(route=route).observe(time.perf_counter() - started)


def _templates() -> list[tuple[re.Pattern[str], str]]:
    out = []
    for route in ROUTES:
        pattern = re.sub(r"\\{[^}]+\\}", ".+", re.escape(route.path))
        out.append((re.compile(pattern), route.path))
    return out


def _error_response(err: ApiError, path: str) -> Response:
    return Response(err.body_for(path), status_code=err.status, media_type="application/json",
                    headers=err.headers)


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return _error_response(exc, request.url.path)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        err = ApiError(404, "not_found", f"no route for {request.method} {request.url.path}")
    elif exc.status_code == 405:
        err = ApiError(
            405, "method_not_allowed", f"method {request.method} not allowed on {request.url.path}"
        )
        err.headers.update(exc.headers or {})
    else:
        err = ApiError(exc.status_code, "http_error", str(exc.detail))
    return _error_response(err, request.url.path)


def _routes(state: AppState) -> list[Route]:
    """One Starlette route per path (its 405 then lists every method the path has), in the
    table's order, each method to its handler."""
    by_path: dict[str, dict[str, Endpoint]] = {}
    names: dict[str, str] = {}
    for route in ROUTES:
        endpoint: Endpoint | None = HANDLERS.get((route.method, route.path))
        if endpoint is None:
            raise RuntimeError(f"no handler for {route.method} {route.path}")
        by_path.setdefault(route.path, {})[route.method] = endpoint
        names.setdefault(route.path, route.operation_id)
    routes = []
    for template, methods in by_path.items():
        # path parameters take the rest of the path, so "a/b" reaches the handler (and its 400)
        path = re.sub(r"{([^}:]+)}", r"{\1:path}", template)
        routes.append(Route(path, _by_method(methods), methods=list(methods),
                            name=names[template]))
    return routes


def _by_method(methods: dict[str, Endpoint]) -> Endpoint:
    if len(methods) == 1:
        return next(iter(methods.values()))

    async def endpoint(request: Request) -> Response:
        method = "GET" if request.method == "HEAD" else request.method  # Starlette's HEAD
        return await methods[method](request)

    return endpoint


def build_app(config: ServerConfig, backend: Backend) -> Starlette:
    state = AppState(config=config, backend=backend)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        backend.start()
        try:
            yield
        finally:
            backend.shutdown()
            if state.request_log is not None:  # after uvicorn's drain: every line written
                state.request_log.close()

    app = Starlette(
        routes=_routes(state),
        exception_handlers={
            ApiError: _api_error,
            HTTPException: _http_error,
        },
        lifespan=lifespan,
    )
    app.state.kiln = state
    app.add_middleware(InternalErrorMiddleware)  # innermost of ours: a 500 passes the rest
    if state.request_log is not None:  # sees what the client gets, 500s included
        app.add_middleware(RequestLogMiddleware, log=state.request_log)
    if config.api_keys:
        app.add_middleware(
            ApiKeyMiddleware, keys=config.api_keys, protect_metrics=config.metrics_require_auth
        )
    app.add_middleware(RequestIdMiddleware)  # 401s carry X-Request-Id too
    app.add_middleware(MetricsMiddleware, templates=_templates())  # outermost: counts everything
    return app
