"""A model call as it arrived, read straight from its ASGI scope: the request object of the
proxy path.

Starlette's ``Request`` answers each header lookup by scanning and decoding the raw header list
again, and builds a URL (a string assembled, then split) for the path; the proxy path looks up
a dozen headers a request (the request id, the workload, credentials for every provider, the
bypass token, the betas, the trace context, the encodings). Here the headers are decoded once
into a dict, and the path is the scope's, so each lookup is one dict probe. The other
routes (admin, probes, metrics) keep Starlette's ``Request``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from urllib.parse import parse_qsl

from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope

__all__ = ["ClientDisconnect", "Headers", "Incoming"]


class Headers(dict[str, str]):
    """A request's headers by lower-case name (ASGI servers lower-case them), the first value
    of a repeated one, as Starlette's ``Headers.get`` answers; :attr:`pairs` keeps every
    header in order, repeats included (what is forwarded), :attr:`raw` the scope's bytes."""

    __slots__ = ("pairs", "raw")

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        pairs = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in raw]
        # reversed: the first of a repeated header is the one kept
        super().__init__(reversed(pairs))
        self.pairs = pairs
        self.raw = raw


class Incoming:
    """What the proxy path reads of a request: its headers, its path (as Starlette's
    ``request.url.path`` gives it: ``?``, ``#`` and ``\\`` escaped), the path as the client
    sent it, its query and its body."""

    __slots__ = ("_consumed", "headers", "path", "receive", "scope")

    def __init__(self, scope: Scope, receive: Receive) -> None:
        self.scope, self.receive = scope, receive
        self.headers = Headers(scope["headers"])
        path: str = scope["path"]
        if "?" in path or "#" in path or "\\" in path:
            path = path.replace("?", "%3F").replace("#", "%23").replace("\\", "%5C")
        self.path = path
        self._consumed = False

    @property
    def raw_path(self) -> str:
        """The path with the client's percent-escapes kept (``raw_path``), else :attr:`path`."""
        raw: bytes = self.scope.get("raw_path") or b""
        return raw.decode("latin-1") or self.path

    def query(self) -> list[tuple[str, str]]:
        """The query string's parameters in order, repeats and blank values kept."""
        qs: bytes = self.scope.get("query_string") or b""
        return parse_qsl(qs.decode("latin-1"), keep_blank_values=True) if qs else []

    async def stream(self) -> AsyncIterator[bytes]:
        """The body's chunks as they arrive; ``ClientDisconnect`` when the client hangs up
        first. Read once."""
        if self._consumed:
            raise RuntimeError("the request body was already read")
        self._consumed = True
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                raise ClientDisconnect()
            body: bytes = message.get("body", b"")
            if body:
                yield body
            if not message.get("more_body", False):
                return
