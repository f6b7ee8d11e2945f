"""The structure of a chat request, checked once before anything reads it.

The counters, the image-size code and the trimmer read nested fields of the client's body. A
body that parses as JSON but has a number where an object belongs must be a 400 naming the field,
never a crash that becomes a 500 (SDKs retry a 500, so one bad payload becomes several). The
checks here cover exactly the fields the sidecar reads, in the shapes the providers document;
anything else in the body is the upstream's to judge, and passes through untouched.

Depth: JSON parsers accept bodies nested 1,024 deep, serialisers refuse past 255; no chat
request needs more than a few dozen levels, so deeper bodies are refused up front.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from context_ceiling.core.errors import CeilingError

MAX_DEPTH = 64


class RequestShapeError(CeilingError, ValueError):
    """The request body is not a valid chat request; the message names the field."""


def _is(value: Any, types: type | tuple[type, ...], where: str, what: str) -> None:
    if not isinstance(value, types):
        raise RequestShapeError(f"{where} must be {what}")


def _opt(
    obj: Mapping[str, Any], key: str, types: type | tuple[type, ...], where: str, what: str
) -> None:
    if obj.get(key) is not None:
        _is(obj[key], types, f"{where}.{key}", what)


def check_depth(value: Any, limit: int = MAX_DEPTH) -> None:
    """Iterative (a recursive walk of a 1,000-deep body would itself hit Python's limit)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if d > limit:
            raise RequestShapeError(f"the request body is nested more than {limit} levels deep")
        if isinstance(v, dict):
            stack.extend((x, d + 1) for x in v.values() if isinstance(x, dict | list))
        elif isinstance(v, list):
            stack.extend((x, d + 1) for x in v if isinstance(x, dict | list))


def check_depth_around(body: Mapping[str, Any], key: str) -> None:
    """The depth check of ``body`` except its list ``key`` (the messages), whose items are
    checked one by one (:func:`check_item_depth`) so that a message counted before, whose bytes
    are unchanged, is not walked again."""
    for k, v in body.items():
        if k != key and isinstance(v, dict | list):
            check_depth(v, MAX_DEPTH - 1)


def check_item_depth(item: Any) -> None:
    """The depth check of one item of a body's top-level list (the body is level 1, the list
    level 2)."""
    if isinstance(item, dict | list):
        check_depth(item, MAX_DEPTH - 2)


def _messages(body: Mapping[str, Any]) -> list[Any]:
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise RequestShapeError("'messages' is required and must be an array")
    return messages


def _each(items: list[Any], check: Callable[[int, Any], None]) -> None:
    """Each item of a body's top-level list: its depth, then its shape."""
    for i, item in enumerate(items):
        check_item_depth(item)
        check(i, item)


def check_openai_chat(body: Mapping[str, Any]) -> None:
    check_openai_chat_top(body)
    _each(_messages(body), check_openai_message)


def check_openai_chat_top(body: Mapping[str, Any]) -> None:
    """Everything of a chat completions body but its messages' insides."""
    check_depth_around(body, "messages")
    _messages(body)
    for key in ("tools", "functions"):
        if body.get(key) is not None:
            _is(body[key], list, f"'{key}'", "an array")
            for k, t in enumerate(body[key]):
                _is(t, dict, f"{key}[{k}]", "an object")
    _opt(body, "stream_options", dict, "'stream_options'", "an object")


def check_openai_message(i: int, m: Any) -> None:
    """One chat completions message (``messages[i]``)."""
    w = f"messages[{i}]"
    _is(m, dict, w, "an object")
    if m.get("role") is None:
        raise RequestShapeError(f"{w}.role is required")
    _is(m["role"], str, f"{w}.role", "a string")
    _opt(m, "name", str, w, "a string")
    content = m.get("content")
    if isinstance(content, list):
        for j, part in enumerate(content):
            pw = f"{w}.content[{j}]"
            _is(part, dict, pw, "an object")
            _opt(part, "type", str, pw, "a string")
            kind = part.get("type")
            if kind in ("text", "input_text"):
                _opt(part, "text", str, pw, "a string")
            elif kind == "refusal":
                _opt(part, "refusal", str, pw, "a string")
            elif kind == "image_url":
                img = part.get("image_url")
                if isinstance(img, dict):
                    _is(img.get("url"), str, f"{pw}.image_url.url", "a string")
                    _opt(img, "detail", str, f"{pw}.image_url", "a string")
                else:
                    _is(img, str, f"{pw}.image_url", "an object with a url")
            elif kind == "file":
                _opt(part, "file", dict, pw, "an object")
    elif content is not None and not isinstance(content, str):
        raise RequestShapeError(f"{w}.content must be a string, an array or null")
    if m.get("tool_calls") is not None:
        _is(m["tool_calls"], list, f"{w}.tool_calls", "an array")
        for k, call in enumerate(m["tool_calls"]):
            cw = f"{w}.tool_calls[{k}]"
            _is(call, dict, cw, "an object")
            _opt(call, "function", dict, cw, "an object")
            fn = call.get("function") or {}
            _opt(fn, "name", str, f"{cw}.function", "a string")
            _opt(fn, "arguments", str, f"{cw}.function", "a string")
    if m.get("function_call") is not None:
        _is(m["function_call"], dict, f"{w}.function_call", "an object")


def _anthropic_block(b: Any, w: str, in_tool_result: bool = False) -> None:
    if in_tool_result and isinstance(b, str):
        return
    _is(b, dict, w, "an object")
    _is(b.get("type"), str, f"{w}.type", "a string")
    kind = b["type"]
    if kind == "text":
        _opt(b, "text", str, w, "a string")
    elif kind == "image":
        src = b.get("source")
        _is(src, dict, f"{w}.source", "an object")
        _opt(src, "data", str, f"{w}.source", "a string")
        _opt(src, "type", str, f"{w}.source", "a string")
    elif kind in ("document", "search_result"):
        src = b.get("source")
        if src is not None and not isinstance(src, str):
            _is(src, dict, f"{w}.source", "an object or a string")
            _opt(src, "data", str, f"{w}.source", "a string")
            if src.get("content") is not None:
                _is(src["content"], list, f"{w}.source.content", "an array")
                for k, x in enumerate(src["content"]):
                    _is(x, dict, f"{w}.source.content[{k}]", "an object")
        if b.get("content") is not None:
            _is(b["content"], list, f"{w}.content", "an array")
            for k, x in enumerate(b["content"]):
                _is(x, dict, f"{w}.content[{k}]", "an object")
        for key in ("title", "context"):
            _opt(b, key, str, w, "a string")
    elif kind == "tool_result":
        inner = b.get("content")
        if isinstance(inner, list):
            for k, x in enumerate(inner):
                _anthropic_block(x, f"{w}.content[{k}]", in_tool_result=True)
        elif inner is not None and not isinstance(inner, str):
            raise RequestShapeError(f"{w}.content must be a string or an array")
    elif kind == "tool_use":
        _opt(b, "name", str, w, "a string")
    elif kind == "thinking":
        _opt(b, "thinking", str, w, "a string")


def check_anthropic_messages(body: Mapping[str, Any]) -> None:
    check_anthropic_top(body)
    _each(_messages(body), check_anthropic_message)


def check_anthropic_top(body: Mapping[str, Any]) -> None:
    """Everything of a messages body but its messages' insides."""
    check_depth_around(body, "messages")
    _messages(body)
    system = body.get("system")
    if isinstance(system, list):
        for j, b in enumerate(system):
            _is(b, dict, f"system[{j}]", "an object")
            _opt(b, "text", str, f"system[{j}]", "a string")
    elif system is not None and not isinstance(system, str):
        raise RequestShapeError("'system' must be a string or an array of text blocks")
    if body.get("tools") is not None:
        _is(body["tools"], list, "'tools'", "an array")
        for k, t in enumerate(body["tools"]):
            _is(t, dict, f"tools[{k}]", "an object")


def check_anthropic_message(i: int, m: Any) -> None:
    """One messages-API message (``messages[i]``)."""
    w = f"messages[{i}]"
    _is(m, dict, w, "an object")
    if m.get("role") not in ("user", "assistant"):
        raise RequestShapeError(f"{w}.role must be 'user' or 'assistant'")
    content = m.get("content")
    if isinstance(content, list):
        for j, b in enumerate(content):
            _anthropic_block(b, f"{w}.content[{j}]")
    elif not isinstance(content, str):
        raise RequestShapeError(f"{w}.content must be a string or an array")


def check_openai_responses(body: Mapping[str, Any]) -> None:
    """The Responses API: ``input`` a string or items (messages with text, image and file
    parts; ``function_call`` / ``function_call_output`` pairs; reasoning items)."""
    check_responses_top(body)
    items = body.get("input")
    if isinstance(items, list):
        _each(items, check_responses_item)


def check_responses_top(body: Mapping[str, Any]) -> None:
    """Everything of a Responses body but its input items' insides."""
    check_depth_around(body, "input")
    _opt(body, "instructions", str, "'instructions'", "a string")
    if body.get("tools") is not None:
        _is(body["tools"], list, "'tools'", "an array")
        for k, t in enumerate(body["tools"]):
            _is(t, dict, f"tools[{k}]", "an object")
    items = body.get("input")
    if items is None or isinstance(items, str):
        return
    _is(items, list, "'input'", "a string or an array of items")


def check_responses_item(i: int, it: Any) -> None:
    """One Responses input item (``input[i]``)."""
    w = f"input[{i}]"
    _is(it, dict, w, "an object")
    _opt(it, "type", str, w, "a string")
    _opt(it, "role", str, w, "a string")
    kind = it.get("type") or "message"  # as the count reads it: an untyped item is a message
    if kind == "message":
        content = it.get("content")
        if isinstance(content, list):
            for j, part in enumerate(content):
                pw = f"{w}.content[{j}]"
                _is(part, dict, pw, "an object")
                _opt(part, "type", str, pw, "a string")
                _opt(part, "text", str, pw, "a string")
                _opt(part, "image_url", str, pw, "a string")
                _opt(part, "detail", str, pw, "a string")
        elif content is not None and not isinstance(content, str):
            raise RequestShapeError(f"{w}.content must be a string or an array")
    elif kind == "function_call":
        _opt(it, "name", str, w, "a string")
        _opt(it, "arguments", str, w, "a string")
    elif kind == "function_call_output":
        out = it.get("output")
        if isinstance(out, list):
            for j, part in enumerate(out):
                _is(part, dict, f"{w}.output[{j}]", "an object")
        elif out is not None and not isinstance(out, str):
            raise RequestShapeError(f"{w}.output must be a string or an array")


def check_gemini(body: Mapping[str, Any]) -> None:
    """Gemini ``generateContent``: ``contents`` of ``parts`` (text, inline data, file data,
    function calls and responses), ``systemInstruction``, ``tools``, ``generationConfig``."""
    check_gemini_top(body)
    _each(body["contents"], check_gemini_content)


def check_gemini_top(body: Mapping[str, Any]) -> None:
    """Everything of a generateContent body but its contents' insides."""
    check_depth_around(body, "contents")
    contents = body.get("contents")
    if not isinstance(contents, list):
        raise RequestShapeError("'contents' is required and must be an array")
    si = body.get("systemInstruction")
    if si is not None:
        _is(si, dict, "'systemInstruction'", "an object")
        _gemini_parts(si.get("parts"), "systemInstruction")
    if body.get("tools") is not None:
        _is(body["tools"], list, "'tools'", "an array")
    if body.get("generationConfig") is not None:
        _is(body["generationConfig"], dict, "'generationConfig'", "an object")


def check_gemini_content(i: int, c: Any) -> None:
    """One Gemini content (``contents[i]``)."""
    _is(c, dict, f"contents[{i}]", "an object")
    _opt(c, "role", str, f"contents[{i}]", "a string")
    _gemini_parts(c.get("parts"), f"contents[{i}]")


def _gemini_parts(parts: Any, where: str) -> None:
    if parts is None:
        return
    _is(parts, list, f"{where}.parts", "an array")
    for j, p in enumerate(parts):
        pw = f"{where}.parts[{j}]"
        _is(p, dict, pw, "an object")
        _opt(p, "text", str, pw, "a string")
        for key in ("inlineData", "fileData", "functionCall", "functionResponse"):
            _opt(p, key, dict, pw, "an object")
