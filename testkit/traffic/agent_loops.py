"""Long single-task agent loops in each wire format: one user task, then tool rounds (an
assistant call, or several in parallel, and their results), the whole history resent every turn,
as coding and tool agents send them. Used by the agent-context tests and the agent-loop
benchmark; seeded, so a loop is the same on every run."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from context_ceiling.core.vocabulary import Shape

WORDS = [
    "def",
    "return",
    "class",
    "import",
    "self",
    "value",
    "result",
    "error",
    "file",
    "path",
    "line",
    "test",
    "assert",
    "config",
    "request",
    "response",
    "token",
    "budget",
    "window",
    "ceiling",
    "trim",
    "count",
    "model",
    "agent",
    "tool",
    "call",
    "output",
    "alpha",
    "beta",
    "gamma",
    "delta",
    "lambda",
    "sigma",
    "index",
    "cache",
    "prefix",
    "loop",
    "turn",
    "round",
    "batch",
]
TOOLS = ("read_file", "run_tests", "grep", "list_dir")


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


@dataclass
class Loop:
    """One conversation: ``turns()`` yields the body of every turn, round 1 to ``rounds``."""

    api: Shape
    rounds: int = 60
    #: words of one tool output (about 1.3 tokens a word), drawn per result
    output_words: tuple[int, int] = (1100, 1100)
    parallel: int = 1
    seed: int = 0
    system: str = "You are a coding agent. Use the tools; answer when the task is done."
    task_words: int = 200
    #: a new user instruction (after the model's answer) every this many rounds; 0: one task
    instruct_every: int = 0
    #: thinking before each round's calls (Anthropic thinking blocks, Responses reasoning)
    thinking: bool = False
    #: Anthropic tool results as search_result blocks (the documented RAG-by-tool pattern)
    search_results: bool = False
    #: words of each call's input (a file written through the tool, as coding agents do), drawn
    #: per call: with inputs about twice the results, tool results are a third of the history
    input_words: tuple[int, int] = (0, 0)

    def turns(self) -> Iterator[dict[str, Any]]:
        rng = random.Random(self.seed)
        task = "Fix the failing test. " + words(rng, self.task_words)
        history: list[Any] = []
        if self.api == "openai":
            history = [
                {"role": "system", "content": self.system},
                {"role": "user", "content": task},
            ]
        elif self.api == "gemini":
            history = [{"role": "user", "parts": [{"text": task}]}]
        elif self.api == "converse":
            history = [{"role": "user", "content": [{"text": task}]}]
        else:
            history = [{"role": "user", "content": task}]
        for r in range(self.rounds):
            calls = [
                (f"call_{r}_{k}", rng.choice(TOOLS), self._input(rng, r, k))
                for k in range(self.parallel)
            ]
            outs = [words(rng, rng.randint(*self.output_words)) for _ in calls]
            if self.instruct_every and r and r % self.instruct_every == 0:
                history = history + self._instruction("Now also " + words(rng, 30))
            history = history + self._round(calls, outs, words(rng, 120))
            yield self._body(history)

    def _input(self, rng: random.Random, r: int, k: int) -> dict[str, Any]:
        args: dict[str, Any] = {"path": f"src/mod{r}_{k}.py"}
        if self.input_words[1]:
            args["content"] = words(rng, rng.randint(*self.input_words))
        return args

    def _instruction(self, text: str) -> list[Any]:
        """The model's answer to the instruction so far, then the user's next one."""
        if self.api == "gemini":
            return [
                {"role": "model", "parts": [{"text": "Done."}]},
                {"role": "user", "parts": [{"text": text}]},
            ]
        if self.api == "responses":
            return [
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "Done."}],
                },
                {"role": "user", "content": text},
            ]
        if self.api == "converse":
            return [
                {"role": "assistant", "content": [{"text": "Done."}]},
                {"role": "user", "content": [{"text": text}]},
            ]
        return [{"role": "assistant", "content": "Done."}, {"role": "user", "content": text}]

    def _round(
        self, calls: list[tuple[str, str, dict[str, Any]]], outs: list[str], thought: str
    ) -> list[Any]:
        if self.api == "openai":
            return [
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": cid,
                            "type": "function",
                            "function": {"name": name, "arguments": json.dumps(args)},
                        }
                        for cid, name, args in calls
                    ],
                },
                *(
                    {"role": "tool", "tool_call_id": cid, "content": out}
                    for (cid, _, _), out in zip(calls, outs, strict=True)
                ),
            ]
        if self.api == "anthropic":
            thinking = (
                [{"type": "thinking", "thinking": thought, "signature": "sig-" + calls[0][0]}]
                if self.thinking
                else []
            )
            return [
                {
                    "role": "assistant",
                    "content": [
                        *thinking,
                        *(
                            {"type": "tool_use", "id": cid, "name": name, "input": args}
                            for cid, name, args in calls
                        ),
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": cid, "content": self._result(out)}
                        for (cid, _, _), out in zip(calls, outs, strict=True)
                    ],
                },
            ]
        if self.api == "converse":
            reasoning_text = (
                [{"reasoningContent": {"reasoningText": {"text": thought, "signature": "s"}}}]
                if self.thinking
                else []
            )
            return [
                {
                    "role": "assistant",
                    "content": [
                        *reasoning_text,
                        *(
                            {"toolUse": {"toolUseId": cid, "name": name, "input": args}}
                            for cid, name, args in calls
                        ),
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"toolResult": {"toolUseId": cid, "content": [{"text": out}]}}
                        for (cid, _, _), out in zip(calls, outs, strict=True)
                    ],
                },
            ]
        if self.api == "responses":
            reasoning = (
                [
                    {
                        "type": "reasoning",
                        "id": "rs_" + calls[0][0],
                        "summary": [{"type": "summary_text", "text": thought}],
                    }
                ]
                if self.thinking
                else []
            )
            return [
                *reasoning,
                *(
                    {
                        "type": "function_call",
                        "call_id": cid,
                        "name": name,
                        "arguments": json.dumps(args),
                    }
                    for cid, name, args in calls
                ),
                *(
                    {"type": "function_call_output", "call_id": cid, "output": out}
                    for (cid, _, _), out in zip(calls, outs, strict=True)
                ),
            ]
        return [
            {
                "role": "model",
                "parts": [
                    {"functionCall": {"id": cid, "name": name, "args": args}}
                    for cid, name, args in calls
                ],
            },
            {
                "role": "user",
                "parts": [
                    {"functionResponse": {"id": cid, "name": name, "response": {"result": out}}}
                    for (cid, name, _), out in zip(calls, outs, strict=True)
                ],
            },
        ]

    def _result(self, out: str) -> Any:
        if not self.search_results:
            return out
        half = len(out) // 2
        return [
            {
                "type": "search_result",
                "source": f"https://docs.example/{k}",
                "title": f"result {k}",
                "content": [{"type": "text", "text": text}],
            }
            for k, text in enumerate((out[:half], out[half:]))
        ]

    def _body(self, history: list[Any]) -> dict[str, Any]:
        if self.api == "openai":
            return {"model": "gpt-4o", "messages": history, "max_tokens": 1000}
        if self.api == "anthropic":
            return {
                "model": "claude-sonnet",
                "system": self.system,
                "messages": history,
                "max_tokens": 1000,
            }
        if self.api == "converse":
            return {
                "system": [{"text": self.system}],
                "messages": history,
                "inferenceConfig": {"maxTokens": 1000},
            }
        if self.api == "responses":
            return {
                "model": "gpt-4o",
                "instructions": self.system,
                "input": history,
                "max_output_tokens": 1000,
            }
        return {
            "systemInstruction": {"parts": [{"text": self.system}]},
            "contents": history,
            "generationConfig": {"maxOutputTokens": 1000},
        }


def history_of(api: Shape, body: dict[str, Any]) -> list[Any]:
    if api == "responses":
        return list(body["input"])
    if api == "gemini":
        return list(body["contents"])
    return list(body["messages"])


def pairs(api: Shape, body: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(call ids, result ids) in the order they appear."""
    calls: list[str] = []
    results: list[str] = []
    for m in history_of(api, body):
        if api == "openai":
            calls += [tc["id"] for tc in m.get("tool_calls") or []]
            if m.get("role") == "tool":
                results.append(m["tool_call_id"])
        elif api == "responses":
            if m.get("type") == "function_call":
                calls.append(m["call_id"])
            elif m.get("type") == "function_call_output":
                results.append(m["call_id"])
        elif api == "anthropic":
            for b in m["content"] if isinstance(m["content"], list) else []:
                if b.get("type") == "tool_use":
                    calls.append(b["id"])
                elif b.get("type") == "tool_result":
                    results.append(b["tool_use_id"])
        elif api == "converse":
            for b in m["content"]:
                if "toolUse" in b:
                    calls.append(b["toolUse"]["toolUseId"])
                elif "toolResult" in b:
                    results.append(b["toolResult"]["toolUseId"])
        else:
            for p in m["parts"]:
                if "functionCall" in p:
                    calls.append(p["functionCall"]["id"])
                elif "functionResponse" in p:
                    results.append(p["functionResponse"]["id"])
    return calls, results


def provider_valid(api: Shape, body: dict[str, Any]) -> bool:
    """The providers' structural rules for tool use: every call answered by exactly one result
    after it, every result answering a call before it; Anthropic's and Gemini's first message
    from the user; nothing empty."""
    history = history_of(api, body)
    calls, results = pairs(api, body)
    if sorted(calls) != sorted(results) or len(set(calls)) != len(calls):
        return False
    seen: set[str] = set()
    for m in history:
        c, r = pairs(api, _wrap(api, body, [m]))
        if any(x not in seen for x in r):
            return False
        seen |= set(c)
    if api in ("anthropic", "gemini", "converse") and history and history[0].get("role") != "user":
        return False
    return all(m.get("content") != [] and m.get("parts") != [] for m in history)


def _wrap(api: Shape, body: dict[str, Any], history: list[Any]) -> dict[str, Any]:
    key = {"responses": "input", "gemini": "contents"}.get(api, "messages")
    return {**body, key: history}


def prefix_share(previous: bytes, current: bytes) -> float:
    """The share of the previous forwarded request (its history, serialized as sent) that the
    current one repeats byte for byte at its start."""
    prev = previous.rstrip(b"]}")
    lo, hi = 0, min(len(prev), len(current))
    while lo < hi:  # the longest common prefix, by halving (slices compare in C)
        mid = (lo + hi + 1) // 2
        if prev[:mid] == current[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo / max(1, len(prev))
