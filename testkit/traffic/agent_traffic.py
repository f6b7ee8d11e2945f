"""Generated agent traffic in both APIs, and validators of the providers' published rules.

Shared by the property tests (``tests/core/test_trim_agents.py``) and the trimming benchmark
(``benchmarks/trim_validity.py``), so both judge the trimmer by the same rules. Each generator
takes a ``random.Random``: a seed is a conversation.

Shapes: agent loops with parallel tool calls, Anthropic user messages that hold tool results
*and* text (the reminders coding agents attach), thinking and redacted-thinking blocks with
signatures, documents, search results, images, ``cache_control`` breakpoints, RAG chunks inlined
as ``<document>`` text, an assistant prefill; OpenAI tool loops with parallel calls and RAG.

Every message carries an ``x_id`` so invariants can follow it (the counters ignore it).
"""

from __future__ import annotations

import base64
import itertools
import random
from typing import Any

WORDS = [
    "contract",
    "renewal",
    "fee",
    "EUR",
    "notice",
    "90",
    "days",
    "clause",
    "Northwind",
    "K-17",
    "über",
    "🚀",
    "build",
    "failed",
    "test",
    "passed",
    "src/app.py",
    "line",
    "42",
    "TypeError",
    "None",
    "import",
    "module",
    "refactor",
    "the",
    "function",
    "returns",
]
PNG_1x1 = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
        "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"
    )
).decode()


def words(rng: random.Random, lo: int, hi: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def chunks_text(rng: random.Random, n: int) -> str:
    return "\n".join(f'<document id="d{k}">{words(rng, 20, 300)}</document>' for k in range(n))


# -- Anthropic ------------------------------------------------------------------------------


def anthropic_conversation(rng: random.Random, kind: str | None = None) -> dict[str, Any]:
    """One request body: ``kind`` in agent, rag, chat, prefill (random when None)."""
    kind = kind or rng.choice(["agent", "agent", "rag", "chat", "prefill"])
    thinking = kind == "agent" and rng.random() < 0.5
    msgs: list[dict[str, Any]] = []
    n_turns = rng.randint(1, 6)
    call = 0
    cache_turn = rng.randint(-1, n_turns - 1)
    for t in range(n_turns):
        blocks: list[dict[str, Any]] = []
        if kind == "rag" or rng.random() < 0.2:
            for k in range(rng.randint(0, 3)):
                blocks.append(
                    {
                        "type": "document",
                        "source": {
                            "type": "text",
                            "media_type": "text/plain",
                            "data": words(rng, 20, 300),
                        },
                        "title": f"doc{t}-{k}",
                    }
                )
            if rng.random() < 0.3:
                blocks.append(
                    {
                        "type": "search_result",
                        "source": f"https://example.test/{t}",
                        "title": f"result {t}",
                        "content": [{"type": "text", "text": words(rng, 20, 200)}],
                    }
                )
        if rng.random() < 0.15:
            blocks.append(
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": PNG_1x1},
                }
            )
        inline = chunks_text(rng, rng.randint(0, 3)) + "\n" if kind == "rag" else ""
        blocks.append({"type": "text", "text": f"{inline}Q{t} {words(rng, 1, 30)}"})
        if t == cache_turn:
            blocks[-1]["cache_control"] = {"type": "ephemeral"}
        msgs.append({"role": "user", "content": blocks, "x_id": f"u{t}"})
        last = t == n_turns - 1
        loops = rng.randint(1, 4) if kind == "agent" else 0
        for loop in range(loops):
            ids = [f"toolu_{call + k}" for k in range(rng.randint(1, 3))]
            call += len(ids)
            content: list[dict[str, Any]] = []
            if thinking:
                if rng.random() < 0.15:
                    content.append({"type": "redacted_thinking", "data": f"r3d{t}{loop}" * 8})
                else:
                    content.append(
                        {
                            "type": "thinking",
                            "thinking": words(rng, 5, 60),
                            "signature": f"sig-{t}-{loop}",
                        }
                    )
            if rng.random() < 0.4:
                content.append({"type": "text", "text": words(rng, 1, 15)})
            content += [
                {"type": "tool_use", "id": i, "name": "read_file", "input": {"path": f"src/{i}.py"}}
                for i in ids
            ]
            msgs.append({"role": "assistant", "content": content, "x_id": f"a{t}-{loop}"})
            results: list[dict[str, Any]] = []
            for i in ids:
                inner: Any = words(rng, 10, 800)
                if rng.random() < 0.2:
                    inner = [{"type": "text", "text": words(rng, 10, 400)}]
                if rng.random() < 0.05:
                    inner = [
                        {"type": "text", "text": words(rng, 5, 50)},
                        {
                            "type": "image",
                            "source": {
                                "type": "base64",
                                "media_type": "image/png",
                                "data": PNG_1x1,
                            },
                        },
                    ]
                block: dict[str, Any] = {"type": "tool_result", "tool_use_id": i, "content": inner}
                if rng.random() < 0.1:
                    block["is_error"] = True
                results.append(block)
            if rng.random() < 0.4:  # the coding-agent reminder: text after the results
                results.append(
                    {
                        "type": "text",
                        "text": "<system-reminder>" + words(rng, 3, 40) + "</system-reminder>",
                    }
                )
            if t == cache_turn and rng.random() < 0.3:
                results[-1]["cache_control"] = {"type": "ephemeral"}
            msgs.append({"role": "user", "content": results, "x_id": f"tr{t}-{loop}"})
        if not last:
            final: list[dict[str, Any]] = []
            if thinking and loops == 0:
                final.append(
                    {"type": "thinking", "thinking": words(rng, 5, 40), "signature": f"sig-{t}-f"}
                )
            final.append({"type": "text", "text": words(rng, 1, 40)})
            msgs.append({"role": "assistant", "content": final, "x_id": f"r{t}"})
        elif kind == "prefill":
            msgs.append({"role": "assistant", "content": '{"answer":', "x_id": f"p{t}"})
        elif loops:
            pass  # an agent loop in progress: the request ends with the tool results
    body: dict[str, Any] = {
        "model": "claude-x",
        "max_tokens": 1024,
        "system": [{"type": "text", "text": "You are a coding agent. " + words(rng, 5, 80)}],
        "messages": msgs,
    }
    if kind == "agent":
        body["tools"] = [
            {
                "name": "read_file",
                "description": "Read a file",
                "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
            }
        ]
    if thinking:
        body["thinking"] = {"type": "enabled", "budget_tokens": 2048}
    return body


def anthropic_violations(body: dict[str, Any]) -> list[str]:
    """Rules of the Messages API a request must follow (as published), broken by ``body``."""
    out: list[str] = []
    msgs = body.get("messages") or []
    if not msgs:
        return ["no messages"]
    if msgs[0].get("role") != "user":
        out.append("the first message is not a user message")
    for a, b in itertools.pairwise(msgs):
        if a.get("role") == b.get("role"):
            out.append(f"two {a.get('role')} messages in a row ({a.get('x_id')}, {b.get('x_id')})")
    for k, m in enumerate(msgs):
        content = m.get("content")
        if isinstance(content, str):
            if not content.strip():
                out.append(f"{m.get('x_id')}: empty or whitespace-only content")
            continue
        if not content:
            out.append(f"{m.get('x_id')}: empty content list")
            continue
        seen_other = False
        for b in content:
            if b.get("type") == "text" and not str(b.get("text", "")).strip():
                out.append(f"{m.get('x_id')}: empty text block")
            if b.get("type") == "tool_result":
                if seen_other:
                    out.append(f"{m.get('x_id')}: a tool_result after other content")
            else:
                seen_other = True
        uses = [b["id"] for b in content if b.get("type") == "tool_use"]
        if uses:
            nxt = msgs[k + 1] if k + 1 < len(msgs) else None
            got = (
                {
                    b.get("tool_use_id")
                    for b in nxt["content"]
                    if isinstance(b, dict) and b.get("type") == "tool_result"
                }
                if nxt is not None and isinstance(nxt.get("content"), list)
                else set()
            )
            if nxt is not None and not set(uses) <= got:
                out.append(f"{m.get('x_id')}: tool_use without a tool_result in the next message")
        results = [b.get("tool_use_id") for b in content if b.get("type") == "tool_result"]
        if results:
            prev = msgs[k - 1] if k > 0 else None
            asked = (
                {
                    b.get("id")
                    for b in prev["content"]
                    if isinstance(b, dict) and b.get("type") == "tool_use"
                }
                if prev is not None and isinstance(prev.get("content"), list)
                else set()
            )
            if not set(results) <= asked:
                out.append(
                    f"{m.get('x_id')}: tool_result without its tool_use in the message before"
                )
        if (
            m.get("role") == "assistant"
            and body.get("thinking")
            and any(b.get("type") in ("thinking", "redacted_thinking") for b in content)
        ) and content[0].get("type") not in ("thinking", "redacted_thinking"):
            out.append(f"{m.get('x_id')}: thinking is not the first block")
    last = msgs[-1]
    prefill = last.get("content") if last.get("role") == "assistant" else None
    if isinstance(prefill, str) and prefill != prefill.rstrip():
        out.append("the prefill ends with whitespace")
    return out


# -- OpenAI ---------------------------------------------------------------------------------


def openai_conversation(rng: random.Random, kind: str | None = None) -> dict[str, Any]:
    kind = kind or rng.choice(["agent", "agent", "rag", "chat"])
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an agent. " + words(rng, 3, 60), "x_id": "sys"}
    ]
    call = 0
    n_turns = rng.randint(1, 6)
    for t in range(n_turns):
        inline = chunks_text(rng, rng.randint(0, 4)) + "\n" if kind == "rag" else ""
        content: Any = f"{inline}Q{t} {words(rng, 1, 30)}"
        if rng.random() < 0.1:
            content = [
                {"type": "text", "text": content},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64," + PNG_1x1}},
            ]
        msgs.append({"role": "user", "content": content, "x_id": f"u{t}"})
        for loop in range(rng.randint(1, 4) if kind == "agent" else 0):
            ids = [f"call_{call + k}" for k in range(rng.randint(1, 3))]
            call += len(ids)
            msgs.append(
                {
                    "role": "assistant",
                    "content": words(rng, 1, 10) if rng.random() < 0.3 else None,
                    "tool_calls": [
                        {
                            "id": i,
                            "type": "function",
                            "function": {"name": "read_file", "arguments": '{"path": "a.py"}'},
                        }
                        for i in ids
                    ],
                    "x_id": f"a{t}-{loop}",
                }
            )
            for i in ids:
                msgs.append(
                    {
                        "role": "tool",
                        "tool_call_id": i,
                        "content": words(rng, 10, 800),
                        "x_id": f"t-{i}",
                    }
                )
        if t < n_turns - 1 or rng.random() < 0.5:
            msgs.append({"role": "assistant", "content": words(rng, 1, 40), "x_id": f"r{t}"})
    body: dict[str, Any] = {"model": "gpt-4o", "messages": msgs}
    if kind == "agent":
        body["tools"] = [
            {
                "type": "function",
                "function": {"name": "read_file", "parameters": {"type": "object"}},
            }
        ]
    return body


def openai_violations(body: dict[str, Any]) -> list[str]:
    """Rules of chat completions a request must follow, broken by ``body``."""
    out: list[str] = []
    msgs = body.get("messages") or []
    if not msgs:
        return ["no messages"]
    pending: set[str] = set()
    for m in msgs:
        role = m.get("role")
        if role == "tool":
            if m.get("tool_call_id") not in pending:
                out.append(f"{m.get('x_id')}: a tool message that answers no pending tool call")
            pending.discard(m.get("tool_call_id"))
            continue
        if pending:
            out.append(f"{m.get('x_id')}: tool calls {sorted(pending)} left unanswered")
            pending = set()
        if role == "assistant":
            pending = {c["id"] for c in m.get("tool_calls") or []}
        content = m.get("content")
        if isinstance(content, list) and not content:
            out.append(f"{m.get('x_id')}: empty content list")
        if role == "user" and isinstance(content, str) and not content.strip():
            out.append(f"{m.get('x_id')}: empty user message")
    if pending:
        out.append(f"tool calls {sorted(pending)} left unanswered at the end")
    return out


KINDS = {"openai": ("agent", "rag", "chat"), "anthropic": ("agent", "rag", "chat", "prefill")}


def generate(api: str, rng: random.Random, kind: str | None = None) -> dict[str, Any]:
    return openai_conversation(rng, kind) if api == "openai" else anthropic_conversation(rng, kind)


def violations(api: str, body: dict[str, Any]) -> list[str]:
    return openai_violations(body) if api == "openai" else anthropic_violations(body)
