"""Connections to the upstream model APIs.

One pooled, keep-alive ``httpx.AsyncClient`` per upstream, built once. The transport is
injectable so tests and benchmarks can put any ASGI app or loopback server behind the sidecar.
"""

from __future__ import annotations

from collections.abc import Iterable
from http.cookiejar import CookieJar
from typing import Any

import httpx

from context_ceiling.sidecar.config import Upstream

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


def build_client(
    upstream: Upstream, transport: httpx.AsyncBaseTransport | None = None
) -> httpx.AsyncClient:
    t = upstream.timeouts
    limits = httpx.Limits(
        max_connections=upstream.pool_size,
        max_keepalive_connections=upstream.pool_size,
        keepalive_expiry=30.0,
    )
    return httpx.AsyncClient(
        base_url=upstream.base_url,
        timeout=httpx.Timeout(connect=t.connect, read=t.read, write=t.read, pool=t.connect),
        limits=limits,
        transport=transport,
        follow_redirects=False,
        trust_env=False,
        cookies=_NoCookies(),
    )


def _named_in_connection(values: Iterable[str]) -> set[str]:
    """RFC 9110 7.6.1: the headers a ``Connection`` header names are hop-by-hop too."""
    return {t.strip().lower() for v in values for t in v.split(",") if t.strip()}


def request_headers(items: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """Client headers to send upstream: auth and provider headers pass untouched; hop-by-hop
    headers (RFC 9110 7.6.1, those the client's ``Connection`` names included) do not."""
    pairs = list(items)
    hop = _named_in_connection(v for k, v in pairs if k.lower() == "connection")
    return [(k, v) for k, v in pairs if k.lower() not in _DROP_REQUEST and k.lower() not in hop]


def response_headers(headers: httpx.Headers) -> dict[str, str]:
    """Upstream headers to pass back, less the hop-by-hop ones (those named in the upstream's
    ``Connection`` included)."""
    hop = _named_in_connection(headers.get_list("connection"))
    out: dict[str, str] = {}
    for k, v in headers.multi_items():
        if k.lower() not in _DROP_RESPONSE and k.lower() not in hop:
            out[k] = v
    return out
