"""Relay an upstream event stream to the client as it arrives (pure ASGI), split into events
by the format's framing (Server-Sent Events, or AWS event-stream frames)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Protocol

import anyio
import httpx
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from context_ceiling.core.errors import CeilingError
from context_ceiling.formats.base import Usage
from context_ceiling.formats.framing import SSE, EventTooLarge, Framing, Splitter
from context_ceiling.sidecar.drain import Drain
from context_ceiling.sidecar.outcomes import Outcome, failure_of
from context_ceiling.sidecar.upstream.client import body_chunks


class Tap(Protocol):
    """Reads usage from events and decides what each forwarded event looks like."""

    @property
    def usage(self) -> Usage: ...

    @property
    def complete(self) -> bool:
        """The protocol's end of a whole stream was seen."""
        ...

    @property
    def upstream_error(self) -> bool:
        """The upstream reported its own failure in the stream."""
        ...

    @property
    def whole_reads(self) -> bool:
        """Whether a read of whole events goes to :meth:`needed` and :meth:`plain` (else a
        single event may pass :meth:`on_chunk`)."""
        ...

    def needed(self, chunk: bytes) -> int:
        """In a read of whole events, the offset of the first byte an event this tap reads may
        hold (no event ending before it is read); -1 when it reads none of them."""
        ...

    def plain(self, chunk: bytes) -> bytes:
        """The bytes to forward for whole events this tap does not read."""
        ...

    def on_chunk(self, chunk: bytes) -> bytes | None:
        """The bytes to forward for a read of whole events when none of them needs
        :meth:`on_event` (None: split it and pass each event there)."""
        ...

    def on_event(self, event: bytes) -> bytes | None: ...

    def error_event(self, message: str) -> bytes: ...


def forward_read(splitter: Splitter, tap: Tap, chunk: bytes) -> bytes:
    """What one upstream read becomes for the client: its complete events as the tap forwards
    them (an incomplete tail is held back in ``splitter``). A read of whole events is not split
    into events where the tap reads none of them: most reads are one plain content delta, and a
    whole answer that arrived at once is cut only around the few events the tap reads
    (:func:`_parted`), so only those go through ``on_event``, in order."""
    if splitter.idle and splitter.whole(chunk):
        if tap.whole_reads:
            return _parted(splitter, tap, chunk)
        if (out := tap.on_chunk(chunk)) is not None:
            return out
    return _events(splitter, tap, chunk)


def _parted(splitter: Splitter, tap: Tap, chunk: bytes) -> bytes:
    """A read of whole events: the events before the first one the tap may read
    (``tap.needed``, a byte scan) forwarded as one (``tap.plain``), that event (as the
    splitter bounds it) through ``on_event``, and the rest again, scanned afresh (reading an
    event changes what the tap needs: the first carries the model). One scan per event read,
    however many plain events lie between them."""
    at = tap.needed(chunk)
    if at < 0:  # most reads: one plain content delta
        return tap.plain(chunk)
    parts: list[bytes] = []
    while at >= 0:
        start, end = splitter.around(chunk, at)
        if start:
            parts.append(tap.plain(chunk[:start]))
        parts.append(_events(splitter, tap, chunk[start:end]))
        chunk = chunk[end:]
        at = tap.needed(chunk) if chunk else -1
    if chunk:
        parts.append(tap.plain(chunk))
    return b"".join(parts)


def _events(splitter: Splitter, tap: Tap, chunk: bytes) -> bytes:
    outs = [out for event in splitter.feed(chunk) if (out := tap.on_event(event))]
    return outs[0] if len(outs) == 1 else b"".join(outs)


class StreamFailed(CeilingError):
    """Raised after the error event to abort the connection without the final chunk: the
    client's HTTP library then sees an incomplete body and raises, instead of taking a truncated
    answer for a whole one."""


class StreamRelay(Response):
    """A pure ASGI response that relays an upstream event stream as it arrives.

    Each complete event (as the format's :class:`~context_ceiling.formats.framing.Framing`
    splits them) is sent as soon as it is whole (the events of one upstream read in
    one send); an incomplete event is all that is ever held back (up to ``max_event_bytes``). A
    client disconnect cancels the pump and closes the upstream response, which cancels the
    upstream request; the exchange is recorded exactly once, whatever ended it.

    A stream that fails after the headers (a reset, a read or total timeout, an event cut off, an
    event over the size cap, or an end without the protocol's last event: ``[DONE]``,
    ``message_stop``) ends the way the protocol says a failure ends: a provider-shaped error
    event, then the connection is aborted without the final chunk, and the exchange is recorded
    with that outcome. A stream in which the upstream itself reported an error ends as the
    upstream ended it."""

    def __init__(
        self,
        resp: httpx.Response,
        tap: Tap,
        deadline: float,
        headers: dict[str, str],
        on_done: Callable[[Outcome, Usage], None],
        max_event_bytes: int = 8 * 1024 * 1024,
        drain: Drain | None = None,
        on_first: Callable[[], None] | None = None,
        framing: Framing = SSE,
        keep: Callable[[bytes], None] | None = None,
    ) -> None:
        self.on_first = on_first
        #: what keeps each upstream read as it arrives (a captured or checked stream's
        #: ``Collector``): one call per read, not per event
        self.keep = keep
        #: the reads relayed with content (the conventions' time per output chunk: the
        #: stream's time after its first chunk over the chunks after it)
        self.chunks = 0
        self.framing = framing
        self.resp, self.tap, self.deadline, self.on_done = resp, tap, deadline, on_done
        self.drain = drain
        self._scope: anyio.CancelScope | None = None
        self._cut = False
        self.max_event_bytes = max_event_bytes
        self.outcome: Outcome = "cancelled"
        self.status_code = resp.status_code
        self.background = None
        self._closed = False
        self.raw_headers = [
            (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()
        ]

    def cut(self) -> None:
        """End this stream now (the sidecar is shutting down): the pump stops, and the client
        gets the provider-shaped error event and an aborted body."""
        self._cut = True
        if self._scope is not None:
            self._scope.cancel()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        failed = False
        if self.drain is not None:
            self.drain.streams.add(self)
        try:
            # The hang-up is delivered through an anyio cancel scope around the pump: anyio never
            # lands a scope's cancellation inside a transport's shielded clean-up; a bare
            # task.cancel() of the pump can, and under load that leaked upstream pool slots
            # (seen with httpcore's pool; tests/sidecar/test_serve_process.py, streams
            # cut at any moment, holds every transport to it). The watcher is a plain
            # task (it only waits on receive(), safe to cancel outright): a task group for it
            # costs more per stream than the whole watcher.
            with anyio.CancelScope() as cancel:
                self._scope = cancel
                watcher = asyncio.get_running_loop().create_task(
                    self._watch_disconnect(receive, cancel)
                )
                try:
                    await self._pump(send)
                except OSError:  # the client went away while we were sending
                    self.outcome = "cancelled"
                except StreamFailed:
                    failed = True
                finally:
                    watcher.cancel()
            if self._cut and not self._closed:
                self.outcome = "shutdown"
                with anyio.CancelScope(shield=True):
                    await self._close()
                    message = "context-ceiling is shutting down; the answer is incomplete"
                    with contextlib.suppress(OSError):
                        await send(
                            {
                                "type": "http.response.body",
                                "body": self.tap.error_event(message),
                                "more_body": True,
                            }
                        )
                failed = True
        finally:
            if self.drain is not None:
                self.drain.streams.discard(self)
            if not self._closed:  # the pump closes on every ending it reaches itself
                with anyio.CancelScope(shield=True):
                    await self._close()
        if failed:
            # returning without the final body makes the server close the connection mid-body
            # (uvicorn logs one line, "ASGI callable returned without completing response")
            return

    async def _close(self) -> None:
        """Close the upstream response and record the exchange, exactly once."""
        if self._closed:
            return
        self._closed = True
        await self.resp.aclose()
        if self.outcome == "cancelled" and self.tap.complete:
            # the client hung up after the protocol's last event (SDKs stop reading at
            # [DONE]): the exchange was complete, not cancelled
            self.outcome = "ok"
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
        splitter = self.framing.splitter(self.max_event_bytes)
        keep = self.keep
        failure = ""
        try:
            async with asyncio.timeout(max(0.0, self.deadline - time.monotonic())):
                async for chunk in body_chunks(self.resp):
                    # the events that arrived together leave together: one send per upstream
                    # read, not per event (each send is a syscall and an ASGI round trip)
                    if keep is not None:
                        keep(chunk)
                    body = forward_read(splitter, tap, chunk)
                    if body and self.on_first is not None:
                        self.on_first()  # the time to the first token
                        self.on_first = None
                    if body:
                        self.chunks += 1
                        await send({"type": "http.response.body", "body": body, "more_body": True})
            if splitter.flush():
                self.outcome, failure = "upstream_truncated", "the upstream closed mid-event"
            elif tap.complete or tap.upstream_error:
                self.outcome = "ok" if tap.complete else "upstream_5xx"
            else:
                self.outcome = "upstream_truncated"
                failure = "the upstream ended the stream before its last event"
        except EventTooLarge:
            self.outcome, failure = "upstream_truncated", "an upstream event exceeded the size cap"
        except (httpx.TransportError, TimeoutError) as exc:
            f = failure_of(exc)
            self.outcome, failure = f.outcome, f"{f.message} mid-stream"
        # recorded before the client sees the end, so metrics are complete when it does
        with anyio.CancelScope(shield=True):
            await self._close()
        if failure:
            await send(
                {
                    "type": "http.response.body",
                    "body": tap.error_event(
                        f"context-ceiling: {failure}; the answer is incomplete"
                    ),
                    "more_body": True,
                }
            )
            raise StreamFailed(failure)
        await send({"type": "http.response.body", "body": b"", "more_body": False})
