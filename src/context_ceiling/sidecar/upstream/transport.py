"""The upstream connection pool: an httpx transport that sends through aiohttp.

httpx stays the sidecar's client API (one ``httpx.AsyncClient`` per upstream, injectable
transports for tests and benchmarks, httpx's exceptions and response objects everywhere), but its
default transport (httpcore: a pure-Python HTTP/1.1 parser, h11, over anyio streams, and a pool
that polls every idle socket and rescans every connection on each request and each release) was
most of the sidecar's own CPU on a request under its budget. aiohttp parses HTTP in C (llhttp) on plain asyncio transports and keeps its
pool as per-host deques whose closed connections leave on the loop's own ``connection_lost``;
the same sidecar through it uses a fraction of that CPU (``bare`` against ``bare-aiohttp`` in
benchmarks/RESULTS.md).

What this adapter owns, because a proxy depends on it: nothing is added to what the client sent
(no User-Agent, Accept, Accept-Encoding or Content-Type of aiohttp's, no cookies, no redirects,
no decompression: the bytes come back as the upstream sent them), httpx's timeouts apply as httpx
defines them, and aiohttp's errors arrive as the httpx errors the request path already tells
apart: a connect failure, a timeout (connect, pool, read), a connection lost mid-answer. An error
raised by the request body itself (the pass-through's size cap) propagates as it was raised.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import httpx
import yarl

#: aiohttp adds these to a request unless told not to; a proxy forwards what its client sent
_SKIP_AUTO = frozenset({"User-Agent", "Accept", "Accept-Encoding", "Content-Type"})
#: response header lines longer than aiohttp's default 8 KiB are legal and some providers send
#: long ones (rate-limit and trace headers); httpx took them
_MAX_FIELD = 64 * 1024


def _to_httpx(exc: BaseException) -> BaseException | None:
    """The httpx error for an aiohttp one (None: not a transport error, re-raise as it is).

    Most specific first: aiohttp's timeout errors are also connection errors, and its connector
    errors are also OS errors."""
    cause = exc.__cause__
    if (
        isinstance(exc, aiohttp.ClientConnectionError)
        and cause is not None
        and not isinstance(cause, OSError | aiohttp.ClientError | TimeoutError)
    ):
        return cause  # raised by the request body (a size cap): the caller's own error
    msg = str(exc) or type(exc).__name__
    if isinstance(exc, aiohttp.ConnectionTimeoutError):  # opening a socket or waiting for one
        return httpx.ConnectTimeout(msg)
    if isinstance(exc, aiohttp.SocketTimeoutError | aiohttp.ServerTimeoutError):
        return httpx.ReadTimeout(msg)
    if isinstance(exc, aiohttp.ClientConnectorError):
        return httpx.ConnectError(msg)
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
        return httpx.RemoteProtocolError(msg)
    if isinstance(exc, aiohttp.ClientResponseError):  # a malformed response
        return httpx.RemoteProtocolError(msg)
    if isinstance(exc, aiohttp.InvalidURL):
        return httpx.InvalidURL(msg)
    if isinstance(exc, aiohttp.ClientOSError | aiohttp.ClientConnectionError):
        return httpx.ReadError(msg)
    if isinstance(exc, aiohttp.ClientError):
        return httpx.TransportError(msg)
    if isinstance(exc, TimeoutError):
        return httpx.TimeoutException(msg)
    return None


@contextlib.contextmanager
def _mapped() -> Iterator[None]:
    try:
        yield
    except (aiohttp.ClientError, TimeoutError) as exc:
        mapped = _to_httpx(exc)
        if mapped is None:
            raise
        raise mapped from exc


class _Body(httpx.AsyncByteStream):
    """A response body as it arrives (each read as soon as any bytes are there: an event stream
    is relayed event by event). Closing it returns a fully read connection to the pool and
    closes one read partway."""

    __slots__ = ("_resp",)

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp

    async def __aiter__(self) -> AsyncIterator[bytes]:
        content = self._resp.content
        with _mapped():
            while chunk := await content.readany():
                yield chunk

    async def aclose(self) -> None:
        self._resp.release()


class AiohttpTransport(httpx.AsyncBaseTransport):
    """An httpx transport over one aiohttp connection pool of ``pool_size`` connections.

    The session is made on the first request, inside the running event loop (aiohttp binds a
    session to its loop), and closed by :meth:`aclose`. TLS is verified, against the same CA
    bundle as httpx's default transport (certifi) unless ``ssl_context`` says otherwise."""

    def __init__(
        self,
        pool_size: int = 100,
        keepalive_expiry: float = 30.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.pool_size, self.keepalive_expiry = pool_size, keepalive_expiry
        self.ssl_context = ssl_context  # None: httpx's default (certifi), made on first use
        self._session: aiohttp.ClientSession | None = None
        self._timeouts: dict[tuple[Any, ...], aiohttp.ClientTimeout] = {}

    def _open(self) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(
            limit=self.pool_size,
            limit_per_host=0,
            keepalive_timeout=self.keepalive_expiry,
            ssl=self.ssl_context or httpx.create_ssl_context(trust_env=False),
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=_SKIP_AUTO,
            auto_decompress=False,
            trust_env=False,
            timeout=aiohttp.ClientTimeout(total=None),
            max_field_size=_MAX_FIELD,
            max_line_size=_MAX_FIELD,
        )
        return self._session

    def _timeout(self, t: dict[str, float | None]) -> aiohttp.ClientTimeout:
        """httpx's timeouts in aiohttp's terms: ``connect`` to open a socket, ``pool`` to wait
        for a free connection (aiohttp's ``connect`` covers both), ``read`` between reads."""
        key = (t.get("connect"), t.get("read"), t.get("pool"))
        timeout = self._timeouts.get(key)
        if timeout is None:
            connect, read, pool = key
            timeout = aiohttp.ClientTimeout(
                total=None,
                sock_connect=connect,
                sock_read=read,
                connect=None if pool is None or connect is None else pool + connect,
            )
            if len(self._timeouts) < 16:
                self._timeouts[key] = timeout
        return timeout

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        session = self._session or self._open()
        headers = request.headers.multi_items()
        data: Any
        try:
            data = request.content or None
        except httpx.RequestNotRead:  # a streamed body (the pass-through's uploads)
            data = request.stream
            headers = [(k, v) for k, v in headers if k.lower() != "transfer-encoding"]
        with _mapped():
            resp = await session.request(
                request.method,
                # as httpx encoded it, not re-quoted: a path's escapes (a Bedrock ARN's %3A)
                # reach the upstream as the client sent them, and a signature over them holds
                yarl.URL(str(request.url), encoded=True),
                headers=headers,
                data=data,
                allow_redirects=False,
                timeout=self._timeout(request.extensions.get("timeout", {})),
            )
        return httpx.Response(
            status_code=resp.status,
            headers=resp.raw_headers,
            stream=_Body(resp),
            request=request,
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": (resp.reason or "").encode()},
        )

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
