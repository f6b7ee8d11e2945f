"""A bare pass-through proxy: the physical limit for a Python proxy on this stack (a baseline).

Pure ASGI on uvicorn (uvloop + httptools), one pooled keep-alive httpx client, bytes forwarded
both ways with no parsing, no counting, no metrics. Whatever the sidecar costs beyond this is the
price of measuring. ``aiohttp`` as the third argument sends through the sidecar's own upstream
transport (``sidecar/upstream/transport.py``) instead of httpx's default one (httpcore): the ``bare-aiohttp``
target, the floor on the sidecar's stack. Run:
``python -m benchmarks.passthrough PORT UPSTREAM_BASE_URL [aiohttp]``.
"""

from __future__ import annotations

import sys
from typing import Any

import httpx

from context_ceiling.sidecar.upstream.transport import AiohttpTransport
from testkit.asgi import lifespan, read_body, run

DROP = {b"host", b"content-length", b"connection", b"transfer-encoding"}


def make_app(client: httpx.AsyncClient) -> Any:
    """The pass-through over ``client`` (its base URL the upstream's)."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send, client.aclose)
            return
        body = await read_body(receive)
        headers = [(k.decode(), v.decode()) for k, v in scope["headers"] if k not in DROP]
        req = client.build_request(scope["method"], scope["path"], content=body, headers=headers)
        resp = await client.send(req, stream=True)
        try:
            out = [
                (k.encode(), v.encode()) for k, v in resp.headers.items() if k.encode() not in DROP
            ]
            await send({"type": "http.response.start", "status": resp.status_code, "headers": out})
            async for chunk in resp.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await resp.aclose()

    return app


if __name__ == "__main__":
    upstream = sys.argv[2] if len(sys.argv) > 2 else "http://127.0.0.1:9"
    client = httpx.AsyncClient(
        base_url=upstream,
        limits=httpx.Limits(max_connections=200, max_keepalive_connections=200),
        timeout=60,
        trust_env=False,
        transport=AiohttpTransport(200) if sys.argv[3:] == ["aiohttp"] else None,
    )
    run(make_app(client), int(sys.argv[1]))
