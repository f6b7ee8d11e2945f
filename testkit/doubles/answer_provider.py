"""A test double for the hosted providers' answers, served for real on loopback.

It stands in for api.openai.com (chat completions and the Responses API), api.anthropic.com and
the Gemini API, and answers each request with a scripted answer (:class:`Script`) in the wire
shape of that API, as a body or as a stream: text, a refusal, tool calls with arguments as given,
and the stop reason the API uses for a normal stop, the output cap, a content filter, a refusal
or tool calls. The official SDKs parse what it sends.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

StopKind = Literal["stop", "truncated", "content_filter", "refusal", "tool_calls"]


@dataclass
class Script:
    """The next answer: its text, a refusal message (None: no refusal), tool calls as (name,
    arguments as JSON text), and why it stopped."""

    text: str = "The answer is 42."
    stop: StopKind = "stop"
    refusal: str | None = None
    tool_calls: list[tuple[str, str]] = field(default_factory=list)
    reasoning_tokens: int = 0


def _pieces(text: str, n: int = 3) -> list[str]:
    size = max(1, len(text) // n + 1)
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def _sse(obj: Any, event: str | None = None) -> bytes:
    """One SSE event; the Responses API names each event after its ``type``."""
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + orjson.dumps(obj) + b"\n\n"


def _args_object(args: str) -> Any:
    try:
        return json.loads(args)
    except ValueError:
        return {"unparsed": args}


@dataclass
class AnswerProviderDouble:
    """Loopback stand-in for the hosted providers; answers every request with ``script``.
    ``prompt_tokens``: the input it reports."""

    script: Script = field(default_factory=Script)
    prompt_tokens: int = 1000
    completion_tokens: int = 20
    #: of ``prompt_tokens``, how many it reports read from its prompt cache
    cached_tokens: int = 0

    # -- OpenAI chat completions -----------------------------------------------------------

    def _chat_finish(self) -> str:
        s = self.script.stop
        return {
            "truncated": "length",
            "content_filter": "content_filter",
            "tool_calls": "tool_calls",
        }.get(s, "stop")

    def _chat_usage(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "completion_tokens_details": {"reasoning_tokens": self.script.reasoning_tokens},
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }

    async def chat(self, request: Request) -> Response:
        body = json.loads(await request.body())
        s, model = self.script, body.get("model", "gpt-4o")
        calls = [
            {"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": a}}
            for i, (n, a) in enumerate(s.tool_calls)
        ]
        if not body.get("stream"):
            message: dict[str, Any] = {
                "role": "assistant",
                "content": s.text if s.refusal is None else None,
                "refusal": s.refusal,
            }
            if calls:
                message["tool_calls"] = calls
            return JSONResponse(
                {
                    "id": "chatcmpl-double",
                    "object": "chat.completion",
                    "created": 1700000000,
                    "model": model,
                    "choices": [
                        {"index": 0, "message": message, "finish_reason": self._chat_finish()}
                    ],
                    "usage": self._chat_usage(),
                }
            )
        include_usage = (body.get("stream_options") or {}).get("include_usage")

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            return _sse(
                {
                    "id": "chatcmpl-double",
                    "object": "chat.completion.chunk",
                    "created": 1700000000,
                    "model": model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                }
            )

        async def gen() -> AsyncIterator[bytes]:
            yield chunk({"role": "assistant", "content": ""})
            if s.refusal is not None:
                for piece in _pieces(s.refusal):
                    yield chunk({"refusal": piece})
            else:
                for piece in _pieces(s.text) if s.text else []:
                    yield chunk({"content": piece})
            for i, (name, args) in enumerate(s.tool_calls):
                yield chunk(
                    {
                        "tool_calls": [
                            {
                                "index": i,
                                "id": f"call_{i}",
                                "type": "function",
                                "function": {"name": name, "arguments": ""},
                            }
                        ]
                    }
                )
                for piece in _pieces(args):
                    yield chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
            yield chunk({}, self._chat_finish())
            if include_usage:
                yield _sse(
                    {
                        "id": "chatcmpl-double",
                        "object": "chat.completion.chunk",
                        "created": 1700000000,
                        "model": model,
                        "choices": [],
                        "usage": self._chat_usage(),
                    }
                )
            yield b"data: [DONE]\n\n"

        return StreamingResponse(gen(), media_type="text/event-stream")

    # -- the Responses API -------------------------------------------------------------------

    def _response(self, model: str) -> dict[str, Any]:
        s = self.script
        output: list[dict[str, Any]] = []
        if s.refusal is not None:
            content: list[dict[str, Any]] = [{"type": "refusal", "refusal": s.refusal}]
        else:
            content = [{"type": "output_text", "text": s.text, "annotations": []}] if s.text else []
        if content:
            output.append(
                {
                    "type": "message",
                    "id": "msg_double",
                    "status": "completed",
                    "role": "assistant",
                    "content": content,
                }
            )
        for i, (name, args) in enumerate(s.tool_calls):
            output.append(
                {
                    "type": "function_call",
                    "id": f"fc_{i}",
                    "call_id": f"call_{i}",
                    "name": name,
                    "arguments": args,
                    "status": "completed",
                }
            )
        incomplete = {"truncated": "max_output_tokens", "content_filter": "content_filter"}.get(
            s.stop
        )
        return {
            "id": "resp_double",
            "object": "response",
            "created_at": 1700000000,
            "status": "incomplete" if incomplete else "completed",
            "incomplete_details": {"reason": incomplete} if incomplete else None,
            "model": model,
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": {
                "input_tokens": self.prompt_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": self.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": s.reasoning_tokens},
                "total_tokens": self.prompt_tokens + self.completion_tokens,
            },
        }

    async def responses(self, request: Request) -> Response:
        body = json.loads(await request.body())
        final = self._response(body.get("model", "gpt-4o"))
        if not body.get("stream"):
            return JSONResponse(final)
        s = self.script

        async def gen() -> AsyncIterator[bytes]:
            start = {**final, "status": "in_progress", "output": [], "usage": None}
            yield _sse(
                {"type": "response.created", "sequence_number": 0, "response": start},
                "response.created",
            )
            seq = 1
            for piece in _pieces(s.text) if s.text and s.refusal is None else []:
                yield _sse(
                    {
                        "type": "response.output_text.delta",
                        "sequence_number": seq,
                        "item_id": "msg_double",
                        "output_index": 0,
                        "content_index": 0,
                        "delta": piece,
                        "logprobs": [],
                    },
                    "response.output_text.delta",
                )
                seq += 1
            kind = (
                "response.incomplete" if final["status"] == "incomplete" else "response.completed"
            )
            yield _sse({"type": kind, "sequence_number": seq, "response": final}, kind)

        return StreamingResponse(gen(), media_type="text/event-stream")

    # -- Anthropic messages ----------------------------------------------------------------

    def _anthropic_stop(self) -> str:
        return {"truncated": "max_tokens", "refusal": "refusal", "tool_calls": "tool_use"}.get(
            self.script.stop, "end_turn"
        )

    async def messages(self, request: Request) -> Response:
        body = json.loads(await request.body())
        s, model = self.script, body.get("model", "claude-sonnet-4-5")
        # Anthropic reports the cached part apart: input_tokens is what was not read from cache
        usage = {
            "input_tokens": self.prompt_tokens - self.cached_tokens,
            "cache_read_input_tokens": self.cached_tokens,
            "output_tokens": self.completion_tokens,
        }
        if not body.get("stream"):
            content: list[dict[str, Any]] = [{"type": "text", "text": s.text}] if s.text else []
            content += [
                {"type": "tool_use", "id": f"toolu_{i}", "name": n, "input": _args_object(a)}
                for i, (n, a) in enumerate(s.tool_calls)
            ]
            return JSONResponse(
                {
                    "id": "msg_double",
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": content,
                    "stop_reason": self._anthropic_stop(),
                    "stop_sequence": None,
                    "usage": usage,
                }
            )

        async def gen() -> AsyncIterator[bytes]:
            start = {
                "id": "msg_double",
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": self.prompt_tokens, "output_tokens": 1},
            }
            yield _sse({"type": "message_start", "message": start}, "message_start")
            index = 0
            if s.text:
                yield _sse(
                    {
                        "type": "content_block_start",
                        "index": 0,
                        "content_block": {"type": "text", "text": ""},
                    },
                    "content_block_start",
                )
                for piece in _pieces(s.text):
                    yield _sse(
                        {
                            "type": "content_block_delta",
                            "index": 0,
                            "delta": {"type": "text_delta", "text": piece},
                        },
                        "content_block_delta",
                    )
                yield _sse({"type": "content_block_stop", "index": 0}, "content_block_stop")
                index = 1
            for i, (name, args) in enumerate(s.tool_calls, start=index):
                yield _sse(
                    {
                        "type": "content_block_start",
                        "index": i,
                        "content_block": {
                            "type": "tool_use",
                            "id": f"toolu_{i}",
                            "name": name,
                            "input": {},
                        },
                    },
                    "content_block_start",
                )
                for piece in _pieces(args):
                    yield _sse(
                        {
                            "type": "content_block_delta",
                            "index": i,
                            "delta": {"type": "input_json_delta", "partial_json": piece},
                        },
                        "content_block_delta",
                    )
                yield _sse({"type": "content_block_stop", "index": i}, "content_block_stop")
            yield _sse(
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": self._anthropic_stop(), "stop_sequence": None},
                    "usage": {"output_tokens": self.completion_tokens},
                },
                "message_delta",
            )
            yield _sse({"type": "message_stop"}, "message_stop")

        return StreamingResponse(gen(), media_type="text/event-stream")

    # -- Gemini -----------------------------------------------------------------------------

    def _gemini(self, parts: list[dict[str, Any]], final: bool) -> dict[str, Any]:
        s = self.script
        cand: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
        out: dict[str, Any] = {"candidates": [cand], "modelVersion": "gemini-2.5-flash"}
        if final:
            cand["finishReason"] = {"truncated": "MAX_TOKENS", "content_filter": "SAFETY"}.get(
                s.stop, "STOP"
            )
            out["usageMetadata"] = {
                "promptTokenCount": self.prompt_tokens,
                "candidatesTokenCount": self.completion_tokens,
                "thoughtsTokenCount": s.reasoning_tokens,
                "totalTokenCount": self.prompt_tokens + self.completion_tokens,
            }
        return out

    async def gemini(self, request: Request) -> Response:
        s = self.script
        calls = [{"functionCall": {"name": n, "args": _args_object(a)}} for n, a in s.tool_calls]
        if not request.url.path.endswith(":streamGenerateContent"):
            parts = ([{"text": s.text}] if s.text else []) + calls
            return JSONResponse(self._gemini(parts, True))

        async def gen() -> AsyncIterator[bytes]:
            pieces = _pieces(s.text) if s.text else []
            for piece in pieces[:-1]:
                yield _sse(self._gemini([{"text": piece}], False))
            last = ([{"text": pieces[-1]}] if pieces else []) + calls
            yield _sse(self._gemini(last, True))

        return StreamingResponse(gen(), media_type="text/event-stream")

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/openai/deployments/{d}/chat/completions", self.chat, methods=["POST"]),
                Route("/v1/responses", self.responses, methods=["POST"]),
                Route("/v1/messages", self.messages, methods=["POST"]),
                Route("/v1/models/{rest:path}", self.gemini, methods=["POST"]),
                Route("/v1beta/models/{rest:path}", self.gemini, methods=["POST"]),
            ]
        )
