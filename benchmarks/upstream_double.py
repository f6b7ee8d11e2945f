"""A fast stand-in for a hosted model API (a test double): the floor every proxy is measured on.

Raw ASGI, no framework: answers ``/v1/chat/completions`` with a fixed body, or, for
``stream: true``, a fixed stream of ``CHUNKS`` events ``PACE`` seconds apart; both after
``THINK`` seconds (a model's time to first token; 0 by default). It never parses
more than it must, so what the benchmarks measure is the proxy in front of it. The usage it
reports is the request's size in tokens as the benchmark's model name gives it (``bench-8000``:
8,000), as a provider would report it (the sidecar's bounded counting calibrates on it).
Run: ``python -m benchmarks.upstream_double PORT``.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

import orjson

from testkit.asgi import lifespan, read_body, run

CHUNKS = int(os.environ.get("DOUBLE_CHUNKS", "20"))
PACE = float(os.environ.get("DOUBLE_PACE", "0"))
THINK = float(os.environ.get("DOUBLE_THINK", "0"))


def _body(prompt_tokens: int) -> bytes:
    return orjson.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": 0,
            "model": "gpt-4o",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "ok"},
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": 20,
                "total_tokens": prompt_tokens + 20,
            },
        }
    )


def _usage_event(prompt_tokens: int) -> bytes:
    u = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": 20,
        "total_tokens": prompt_tokens + 20,
    }
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "gpt-4o"}
    return b"data: " + orjson.dumps({**chunk, "choices": [], "usage": u}) + b"\n\n"


BODY = _body(1000)
_MODEL = b'"model":"bench-'
_bodies: dict[bytes, tuple[bytes, bytes]] = {}


def _for(body: bytes) -> tuple[bytes, bytes]:
    """(the answer, the usage event) for the size the request's model name says."""
    i = body.find(_MODEL)
    if i < 0:
        return BODY, USAGE
    j = body.find(b'"', i + len(_MODEL))
    key = body[i + len(_MODEL) : j]
    if key not in _bodies:
        n = int(key) if key.isdigit() else 1000
        _bodies[key] = (_body(n), _usage_event(n))
    return _bodies[key]


_chunk = orjson.dumps(
    {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "gpt-4o",
        "choices": [{"index": 0, "delta": {"content": "tok "}, "finish_reason": None}],
    }
)
EVENT = b"data: " + _chunk + b"\n\n"
USAGE = _usage_event(1000)
DONE = b"data: [DONE]\n\n"


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await lifespan(receive, send)
        return
    body = await read_body(receive)
    if THINK:
        await asyncio.sleep(THINK)
    if b'"stream":true' not in body and b'"stream": true' not in body:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": _for(body)[0]})
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
        await send({"type": "http.response.body", "body": _for(body)[1], "more_body": True})
    await send({"type": "http.response.body", "body": DONE, "more_body": False})


if __name__ == "__main__":
    run(app, int(sys.argv[1]))
