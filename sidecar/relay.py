"""Relay an upstream event stream to the client as it arrives (pure ASGI)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

import anyio
import httpx
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from sidecar.sse import EventSplitter
from sidecar.usage import Usage


class Tap(Protocol):
    """Reads usage from events and decides what each forwarded event looks like."""

    usage: Usage

    def on_event(self, event: bytes) -> bytes | None: ...


class SSERelay(Response):
    """A pure ASGI response that relays an upstream event stream as it arrives.

    Each complete SSE event is sent as soon as it is whole (the events of one upstream read in
    one send); an incomplete event is all that is ever held back. A client
    disconnect cancels the pump and closes the upstream response, which cancels the upstream
    request; the exchange is recorded exactly once, whatever ended it."""

    def __init__(
        self,
        resp: httpx.Response,
        tap: Tap,
        deadline: float,
        headers: dict[str, str],
        on_done: Callable[[str, Usage], None],
    ) -> None:
        self.resp, self.tap, self.deadline, self.on_done = resp, tap, deadline, on_done
        self.outcome = "cancelled"
        self.status_code = resp.status_code
        self.background = None
        self._closed = False
        self.raw_headers = [
            (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._watch_disconnect, receive, tg.cancel_scope)
                try:
                    await self._pump(send)
                except OSError:  # the client went away while we were sending
                    self.outcome = "cancelled"
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await self._close()

    async def _close(self) -> None:
        """Close the upstream response and record the exchange, exactly once."""
        if self._closed:
            return
        self._closed = True
        await self.resp.aclose()
        self.on_done(self.outcome, self.tap.usage)

    @staticmethod
    async def _watch_disconnect(receive: Receive, scope: anyio.CancelScope) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                scope.cancel()
                return

    async def _pump(self, send: Send) -> None:
        tap = self.tap
        await send(
            {
                "type": "http.response.start",
                "status": self.resp.status_code,
                "headers": self.raw_headers,
            }
        )
        splitter = EventSplitter()
        try:
            async with asyncio.timeout(max(0.0, self.deadline - time.monotonic())):
                async for chunk in self.resp.aiter_bytes():
                    # the events that arrived together leave together: one send per upstream
                    # read, not per event (each send is a syscall and an ASGI round trip)
                    outs = [out for event in splitter.feed(chunk) if (out := tap.on_event(event))]
                    if outs:
                        body = outs[0] if len(outs) == 1 else b"".join(outs)
                        await send({"type": "http.response.body", "body": body, "more_body": True})
                rest = splitter.flush()
                out = tap.on_event(rest) if rest else None
                if out:
                    await send({"type": "http.response.body", "body": out, "more_body": True})
            self.outcome = "ok"
        except (TimeoutError, httpx.TimeoutException):
            self.outcome = "timeout"
        except httpx.TransportError:
            self.outcome = "unreachable"
        # recorded before the client sees the end, so metrics are complete when it does
        with anyio.CancelScope(shield=True):
            await self._close()
        await send({"type": "http.response.body", "body": b"", "more_body": False})
