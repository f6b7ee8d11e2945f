"""A fast stand-in for a hosted model API (a test double): the floor every proxy is measured on.

Raw ASGI, no framework: answers ``/v1/chat/completions`` with a fixed body, or, for
``stream: true``, a fixed stream of ``CHUNKS`` events ``PACE`` seconds apart. It never parses
more than it must, so what the benchmarks measure is the proxy in front of it.
Run: ``python -m benchmarks.upstream_double PORT``.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

import orjson

from benchmarks.asgi import lifespan, read_body, run

CHUNKS = int(os.environ.get("DOUBLE_CHUNKS", "20"))
PACE = float(os.environ.get("DOUBLE_PACE", "0"))

BODY = orjson.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 0,
        "model": "gpt-4o",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 1000, "completion_tokens": 20, "total_tokens": 1020},
    }
)
_chunk = orjson.dumps(
    {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "gpt-4o",
        "choices": [{"index": 0, "delta": {"content": "tok "}, "finish_reason": None}],
    }
)
_usage = orjson.dumps(
    {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "gpt-4o",
        "choices": [],
        "usage": {"prompt_tokens": 1000, "completion_tokens": 20, "total_tokens": 1020},
    }
)
EVENT = b"data: " + _chunk + b"\n\n"
USAGE = b"data: " + _usage + b"\n\n"
DONE = b"data: [DONE]\n\n"


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await lifespan(receive, send)
        return
    body = await read_body(receive)
    if b'"stream":true' not in body and b'"stream": true' not in body:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": BODY})
        return
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/event-stream")],
        }
    )
    for _ in range(CHUNKS):
        await send({"type": "http.response.body", "body": EVENT, "more_body": True})
        if PACE:
            await asyncio.sleep(PACE)
    if b"include_usage" in body:
        await send({"type": "http.response.body", "body": USAGE, "more_body": True})
    await send({"type": "http.response.body", "body": DONE, "more_body": False})


if __name__ == "__main__":
    run(app, int(sys.argv[1]))
