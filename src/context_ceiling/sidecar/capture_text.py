"""What a captured exchange says, per wire format: the request's shape (system prompt, tool
definitions, the latest user question, the retrieved chunks in rank order) and the answer's text
and finish reason, from a response body or a stream's events. Pure functions over parsed JSON:
the capture writer calls them off the request path."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from context_ceiling.core.wire import Shape

_DOC_ID = re.compile(r"""<document\b[^>]*\bid=["']([^"']+)["']""")
_DOC_BODY = re.compile(r"^<document\b[^>]*>(.*)</document>$", re.S)


@dataclass
class Extract:
    system: str = ""
    tools: str = ""
    question: str = ""
    chunks: list[tuple[str, str | None]] | None = None


def _text(content: Any) -> str:
    """The text of a message content: a string, or the text parts of a list of blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for b in content:
            if isinstance(b, str):
                out.append(b)
            elif isinstance(b, Mapping):
                t = b.get("text")
                if isinstance(t, str) and b.get("type") in (None, "text", "input_text"):
                    out.append(t)
        return "\n".join(out)
    return ""


def _documents(content: Any) -> list[tuple[str, str | None]]:
    """Anthropic ``document`` blocks with plain text sources: retrieved chunks as blocks."""
    out: list[tuple[str, str | None]] = []
    if isinstance(content, list):
        for b in content:
            if isinstance(b, Mapping) and b.get("type") == "document":
                src = b.get("source")
                if isinstance(src, Mapping) and isinstance(src.get("data"), str):
                    title = b.get("title")
                    out.append((src["data"], title if isinstance(title, str) else None))
    return out


def _last(messages: Any, roles: tuple[str, ...]) -> Any:
    if isinstance(messages, list):
        for m in reversed(messages):
            if isinstance(m, Mapping) and m.get("role") in roles:
                return m.get("content") if "content" in m else m.get("parts")
    return None


def extract(
    shape: Shape, body: Mapping[str, Any], chunk_pattern: re.Pattern[str] | None
) -> Extract:
    """System prompt, tool definitions, latest user question and retrieved chunks (rank order:
    as they appear) of one request body."""
    ex = Extract()
    chunks: list[tuple[str, str | None]] = []
    if shape == "openai":
        msgs = body.get("messages")
        if isinstance(msgs, list):
            ex.system = "\n".join(
                _text(m.get("content"))
                for m in msgs
                if isinstance(m, Mapping) and m.get("role") in ("system", "developer")
            )
        user = _text(_last(msgs, ("user",)))
        tools = body.get("tools")
    elif shape == "anthropic":
        sys_ = body.get("system")
        ex.system = sys_ if isinstance(sys_, str) else _text(sys_)
        content = _last(body.get("messages"), ("user",))
        user = _text(content)
        chunks += _documents(content)
        tools = body.get("tools")
    elif shape == "responses":
        ins = body.get("instructions")
        ex.system = ins if isinstance(ins, str) else ""
        inp = body.get("input")
        user = inp if isinstance(inp, str) else _text(_last(inp, ("user",)))
        tools = body.get("tools")
    else:  # gemini
        si = body.get("systemInstruction") or body.get("system_instruction")
        ex.system = _text(si.get("parts")) if isinstance(si, Mapping) else ""
        user = _text(_last(body.get("contents"), ("user",)))
        tools = body.get("tools")
    if chunk_pattern is not None and user:
        found = [(m.start(), m.end(), m.group(0)) for m in chunk_pattern.finditer(user)]
        for _, _, raw in found:
            idm = _DOC_ID.search(raw)
            inner = _DOC_BODY.match(raw)
            chunks.append(
                ((inner.group(1) if inner else raw).strip(), idm.group(1) if idm else None)
            )
        for start, end, _ in reversed(found):
            user = user[:start] + user[end:]
    ex.question = re.sub(r"\n{3,}", "\n\n", user).strip()
    ex.tools = json.dumps(tools, sort_keys=True) if tools else ""
    ex.chunks = chunks
    return ex


# -- the response text, whole or streamed -------------------------------------------------------


def _events(raw: bytes) -> list[Any]:
    out = []
    for line in raw.split(b"\n"):
        if line.startswith(b"data:"):
            data = line[5:].strip()
            if data and data != b"[DONE]":
                with contextlib.suppress(ValueError):
                    out.append(json.loads(data))
    return out


def response_text(shape: Shape, raw: bytes, stream: bool) -> tuple[str, str | None]:
    """(the answer's text, its finish reason) from a response body or a stream's events."""
    parts: list[str] = []
    finish: str | None = None
    objs = _events(raw) if stream else [json.loads(raw)] if raw else []
    for o in objs:
        if not isinstance(o, Mapping):
            continue
        if shape == "openai":
            for c in o.get("choices") or []:
                if isinstance(c, Mapping):
                    msg = c.get("delta") if stream else c.get("message")
                    if isinstance(msg, Mapping) and isinstance(msg.get("content"), str):
                        parts.append(msg["content"])
                    finish = c.get("finish_reason") or finish
        elif shape == "anthropic":
            if stream:
                d = o.get("delta")
                if isinstance(d, Mapping):
                    if d.get("type") == "text_delta" and isinstance(d.get("text"), str):
                        parts.append(d["text"])
                    finish = d.get("stop_reason") or finish
            else:
                parts.append(_text(o.get("content")))
                finish = o.get("stop_reason")
        elif shape == "responses":
            if stream:
                if o.get("type") == "response.output_text.delta" and isinstance(
                    o.get("delta"), str
                ):
                    parts.append(o["delta"])
                if o.get("type") == "response.completed":
                    finish = "completed"
            else:
                for item in o.get("output") or []:
                    if isinstance(item, Mapping) and item.get("type") == "message":
                        parts.append(
                            "".join(
                                c.get("text", "")
                                for c in item.get("content") or []
                                if isinstance(c, Mapping) and c.get("type") == "output_text"
                            )
                        )
                finish = o.get("status")
        else:
            for c in o.get("candidates") or []:
                if isinstance(c, Mapping):
                    content = c.get("content")
                    if isinstance(content, Mapping):
                        parts.append(_text(content.get("parts")))
                    finish = c.get("finishReason") or finish
    return "".join(parts), finish
