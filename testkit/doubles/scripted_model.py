"""A test double for a language model whose accuracy falls at a known utilization.

It stands in for a real model where the statistics must be checked against a known truth: it
reads the question from the prompt, looks the item up in the task set, measures the prompt's
utilization with the shared counter, and answers correctly with probability ``high`` below the
knee and ``low`` above it (deterministically per prompt, so repeats with different gold positions
vary). Wrong answers are decoys: a neighbour's value citing the neighbour's document.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from context_ceiling.core.tokenizers import TiktokenCounter
from context_ceiling.formats.openai_chat import count as count_openai
from context_ceiling.sweep.taskset import ExactAnswer, Item, SetAnswer, TaskSet

_Q = re.compile(r"Question: (.*?)\nReply with JSON", re.S)


@dataclass
class ScriptedModelDouble:
    ts: TaskSet
    window: int
    knee: float
    high: float = 0.95
    low: float = 0.2
    delay: float = 0.0
    fail_first: dict[str, int] = field(default_factory=dict)  # status -> how many times
    calls: int = 0
    shoulder: tuple[float, float] | None = None  # (from utilization, accuracy) before the knee
    closed_book: bool = False  # answers right with no documents too (it knows the task set)
    reasoning_only: bool = False  # refuses max_tokens / temperature like a reasoning model
    usage_scale: float = 1.0  # reports prompt tokens off by this factor (another tokenizer)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    #: OpenAI's automatic prompt cache, as documented: a prompt of 1,024 tokens or more reads
    #: from the cache the longest prefix it shares with an earlier prompt, in steps of 128
    #: tokens from 1,024 (reported as ``usage.prompt_tokens_details.cached_tokens``)
    prompt_cache: bool = True
    seen: list[Any] = field(default_factory=list)  # the last prompts' token ids

    def __post_init__(self) -> None:
        self.by_question = {it.question: it for it in self.ts.items}
        self.enc = TiktokenCounter("o200k_base")

    def _answer(self, item: Item, correct: bool) -> dict[str, Any]:
        a = item.answer
        if correct:
            value: Any = (
                a.value
                if isinstance(a, ExactAnswer)
                else a.values
                if isinstance(a, SetAnswer)
                else a.value
            )
            return {"answer": value, "evidence": item.gold}
        value = item.decoy_values[0] if item.decoy_values else "unknown"
        return {
            "answer": [value] if isinstance(a, SetAnswer) else value,
            "evidence": item.decoy_docs[:1],
        }

    async def chat(self, request: Request) -> Response:
        self.calls += 1
        for status, n in list(self.fail_first.items()):
            if n > 0:
                self.fail_first[status] = n - 1
                return JSONResponse(
                    {"error": {"message": "scripted failure"}},
                    status_code=int(status),
                    headers={"retry-after": "0"},
                )
        if self.delay:
            await asyncio.sleep(self.delay)
        body = await request.json()
        self.bodies.append({k: v for k, v in body.items() if k != "messages"})
        if self.reasoning_only and ("max_tokens" in body or "temperature" in body):
            return JSONResponse(
                {
                    "error": {
                        "message": "Unsupported parameter: 'max_tokens' is not supported with "
                        "this model. Use 'max_completion_tokens' instead.",
                        "type": "invalid_request_error",
                        "param": "max_tokens",
                        "code": "unsupported_parameter",
                    }
                },
                status_code=400,
            )
        user = body["messages"][-1]["content"]
        m = _Q.search(user)
        item = self.by_question.get(m.group(1).strip()) if m else None
        tokens = count_openai(body, self.enc).total
        cached = self._cached(body) if self.prompt_cache else 0
        if item is not None and self.closed_book:
            reply: dict[str, Any] = self._answer(item, True)
        elif item is None or "(no documents)" in user:
            reply = {"answer": None, "evidence": []}
        else:
            u = int.from_bytes(hashlib.sha256(user.encode()).digest()[:8], "big") / 2**64
            u_fill = tokens / self.window
            p = self.high if u_fill < self.knee else self.low
            if self.shoulder and self.shoulder[0] <= u_fill < self.knee:
                p = self.shoulder[1]
            reply = self._answer(item, u < p)
        return JSONResponse(
            {
                "id": "chatcmpl-scripted",
                "object": "chat.completion",
                "model": "scripted-model-v1",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": json.dumps(reply)},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {
                    "prompt_tokens": round(tokens * self.usage_scale),
                    "completion_tokens": 20,
                    "total_tokens": tokens + 20,
                    "prompt_tokens_details": {"cached_tokens": cached},
                },
            }
        )

    def _cached(self, body: dict[str, Any]) -> int:
        import numpy as np

        text = "".join(str(m.get("role")) + str(m.get("content")) for m in body["messages"])
        ids = np.asarray(self.enc.encoding.encode_ordinary(text), dtype=np.int64)
        best = 0
        for prev in self.seen:
            n = min(len(prev), len(ids))
            differ = np.flatnonzero(prev[:n] != ids[:n])
            best = max(best, int(differ[0]) if len(differ) else n)
        self.seen = [*self.seen[-15:], ids]
        if len(ids) < 1024 or best < 1024:
            return 0
        return 1024 + (best - 1024) // 128 * 128

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/chat/completions", self.chat, methods=["POST"])])
