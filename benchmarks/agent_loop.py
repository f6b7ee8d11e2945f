"""Long agent loops through the real sidecar: rejected turns, forwarded over budget, provider-
invalid requests, the prompt cache kept, and what the input costs; side by side with no
trimming, the policy without the clear stage, and LiteLLM's ``trim_messages``.

Each loop (``testkit/traffic/agent_loops.py``: one task, then tool rounds whose results are 200 to 8,000
tokens, parallel calls, the whole history resent every turn) runs turn by turn through a real
sidecar on loopback in enforce mode, in front of a test double for the hosted API that records
what it received. Per API and policy:

- rejected: turns the sidecar answered with its context-length error;
- over budget: forwarded requests whose independent recount is above the budget;
- invalid: forwarded requests that break the provider's tool-use rules;
- prefix >= 90%: after the first trimmed turn, the share of turns whose forwarded history repeats
  at least 90% of the previous forwarded history byte for byte (what a prefix cache can serve);
- input cost: the input tokens of the conversation priced with the provider's cache discount
  (cached tokens at a tenth for OpenAI and Anthropic, a quarter for Gemini), against the same
  conversation untrimmed, over the turns the untrimmed one still fits the window.

And the sidecar's CPU per turn over a 300-round loop (in process, the functions a request runs):
the JSON parse, the count with texts cached alone (every message walked and shape-checked, its
long texts looked up) and with messages and the conversation's history cached (the resent
history taken whole), and the count of the turn's new messages alone, the floor a count can
reach.

``python -m benchmarks.agent_loop [--quick] [--no-litellm] [--out out/bench/agent_loop.md]``
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from benchmarks.trim_validity import LITELLM, LITELLM_SCRIPT
from context_ceiling import count, fit
from context_ceiling.core.counting import DEFAULT_CHUNK_PATTERN
from context_ceiling.core.tokenizers import CountCache, RequestMemo, TiktokenCounter
from context_ceiling.core.vocabulary import Shape
from context_ceiling.formats import FORMATS
from context_ceiling.sidecar.app import create_app
from context_ceiling.sidecar.config import Settings
from testkit.serving import serve, upstreams_at
from testkit.traffic.agent_loops import Loop, history_of, prefix_share, provider_valid

APIS: tuple[Shape, ...] = ("openai", "anthropic", "responses", "gemini")
#: what a cached input token costs against an uncached one
CACHE_PRICE = {"openai": 0.1, "anthropic": 0.1, "responses": 0.1, "gemini": 0.25}
WINDOW = 1_000_000
#: LiteLLM's trim_messages is run on loops up to this long (its time grows with the square of
#: the history: a 150-round loop takes it tens of minutes on 2 cores)
LITELLM_MAX_ROUNDS = 60
USE_LITELLM = True


@dataclass
class Shape_:
    name: str
    rounds: int
    output_words: tuple[int, int]
    parallel: int
    budget: int
    instruct_every: int = 0
    thinking: bool = False
    search_results: bool = False

    def loop(self, api: Shape, seed: int) -> Loop:
        return Loop(
            api,
            self.rounds,
            self.output_words,
            self.parallel,
            seed,
            instruct_every=self.instruct_every,
            thinking=self.thinking,
            search_results=self.search_results,
        )


SHAPES = [
    Shape_("60 rounds, ~1.5k-token results", 60, (1100, 1100), 1, 20_000),
    Shape_("60 rounds, 200-8k-token results", 60, (150, 6000), 1, 60_000),
    Shape_("150 rounds, 3 parallel calls", 150, (150, 1500), 3, 60_000),
    Shape_(
        "100 rounds, 5 instructions, thinking, search results",
        100,
        (150, 2000),
        2,
        40_000,
        instruct_every=20,
        thinking=True,
        search_results=True,
    ),
    Shape_("300 rounds, 200-2k-token results", 300, (150, 1500), 1, 60_000),
]
POLICIES: dict[str, dict[str, Any] | None] = {
    "no trimming": None,
    "without the clear stage": {"stages": ["tool_results", "retrieved", "history"]},
    "default policy": {},
}


@dataclass
class Tally:
    turns: int = 0
    rejected: int = 0
    over: int = 0
    invalid: int = 0
    trimmed_turns: int = 0
    kept_prefix: int = 0
    cost: float = 0.0
    cost_base: float = 0.0
    seconds: float = 0.0
    shares: list[float] = field(default_factory=list)


class RecordingProviderDouble:
    """A test double for the hosted APIs: answers each route with a minimal valid body and keeps
    the last request it received."""

    def __init__(self) -> None:
        self.last: bytes = b""

    async def _any(self, request: Request) -> Response:
        self.last = await request.body()
        path = request.url.path
        if path.endswith("/messages"):
            body: dict[str, Any] = {
                "id": "m",
                "type": "message",
                "role": "assistant",
                "model": "claude",
                "content": [{"type": "text", "text": "ok"}],
                "stop_reason": "end_turn",
                "usage": {"input_tokens": 1, "output_tokens": 1},
            }
        elif path.endswith("/responses"):
            body = {"id": "r", "object": "response", "status": "completed", "output": []}
        elif ":generateContent" in path:
            body = {"candidates": [{"content": {"role": "model", "parts": [{"text": "ok"}]}}]}
        else:
            body = {
                "id": "c",
                "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
            }
        return Response(orjson.dumps(body), media_type="application/json")

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/chat/completions", self._any, methods=["POST"]),
                Route("/v1/messages", self._any, methods=["POST"]),
                Route("/v1/responses", self._any, methods=["POST"]),
                Route("/v1beta/models/{model}:generateContent", self._any, methods=["POST"]),
            ]
        )


@contextmanager
def sidecar(
    policy: dict[str, Any] | None, budget: int, tmp: Path
) -> Iterator[tuple[str, RecordingProviderDouble]]:
    d = RecordingProviderDouble()
    ceilings = tmp / "ceilings.yaml"
    entries = [
        {
            "model": m,
            "workload": "default",
            "ceiling_tokens": budget,
            "ceiling_utilization": budget / WINDOW,
            "window": WINDOW,
            "output_reservation": 1000,
            "tolerance": 0.05,
            "margin": 0.1,
            "created_at": "2026-12-01T00:00:00Z",
            "provenance": {"sweep_run_id": "bench", "task_set_hash": "x", "model_version": m},
        }
        for m in ("gpt-4o", "claude", "gemini")
    ]
    ceilings.write_text(yaml.safe_dump({"schema_version": 1, "version": 1, "entries": entries}))
    with serve(d.app()) as durl:
        cfg: dict[str, Any] = {
            "upstreams": upstreams_at(durl),
            "models": [
                {"match": "gpt-4o", "window": WINDOW, "max_output_tokens": 16_000},
                {"match": "claude-*", "label": "claude", "window": WINDOW},
                {
                    "match": "gemini-*",
                    "label": "gemini",
                    "window": WINDOW,
                    "tokenizer": {"kind": "calibrated", "encoding": "o200k_base", "factor": 1.0},
                },
            ],
            "ceilings_file": ceilings,
            "enforcement": {
                "mode": "enforce" if policy is not None else "off",
                "policy": policy or {},
            },
            "log_level": "warning",
        }
        settings = Settings(**cfg)
        with serve(create_app(settings)) as url:
            yield url, d


def _send(client: httpx.Client, url: str, api: Shape, body: dict[str, Any]) -> httpx.Response:
    path = {
        "openai": "/v1/chat/completions",
        "anthropic": "/v1/messages",
        "responses": "/v1/responses",
        "gemini": "/v1beta/models/gemini-2.5-pro:generateContent",
    }[api]
    headers = {"authorization": "Bearer sk-bench", "x-api-key": "k"}
    if api == "anthropic":
        headers["anthropic-version"] = "2023-06-01"
    return client.post(url + path, content=orjson.dumps(body), headers=headers, timeout=120)


def _account(t: Tally, api: Shape, sent: dict[str, Any], budget: int, prev: bytes | None) -> bytes:
    """Judge one forwarded request; returns its history as bytes for the next turn's prefix."""
    tokens = count(sent, shape=api).total
    t.over += tokens > budget
    t.invalid += not provider_valid(api, sent)
    history = orjson.dumps(history_of(api, sent))
    share = prefix_share(prev, history) if prev is not None else 0.0
    cached = int(share * len(prev or b"") / max(1, len(history)) * tokens) if prev else 0
    t.cost += (tokens - cached) + CACHE_PRICE[api] * cached
    return history


def _turn(
    t: Tally, api: Shape, sent: dict[str, Any], trimmed: bool, budget: int, prev: bytes | None
) -> bytes:
    """One forwarded turn into the tally: its prefix share of the previous turn (once a turn
    was trimmed), then what :func:`_account` judges."""
    if t.trimmed_turns and prev is not None:
        share = prefix_share(prev, orjson.dumps(history_of(api, sent)))
        t.shares.append(share)
        t.kept_prefix += share >= 0.9
    t.trimmed_turns += trimmed
    return _account(t, api, sent, budget, prev)


def run_loop(api: Shape, shape: Shape_, seed: int, tmp: Path) -> dict[str, Tally]:
    out: dict[str, Tally] = {}
    base_costs: list[float] = []
    for name, policy in POLICIES.items():
        t = Tally()
        prev: bytes | None = None
        loop = shape.loop(api, seed)
        with sidecar(policy, shape.budget, tmp) as (url, d), httpx.Client() as client:
            started = time.perf_counter()
            for n, body in enumerate(loop.turns()):
                t.turns += 1
                r = _send(client, url, api, body)
                if r.status_code == 400:
                    t.rejected += 1
                    continue
                r.raise_for_status()
                sent = orjson.loads(d.last)
                before = t.cost
                trimmed = int(r.headers.get("x-ceiling-trimmed-tokens", "0")) > 0
                prev = _turn(t, api, sent, trimmed, shape.budget, prev)
                if name == "no trimming":
                    base_costs.append(t.cost - before)
                elif n < len(base_costs):
                    t.cost_base += base_costs[n]
            t.seconds = time.perf_counter() - started
        if name == "no trimming":
            t.cost_base = t.cost
        out[name] = t
    if USE_LITELLM and api == "openai" and LITELLM.exists() and shape.rounds <= LITELLM_MAX_ROUNDS:
        out["LiteLLM trim_messages"] = litellm_loop(shape, seed, base_costs)
    return out


def litellm_loop(shape: Shape_, seed: int, base_costs: list[float]) -> Tally:
    """LiteLLM's ``trim_messages`` on the same chat-completions turns (its own venv)."""
    bodies = list(shape.loop("openai", seed).turns())
    jobs = [{"messages": b["messages"], "budget": shape.budget} for b in bodies]
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "in.json", Path(tmp) / "out.json"
        src.write_text(json.dumps(jobs))
        subprocess.run(
            [str(LITELLM), "-c", LITELLM_SCRIPT, str(src), str(dst)],
            check=True,
            timeout=3600,
            env={"LITELLM_LOCAL_MODEL_COST_MAP": "True", "PATH": "/usr/bin:/bin"},  # offline
        )
        results = json.loads(dst.read_text())
    t = Tally()
    prev: bytes | None = None
    for n, (body, got) in enumerate(zip(bodies, results, strict=True)):
        t.turns += 1
        if isinstance(got, dict):
            t.rejected += 1
            continue
        sent = {**body, "messages": got}
        prev = _turn(t, "openai", sent, got != body["messages"], shape.budget, prev)
        if n < len(base_costs):
            t.cost_base += base_costs[n]
    return t


#: the rounds of the 300-round loop at which the CPU per turn is measured
CPU_ROUNDS = (10, 50, 150, 300)


def _median_ms(run: Any, raw: bytes, repeats: int = 15) -> float:
    """Median CPU ms of ``run(body)`` on a fresh parse of ``raw`` (a new request's objects)."""
    times = []
    for _ in range(repeats):
        body = orjson.loads(raw)
        started = time.thread_time()
        run(body)
        times.append(time.thread_time() - started)
    return statistics.median(times) * 1e3


CpuRow = tuple[int, int, float, float, float, float, float, float]


def cpu_per_turn(api: Shape, seed: int) -> list[CpuRow]:
    """(round, body bytes, parse ms, count ms with texts cached, with messages and history cached, the
    new messages alone, the public ``count()``, the public ``fit()`` at a 60k budget) at each of
    :data:`CPU_ROUNDS`, the turns before counted as the sidecar (and an application calling the
    public functions) would have (caches warm)."""
    pattern = re.compile(DEFAULT_CHUNK_PATTERN)
    cache = CountCache(64 * 2**20)
    counter = cache.wrap(TiktokenCounter("o200k_base"))
    fn = FORMATS[api].count
    key = {"responses": "input", "gemini": "contents"}.get(api, "messages")
    rows = []
    previous = 0
    for n, body in enumerate(Shape_("", 300, (150, 1500), 1, 0).loop(api, seed).turns(), 1):
        raw = orjson.dumps(body)
        fn(orjson.loads(raw), RequestMemo(counter), None, pattern, memo=cache)
        fit(orjson.loads(raw), shape=api, budget=60_000)  # the application's own turn
        history = body[key]
        if n in CPU_ROUNDS:
            fresh = orjson.dumps({**body, key: history[previous:]})
            rows.append(
                (
                    n,
                    len(raw),
                    _parse_ms(raw),
                    _median_ms(lambda b: fn(b, RequestMemo(counter), None, pattern), raw),
                    _median_ms(
                        lambda b: fn(b, RequestMemo(counter), None, pattern, memo=cache), raw
                    ),
                    _median_ms(
                        lambda b: fn(b, TiktokenCounter("o200k_base"), None, pattern), fresh
                    ),
                    _median_ms(lambda b: count(b, shape=api), raw),
                    _median_ms(lambda b: fit(b, shape=api, budget=60_000), raw),
                )
            )
        previous = len(history)
    return rows


def _parse_ms(raw: bytes, repeats: int = 15) -> float:
    times = []
    for _ in range(repeats):
        started = time.thread_time()
        orjson.loads(raw)
        times.append(time.thread_time() - started)
    return statistics.median(times) * 1e3


def cpu_report(rows: dict[Shape, list[CpuRow]]) -> str:
    lines = [
        "| API | round | body | parse | count, texts cached | count, messages and history cached | new messages alone | public count() | public fit(), 60k |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for api, got in rows.items():
        for n, size, parse, text, message, new, public, fitted in got:
            lines.append(
                f"| {api} | {n} | {size / 1e6:.2f} MB | {parse:.2f} ms | {text:.2f} ms | "
                f"{message:.2f} ms | {new:.2f} ms | {public:.2f} ms | {fitted:.2f} ms |"
            )
    return "\n".join(lines)


def report(results: dict[tuple[str, str], dict[str, Tally]]) -> str:
    lines = [
        "| API | loop | policy | turns | rejected | over budget | invalid | prefix >= 90% | input cost vs untrimmed |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for (api, shape), by_policy in results.items():
        for name, t in by_policy.items():
            after = len(t.shares)
            prefix = f"{t.kept_prefix / after:.0%} of {after}" if after else "-"
            ratio = f"x{t.cost / t.cost_base:.2f}" if t.cost_base else "-"
            lines.append(
                f"| {api} | {shape} | {name} | {t.turns} | {t.rejected} | {t.over} | "
                f"{t.invalid} | {prefix} | {ratio} |"
            )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the first loop shape only")
    ap.add_argument("--no-litellm", action="store_true", help="leave LiteLLM out")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default="out/bench/agent_loop.md")
    args = ap.parse_args()
    global USE_LITELLM
    USE_LITELLM = not args.no_litellm
    shapes = SHAPES[:1] if args.quick else SHAPES
    results: dict[tuple[str, str], dict[str, Tally]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for shape in shapes:
            for api in APIS:
                results[(api, shape.name)] = run_loop(api, shape, args.seed, Path(tmp))
                print(f"{api} / {shape.name}: done", file=sys.stderr)
    cpu = {api: cpu_per_turn(api, args.seed) for api in APIS}
    table = report(results) + "\n\nCPU per turn, 300-round loop:\n\n" + cpu_report(cpu)
    print(table)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(table + "\n")


if __name__ == "__main__":
    main()
