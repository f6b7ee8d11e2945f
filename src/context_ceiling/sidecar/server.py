"""How ``ceiling serve`` runs the app: uvicorn (uvloop, httptools) with the sidecar's limits.

uvicorn bounds idle keep-alive connections but neither a request whose headers never finish (a
slow-loris client holds its connection and buffer forever) nor the size of a request's head
(httptools buffers a header of any size: 150 connections sending 8 MiB each took a sidecar past
a gigabyte). :class:`HeaderDeadline` closes a connection whose request headers have not arrived
whole within ``limits.header_read_timeout``, and answers 431 and closes the connection as soon
as the request line and headers pass ``limits.max_header_bytes``, counted as they are read,
before the parser holds them. The body has its own deadline in the proxy
(``limits.body_read_timeout``, a 408). The protocol's own answers (a malformed request, the
connection limit) are JSON in the OpenAI error shape, as every other error the sidecar sends.

On shutdown uvicorn closes every connection with no response in progress, which drops a
request the client has already sent on a connection accepted a moment before, or half of whose
head has arrived. :meth:`HeaderDeadline.shutdown` closes only connections idle between requests;
a request still arriving is read and answered, and its connection closed after it.
:class:`SidecarServer` first takes the connections the kernel has already completed into a
listener's accept queue: closing the last copy of a listening socket resets them, so a client
whose connection was established a moment before the shutdown would see a reset instead of an
answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Any

import orjson
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from context_ceiling.sidecar.config import Settings


def _error(status: int, reason: str, message: str, kind: str) -> bytes:
    """A whole HTTP/1.1 response in the OpenAI error shape that closes the connection."""
    body = orjson.dumps({"error": {"message": message, "type": kind, "param": None, "code": None}})
    return (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode() + body


async def _busy(scope: Any, receive: Any, send: Any) -> None:
    """The answer past ``limits.max_connections``: a 503 in the error shape of the client's
    API (its path and the headers its SDK always sends tell which)."""
    from starlette.requests import Request

    from context_ceiling.sidecar.errors import error_response
    from context_ceiling.sidecar.upstream.passthrough import client_api

    response = error_response(
        client_api(Request(scope)), 503, "the sidecar is at its connection limit; retry"
    )
    response.headers["connection"] = "close"
    response.headers["retry-after"] = "1"
    await response(scope, receive, send)


class HeaderDeadline(HttpToolsProtocol):
    """httptools' protocol with a deadline from a connection's (or request's) first byte to the
    end of its headers, and a cap on the bytes of the request line and headers together."""

    header_timeout = 10.0
    max_head_bytes = 65536
    max_header_count = 100
    #: at shutdown, how long a connection that has sent nothing yet may take to send its first
    #: byte: a client that connected just before the listener closed is already sending
    first_byte_on_shutdown = 1.0
    _timer: asyncio.TimerHandle | None = None
    _last: asyncio.TimerHandle | None = None
    _in_head = True
    _draining = False
    _head_bytes = 0
    _head_lines = 0
    _tail = b""

    def _arm(self) -> None:
        if self._timer is None:
            self._timer = self.loop.call_later(self.header_timeout, self._expire)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timer = None
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._in_head:
            # count only the head: up to the blank line that ends it (a body may share the read)
            seen = self._tail + data
            end = seen.find(b"\r\n\r\n")
            part = len(data) if end < 0 else max(0, end + 4 - len(self._tail))
            self._head_bytes += part
            # lines of the head: the request line, one per header field, the blank line
            self._head_lines += (self._tail[-1:] + data[:part]).count(b"\r\n")
            self._tail = seen[-3:]
            if self._head_bytes > self.max_head_bytes:
                self._reject_head(
                    f"the request line and headers exceed {self.max_head_bytes} bytes"
                )
                return
            if self._head_lines - 2 > self.max_header_count:
                self._reject_head(
                    f"the request has more than {self.max_header_count} header fields"
                )
                return
        super().data_received(data)

    def _reject_head(self, why: str) -> None:
        self._disarm()
        self._in_head = False
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(
                _error(431, "Request Header Fields Too Large", why, "invalid_request_error")
            )
            self.transport.close()

    def send_400_response(self, msg: str) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(_error(400, "Bad Request", msg, "invalid_request_error"))
            self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        self._in_head, self._head_bytes, self._head_lines, self._tail = False, 0, 0, b""
        limit = self.limit_concurrency
        if limit is not None and (len(self.connections) >= limit or len(self.tasks) >= limit):
            app, self.app = self.app, _busy  # uvicorn's own answer here is plain text
            self.limit_concurrency = None
            try:
                super().on_headers_complete()
            finally:
                self.app, self.limit_concurrency = app, limit
        else:
            super().on_headers_complete()
        if self._draining and self.cycle is not None:
            self.cycle.keep_alive = False  # answered, then closed: the server is stopping

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head = True  # the next request on this connection starts with its head

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._last is not None:
            self._last.cancel()
        super().connection_lost(exc)

    def shutdown(self) -> None:
        """Close the connection if it is idle between requests; else answer the request under
        way (a response being written, or a request being read: the connection accepted but
        nothing read yet, or part of the head in) and close after it."""
        c = self.cycle
        if c is not None and (not c.response_complete or self._head_bytes == 0):
            super().shutdown()  # a response under way, or idle between requests
            return
        self._draining = True
        if self._head_bytes == 0 and self.cycle is None:
            self._last = self.loop.call_later(
                min(self.first_byte_on_shutdown, self.header_timeout), self._if_silent
            )

    def _if_silent(self) -> None:
        self._last = None
        if self._head_bytes == 0 and self.cycle is None:
            self._expire()


def _queued(listener: Any, most: int) -> list[socket.socket]:
    """The connections waiting in ``listener``'s accept queue (at most ``most``), accepted
    without blocking through a duplicate of its descriptor (the event loop's own socket object
    has no ``accept``; asyncio's and uvloop's differ)."""
    taken: list[socket.socket] = []
    with socket.socket(fileno=socket.dup(listener.fileno())) as dup:
        dup.setblocking(False)
        while len(taken) < most:
            try:
                conn, _ = dup.accept()
            except (BlockingIOError, InterruptedError):
                break
            except ConnectionAbortedError:  # the client gave up while queued
                continue
            except OSError:  # out of descriptors, a socket that is not a listener
                break
            conn.setblocking(False)
            taken.append(conn)
    return taken


class SidecarServer(uvicorn.Server):
    """uvicorn's server, shut down without resetting a connection the kernel has accepted.

    uvicorn's shutdown closes the listening sockets; connections that completed their handshake
    since the event loop last accepted are still in the kernel's queue, and closing the last
    copy of the socket resets them. Here they are taken first, in the same step as the close (no
    await between, so only a handshake completed in the instant between the last accept and the
    close can still be reset, where before it was any since the loop last accepted), and served like
    every connection open at the shutdown: a request already sent, or arriving within the
    protocol's first-byte wait, is answered, and the connection closed after it."""

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        taken: list[socket.socket] = []
        for server in self.servers:  # set by startup; shutdown runs only once it has started
            for listener in server.sockets:
                taken += _queued(listener, self.config.backlog)
            server.close()
        if taken:
            config, state = self.config, self.server_state
            app_state = self.lifespan.state

            def protocol() -> asyncio.Protocol:
                made: asyncio.Protocol = config.http_protocol_class(  # type: ignore[call-arg]
                    config=config, server_state=state, app_state=app_state
                )
                return made

            loop = asyncio.get_running_loop()
            opened = await asyncio.gather(
                *(loop.connect_accepted_socket(protocol, conn) for conn in taken),
                return_exceptions=True,
            )
            for conn, result in zip(taken, opened, strict=True):
                if isinstance(result, BaseException):  # reset by its client meanwhile
                    with contextlib.suppress(OSError):
                        conn.close()
        await super().shutdown(sockets)


def sockets_for(config: Any, admin_port: int | None) -> list[Any]:
    """The listening sockets: the traffic port's (uvicorn binds it), and the admin port's on
    the same host when one is set (``listen.admin_port``)."""
    import socket

    sockets = [config.bind_socket()]
    if admin_port is not None:
        family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
        admin = socket.socket(family, socket.SOCK_STREAM)
        admin.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        admin.bind((config.host, admin_port))
        admin.set_inheritable(True)
        sockets.append(admin)
    return sockets


def protocol_for(settings: Settings) -> type[HeaderDeadline]:
    """A protocol class carrying this config's header deadline (uvicorn takes a class)."""
    return type(
        "SidecarHttp",
        (HeaderDeadline,),
        {
            "header_timeout": settings.limits.header_read_timeout,
            "max_head_bytes": settings.limits.max_header_bytes,
            "max_header_count": settings.limits.max_header_count,
        },
    )


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """The uvicorn settings the sidecar runs with (``ceiling serve`` and the tests alike)."""
    return {
        "http": protocol_for(settings),
        "access_log": False,
        # one Date (uvicorn's, on every response) and at most one Server (the upstream's, passed
        # through on forwarded responses): upstream.response_headers drops the upstream's Date
        "server_header": False,
        "date_header": True,
        # logging is ours (logs.configure): one JSON format on stdout for uvicorn's lines too
        "log_config": None,
        "timeout_graceful_shutdown": int(settings.limits.shutdown_grace_seconds),
        "limit_concurrency": settings.limits.max_connections,
    }
