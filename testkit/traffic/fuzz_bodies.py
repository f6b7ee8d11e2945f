"""Request bodies for fuzzing: valid templates of both APIs touching every field the sidecar
reads, a list of every path into them, and a mutation that puts another JSON value at one path.
Shared by the property test (``tests/sidecar/test_failure_modes.py``) and ``benchmarks/fuzz.py``."""

from __future__ import annotations

import json
import random
from typing import Any

OPENAI_TEMPLATE: dict[str, Any] = {
    "model": "gpt-4o",
    "messages": [
        {"role": "system", "content": "s"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "t"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c", "content": "r"},
    ],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
    "stream_options": {"include_usage": True},
}
ANTHROPIC_TEMPLATE: dict[str, Any] = {
    "model": "claude-x",
    "max_tokens": 10,
    "system": [{"type": "text", "text": "s"}],
    "messages": [
        {
            "role": "user",
            "content": [
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"},
                },
                {
                    "type": "document",
                    "source": {"type": "content", "content": [{"type": "text", "text": "d"}]},
                },
                {"type": "text", "text": "q"},
            ],
        },
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t",
                    "content": [{"type": "text", "text": "r"}],
                }
            ],
        },
    ],
    "tools": [{"name": "f", "input_schema": {}}],
}


RESPONSES_TEMPLATE: dict[str, Any] = {
    "model": "gpt-4o",
    "instructions": "s",
    "input": [
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "t"},
                {"type": "input_image", "image_url": "data:image/png;base64,AAAA"},
            ],
        },
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "r"},
        {"type": "reasoning", "id": "rs", "summary": []},
    ],
    "tools": [{"type": "function", "name": "f", "parameters": {}}],
    "max_output_tokens": 10,
}
GEMINI_TEMPLATE: dict[str, Any] = {
    "systemInstruction": {"parts": [{"text": "s"}]},
    "contents": [
        {
            "role": "user",
            "parts": [{"text": "t"}, {"inlineData": {"mimeType": "image/png", "data": "AAAA"}}],
        },
        {"role": "model", "parts": [{"functionCall": {"name": "f", "args": {}}}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {"r": 1}}}]},
    ],
    "tools": [{"functionDeclarations": [{"name": "f"}]}],
    "generationConfig": {"maxOutputTokens": 10},
}
#: where each template is sent
ROUTES = {
    "openai": "/v1/chat/completions",
    "anthropic": "/v1/messages",
    "responses": "/v1/responses",
    "gemini": "/v1beta/models/gemini-x:generateContent",
}
TEMPLATES = {
    "openai": OPENAI_TEMPLATE,
    "anthropic": ANTHROPIC_TEMPLATE,
    "responses": RESPONSES_TEMPLATE,
    "gemini": GEMINI_TEMPLATE,
}


def non_object_parts(template: dict[str, Any]) -> list[tuple[tuple[Any, ...], Any]]:
    """(path, value) mutations that put a scalar or a list where a content part (an object
    inside a list) belongs, at every depth: the shape a careless client sends."""
    out = []
    for path in paths(template):
        if path and isinstance(path[-1], int):
            for value in (5, None, "s", [1], [[{"type": "text"}]], True):
                out.append((path, value))
    return out


def paths(v: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [at]
    if isinstance(v, dict):
        for k, x in v.items():
            out += paths(x, (*at, k))
    elif isinstance(v, list):
        for k, x in enumerate(v):
            out += paths(x, (*at, k))
    return out


def mutate(template: dict[str, Any], path: tuple[Any, ...], value: Any) -> Any:
    body = json.loads(json.dumps(template))
    if not path:
        return value
    node = body
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return body


def random_json(rng: random.Random, depth: int = 0) -> Any:
    """Any JSON value: scalars of every type, lists and objects, occasionally nested deep."""
    r = rng.random()
    if depth > 3 or r < 0.5:
        return rng.choice([None, True, False, 0, -1, 7, 2**40, 1.5, "", "x", "data:,", "🚀" * 3])
    if r < 0.6:
        deep: Any = "x"
        for _ in range(rng.choice([10, 100, 256, 300])):
            deep = [deep]
        return deep
    if r < 0.8:
        return [random_json(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {
        rng.choice(["type", "text", "url", "source", "content", "x"]): random_json(rng, depth + 1)
        for _ in range(rng.randint(0, 3))
    }
