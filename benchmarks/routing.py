"""Routing by measured ceilings against LiteLLM's ``context_window_fallbacks``, on the same traffic.

Traffic: every turn of the shipped real agent trajectories (a coding agent on SWE-bench tasks, a
customer-service agent; ``testkit/data/trajectories``) and RAG requests of the bundled task sets'
documents (1k to 500k tokens, log-uniform, seeded), all sent for the smallest of three models.
The upstream is a provider double that serves each model up to its *advertised* window and
answers beyond it with OpenAI's ``context_length_exceeded`` error, as a provider does. Each model
has a sweep curve (accuracy by fill: flat, then falling past its true drop) and a ceiling at that
drop less a 10% margin, in a ceilings document.

Policies: the sidecar's ``trim`` (the default), ``fallback`` and ``trim_then_fallback`` (at most a
quarter of the input trimmed) with the fallback list ``mid, long``; LiteLLM's proxy with
``context_window_fallbacks`` over the same list (it falls back when the provider says the
advertised window is exceeded). Per policy: the share of requests served unchanged, trimmed,
routed and rejected, the share served above the answering model's measured ceiling, and the
expected accuracy of what was served (the answering model's curve at the fill it was sent at).

``python -m benchmarks.routing [--rag 150] [--no-litellm]``
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from benchmarks.targets import litellm
from context_ceiling.core.tokenizers import TiktokenCounter
from context_ceiling.sidecar.app import create_app
from context_ceiling.sidecar.config import Settings
from context_ceiling.sweep.taskset import load_taskset
from testkit.serving import serve
from testkit.traffic.trajectories import load_all, turns


@dataclass(frozen=True)
class Model:
    name: str
    window: int
    #: the true drop of its sweep curve (a share of the window) and its accuracy before it
    drop: float
    base: float = 0.85
    floor: float = 0.35

    @property
    def ceiling(self) -> int:
        """A ceiling the sweep could put there: the drop less a 10% margin."""
        return math.floor(self.drop * 0.9 * self.window)

    def accuracy(self, tokens: int) -> float:
        """The curve: flat to the drop, then falling linearly to ``floor`` at a full window."""
        u = tokens / self.window
        if u <= self.drop:
            return self.base
        return self.base - (self.base - self.floor) * min(1.0, (u - self.drop) / (1 - self.drop))


MODELS = {
    m.name: m
    for m in (
        Model("small", 128_000, drop=0.19),  # a ceiling of 21.9k: NoLiMa-like for a 128k model
        Model("mid", 200_000, drop=0.35),
        Model("long", 1_000_000, drop=0.25),
    )
}
FALLBACK = ["mid", "long"]
#: the provider's tokenizer (the encoding's data ships with the package: nothing is fetched)
ENC = TiktokenCounter("o200k_base")


def tokens_of(body: dict[str, Any]) -> int:
    """The provider's count: every message's text, plus a few tokens a message."""
    n = 0
    for m in body.get("messages") or []:
        c = m.get("content")
        texts = (
            [c]
            if isinstance(c, str)
            else [p.get("text", "") for p in c or [] if isinstance(p, dict)]
        )
        n += 4 + sum(ENC.count(t) for t in texts if t)
    return n


class Provider:
    """The upstream: serves each model up to its advertised window, records what it served."""

    def __init__(self) -> None:
        self.served: list[tuple[str, int]] = []

    async def chat(self, request: Request) -> JSONResponse:
        body = orjson.loads(await request.body())
        name = str(body.get("model", "")).removeprefix("openai/")
        model, n = MODELS.get(name), tokens_of(body)
        if model is None:
            return JSONResponse({"error": {"message": f"no model {name}"}}, status_code=404)
        if n + int(body.get("max_tokens") or 0) > model.window:
            message = (
                f"This model's maximum context length is {model.window} tokens. However, your "
                f"messages resulted in {n} tokens. Please reduce the length of the messages."
            )
            error = {
                "message": message,
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
            return JSONResponse({"error": error}, status_code=400)
        self.served.append((name, n))
        return JSONResponse(
            {
                "id": "chatcmpl-x",
                "object": "chat.completion",
                "created": 0,
                "model": name,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "ok"},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": n, "completion_tokens": 1, "total_tokens": n + 1},
            }
        )

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/chat/completions", self.chat, methods=["POST"])])


def traffic(rag: int, seed: int) -> Iterator[tuple[str, dict[str, Any]]]:
    """(kind, body): every agent turn of the shipped trajectories, then ``rag`` RAG requests."""
    for t in load_all():
        for body in turns(t, "openai"):
            yield "agent", {**body, "model": "small", "max_tokens": 512}
    docs = [d.text for name in ("contracts", "records") for d in load_taskset(name).docs.values()]
    per_doc = statistics.mean(ENC.count(d) for d in docs[:50])
    rng = random.Random(seed)
    for _ in range(rag):
        target = math.exp(rng.uniform(math.log(1_000), math.log(500_000)))
        n = max(1, round(target / per_doc))
        picked = [docs[(rng.randrange(len(docs)) + k) % len(docs)] for k in range(n)]
        text = "\n".join(f'<document id="{k}">{d}</document>' for k, d in enumerate(picked))
        messages = [
            {"role": "system", "content": "Answer from the documents."},
            {"role": "user", "content": text + "\nWhat does the first document say?"},
        ]
        yield "rag", {"model": "small", "messages": messages, "max_tokens": 512}


@dataclass
class Result:
    outcome: str  # unchanged | trimmed | routed | rejected
    model: str | None = None
    #: input tokens the answering model got, and what the client sent
    tokens: int = 0
    sent: int = 0


def sidecar_results(policy: str, bodies: list[dict[str, Any]]) -> list[Result]:
    provider = Provider()
    doc = {
        "schema_version": 1,
        "version": 1,
        "entries": [
            {
                "model": m.name,
                "workload": "default",
                "ceiling_tokens": m.ceiling,
                "ceiling_utilization": round(m.ceiling / m.window, 6),
                "window": m.window,
                "output_reservation": 512,
                "tolerance": 0.05,
                "margin": 0.1,
            }
            for m in MODELS.values()
        ],
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ceilings.json"
        path.write_bytes(orjson.dumps(doc))
        settings = Settings(
            upstreams={"openai": {"base_url": "http://upstream.test/v1"}},
            models=[
                {"match": m.name, "window": m.window, "max_output_tokens": 4096}
                for m in MODELS.values()
            ],
            ceilings_file=path,
            enforcement={
                "mode": "enforce",
                "over_ceiling": policy,
                "fallback": FALLBACK,
                "max_trimmed_share": 0.25,
            },
        )
        app = create_app(settings, httpx.ASGITransport(app=provider.app()))
        out = []
        with TestClient(app, base_url="http://sidecar.test") as http:
            for body in bodies:
                before = len(provider.served)
                r = http.post("/v1/chat/completions", json=body)
                if r.status_code != 200:
                    out.append(Result("rejected"))
                    continue
                model, n = provider.served[before]
                if "x-ceiling-routed-to" in r.headers:
                    outcome = "routed"
                elif int(r.headers.get("x-ceiling-trimmed-tokens", "0")) > 0:
                    outcome = "trimmed"
                else:
                    outcome = "unchanged"
                out.append(Result(outcome, model, n, tokens_of(body)))
    return out


def litellm_results(bodies: list[dict[str, Any]]) -> list[Result] | None:
    provider = Provider()
    with tempfile.TemporaryDirectory() as tmp, serve(provider.app()) as up:
        target = litellm(
            up,
            Path(tmp),
            models=list(MODELS),
            router_settings={
                "context_window_fallbacks": [{"small": FALLBACK}],
                "num_retries": 0,
            },
        )
        if target is None:
            return None
        out = []
        try:
            with httpx.Client(timeout=120) as client:
                for body in bodies:
                    before = len(provider.served)
                    r = client.post(target.url, content=orjson.dumps(body))
                    if r.status_code != 200 or len(provider.served) == before:
                        out.append(Result("rejected"))
                        continue
                    model, n = provider.served[-1]
                    outcome = "unchanged" if model == "small" else "routed"
                    out.append(Result(outcome, model, n, tokens_of(body)))
        finally:
            target.stop()
    return out


def row(name: str, results: list[Result]) -> str:
    n = len(results)
    counts = Counter(r.outcome for r in results)
    served = [(MODELS[r.model], r.tokens) for r in results if r.model is not None]
    over = sum(1 for m, tokens in served if tokens > m.ceiling)
    acc = statistics.mean(m.accuracy(tokens) for m, tokens in served) if served else 0.0
    share = " | ".join(
        f"{counts[k] / n:.1%}" for k in ("unchanged", "trimmed", "routed", "rejected")
    )
    cut = [1 - r.tokens / r.sent for r in results if r.outcome == "trimmed" and r.sent]
    removed = f"{statistics.median(cut):.0%}" if cut else "-"
    return f"| {name} | {n} | {share} | {over / max(1, len(served)):.1%} | {acc:.3f} | {removed} |"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--rag", type=int, default=150, help="RAG requests (1k-500k tokens)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-litellm", action="store_true", help="leave LiteLLM's proxy out")
    args = ap.parse_args(argv)
    sent = list(traffic(args.rag, args.seed))
    bodies = [b for _, b in sent]
    kinds = Counter(k for k, _ in sent)
    sizes = sorted(tokens_of(b) for b in bodies)
    print(
        f"traffic: {kinds['agent']} agent turns (real trajectories) and {kinds['rag']} RAG "
        f"requests, {sizes[0]:,} to {sizes[-1]:,} tokens (median {sizes[len(sizes) // 2]:,}); "
        "models: "
        + ", ".join(
            f"{m.name} (window {m.window:,}, ceiling {m.ceiling:,})" for m in MODELS.values()
        )
    )
    print()
    print(
        "| policy | requests | unchanged | trimmed | routed | rejected | served above the "
        "answering model's measured ceiling | expected accuracy of what was served (its "
        "curve at the fill it was sent at) | median share of a trimmed request's input cut |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for policy in ("trim", "fallback", "trim_then_fallback"):
        print(row(f"sidecar `{policy}`", sidecar_results(policy, bodies)))
    if not args.no_litellm:
        got = litellm_results(bodies)
        if got is None:
            print("| LiteLLM | (not installed: scripts/litellm.sh) |")
        else:
            print(row("LiteLLM `context_window_fallbacks`", got))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
