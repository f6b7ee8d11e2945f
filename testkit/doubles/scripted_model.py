"""A test double for a hosted language model whose accuracy falls at a known utilization.

It stands in for a real model where the statistics must be checked against a known truth: it
reads the question from the prompt, looks the item up in the task set, measures the prompt's
utilization with the shared counter, and answers correctly with probability ``high`` below the
knee and ``low`` above it (deterministically per prompt, so repeats with different gold positions
vary). Wrong answers are decoys: a neighbour's value citing the neighbour's document.

It serves OpenAI chat completions and Anthropic messages, their prompt caches (OpenAI's
automatic prefix cache, Anthropic's ``cache_control`` breakpoints) and their batch APIs (OpenAI's
files and batches, Anthropic's message batches) with the semantics their documentation gives,
standing in for the hosted providers that cannot run here.
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
from context_ceiling.sweep.taskset import ExactAnswer, Item, OneOfAnswer, SetAnswer, TaskSet

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
    #: (from, to, accuracy): a dip between two fills that recovers after it
    dip: tuple[float, float, float] | None = None
    closed_book: bool = False  # answers right with no documents too (it knows the task set)
    reasoning_only: bool = False  # refuses max_tokens / temperature like a reasoning model
    usage_scale: float = 1.0  # reports prompt tokens off by this factor (another tokenizer)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    #: OpenAI's automatic prompt cache, as documented: a prompt of 1,024 tokens or more reads
    #: from the cache the longest prefix it shares with an earlier prompt, in steps of 128
    #: tokens from 1,024 (reported as ``usage.prompt_tokens_details.cached_tokens``)
    prompt_cache: bool = True
    seen: list[Any] = field(default_factory=list)  # the last prompts' token ids
    anthropic_cache: set[str] = field(default_factory=set)  # prefixes written to the cache
    files: dict[str, str] = field(default_factory=dict)  # uploaded and result files by id
    batches: dict[str, dict[str, Any]] = field(default_factory=dict)
    hold_batches: bool = False  # batches stay in progress (a provider's 24-hour window)
    #: an item's answer at a fill does not depend on where its evidence sits, so its repeats
    #: agree (a model at temperature 0 that is insensitive to order)
    repeats_agree: bool = False

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
                else a.values[0]
                if isinstance(a, OneOfAnswer)
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
        return JSONResponse(self._complete(body))

    def _reply(self, user: str, tokens: int) -> dict[str, Any]:
        """The answer to the question in ``user`` at a prompt of ``tokens`` tokens."""
        m = _Q.search(user)
        item = self.by_question.get(m.group(1).strip()) if m else None
        if item is not None and self.closed_book:
            return self._answer(item, True)
        if item is None or "(no documents)" in user:
            return {"answer": None, "evidence": []}
        u_fill = tokens / self.window
        seed = f"{item.id}@{u_fill:.2f}" if self.repeats_agree else user
        u = int.from_bytes(hashlib.sha256(seed.encode()).digest()[:8], "big") / 2**64
        p = self.high if u_fill < self.knee else self.low
        if self.shoulder and self.shoulder[0] <= u_fill < self.knee:
            p = self.shoulder[1]
        if self.dip and self.dip[0] <= u_fill < self.dip[1]:
            p = self.dip[2]
        return self._answer(item, u < p)

    def _complete(self, body: dict[str, Any]) -> dict[str, Any]:
        """An OpenAI chat completion's response body."""
        user = body["messages"][-1]["content"]
        tokens = count_openai(body, self.enc).total
        cached = self._cached(body) if self.prompt_cache else 0
        return {
            "id": "chatcmpl-scripted",
            "object": "chat.completion",
            "model": "scripted-model-v1",
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": json.dumps(self._reply(user, tokens)),
                    },
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

    def _message(self, params: dict[str, Any]) -> dict[str, Any]:
        """An Anthropic message's response body. Its prompt cache as documented: the prompt up
        to a block marked ``cache_control`` is written on first use (``cache_creation_input_
        tokens``) and read after (``cache_read_input_tokens``), from 1,024 tokens."""
        content = params["messages"][-1]["content"]
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        system = str(params.get("system") or "")
        user = "".join(b.get("text", "") for b in blocks)
        total = self.enc.count(system) + self.enc.count(user) + 8
        read = written = 0
        upto = next((k for k, b in enumerate(blocks) if b.get("cache_control")), None)
        if upto is not None:
            prefix = system + "".join(b.get("text", "") for b in blocks[: upto + 1])
            n = self.enc.count(prefix)
            if n >= 1024:
                if prefix in self.anthropic_cache:
                    read = n
                else:
                    self.anthropic_cache.add(prefix)
                    written = n
        return {
            "id": "msg_scripted",
            "type": "message",
            "role": "assistant",
            "model": "scripted-model-v1",
            "content": [{"type": "text", "text": json.dumps(self._reply(user, total))}],
            "stop_reason": "end_turn",
            "usage": {
                "input_tokens": total - read - written,
                "cache_read_input_tokens": read,
                "cache_creation_input_tokens": written,
                "output_tokens": 20,
            },
        }

    async def messages(self, request: Request) -> Response:
        self.calls += 1
        return JSONResponse(self._message(await request.json()))

    # -- the batch APIs: a batch runs on the second look at its status --------------------------

    async def upload(self, request: Request) -> Response:
        """OpenAI ``POST /v1/files``: the multipart upload's ``file`` part kept by id."""
        raw = await request.body()
        boundary = request.headers["content-type"].split("boundary=")[1].encode()
        for part in raw.split(b"--" + boundary):
            head, _, data = part.partition(b"\r\n\r\n")
            if b'name="file"' in head:
                fid = f"file-{len(self.files)}"
                self.files[fid] = data.rsplit(b"\r\n", 1)[0].decode()
                return JSONResponse({"id": fid, "object": "file", "purpose": "batch"})
        return JSONResponse({"error": {"message": "no file part"}}, status_code=400)

    async def create_batch(self, request: Request) -> Response:
        body = await request.json()
        if body.get("input_file_id") not in self.files:
            return JSONResponse({"error": {"message": "no such file"}}, status_code=400)
        bid = f"batch_{len(self.batches)}"
        self.batches[bid] = {"id": bid, "object": "batch", "status": "validating", **body}
        return JSONResponse(self.batches[bid])

    async def list_batches(self, request: Request) -> Response:
        """OpenAI ``GET /v1/batches``: newest first, ``limit`` and ``after`` as documented."""
        rows = list(reversed(self.batches.values()))
        rows = [b for b in rows if b.get("object") == "batch"]
        after = request.query_params.get("after")
        if after is not None:
            ids = [b["id"] for b in rows]
            rows = rows[ids.index(after) + 1 :] if after in ids else []
        limit = int(request.query_params.get("limit", "20"))
        return JSONResponse({"object": "list", "data": rows[:limit], "has_more": len(rows) > limit})

    async def get_batch(self, request: Request) -> Response:
        b = self.batches[request.path_params["id"]]
        if b["status"] == "validating":
            b["status"] = "in_progress"
        elif b["status"] == "in_progress" and not self.hold_batches:
            out: list[dict[str, Any]] = []
            for line in self.files[b["input_file_id"]].splitlines():
                req = json.loads(line)
                self.calls += 1
                out.append(
                    {
                        "id": f"req-{len(out)}",
                        "custom_id": req["custom_id"],
                        "response": {"status_code": 200, "body": self._complete(req["body"])},
                        "error": None,
                    }
                )
            fid = f"file-{len(self.files)}"
            self.files[fid] = "".join(json.dumps(r) + "\n" for r in out)
            b |= {"status": "completed", "output_file_id": fid, "error_file_id": None}
        return JSONResponse(b)

    async def file_content(self, request: Request) -> Response:
        return Response(self.files[request.path_params["id"]], media_type="application/jsonl")

    async def create_message_batch(self, request: Request) -> Response:
        body = await request.json()
        bid = f"msgbatch_{len(self.batches)}"
        self.batches[bid] = {
            "id": bid,
            "type": "message_batch",
            "processing_status": "in_progress",
            "requests": body["requests"],
            "looks": 0,
        }
        return JSONResponse({k: v for k, v in self.batches[bid].items() if k != "requests"})

    async def get_message_batch(self, request: Request) -> Response:
        b = self.batches[request.path_params["id"]]
        b["looks"] += 1
        if b["looks"] >= 2 and b["processing_status"] != "ended" and not self.hold_batches:
            lines = []
            for r in b["requests"]:
                self.calls += 1
                msg = self._message(r["params"])
                lines.append(
                    {"custom_id": r["custom_id"], "result": {"type": "succeeded", "message": msg}}
                )
            self.files[b["id"]] = "".join(json.dumps(x) + "\n" for x in lines)
            b["processing_status"] = "ended"
            b["results_url"] = f"{request.base_url}v1/messages/batches/{b['id']}/results"
        return JSONResponse({k: v for k, v in b.items() if k != "requests"})

    async def message_batch_results(self, request: Request) -> Response:
        return Response(self.files[request.path_params["id"]], media_type="application/jsonl")

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
        return Starlette(
            routes=[
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/v1/messages", self.messages, methods=["POST"]),
                Route("/v1/files", self.upload, methods=["POST"]),
                Route("/v1/files/{id}/content", self.file_content),
                Route("/v1/batches", self.create_batch, methods=["POST"]),
                Route("/v1/batches", self.list_batches, methods=["GET"]),
                Route("/v1/batches/{id}", self.get_batch),
                Route("/v1/messages/batches", self.create_message_batch, methods=["POST"]),
                Route("/v1/messages/batches/{id}", self.get_message_batch),
                Route("/v1/messages/batches/{id}/results", self.message_batch_results),
            ]
        )
