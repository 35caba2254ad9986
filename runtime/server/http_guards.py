"""Transport-level guards of the HTTP server: a body-size limit and a header-read timeout.

Both act before a route runs, so no handler ever sees an oversized body and no socket can be
held open by a client that never finishes its headers (slowloris).
"""

from __future__ import annotations

import asyncio
import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from radixgen.runtime.server.errors import error_response

logger = logging.getLogger(__name__)


class ClientDisconnected(Exception):
    """The client went away while its request body was being read."""


class BodyLimitMiddleware:
    """Reads each request body up front, refusing (413) one larger than `max_bytes`.

    A declared `Content-Length` over the limit is refused before a byte is read; a chunked
    body is counted as it arrives, and reading stops at the limit, so memory stays bounded.
    The app then gets the body from memory. A client that disconnects mid-body is an
    ordinary abort: logged at INFO, nothing else runs.
    """

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._refuse(scope, receive, send, f"{declared} bytes")
            return
        try:
            body = await self._read_body(receive)
        except ClientDisconnected:
            logger.info("client disconnected while sending %s %s", scope["method"], scope["path"])
            return
        if body is None:
            await self._refuse(scope, receive, send, f"more than {self.max_bytes} bytes")
            return
        await self.app(scope, _replay(body, receive), send)

    async def _read_body(self, receive: Receive) -> bytes | None:
        """The whole body, or None once it exceeds the limit."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientDisconnected
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, size: str) -> None:
        message = (
            f"the request body ({size}) exceeds the server's limit of {self.max_bytes} bytes "
            "(--max-request-bytes)"
        )
        await error_response(message, 413)(scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        # After the body: what the server says next (a disconnect, while streaming).
        return await receive()

    return replay


def header_timeout_protocol(timeout_s: float) -> type[H11Protocol]:
    """An h11 protocol class that closes connections whose request headers take too long.

    uvicorn's keep-alive timer runs only after a response, so a client that opens a socket
    and trickles partial headers would hold it forever. This timer runs from the moment the
    connection opens (and again after each response) until a request's headers are complete.
    """

    class HeaderTimeoutProtocol(H11Protocol):
        header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm_header_timer()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            # `cycle` exists once h11 parsed a complete request head.
            if self.cycle is not None and not self.cycle.response_complete:
                self._cancel_header_timer()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm_header_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_header_timer()
            super().connection_lost(exc)

        def _arm_header_timer(self) -> None:
            self._cancel_header_timer()
            self.header_timer = self.loop.call_later(timeout_s, self._on_header_timeout)

        def _cancel_header_timer(self) -> None:
            if self.header_timer is not None:
                self.header_timer.cancel()
                self.header_timer = None

        def _on_header_timeout(self) -> None:
            self.header_timer = None
            if self.cycle is not None and not self.cycle.response_complete:
                return  # a request is being served: its headers did arrive
            logger.info("closing a connection whose request headers took over %.1f s", timeout_s)
            self.transport.close()

    return HeaderTimeoutProtocol
