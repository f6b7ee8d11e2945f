"""Connections to the upstream model APIs.

One pooled, keep-alive client per upstream, built once. The transport is injectable so tests and
benchmarks can put any ASGI app or loopback server behind the sidecar.

The measured routes send through :meth:`UpstreamClient.forward`, straight to the transport (the
connection pool): everything ``httpx.AsyncClient.send`` adds on top (auth, redirects, cookies,
default headers, URL merging, event hooks, a decoder per body) is what a proxy must not do or
does not need, at a cost paid on every request. The other routes use the full client.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from http.cookiejar import CookieJar
from typing import Any

import httpx

from context_ceiling.sidecar.config import Upstream
from context_ceiling.sidecar.upstream.transport import AiohttpTransport

#: Never forwarded upstream: hop-by-hop, recomputed, or ours.
_DROP_REQUEST = frozenset(
    {
        "host",
        "content-length",
        "connection",
        "keep-alive",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "proxy-authorization",
        "proxy-connection",
        "proxy-authenticate",
        "expect",  # the body was read already: a 100-continue handshake upstream is meaningless
        "accept-encoding",
        "x-ceiling-workload",
        "x-ceiling-bypass",
    }
)
#: Never passed back to the client: hop-by-hop or invalidated because httpx decodes the body;
#: ``date`` because the server in front (uvicorn) dates every response itself, and two Date
#: headers are one too many (the upstream's ``server`` passes: uvicorn adds none).
_DROP_RESPONSE = frozenset(
    {
        "date",
        "content-length",
        "connection",
        "keep-alive",
        "transfer-encoding",
        "content-encoding",
        "trailer",
        "upgrade",
        "proxy-authenticate",
        "proxy-connection",
        "te",
    }
)


class _NoCookies(CookieJar):
    """A proxy must not keep cookies: one client's upstream cookies would ride on the next
    client's requests. httpx keeps a jar per client by default; this one never stores or sends."""

    def extract_cookies(self, response: Any, request: Any) -> None:
        return None

    def add_cookie_header(self, request: Any) -> None:
        return None


class UpstreamClient(httpx.AsyncClient):
    """An ``httpx.AsyncClient`` (for the pass-through routes, the models list and the probes)
    that also sends the measured requests the short way, straight to its transport."""

    def __init__(
        self, upstream: Upstream, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        t = upstream.timeouts
        timeout = httpx.Timeout(connect=t.connect, read=t.read, write=t.read, pool=t.connect)
        #: the connection pool itself (or the injected transport)
        self.pool = transport or AiohttpTransport(upstream.pool_size, keepalive_expiry=30.0)
        super().__init__(
            base_url=upstream.base_url,
            timeout=timeout,
            transport=self.pool,
            follow_redirects=False,
            trust_env=False,
            cookies=_NoCookies(),
        )
        self._fw_timeout = timeout.as_dict()
        self._fw_prefix = str(self.base_url).rstrip("/")
        self._fw_urls: dict[str, httpx.URL] = {}

    def url(self, path: str, params: list[tuple[str, str]] | None = None) -> httpx.URL:
        """The upstream URL of ``path`` (and query ``params``) under the base URL."""
        if params:
            return httpx.URL(self._fw_prefix + path, params=params)
        url = self._fw_urls.get(path)
        if url is None:
            url = httpx.URL(self._fw_prefix + path)
            if len(self._fw_urls) < 64:  # the fixed routes; a path with an id is built each time
                self._fw_urls[path] = url
        return url

    async def forward(
        self,
        path: str,
        content: bytes,
        headers: list[tuple[str, str]],
        params: list[tuple[str, str]] | None = None,
    ) -> httpx.Response:
        """POST ``content`` to ``path`` under the base URL; the response's body is not read.
        Only the client's own headers go upstream (no ``Accept-Encoding`` among them: see
        :func:`body_chunks`); the pool's timeouts apply as they do through the client."""
        req = httpx.Request(
            "POST",
            self.url(path, params),
            headers=headers,
            content=content,
            extensions={"timeout": self._fw_timeout},
        )
        resp = await self.pool.handle_async_request(req)
        resp.request = req
        return resp


def body_chunks(resp: httpx.Response) -> AsyncIterator[bytes]:
    """A response's body as it arrives. The sidecar asks for no content encoding, so the
    transport's stream is the body itself; an upstream that encodes anyway is decoded by httpx
    (its ``content-encoding`` is dropped on the way back)."""
    encoding = resp.headers.get("content-encoding")
    if (encoding is None or encoding.lower() == "identity") and isinstance(
        resp.stream, httpx.AsyncByteStream
    ):
        return resp.stream.__aiter__()
    return resp.aiter_bytes()


def _named_in_connection(values: Iterable[str]) -> set[str]:
    """RFC 9110 7.6.1: the headers a ``Connection`` header names are hop-by-hop too."""
    return {t.strip().lower() for v in values for t in v.split(",") if t.strip()}


def request_headers(items: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """Client headers to send upstream: auth and provider headers pass untouched; hop-by-hop
    headers (RFC 9110 7.6.1, those the client's ``Connection`` names included) do not."""
    pairs = list(items)
    hop = _named_in_connection(v for k, v in pairs if k.lower() == "connection")
    return [(k, v) for k, v in pairs if k.lower() not in _DROP_REQUEST and k.lower() not in hop]


def accepts_gzip(header: str | None) -> bool:
    """Whether an ``Accept-Encoding`` header takes gzip (and does not refuse it with q=0)."""
    for item in (header or "").split(","):
        name, _, params = item.strip().partition(";")
        if name.strip().lower() in ("gzip", "*"):
            q = params.strip().removeprefix("q=").strip() if "q=" in params else "1"
            try:
                return float(q) > 0
            except ValueError:
                return True
    return False


def with_beta(headers: list[tuple[str, str]], name: str, beta: str) -> list[tuple[str, str]]:
    """The headers with ``beta`` among the values of the betas header ``name`` (Anthropic's
    ``anthropic-beta``; once, the client's own kept: the header is a comma-separated list)."""
    name = name.lower()
    values = [v.strip() for k, v in headers if k.lower() == name for v in v.split(",")]
    if beta in values:
        return headers
    rest = [(k, v) for k, v in headers if k.lower() != name]
    return [*rest, (name, ",".join([*[v for v in values if v], beta]))]


def response_headers(headers: httpx.Headers) -> dict[str, str]:
    """Upstream headers to pass back, less the hop-by-hop ones (those named in the upstream's
    ``Connection`` included)."""
    hop = _named_in_connection(headers.get_list("connection"))
    out: dict[str, str] = {}
    for k, v in headers.multi_items():
        if k.lower() not in _DROP_RESPONSE and k.lower() not in hop:
            out[k] = v
    return out
