"""The solver: a sweep's calls, with bounded concurrency, retries and a budget, each result
appended to the call log (:mod:`context_ceiling.sweep.calllog`) as soon as it completes.

One worker per haystack group keeps a group's questions in order, so an engine's prefix cache
serves them; the prompt is built and measured by :mod:`context_ceiling.sweep.prompts`.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import httpx
import orjson
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from context_ceiling.core.prices import Price
from context_ceiling.core.vocabulary import SweepApi
from context_ceiling.formats import APIS, SWEEP_APIS
from context_ceiling.formats.base import Ask
from context_ceiling.sweep import batch
from context_ceiling.sweep.calllog import CallLog, CallRecord, sample_key
from context_ceiling.sweep.prompts import ContextBuilder, RenderedPrompt
from context_ceiling.sweep.spec import Reasoning, Spec
from context_ceiling.sweep.taskset import Item

RETRYABLE = {408, 409, 425, 429, 500, 502, 503, 504, 529}


@dataclass(frozen=True)
class Endpoint:
    """Where calls go, and the sampling used at every level."""

    base_url: str
    api: SweepApi = "openai"
    model: str = "model"
    api_key: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    max_tokens: int = 100
    temperature: float = 0.0
    json_mode: bool = True
    reasoning: Reasoning = "auto"
    reasoning_tokens: int = 0
    timeout_s: float = 900.0
    #: send each step's calls through the provider's batch API (half the price, within 24 h)
    batch: bool = False
    batch_poll_s: float = 30.0
    max_attempts: int = 5
    backoff_s: float = 1.0
    backoff_cap_s: float = 30.0

    @classmethod
    def for_spec(
        cls, spec: Spec, api_key: str | None = None, headers: dict[str, str] | None = None
    ) -> Endpoint:
        """The endpoint a sweep's spec calls: its URL, API, model, output cap, JSON mode and
        reasoning, with the caller's key and extra headers."""
        return cls(
            base_url=spec.base_url,
            api=spec.api,
            model=spec.model,
            api_key=api_key,
            headers=headers or {},
            max_tokens=spec.max_tokens,
            json_mode=spec.json_mode,
            reasoning=spec.reasoning,
            reasoning_tokens=spec.reasoning_tokens,
            batch=spec.batch,
        )


@dataclass(frozen=True)
class Sample:
    key: str
    item: Item
    group: tuple[Item, ...]
    level: float | None  # None: closed-book control
    repeat: int
    target: int


def _retry_after(resp: httpx.Response) -> float | None:
    value = resp.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


_REASONING_400 = re.compile(
    r"max_completion_tokens|max_tokens.{0,80}not supported|unsupported.{0,40}(max_tokens|temperature)"
    r"|temperature.{0,80}(not supported|does not support|only the default)",
    re.I | re.S,
)


def request_of(ep: Endpoint, prompt: RenderedPrompt) -> tuple[str, dict[str, str], dict[str, Any]]:
    """URL, headers and body of one call, written by the API's own format (:attr:`Format.ask`,
    the layer the sidecar serves): a question on a shared haystack marks the haystack as a
    prompt-cache breakpoint where the API has one (the runner keeps a haystack's questions in
    order, so each reads what the first wrote); reasoning models get what they accept (OpenAI's
    ``max_completion_tokens`` and no ``temperature``; extended thinking with its budget on top of
    the output elsewhere)."""
    fmt = SWEEP_APIS[ep.api]
    assert fmt.ask is not None  # SWEEP_APIS holds the formats that ask
    if ep.api == "openai":
        thinking = ep.reasoning_tokens  # reserved within max_completion_tokens
    else:  # extended thinking (Claude, on Anthropic's API or on Bedrock)
        thinking = max(1024, ep.reasoning_tokens) if ep.reasoning == "anthropic" else 0
    path, body = fmt.ask(
        Ask(
            model=ep.model,
            user=prompt.user,
            system=prompt.system,
            shared=prompt.shared,
            max_tokens=ep.max_tokens,
            temperature=ep.temperature,
            json=ep.json_mode and ep.api == "openai",
            thinking=thinking,
            reasoning=ep.reasoning == "openai",
        )
    )
    headers = dict(ep.headers) | APIS[ep.api].key_headers(ep.api_key)
    return ep.base_url.rstrip("/") + path, headers, body


async def call_model(
    client: httpx.AsyncClient, ep: Endpoint, prompt: RenderedPrompt
) -> dict[str, Any]:
    """One call with retries: 429 waits for Retry-After, 5xx and timeouts back off exponentially.
    With ``reasoning="auto"``, a 400 that refuses ``max_tokens`` or ``temperature`` (OpenAI's
    reasoning models) is answered by resending in the reasoning form; the record says so
    (``reasoning_mode``) and the runner keeps that form for later calls."""
    url, headers, payload = request_of(ep, prompt)
    content = orjson.dumps(payload)
    headers["content-type"] = "application/json"
    error = ""
    for attempt in range(1, ep.max_attempts + 1):
        t0 = time.perf_counter()
        wait: float | None = None
        try:
            # signed anew each attempt where the API signs (a SigV4 signature carries its time)
            sent = await APIS[ep.api].signed(url, list(headers.items()), content, True)
            resp = await client.post(url, content=content, headers=sent, timeout=ep.timeout_s)
            if resp.status_code == 200:
                return _result(ep, resp.json(), time.perf_counter() - t0, attempt)
            error = f"HTTP {resp.status_code}: {resp.text[:300]}"
            if (
                resp.status_code == 400
                and ep.reasoning == "auto"
                and ep.api == "openai"
                and _REASONING_400.search(resp.text[:2000])
            ):
                result = await call_model(client, replace(ep, reasoning="openai"), prompt)
                return result | {"reasoning_mode": "openai"}
            if resp.status_code not in RETRYABLE:
                return {
                    "status": "error",
                    "error": error,
                    "attempts": attempt,
                    "http_status": resp.status_code,
                }
            wait = _retry_after(resp) if resp.status_code == 429 else None
        except (httpx.TimeoutException, httpx.TransportError) as exc:
            error = f"{type(exc).__name__}"
        if attempt < ep.max_attempts:
            backoff = min(ep.backoff_cap_s, ep.backoff_s * 2 ** (attempt - 1)) * (
                0.5 + random.random() / 2
            )
            await asyncio.sleep(wait if wait is not None else backoff)
    return {"status": "error", "error": error, "attempts": ep.max_attempts}


def _result(ep: Endpoint, body: dict[str, Any], latency: float, attempts: int) -> dict[str, Any]:
    """One answer's call-log fields, read by the API's own format (its answer and usage)."""
    fmt = SWEEP_APIS[ep.api]
    answer = fmt.read_answer([body], False)
    usage = fmt.body_usage(orjson.dumps(body))
    return {
        "status": "ok",
        "text": answer.text,
        "finish_reason": answer.finish,
        "model_reported": usage.response_model,
        "usage_prompt": usage.input_tokens,
        "usage_completion": usage.output_tokens,
        "cached_tokens": usage.cached_tokens,
        "cache_write_tokens": usage.cache_write_tokens,
        "latency_s": round(latency, 3),
        "attempts": attempts,
    }


class SpendCap:
    """Caps on calls, input tokens and dollars; the runner stops starting calls once one is
    reached (so the adaptive design stops adding items, and the decision stays open). A call
    is charged its input tokens and its whole output reservation (``output_tokens``) at
    ``price`` before it starts, so the dollar cap is never crossed."""

    def __init__(
        self,
        max_calls: int | None = None,
        max_tokens: int | None = None,
        max_usd: float | None = None,
        price: Price | None = None,
        output_tokens: int = 0,
    ) -> None:
        self.max_calls, self.max_tokens, self.max_usd = max_calls, max_tokens, max_usd
        self.price, self.output_tokens = price, output_tokens
        self.calls = 0
        self.tokens = 0
        self.usd = 0.0

    def _usd(self, tokens: int) -> float:
        return self.price.cost(tokens, self.output_tokens) if self.price is not None else 0.0

    def allows(self, tokens: int) -> bool:
        if self.max_calls is not None and self.calls >= self.max_calls:
            return False
        if self.max_usd is not None and self.usd + self._usd(tokens) > self.max_usd:
            return False
        return self.max_tokens is None or self.tokens + tokens <= self.max_tokens

    def fits(self, calls: int, tokens: int) -> bool:
        """Whether ``calls`` more calls of ``tokens`` input tokens in all (their output
        reservation included) stay within every cap: what the adaptive design asks before a
        step, so it stops adding items rather than leave a step half measured."""
        if self.max_calls is not None and self.calls + calls > self.max_calls:
            return False
        if self.max_tokens is not None and self.tokens + tokens > self.max_tokens:
            return False
        if self.max_usd is None or self.price is None:
            return True
        return self.usd + self.price.cost(tokens, calls * self.output_tokens) <= self.max_usd

    def spend(self, tokens: int) -> None:
        self.calls += 1
        self.tokens += tokens
        self.usd += self._usd(tokens)


class LineProgress:
    """Progress for a log or a pipe (CI, ``make demo > log``): one line on stderr every tenth
    of the calls, or every ``every_s`` seconds, with the calls done of planned, tokens, errors
    and the time elapsed."""

    def __init__(self, total: int, every_s: float = 30.0) -> None:
        self.total, self.every_s = total, every_s
        self.done = 0
        self.started = self.last = time.monotonic()
        self.step = max(1, total // 10)

    def update(self, _task: Any, advance: int = 1, tokens: int = 0, errors: int = 0) -> None:
        self.done += advance
        now = time.monotonic()
        if self.done % self.step and self.done != self.total and now - self.last < self.every_s:
            return
        self.last = now
        elapsed = int(now - self.started)
        print(
            f"sweep: {self.done}/{self.total} calls, {tokens:,} tokens, {errors} errors, "
            f"{elapsed // 60}m{elapsed % 60:02d}s",
            file=sys.stderr,
            flush=True,
        )


class Runner:
    def __init__(
        self,
        builder: ContextBuilder,
        endpoint: Endpoint,
        log: CallLog,
        window: int,
        concurrency: int = 1,
        budget: SpendCap | None = None,
        progress: bool = True,
    ) -> None:
        self.builder, self.ep, self.log, self.window = builder, endpoint, log, window
        self.concurrency = max(1, concurrency)
        self.budget = budget or SpendCap()
        self.progress = progress
        self.errors = 0
        self.exhausted = False

    def plan(
        self, groups: list[list[Item]], levels: Iterable[float], repeats: int, controls: bool = True
    ) -> list[Sample]:
        """Samples in execution order: level, repeat, haystack, question (cache-friendly)."""
        out: list[Sample] = []
        if controls:
            out += [
                Sample(sample_key(it.id, None, 0), it, (it,), None, 0, 0)
                for g in groups
                for it in g
            ]
        for level in levels:
            target = round(level * self.window)
            for r in range(repeats):
                for g in groups:
                    out += [
                        Sample(sample_key(it.id, level, r), it, tuple(g), level, r, target)
                        for it in g
                    ]
        return out

    def estimate(self, samples: list[Sample]) -> tuple[int, int]:
        """(calls, input tokens) the samples would cost: for --dry-run, before spending anything."""
        tokens = 0
        for s in samples:
            tokens += (
                self.builder.base_tokens(s.item.question) if s.level is None else s.target
            ) + self.ep.max_tokens
        return len(samples), tokens

    async def run(self, samples: list[Sample]) -> None:
        done = self.log.done()
        todo = [s for s in samples if s.key not in done]
        if self.ep.batch:
            await self._batched(todo)
            return
        if not todo:
            return
        # one worker per haystack group keeps each group's questions in order (prefix cache)
        queues: dict[tuple[str, ...], list[Sample]] = {}
        for s in todo:
            queues.setdefault((f"{s.level}#{s.repeat}", *(i.id for i in s.group)), []).append(s)
        sem = asyncio.Semaphore(self.concurrency)
        limits = httpx.Limits(
            max_connections=self.concurrency, max_keepalive_connections=self.concurrency
        )
        with self._progress(len(todo)) as (bar, task), contextlib.ExitStack():
            async with httpx.AsyncClient(limits=limits, trust_env=False) as client:

                async def worker(batch: list[Sample]) -> None:
                    async with sem:
                        for s in batch:
                            if self.exhausted:
                                return
                            await self._one(client, s)
                            if bar is not None:
                                bar.update(
                                    task, advance=1, tokens=self.budget.tokens, errors=self.errors
                                )

                await asyncio.gather(*(worker(b) for b in queues.values()))

    def _prompt(self, s: Sample) -> RenderedPrompt:
        if s.level is None:
            return self.builder.build([s.item], 0, 0, closed_book=True)
        return self.builder.build(list(s.group), s.target, s.repeat, question_item=s.item)

    def _fields(self, s: Sample, prompt: RenderedPrompt) -> dict[str, Any]:
        """What the call log records of a call besides its result: the sample and its prompt."""
        return {
            "key": s.key,
            "item": s.item.id,
            "level": s.level,
            "repeat": s.repeat,
            "control": s.level is None,
            "target_tokens": s.target,
            "prompt_tokens": prompt.tokens,
            "utilization": round(prompt.tokens / self.window, 5),
            "window": self.window,
            "gold_position": prompt.gold_positions.get(s.item.id),
            "n_docs": len(prompt.doc_ids),
            "shown": prompt.doc_ids,
            "group_size": len(s.group),
            "counter": self.builder.meter.name,
        }

    def _log(self, fields: dict[str, Any], result: dict[str, Any]) -> None:
        if result["status"] != "ok":
            self.errors += 1
        self.log.append(CallRecord(**fields, ts=time.time(), **result))

    async def _one(self, client: httpx.AsyncClient, s: Sample) -> None:
        prompt = self._prompt(s)
        cost = prompt.tokens + self.ep.max_tokens
        if not self.budget.allows(cost):
            self.exhausted = True
            return
        result = await call_model(client, self.ep, prompt)
        if result.get("reasoning_mode") and self.ep.reasoning == "auto":
            self.ep = replace(self.ep, reasoning=result["reasoning_mode"])
        self.budget.spend(cost)
        self._log(self._fields(s, prompt), result)

    async def _batched(self, todo: list[Sample]) -> None:
        """The calls through the provider's batch API: first the batches an earlier process
        sent and did not see end (``batches.jsonl``), then the rest, within the budget, in
        batches within the provider's limits; each batch's results go to the call log when it
        ends."""
        api = batch.api_for(self.ep.api)
        ledger = batch.Ledger(self.log.path.parent / "batches.jsonl")
        _, headers, _ = request_of(self.ep, RenderedPrompt("", "", [], {}, 0, 0))
        base = self.ep.base_url.rstrip("/")
        path = "/v1/chat/completions" if self.ep.api == "openai" else "/v1/messages"
        async with httpx.AsyncClient(trust_env=False, timeout=self.ep.timeout_s) as client:
            for u in ledger.unconfirmed():
                # sent or not? the provider says, where it keeps the tag; else its calls go again
                found = await api.find(client, base, headers, u.tag)
                if found is None:
                    ledger.closed(u.tag)
                else:
                    ledger.sent(batch.Pending(found, u.api, u.calls, u.at, u.tag))
            for p in ledger.pending():
                await self._collect(api, client, base, headers, p, ledger)
            done = self.log.done()
            requests: list[tuple[str, dict[str, Any]]] = []
            fields: dict[str, dict[str, Any]] = {}
            for s in todo:
                if s.key in done:
                    continue
                prompt = self._prompt(s)
                cost = prompt.tokens + self.ep.max_tokens
                if not self.budget.allows(cost):
                    self.exhausted = True
                    break
                self.budget.spend(cost)
                cid = f"c{len(requests)}"  # Anthropic allows [a-zA-Z0-9_-]{1,64} only
                requests.append((cid, request_of(self.ep, prompt)[2]))
                fields[cid] = self._fields(s, prompt)
            sent = []
            for chunk in batch.chunks(requests):
                calls = {cid: fields[cid] for cid, _ in chunk}
                # the intent first: a restart between the provider's answer and the next line
                # finds the batch by its tag instead of sending its calls again
                intent = batch.Unconfirmed(uuid.uuid4().hex, api.name, calls, time.time())
                ledger.sending(intent)
                bid = await api.submit(client, base, headers, path, chunk, intent.tag)
                p = batch.Pending(bid, api.name, calls, intent.at, intent.tag)
                ledger.sent(p)
                sent.append(p)
                print(f"batch {bid}: {len(chunk)} calls sent", file=sys.stderr, flush=True)
            for p in sent:
                await self._collect(api, client, base, headers, p, ledger)

    async def _collect(
        self,
        api: batch.BatchApi,
        client: httpx.AsyncClient,
        base: str,
        headers: dict[str, str],
        p: batch.Pending,
        ledger: batch.Ledger,
    ) -> None:
        outcomes = await batch.wait(api, client, base, headers, p.id, self.ep.batch_poll_s)
        got = {o.custom_id: o for o in outcomes}
        for cid, fields in p.calls.items():
            o = got.get(cid)
            if o is not None and o.body is not None:
                result = _result(self.ep, o.body, 0.0, 1)
            else:
                result = {
                    "status": "error",
                    "error": o.error if o is not None else "batch: no result for this request",
                    "attempts": 1,
                    "http_status": o.http_status if o is not None else None,
                }
            self._log(fields, result)
        ledger.done(p.id)
        print(f"batch {p.id}: {len(p.calls)} results logged", file=sys.stderr, flush=True)

    @contextlib.contextmanager
    def _progress(self, total: int) -> Iterator[tuple[Progress | LineProgress | None, Any]]:
        if not self.progress:
            yield None, None
            return
        if not sys.stderr.isatty():  # a log or a pipe: rich draws nothing there until the end
            yield LineProgress(total), None
            return
        bar = Progress(
            TextColumn("[bold]sweep"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} calls"),
            TextColumn("{task.fields[tokens]:,} tokens"),
            TextColumn("{task.fields[errors]} errors"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
        )
        with bar:
            task = bar.add_task("calls", total=total, tokens=0, errors=0)
            yield bar, task
