"""A test double for the hosted providers (OpenAI, Anthropic), served for real on loopback.

It stands in only for what cannot run here: api.openai.com and api.anthropic.com. It speaks their
wire formats (JSON bodies, SSE streams, error shapes), records exactly what it received, and can
be told per request to fail, stall or stream slowly through ``x-double-*`` headers.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return orjson.loads(self.body)


#: after a threshold compaction: the input of the answer's own sampling (the summary and what
#: followed it), and the summary step's output
COMPACTED_INPUT = 2300
COMPACTION_OUTPUT = 350


@dataclass
class HostedProviderDouble:
    """Loopback stand-in for a hosted provider. ``prompt_tokens`` is what it reports as usage."""

    prompt_tokens: int = 1234
    completion_tokens: int = 7
    cache_read: int = 0
    cache_creation: int = 0
    received: list[Received] = field(default_factory=list)
    stream_cancelled: threading.Event = field(default_factory=threading.Event)
    last_bodies: dict[str, bytes] = field(default_factory=dict)

    # -- canned bodies --------------------------------------------------------------------

    def openai_body(self, model: str, version: str | None = None) -> bytes:
        return orjson.dumps(
            {
                "id": "chatcmpl-double-1",
                "object": "chat.completion",
                "created": 1700000000,
                "model": version or model + "-2024-08-06",
                "choices": [
                    {
                        "index": 0,
                        "message": {
                            "role": "assistant",
                            "content": "The answer is 42.",
                            "refusal": None,
                        },
                        "logprobs": None,
                        "finish_reason": "stop",
                    }
                ],
                "usage": {
                    "prompt_tokens": self.prompt_tokens,
                    "completion_tokens": self.completion_tokens,
                    "total_tokens": self.prompt_tokens + self.completion_tokens,
                    "prompt_tokens_details": {"cached_tokens": self.cache_read},
                },
                "system_fingerprint": "fp_double",
            }
        )

    def anthropic_usage(self, compacted: bool = False) -> dict[str, Any]:
        """A message's usage; after a threshold compaction (``compact_20260112``), as
        documented: the top level is the answer's own sampling over the compacted context,
        ``iterations`` lists the compaction step (billed apart) and the message step."""
        if not compacted:
            return {
                "input_tokens": self.prompt_tokens,
                "cache_read_input_tokens": self.cache_read,
                "cache_creation_input_tokens": self.cache_creation,
                "output_tokens": self.completion_tokens,
            }
        own = {
            "input_tokens": COMPACTED_INPUT,
            "cache_read_input_tokens": 0,
            "cache_creation_input_tokens": 0,
            "output_tokens": self.completion_tokens,
        }
        step = {
            "type": "compaction",
            "input_tokens": self.prompt_tokens,
            "cache_read_input_tokens": 0,
            "cache_creation_input_tokens": 0,
            "output_tokens": COMPACTION_OUTPUT,
        }
        return own | {"iterations": [step, {"type": "message", **own}]}

    def anthropic_body(self, model: str, compacted: bool = False) -> bytes:
        content: list[dict[str, Any]] = [{"type": "text", "text": "The answer is 42."}]
        if compacted:  # the summary comes first; the client sends it back next turn
            content.insert(0, {"type": "compaction", "content": "Summary of the conversation."})
        return orjson.dumps(
            {
                "id": "msg_double_1",
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": content,
                "stop_reason": "end_turn",
                "stop_sequence": None,
                "usage": self.anthropic_usage(compacted),
            }
        )

    def anthropic_context(self, body: dict[str, Any]) -> tuple[JSONResponse | None, bool]:
        """Anthropic's documented rules for context management: the on-demand ``compaction``
        parameter shares no request with ``context_management``; ``clear_thinking_20251015``
        must come first among the edits; a ``compact_20260112`` trigger is at least 50,000
        tokens (default 150,000) and compacts once the input reaches it. Returns a refusal
        (400 ``invalid_request_error``), or whether the answer was compacted."""

        def refuse(message: str) -> tuple[JSONResponse, bool]:
            err = {"type": "invalid_request_error", "message": message}
            return JSONResponse({"type": "error", "error": err}, 400), False

        cm = body.get("context_management")
        if "compaction" in body and cm is not None:
            return refuse("compaction cannot be used together with context_management")
        edits = cm.get("edits", []) if isinstance(cm, dict) else []
        kinds = [e.get("type") for e in edits if isinstance(e, dict)]
        if "clear_thinking_20251015" in kinds[1:]:
            return refuse("clear_thinking_20251015 must be the first edit in context_management")
        for edit in edits:
            if isinstance(edit, dict) and edit.get("type") == "compact_20260112":
                trigger = (edit.get("trigger") or {}).get("value", 150_000)
                if trigger < 50_000:
                    return refuse("compact_20260112 trigger must be at least 50000 input tokens")
                return None, self.prompt_tokens >= trigger
        return None, False

    def openai_events(self, model: str, include_usage: bool, n: int) -> list[bytes]:
        base = {
            "id": "chatcmpl-double-2",
            "object": "chat.completion.chunk",
            "created": 1700000000,
            "model": model,
            "system_fingerprint": "fp_double",
        }
        extra = {"usage": None} if include_usage else {}
        events = []
        first = (
            base
            | {
                "choices": [
                    {
                        "index": 0,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ]
            }
            | extra
        )
        events.append(first)
        for i in range(n):
            events.append(
                base
                | {
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"content": f"tok{i} "},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ]
                }
                | extra
            )
        events.append(
            base
            | {"choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}]}
            | extra
        )
        if include_usage:
            events.append(
                base
                | {
                    "choices": [],
                    "usage": {
                        "prompt_tokens": self.prompt_tokens,
                        "completion_tokens": self.completion_tokens,
                        "total_tokens": self.prompt_tokens + self.completion_tokens,
                    },
                }
            )
        out = [b"data: " + orjson.dumps(e) + b"\n\n" for e in events]
        out.append(b"data: [DONE]\n\n")
        return out

    def anthropic_events(self, model: str, n: int, compacted: bool = False) -> list[bytes]:
        def ev(name: str, data: dict[str, Any]) -> bytes:
            return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"

        out = [
            ev(
                "message_start",
                {
                    "type": "message_start",
                    "message": {
                        "id": "msg_double_2",
                        "type": "message",
                        "role": "assistant",
                        "model": model,
                        "content": [],
                        "stop_reason": None,
                        "stop_sequence": None,
                        "usage": self.anthropic_usage(compacted)
                        | {"output_tokens": 1}
                        | ({"iterations": None} if compacted else {}),
                    },
                },
            ),
            ev(
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "text", "text": ""},
                },
            ),
            ev("ping", {"type": "ping"}),
        ]
        for i in range(n):
            out.append(
                ev(
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": 0,
                        "delta": {"type": "text_delta", "text": f"tok{i} "},
                    },
                )
            )
        out += [
            ev("content_block_stop", {"type": "content_block_stop", "index": 0}),
            ev(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                    "usage": {"output_tokens": self.completion_tokens}
                    # the final usage repeats the iterations, the compaction step among them
                    | (
                        {"iterations": self.anthropic_usage(True)["iterations"]}
                        if compacted
                        else {}
                    ),
                },
            ),
            ev("message_stop", {"type": "message_stop"}),
        ]
        return out

    # -- the app --------------------------------------------------------------------------

    async def _record(self, request: Request) -> Received:
        rec = Received(request.url.path, dict(request.headers), await request.body())
        self.received.append(rec)
        return rec

    def _stream(self, events: list[bytes], pace: float, split: bool) -> StreamingResponse:
        async def gen() -> AsyncIterator[bytes]:
            try:
                for e in events:
                    if split:  # cut events across network chunks to exercise reassembly
                        mid = len(e) // 2
                        yield e[:mid]
                        await asyncio.sleep(0)
                        yield e[mid:]
                    else:
                        yield e
                    if pace:
                        await asyncio.sleep(pace)
            except BaseException:
                self.stream_cancelled.set()
                raise

        self.last_bodies["stream"] = b"".join(events)
        return StreamingResponse(gen(), media_type="text/event-stream")

    async def _control(self, request: Request, api: str) -> Response | None:
        delay = float(request.headers.get("x-double-delay", "0"))
        if delay:
            await asyncio.sleep(delay)
        status = int(request.headers.get("x-double-status", "0"))
        if status:
            if api == "anthropic":
                body = {
                    "type": "error",
                    "error": {
                        "type": "rate_limit_error" if status == 429 else "api_error",
                        "message": f"double says {status}",
                    },
                }
            else:
                body = {
                    "error": {
                        "message": f"double says {status}",
                        "type": "requests",
                        "param": None,
                        "code": None,
                    }
                }
            return JSONResponse(
                body, status_code=status, headers={"retry-after": "1", "x-double": "error"}
            )
        return None

    async def chat(self, request: Request) -> Response:
        rec = await self._record(request)
        if (r := await self._control(request, "openai")) is not None:
            return r
        body = rec.json
        if body.get("stream"):
            inc = bool((body.get("stream_options") or {}).get("include_usage"))
            return self._stream(
                self.openai_events(
                    body["model"], inc, int(request.headers.get("x-double-chunks", "5"))
                ),
                float(request.headers.get("x-double-pace", "0")),
                request.headers.get("x-double-split") == "1",
            )
        content = self.openai_body(body["model"], request.headers.get("x-double-model"))
        self.last_bodies["openai"] = content
        return Response(
            content,
            media_type="application/json",
            headers={
                "x-request-id": "req_double",
                "openai-processing-ms": "5",
                # hosted APIs set load-balancer cookies; a proxy must not replay them for others
                "set-cookie": "__cf_bm=double-session; Path=/; HttpOnly",
            },
        )

    async def messages(self, request: Request, model: str | None = None) -> Response:
        rec = await self._record(request)
        if (r := await self._control(request, "anthropic")) is not None:
            return r
        body = rec.json
        model = model or body["model"]
        refused, compacted = self.anthropic_context(body)
        if refused is not None:
            return refused
        if body.get("stream"):
            return self._stream(
                self.anthropic_events(
                    model, int(request.headers.get("x-double-chunks", "5")), compacted
                ),
                float(request.headers.get("x-double-pace", "0")),
                request.headers.get("x-double-split") == "1",
            )
        content = self.anthropic_body(model, compacted)
        self.last_bodies["anthropic"] = content
        return Response(
            content, media_type="application/json", headers={"request-id": "req_double"}
        )

    async def count_tokens(self, request: Request) -> Response:
        await self._record(request)
        return JSONResponse({"input_tokens": self.prompt_tokens})

    async def vertex(self, request: Request) -> Response:
        """Anthropic on Vertex AI: ``.../publishers/anthropic/models/{model}:rawPredict`` (or
        ``:streamRawPredict``), and ``.../models/count-tokens:rawPredict``."""
        tail = request.url.path.rsplit("/models/", 1)[-1]
        model, method = tail.split(":", 1)
        if model == "count-tokens":
            return await self.count_tokens(request)
        if method not in ("rawPredict", "streamRawPredict"):
            return JSONResponse({"error": {"code": 404, "message": "no such method"}}, 404)
        return await self.messages(request, model)

    async def models(self, request: Request) -> Response:
        await self._record(request)
        return JSONResponse(
            {
                "object": "list",
                "data": [{"id": "gpt-4o", "object": "model", "created": 0, "owned_by": "double"}],
            }
        )

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/v1/messages", self.messages, methods=["POST"]),
                Route("/v1/messages/count_tokens", self.count_tokens, methods=["POST"]),
                Route("/v1/models", self.models, methods=["GET"]),
                Route(
                    "/v1/projects/{project}/locations/{region}/publishers/anthropic/models/{rest}",
                    self.vertex,
                    methods=["POST"],
                ),
            ]
        )
