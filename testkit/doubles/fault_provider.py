"""A loopback stand-in for a hosted provider that fails on request (a test double).

The fault is chosen per request with the ``x-fault`` header, which the sidecar forwards like any
client header: ``none``, ``reset`` (the connection drops mid-stream), ``truncated_event`` (the
stream ends in the middle of an event), ``no_end`` (a clean end without ``[DONE]`` /
``message_stop``), ``stall`` (one event, then nothing), ``stall_headers`` (nothing at all),
``huge`` (a non-stream body of ``huge_bytes``), ``linger`` (a whole stream, then 2 s before
the connection closes), ``oversized_event`` (one event with no boundary,
``huge_bytes`` long), ``garbage`` (bytes that are not server-sent events), ``429`` and ``500``.
A raw ASGI app, so a fault is exactly the bytes and the timing it says.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import orjson

from testkit.asgi import lifespan, read_body

Send = Any
Receive = Any


def openai_events(model: str) -> list[bytes]:
    base = {"id": "chatcmpl-f", "object": "chat.completion.chunk", "created": 1, "model": model}
    chunks = [
        base
        | {
            "choices": [
                {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
            ]
        },
        base | {"choices": [{"index": 0, "delta": {"content": "Hello"}, "finish_reason": None}]},
        base | {"choices": [{"index": 0, "delta": {"content": " world"}, "finish_reason": None}]},
        base | {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        base
        | {
            "choices": [],
            "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
        },
    ]
    return [b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks] + [b"data: [DONE]\n\n"]


def anthropic_events(model: str) -> list[bytes]:
    def ev(name: str, data: dict[str, Any]) -> bytes:
        return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"

    msg: dict[str, Any] = {
        "id": "msg_f",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 1},
    }
    return [
        ev("message_start", {"type": "message_start", "message": msg}),
        ev(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
        ev(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "Hello"},
            },
        ),
        ev(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": " world"},
            },
        ),
        ev("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ev(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": 2},
            },
        ),
        ev("message_stop", {"type": "message_stop"}),
    ]


def unary(api: str, model: str) -> bytes:
    if api == "anthropic":
        return orjson.dumps(
            {
                "id": "msg_f",
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [{"type": "text", "text": "Hello world"}],
                "stop_reason": "end_turn",
                "stop_sequence": None,
                "usage": {"input_tokens": 10, "output_tokens": 2},
            }
        )
    return orjson.dumps(
        {
            "id": "chatcmpl-f",
            "object": "chat.completion",
            "created": 1,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "Hello world"},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
        }
    )


@dataclass
class FaultyProviderDouble:
    huge_bytes: int = 5 * 1024 * 1024
    stall_seconds: float = 30.0
    seen: list[str] = field(default_factory=list)

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        body = await read_body(receive)
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        fault = headers.get("x-fault", "none")
        self.seen.append(fault)
        api = "anthropic" if scope["path"].startswith("/v1/messages") else "openai"
        try:
            req = orjson.loads(body) if body else {}
        except orjson.JSONDecodeError:
            req = {}
        asked = req.get("model") if isinstance(req, dict) else None
        model = asked if isinstance(asked, str) else "m"
        stream = isinstance(req, dict) and req.get("stream") is True
        if fault in ("429", "500"):
            err = {
                "error": {
                    "type": "rate_limit_error" if fault == "429" else "api_error",
                    "message": "injected",
                }
            }
            await self._start(send, int(fault), "application/json")
            await send({"type": "http.response.body", "body": orjson.dumps(err)})
            return
        if fault == "stall_headers":
            await asyncio.sleep(self.stall_seconds)
        if fault == "huge":
            await self._start(send, 200, "application/json")
            block = b" " * 65536
            for _ in range(self.huge_bytes // len(block)):
                await send({"type": "http.response.body", "body": block, "more_body": True})
            await send({"type": "http.response.body", "body": unary(api, model)})
            return
        if not stream:
            await self._start(send, 200, "application/json")
            await send({"type": "http.response.body", "body": unary(api, model)})
            return
        events = anthropic_events(model) if api == "anthropic" else openai_events(model)
        await self._start(send, 200, "text/event-stream")

        async def out(data: bytes, more: bool = True) -> None:
            await send({"type": "http.response.body", "body": data, "more_body": more})

        if fault == "reset":
            for e in events[:3]:
                await out(e)
            raise RuntimeError("injected: the connection drops mid-stream")
        if fault == "truncated_event":
            for e in events[:3]:
                await out(e)
            await out(events[3][: len(events[3]) // 2], more=False)
            return
        if fault == "no_end":
            for e in events[:-1]:
                await out(e)
            await out(b"", more=False)
            return
        if fault == "stall":
            await out(events[0])
            await asyncio.sleep(self.stall_seconds)
            await out(b"", more=False)
            return
        if fault == "oversized_event":
            await out(events[0])
            await out(b"data: " + b"x" * self.huge_bytes)
            await out(b"", more=False)
            return
        if fault == "linger":  # a whole stream, then the connection stays open a while
            for e in events:
                await out(e)
            await asyncio.sleep(2)
            await out(b"", more=False)
            return
        if fault == "garbage":
            await out(b"\x00\xffnot an event stream" * 100, more=False)
            return
        for e in events:
            await out(e)
        await out(b"", more=False)

    @staticmethod
    async def _start(send: Send, status: int, ctype: str) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", ctype.encode())],
            }
        )
