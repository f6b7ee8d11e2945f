"""How ``ceiling serve`` runs the app: uvicorn (uvloop, httptools) with the sidecar's limits.

uvicorn bounds idle keep-alive connections but not a request whose headers never finish (a
slow-loris client holds its connection and buffer forever). :class:`HeaderDeadline` closes a
connection whose request headers have not arrived whole within ``limits.header_read_timeout``;
the body has its own deadline in the proxy (``limits.body_read_timeout``, a 408).
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from context_ceiling.sidecar.config import Settings


class HeaderDeadline(HttpToolsProtocol):
    """httptools' protocol with a deadline from a connection's (or request's) first byte to the
    end of its headers."""

    header_timeout = 10.0
    _timer: asyncio.TimerHandle | None = None

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

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


def protocol_for(settings: Settings) -> type[HeaderDeadline]:
    """A protocol class carrying this config's header deadline (uvicorn takes a class)."""
    return type(
        "SidecarHttp", (HeaderDeadline,), {"header_timeout": settings.limits.header_read_timeout}
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
