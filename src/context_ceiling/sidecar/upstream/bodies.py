"""Bodies read under a size cap: a request body, a non-stream upstream response, or one
streamed through. One place decides how a declared ``content-length`` and the bytes that really
arrive are held against a limit."""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator, Mapping
from typing import Protocol

import httpx

from context_ceiling.core.errors import CeilingError
from context_ceiling.sidecar.upstream.client import body_chunks


class TooLarge(CeilingError):
    """More bytes than the cap allows (declared, or arrived)."""


class BodyTooLarge(TooLarge):
    pass


class ResponseTooLarge(TooLarge):
    pass


def check_declared(declared: str | None, cap: int, exc: type[TooLarge]) -> None:
    if declared and declared.isdigit() and int(declared) > cap:
        raise exc


async def capped(
    chunks: AsyncIterator[bytes], cap: int, exc: type[TooLarge]
) -> AsyncIterator[bytes]:
    """The chunks as they arrive, raising ``exc`` once their total passes ``cap``."""
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > cap:
            raise exc
        if chunk:
            yield chunk


async def collect(
    chunks: AsyncIterator[bytes], declared: str | None, cap: int, exc: type[TooLarge]
) -> bytes:
    """A whole body of at most ``cap`` bytes."""
    check_declared(declared, cap, exc)
    return b"".join([c async for c in capped(chunks, cap, exc)])


async def read_capped(resp: httpx.Response, cap: int) -> bytes:
    """A non-stream response body, refused past ``cap`` bytes (held whole to read its usage, so
    its size must be bounded: a 100 MiB body must not become 100 MiB of sidecar memory)."""
    return await collect(
        body_chunks(resp), resp.headers.get("content-length"), cap, ResponseTooLarge
    )


def gzipped(resp: httpx.Response) -> bool:
    return (resp.headers.get("content-encoding") or "").strip().lower() == "gzip"


async def read_capped_raw(resp: httpx.Response, cap: int) -> tuple[bytes, bytes]:
    """A gzip-encoded non-stream response as it came (to relay compressed) and decoded (to read
    its usage), each refused past ``cap`` bytes: a small compressed body can inflate to
    gigabytes, so the decoded copy is capped as it is inflated."""
    raw = await collect(resp.aiter_raw(), resp.headers.get("content-length"), cap, ResponseTooLarge)
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        plain = inflate.decompress(raw, cap + 1)
    except zlib.error:
        return raw, b""  # not gzip after all: relayed as it came, no usage read
    if len(plain) > cap or inflate.unconsumed_tail:
        raise ResponseTooLarge(cap)
    return raw, plain


class Readable(Protocol):
    """A request whose body can be read: Starlette's ``Request``, the proxy path's
    :class:`~context_ceiling.sidecar.incoming.Incoming`."""

    @property
    def headers(self) -> Mapping[str, str]: ...

    def stream(self) -> AsyncIterator[bytes]: ...


async def read_body(request: Readable, limit: int) -> bytes:
    """The whole body, at most ``limit`` bytes (the caller bounds the time: a client that sends
    part of its body and then nothing must not hold a connection and its buffer forever)."""
    return await collect(
        request.stream(), request.headers.get("content-length"), limit, BodyTooLarge
    )
