"""The upstream transport (httpx over aiohttp, ``sidecar/upstream/transport.py``) against raw loopback servers:
the bytes a proxy must forward as they are, and every way a connection fails arriving as the
httpx error the request path tells apart. Each server here is a real TCP listener that writes
exactly the bytes (and the timing) the case needs."""

from __future__ import annotations

import asyncio
import gzip
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest
import trustme

from context_ceiling.sidecar.upstream.transport import AiohttpTransport

pytestmark = pytest.mark.e2e  # sockets, processes or served servers

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
KEEP = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
OK = KEEP.replace(b"\r\n\r\n", b"\r\nconnection: close\r\n\r\n")  # the handler closes


async def _head(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """A request's head and its body (Content-Length or chunked)."""
    head = await reader.readuntil(b"\r\n\r\n")
    body = b""
    lower = head.lower()
    if b"content-length:" in lower:
        n = int(lower.split(b"content-length:")[1].split(b"\r\n")[0])
        body = await reader.readexactly(n)
    elif b"transfer-encoding: chunked" in lower:
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            chunk = await reader.readexactly(size + 2)
            if size == 0:
                break
            body += chunk[:-2]
    return head, body


def run(
    handler: Handler, case: Callable[[str, AiohttpTransport], Awaitable[Any]], **kw: Any
) -> Any:
    async def main() -> Any:
        server = await asyncio.start_server(handler, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        transport = AiohttpTransport(**kw)
        try:
            return await case(f"http://127.0.0.1:{port}", transport)
        finally:
            await transport.aclose()
            server.close()

    return asyncio.run(main())


def request(url: str, **kw: Any) -> httpx.Request:
    kw.setdefault("extensions", {"timeout": {"connect": 2, "read": 2, "write": 2, "pool": 2}})
    return httpx.Request("POST", url + "/v1/chat/completions", **kw)


async def read(resp: httpx.Response) -> bytes:
    try:
        return b"".join([c async for c in resp.stream])  # type: ignore[union-attr]
    finally:
        await resp.aclose()


def test_the_request_goes_as_the_client_sent_it_and_the_answer_comes_back_raw() -> None:
    seen: list[bytes] = []
    packed = gzip.compress(b'{"a": 1}')

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        head, body = await _head(r)
        seen.extend([head, body])
        w.write(
            b"HTTP/1.1 201 Created\r\ncontent-encoding: gzip\r\nset-cookie: s=1\r\n"
            b"x-long: " + b"v" * 20000 + b"\r\n"
            b"content-length: " + str(len(packed)).encode() + b"\r\n\r\n" + packed
        )
        await w.drain()
        w.close()

    async def case(url: str, t: AiohttpTransport) -> tuple[httpx.Response, bytes]:
        resp = await t.handle_async_request(
            request(url, content=b'{"x":1}', headers={"authorization": "Bearer k", "x-a": "1"})
        )
        return resp, await read(resp)

    resp, raw = run(handler, case)
    head = seen[0].decode().lower()
    assert seen[1] == b'{"x":1}'
    assert "authorization: bearer k" in head and "x-a: 1" in head and "host: 127.0.0.1" in head
    # nothing of aiohttp's own: the upstream sees the client's headers only
    for added in ("user-agent", "accept:", "accept-encoding", "content-type", "cookie"):
        assert added not in head, added
    # the status, the headers (a 20 kB one too) and the bytes as the upstream sent them
    assert resp.status_code == 201 and resp.headers["x-long"] == "v" * 20000
    assert resp.headers["content-encoding"] == "gzip" and raw == packed


def test_a_streamed_body_goes_chunked_and_its_own_error_propagates() -> None:
    bodies: list[bytes] = []

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            _, body = await _head(r)
        except (asyncio.IncompleteReadError, ValueError):
            w.close()
            return
        bodies.append(body)
        w.write(OK)
        await w.drain()
        w.close()

    class Cap(Exception):
        pass

    async def parts(fail: bool) -> AsyncIterator[bytes]:
        yield b"part one, "
        await asyncio.sleep(0.01)
        if fail:
            raise Cap("over the size cap")
        yield b"part two"

    async def case(url: str, t: AiohttpTransport) -> None:
        resp = await t.handle_async_request(request(url, content=parts(False)))
        assert resp.status_code == 200 and await read(resp) == b"{}"
        with pytest.raises(Cap, match="size cap"):
            await t.handle_async_request(request(url, content=parts(True)))

    run(handler, case)
    assert bodies[0] == b"part one, part two"


def test_connections_are_kept_alive_and_one_the_server_closed_is_not_reused() -> None:
    connections = 0

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        # answers two requests on a connection, then closes it while it sits idle
        for _ in range(2):
            await _head(r)
            w.write(KEEP)
            await w.drain()
        w.close()

    async def case(url: str, t: AiohttpTransport) -> None:
        for _ in range(5):
            resp = await t.handle_async_request(request(url, content=b"{}"))
            assert await read(resp) == b"{}"
            await asyncio.sleep(0.02)  # the server's close reaches the pool before the next

    run(handler, case)
    assert connections == 3


@pytest.mark.parametrize(
    ("fault", "error"),
    [
        ("refused", httpx.ConnectError),
        ("silent", httpx.ReadTimeout),
        ("hangup", httpx.RemoteProtocolError),
        ("garbage", httpx.RemoteProtocolError),
    ],
)
def test_a_failed_exchange_is_the_httpx_error_for_it(
    fault: str, error: type[httpx.TransportError]
) -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await _head(r)
        if fault == "silent":
            await asyncio.sleep(5)
        elif fault == "garbage":
            w.write(b"this is not HTTP\r\n\r\n")
            await w.drain()
        w.close()

    async def case(url: str, t: AiohttpTransport) -> None:
        if fault == "refused":
            url = "http://127.0.0.1:9"
        timeout = {"connect": 1, "read": 0.3, "write": 1, "pool": 1}
        with pytest.raises(error):
            await t.handle_async_request(
                request(url, content=b"{}", extensions={"timeout": timeout})
            )

    run(handler, case)


def test_an_answer_cut_off_midway_fails_while_it_is_read_and_each_read_comes_as_it_arrives() -> (
    None
):
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await _head(r)
        w.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: 1000\r\n\r\n"
        )
        w.write(b"data: one\n\n")
        await w.drain()
        await asyncio.sleep(0.3)
        w.write(b"data: two\n\n")
        await w.drain()
        w.transport.abort()

    async def case(url: str, t: AiohttpTransport) -> list[tuple[bytes, float]]:
        loop = asyncio.get_running_loop()
        resp = await t.handle_async_request(request(url, content=b"{}"))
        got: list[tuple[bytes, float]] = []
        start = loop.time()

        async def drain() -> None:
            async for chunk in resp.stream:  # type: ignore[union-attr]
                got.append((chunk, loop.time() - start))

        with pytest.raises(httpx.RemoteProtocolError):
            await drain()
        await resp.aclose()
        return got

    got = run(handler, case)
    assert [c for c, _ in got] == [b"data: one\n\n", b"data: two\n\n"]
    assert got[0][1] < 0.2 <= got[1][1]  # the first event was not held for the second


def test_a_full_pool_waits_for_a_connection_then_times_out_and_the_held_one_completes() -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await _head(r)
        await asyncio.sleep(1.0)
        w.write(OK)
        await w.drain()
        w.close()

    async def case(url: str, t: AiohttpTransport) -> None:
        held = asyncio.ensure_future(t.handle_async_request(request(url, content=b"{}")))
        await asyncio.sleep(0.1)
        timeout = {"connect": 0.1, "read": 2, "write": 2, "pool": 0.1}
        with pytest.raises(httpx.TimeoutException):  # aiohttp's connect timeout covers the wait
            await t.handle_async_request(
                request(url, content=b"{}", extensions={"timeout": timeout})
            )
        assert await read(await held) == b"{}"

    run(handler, case, pool_size=1)


def test_tls_is_verified_against_the_ca_bundle_and_a_trusted_server_answers() -> None:
    """An upstream whose certificate no CA in the bundle signed is refused (a proxy that did not
    verify would hand every API key to whoever answers); one the context trusts is spoken to."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(server_ctx)
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            await _head(r)
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            w.close()
            return
        w.write(OK)
        await w.drain()
        w.close()

    async def main() -> bytes:
        server = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=server_ctx)
        url = f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        default, trusting = AiohttpTransport(), AiohttpTransport(ssl_context=client_ctx)
        try:
            with pytest.raises(httpx.ConnectError, match=r"(?i)certificate"):
                await default.handle_async_request(request(url, content=b"{}"))
            return await read(await trusting.handle_async_request(request(url, content=b"{}")))
        finally:
            await default.aclose()
            await trusting.aclose()
            server.close()

    assert asyncio.run(main()) == b"{}"
