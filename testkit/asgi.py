"""The small pieces of raw ASGI the benchmark servers and the raw test doubles share (the
benchmark upstream, the bare pass-through, the fault-injecting and echo provider doubles):
lifespan handling, reading a whole request body, running on uvicorn."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any


async def lifespan(
    receive: Any, send: Any, on_shutdown: Callable[[], Awaitable[None]] | None = None
) -> None:
    while True:
        msg = await receive()
        if msg["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        else:
            if on_shutdown is not None:
                await on_shutdown()
            await send({"type": "lifespan.shutdown.complete"})
            return


async def read_body(receive: Any) -> bytes:
    body = b""
    more = True
    while more:
        msg = await receive()
        body += msg.get("body", b"")
        more = msg.get("more_body", False)
    return body


def run(app: Any, port: int) -> None:
    import uvicorn

    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        access_log=False,
        loop="uvloop",
        http="httptools",
    )
