"""The FastAPI app: routes (native and OpenAI), API-key check, and errors in one format."""

from __future__ import annotations

import hmac
import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from radixgen.runtime.server import native_api, openai_api
from radixgen.runtime.server.errors import RequestError, error_response
from radixgen.runtime.server.tokenizer_manager import TokenizerManager

logger = logging.getLogger(__name__)

# Load balancers and orchestrators probe liveness without credentials.
PATHS_WITHOUT_API_KEY = frozenset({"/health"})


class ApiKeyMiddleware:
    """Refuses (401) requests without the server's key, except on `/health` (and `/metrics`
    with `--metrics-no-auth`).

    The key comes as `Authorization: Bearer KEY` (what the openai client sends) or
    `X-API-Key: KEY`. The comparison takes constant time, so response timing does not leak
    how much of a guess was right.
    """

    def __init__(self, app: ASGIApp, api_key: str, open_paths: frozenset[str]):
        self.app = app
        self.api_key = api_key.encode()
        self.open_paths = open_paths  # served without the key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        authorization = headers.get("authorization", "")
        scheme, _, token = authorization.partition(" ")
        given = token.strip() if scheme.lower() == "bearer" else headers.get("x-api-key", "")
        if not hmac.compare_digest(given.encode(), self.api_key):
            message = "missing or invalid API key" if given else "an API key is required"
            response = error_response(message, 401)
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def create_app(manager: TokenizerManager, *, api_key: str | None, process_ids: dict) -> FastAPI:
    """Builds the app around a started-up tokenizer manager.

    Args:
        manager: routes requests to the scheduler; started with the app's event loop.
        api_key: required on every endpoint except /health when set.
        process_ids: pids of the server's processes, reported by /get_server_info.
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        manager.start()
        yield
        await manager.stop()

    app = FastAPI(title="radixgen", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.tokenizer_manager = manager
    app.state.process_ids = process_ids
    app.include_router(native_api.router)
    app.include_router(openai_api.router)
    if api_key:
        open_paths = PATHS_WITHOUT_API_KEY
        if manager.server_args.metrics_no_auth:  # for Prometheus scrapers without the key
            open_paths = open_paths | {"/metrics"}
        app.add_middleware(ApiKeyMiddleware, api_key=api_key, open_paths=open_paths)

    @app.exception_handler(RequestError)
    async def on_request_error(request: Request, error: RequestError):
        return error_response(error.message, error.status_code, error.param, error.code)

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, error: RequestValidationError):
        return error_response(f"invalid request: {error.errors()}", 400)

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, error: StarletteHTTPException):
        return error_response(str(error.detail), error.status_code)

    @app.exception_handler(Exception)
    async def on_unexpected_error(request: Request, error: Exception):
        logger.exception("unhandled error on %s", request.url.path)
        return error_response(f"internal error: {type(error).__name__}: {error}", 500)

    return app
