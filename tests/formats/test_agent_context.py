"""Long-running agents: the clearing stage fits single-task loops instead of rejecting them,
keeps the prompt cache between clearing events, keeps every call with its result for every
provider; tool-result documents are counted; a second cut merges markers; dropped documents keep
citation indices; compaction artefacts stay; Gemini is trimmed; and the native strategy gives
the providers' own context management the ceiling as its threshold."""

from __future__ import annotations

import base64
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from context_ceiling import Policy, count, fit
from context_ceiling.core.trim import CLEARED_RE, MARKER_RE
from context_ceiling.core.vocabulary import Shape
from context_ceiling.formats import FORMATS
from context_ceiling.sidecar.app import create_app
from context_ceiling.sidecar.config import Settings
from testkit.serving import serve
from testkit.traffic.agent_loops import Loop, history_of, pairs, prefix_share, provider_valid
from testkit.traffic.ceiling_docs import doc, entry

APIS: list[Shape] = list(FORMATS)


def _fixed_part(api: Shape, body: dict[str, Any], keep: int) -> int:
    """Tokens of the system prompt, the task and the last ``keep`` rounds: what must fit."""
    history = history_of(api, body)
    per_round = 2  # a call message (or item) and its result
    head = history[: 2 if api == "openai" else 1]
    tail = history[-keep * per_round :] if keep else []
    key = {"responses": "input", "gemini": "contents"}.get(api, "messages")
    return count({**body, key: head + tail}, shape=api).total


@pytest.mark.parametrize("api", APIS)
def test_a_single_task_loop_is_never_rejected_and_stays_valid(api: Shape) -> None:
    """60 rounds of ~1.5k tokens against a 20k budget: every turn fits, every call keeps its
    result (ids unchanged), the latest ``keep`` results are whole, the task is kept."""
    policy = Policy()
    rejected = 0
    for n, body in enumerate(Loop(api, rounds=60).turns(), 1):
        out, report = fit(body, shape=api, budget=20_000, policy=policy)
        if _fixed_part(api, body, policy.keep) <= 20_000:
            assert report.fits, f"turn {n} rejected at {report.after}"
        rejected += not report.fits
        assert provider_valid(api, out), f"turn {n}"
        assert report.after == count(out, shape=api).total
        calls, _ = pairs(api, out)
        assert pairs(api, body)[0][-policy.keep :] == calls[-policy.keep :]
        if report.trimmed:
            kept = history_of(api, out)
            assert json.dumps(kept[-1]) == json.dumps(history_of(api, body)[-1])
            first = kept[1] if api == "openai" else kept[0]
            assert first == history_of(api, body)[1 if api == "openai" else 0]
    assert rejected == 0


@pytest.mark.parametrize("api", APIS)
def test_turns_between_clearing_events_only_append(api: Shape) -> None:
    """Stateless cache stability: after the first clearing event, a turn that is not itself a
    clearing event repeats the previous forwarded request byte for byte as its prefix; an event
    is flagged, and the placeholders name the tool, the call id and the tokens cleared."""
    previous: bytes | None = None
    events = appended = 0
    for body in Loop(api, rounds=60, seed=3).turns():
        out, report = fit(body, shape=api, budget=20_000)
        current = orjson.dumps(history_of(api, out))
        if previous is not None and report.trimmed:
            share = prefix_share(previous, current)
            if report.clearing_event:
                events += 1
            else:
                appended += 1
                assert share > 0.99, share
        previous = current
    assert events >= 1 and appended >= 4 * events
    placeholders = CLEARED_RE.findall(current.decode())
    assert placeholders and all("(call call_" in p and "tokens]" in p for p in placeholders)


def test_clearing_keeps_excluded_tools_and_can_clear_inputs() -> None:
    body = list(Loop("anthropic", rounds=30, seed=5).turns())[-1]
    names = {
        b["name"]
        for m in body["messages"]
        if m["role"] == "assistant"
        for b in m["content"]
        if b["type"] == "tool_use"
    }
    excluded = sorted(names)[0]
    out, report = fit(
        body,
        shape="anthropic",
        budget=15_000,
        policy=Policy(exclude_tools=[excluded], clear_tool_inputs=True),
    )
    assert report.cleared_tool_uses > 0
    calls = {
        b["id"]: b
        for m in out["messages"]
        if m["role"] == "assistant"
        for b in m["content"]
        if b["type"] == "tool_use"
    }
    for m in out["messages"]:
        for b in m["content"] if isinstance(m["content"], list) else []:
            if b["type"] != "tool_result":
                continue
            call = calls[b["tool_use_id"]]
            cleared = isinstance(b["content"], str) and CLEARED_RE.fullmatch(b["content"])
            if call["name"] == excluded:
                assert not cleared
            if cleared:
                assert call["input"] == {}  # clear_tool_inputs
    assert provider_valid("anthropic", out)


def test_parallel_calls_and_long_outputs_fit_when_the_fixed_part_does() -> None:
    rng = random.Random(11)
    for api in APIS:
        loop = Loop(api, rounds=40, parallel=3, output_words=(150, 6000), seed=rng.randrange(99))
        for body in loop.turns():
            out, report = fit(body, shape=api, budget=60_000)
            if _fixed_part(api, body, 3) <= 60_000:
                assert report.fits
            assert provider_valid(api, out)


def test_documents_and_search_results_inside_tool_results_are_counted() -> None:
    text = "the quarterly report says revenue grew " * 200
    pdf = b"%PDF-1.4\n" + b"".join(b"1 0 obj << /Type /Page >> endobj\n" for _ in range(3))
    result_blocks: list[dict[str, Any]] = [
        {
            "type": "search_result",
            "source": "https://x/a",
            "title": "A",
            "content": [{"type": "text", "text": text}],
        },
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": text}},
        {
            "type": "document",
            "source": {
                "type": "base64",
                "media_type": "application/pdf",
                "data": base64.b64encode(pdf).decode(),
            },
        },
    ]
    body = {
        "model": "claude",
        "max_tokens": 10,
        "messages": [
            {"role": "user", "content": "find it"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "search", "input": {}}],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t1", "content": result_blocks}],
            },
        ],
    }
    c = count(body, shape="anthropic")
    n_text = count(
        {**body, "messages": [{"role": "user", "content": text}]}, shape="anthropic"
    ).total
    assert c.total > 2 * n_text + 3 * 3000 - 50  # two texts and a 3-page PDF (3,000 a page)


def test_a_second_cut_merges_markers_and_keeps_the_true_total() -> None:
    long = "word " * 6000
    body = {
        "model": "gpt-4o",
        "messages": [
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": long},
        ],
    }
    policy = Policy(stages=["tool_results"], tool_result_max_tokens=16)
    before = count(body, shape="openai").total
    once, r1 = fit(body, shape="openai", budget=before - 3000, policy=policy)
    twice, r2 = fit(once, shape="openai", budget=r1.after - 1000, policy=policy)
    text = twice["messages"][2]["content"]
    markers = MARKER_RE.findall(text)
    assert len(markers) == 1
    removed = int(markers[0])
    assert abs(removed - (before - r2.after)) <= 40  # the total, not the second cut alone
    assert removed > int(MARKER_RE.findall(once["messages"][2]["content"])[0])


def test_dropped_documents_keep_citation_indices() -> None:
    docs = [
        {
            "type": "document",
            "title": f"doc {k}",
            "source": {"type": "text", "media_type": "text/plain", "data": f"fact {k} " * 600},
            "citations": {"enabled": True},
        }
        for k in range(6)
    ]
    body = {
        "model": "claude",
        "max_tokens": 10,
        "messages": [
            {"role": "user", "content": [*docs, {"type": "text", "text": "summarise"}]},
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "text",
                        "text": "Doc 4 says fact 4.",
                        "citations": [
                            {"type": "char_location", "document_index": 4, "cited_text": "fact 4"}
                        ],
                    }
                ],
            },
            {"role": "user", "content": "and doc 5?"},
        ],
    }
    out, report = fit(body, shape="anthropic", budget=count(body, shape="anthropic").total // 2)
    assert report.fits and report.removed["retrieved"] > 0
    kept = [b for b in out["messages"][0]["content"] if b["type"] == "document"]
    assert len(kept) == 6  # stubs in place of the dropped ones: index 4 is still doc 4
    assert kept[4]["title"] == "doc 4"
    assert out["messages"][1] == body["messages"][1]  # type: ignore[index]
    assert not any("tool result" in a for a in report.actions), report.actions
    assert any("retrieved chunk" in a for a in report.actions)


def test_compaction_items_are_counted_and_never_dropped() -> None:
    enc = base64.b64encode(random.Random(0).randbytes(3000)).decode()
    loop = list(Loop("responses", rounds=20, seed=2).turns())[-1]
    items = loop["input"]
    compacted = [
        *items[:10],
        {"type": "compaction", "id": "cmp_1", "encrypted_content": enc},
        *items[10:],
    ]
    body = {**loop, "input": compacted}
    c = count(body, shape="responses")
    assert c.total > count(loop, shape="responses").total + 400  # estimated from its size
    out, report = fit(body, shape="responses", budget=6000)
    assert report.fits
    assert {"type": "compaction", "id": "cmp_1", "encrypted_content": enc} in out["input"]
    assert provider_valid("responses", out)


def test_anthropic_compaction_blocks_are_counted() -> None:
    summary = "Summary of the work so far: " + "edited files and ran tests " * 100
    body = {
        "model": "claude",
        "max_tokens": 10,
        "messages": [
            {"role": "user", "content": "continue"},
            {"role": "assistant", "content": [{"type": "compaction", "content": summary}]},
            {"role": "user", "content": "go on"},
        ],
    }
    plain = {**body, "messages": [{"role": "user", "content": summary}]}
    assert count(body, shape="anthropic").total >= count(plain, shape="anthropic").total


# -- native context management through the real sidecar ---------------------------------------


class ContextManagementProviderDouble:
    """A test double for Anthropic's and OpenAI's APIs that implements their documented context
    management: Anthropic's ``clear_tool_uses_20250919`` edit (with the beta header) clears the
    oldest tool results beyond ``keep`` once the input passes ``trigger`` and reports
    ``applied_edits``; the Responses API's ``compaction`` entry adds a compaction item to the
    output once the input passes ``compact_threshold``. Input is measured in o200k tokens."""

    def __init__(self) -> None:
        self.received: list[tuple[dict[str, str], dict[str, Any]]] = []

    async def messages(self, request: Request) -> JSONResponse:
        body = await request.json()
        self.received.append((dict(request.headers), body))
        cm = body.get("context_management")
        cleared = edits = 0
        tokens = count(
            {k: v for k, v in body.items() if k != "context_management"}, shape="anthropic"
        ).total
        if cm and "context-management-2025-06-27" in request.headers.get("anthropic-beta", ""):
            edit = cm["edits"][0]
            if tokens > edit["trigger"]["value"]:
                results = [
                    b
                    for m in body["messages"]
                    if isinstance(m["content"], list)
                    for b in m["content"]
                    if b.get("type") == "tool_result"
                ]
                for b in results[: max(0, len(results) - edit["keep"]["value"])]:
                    cleared += len(str(b.get("content"))) // 4
                    edits = 1
        reply: dict[str, Any] = {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": [{"type": "text", "text": "ok"}],
            "stop_reason": "end_turn",
            "usage": {"input_tokens": tokens - cleared, "output_tokens": 1},
        }
        if cm:
            reply["context_management"] = {
                "applied_edits": [
                    {
                        "type": "clear_tool_uses_20250919",
                        "cleared_tool_uses": 1,
                        "cleared_input_tokens": cleared,
                    }
                ]
                if edits
                else []
            }
        return JSONResponse(reply)

    async def responses(self, request: Request) -> JSONResponse:
        body = await request.json()
        self.received.append((dict(request.headers), body))
        cm = body.get("context_management") or []
        tokens = count(
            {k: v for k, v in body.items() if k != "context_management"}, shape="responses"
        ).total
        output: list[dict[str, Any]] = []
        if cm and tokens > cm[0]["compact_threshold"]:
            output.append({"type": "compaction", "id": "cmp_1", "encrypted_content": "eA=="})
        output.append(
            {
                "type": "message",
                "id": "msg_1",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "ok", "annotations": []}],
            }
        )
        return JSONResponse(
            {
                "id": "resp_1",
                "object": "response",
                "created_at": 1,
                "status": "completed",
                "model": body["model"],
                "output": output,
                "usage": {"input_tokens": tokens, "output_tokens": 1, "total_tokens": tokens + 1},
            }
        )

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/messages", self.messages, methods=["POST"]),
                Route("/v1/responses", self.responses, methods=["POST"]),
            ]
        )


@pytest.fixture
def native(tmp_path: Path) -> Iterator[tuple[str, ContextManagementProviderDouble, Any]]:
    d = ContextManagementProviderDouble()
    ceilings = tmp_path / "ceilings.yaml"
    ceilings.write_text(
        yaml.safe_dump(
            doc(
                1,
                entry(model="claude", tokens=12_000, window=200_000),
                entry(model="gpt-4o", tokens=9_000, window=128_000),
            )
        )
    )
    with serve(d.app()) as durl:
        settings = Settings(
            upstreams={"anthropic": {"base_url": durl}, "openai": {"base_url": durl + "/v1"}},
            models=[
                {"match": "claude-*", "label": "claude", "window": 200_000},
                {"match": "gpt-4o", "window": 128_000},
            ],
            ceilings_file=ceilings,
            enforcement={"mode": "enforce", "strategy": "native"},
        )
        app = create_app(settings)
        with serve(app) as url:
            yield url, d, app.state.sidecar


@pytest.mark.e2e
def test_native_strategy_sets_anthropic_context_editing_from_the_ceiling(
    native: tuple[str, ContextManagementProviderDouble, Any],
) -> None:
    url, d, state = native
    client = anthropic.Anthropic(base_url=url, api_key="sk-ant-x", max_retries=0)
    body = list(Loop("anthropic", rounds=20, seed=1).turns())[-1]
    r = client.messages.with_raw_response.create(
        model="claude-sonnet",
        max_tokens=100,
        system=body["system"],
        messages=body["messages"],
        extra_headers={"anthropic-beta": "interleaved-thinking-2025-05-14"},
    )
    assert r.http_response.status_code == 200
    headers, sent = d.received[-1]
    edit = sent["context_management"]["edits"][0]
    assert edit["type"] == "clear_tool_uses_20250919"
    assert edit["trigger"] == {"type": "input_tokens", "value": 12_000}  # the running ceiling
    assert edit["keep"] == {"type": "tool_uses", "value": 3}
    betas = headers["anthropic-beta"].split(",")
    assert "context-management-2025-06-27" in betas and "interleaved-thinking-2025-05-14" in betas
    assert sent["messages"] == body["messages"]  # the provider clears; the sidecar did not trim
    assert r.http_response.headers["x-ceiling-context-management"] == "native"
    reg = state.metrics.registry
    cleared = reg.get_sample_value(
        "llm_context_native_cleared_tokens_total", {"model": "claude", "workload": "default"}
    )
    assert cleared is not None and cleared > 0


@pytest.mark.e2e
def test_native_strategy_never_overrides_the_clients_own(
    native: tuple[str, ContextManagementProviderDouble, Any],
) -> None:
    url, d, _ = native
    own = {
        "edits": [
            {
                "type": "clear_tool_uses_20250919",
                "trigger": {"type": "input_tokens", "value": 50_000},
            }
        ]
    }
    httpx.post(
        url + "/v1/messages",
        json={
            "model": "claude-sonnet",
            "max_tokens": 10,
            "messages": [{"role": "user", "content": "hi"}],
            "context_management": own,
        },
        headers={"x-api-key": "k", "anthropic-version": "2023-06-01"},
    ).raise_for_status()
    assert d.received[-1][1]["context_management"] == own


@pytest.mark.e2e
def test_native_strategy_sets_responses_compaction_from_the_ceiling(
    native: tuple[str, ContextManagementProviderDouble, Any],
) -> None:
    url, d, state = native
    client = openai.OpenAI(base_url=url + "/v1", api_key="sk-x", max_retries=0)
    body = list(Loop("responses", rounds=12, seed=4).turns())[-1]
    resp = client.responses.create(
        model="gpt-4o", instructions=body["instructions"], input=body["input"]
    )
    assert resp.output[0].type == "compaction"
    _, sent = d.received[-1]
    assert sent["context_management"] == [{"type": "compaction", "compact_threshold": 9_000}]
    edits = state.metrics.registry.get_sample_value(
        "llm_context_native_edits_total", {"model": "gpt-4o", "workload": "default"}
    )
    assert edits == 1


def test_auto_uses_native_only_on_the_providers_own_api() -> None:
    from context_ceiling.sidecar.state import SidecarState

    official = Settings(
        upstreams={
            "anthropic": {"base_url": "https://api.anthropic.com"},
            "openai": {"base_url": "https://api.openai.com/v1"},
        }
    )
    local = Settings(upstreams={"openai": {"base_url": "http://127.0.0.1:8080/v1"}})
    s1, s2 = SidecarState.build(official), SidecarState.build(local)
    assert s1.upstreams.native_ok("anthropic", None) and s1.upstreams.native_ok("responses", None)
    assert not s1.upstreams.native_ok("openai", None) and not s1.upstreams.native_ok("gemini", None)
    assert not s2.upstreams.native_ok("responses", None)


@pytest.mark.e2e
def test_gemini_over_budget_is_trimmed_through_the_sidecar(tmp_path: Path) -> None:
    got: list[dict[str, Any]] = []

    async def generate(request: Request) -> JSONResponse:
        got.append(await request.json())
        return JSONResponse(
            {
                "candidates": [
                    {
                        "content": {"role": "model", "parts": [{"text": "ok"}]},
                        "finishReason": "STOP",
                    }
                ],
                "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 1},
            }
        )

    upstream = Starlette(
        routes=[Route("/v1beta/models/gemini-2.5-pro:generateContent", generate, methods=["POST"])]
    )
    ceilings = tmp_path / "c.yaml"
    ceilings.write_text(
        yaml.safe_dump(doc(1, entry(model="gemini", tokens=15_000, window=1_000_000)))
    )
    body = list(Loop("gemini", rounds=40, seed=9).turns())[-1]
    with serve(upstream) as durl:
        settings = Settings(
            upstreams={"gemini": {"base_url": durl}, "openai": {"base_url": durl + "/v1"}},
            models=[
                {
                    "match": "gemini-*",
                    "label": "gemini",
                    "window": 1_000_000,
                    "tokenizer": {"kind": "calibrated", "encoding": "o200k_base", "factor": 1.0},
                }
            ],
            ceilings_file=ceilings,
            enforcement={"mode": "enforce"},
        )
        with serve(create_app(settings)) as url:
            r = httpx.post(
                url + "/v1beta/models/gemini-2.5-pro:generateContent",
                json=body,
                headers={"x-goog-api-key": "k"},
                timeout=30,
            )
    assert r.status_code == 200, r.text
    sent = got[-1]
    assert provider_valid("gemini", sent)
    assert count(sent, shape="gemini").total <= 15_000
    assert int(r.headers["x-ceiling-cleared-tool-uses"]) > 0
    assert sent["contents"][-1] == body["contents"][-1]


@pytest.mark.parametrize("api", APIS)
def test_loops_with_instructions_thinking_and_search_results_fit_and_stay_valid(
    api: Shape,
) -> None:
    loop = Loop(
        api,
        rounds=80,
        parallel=2,
        output_words=(150, 3000),
        instruct_every=15,
        thinking=True,
        search_results=True,
        seed=2,
    )
    for body in loop.turns():
        out, report = fit(body, shape=api, budget=40_000)
        assert report.fits and provider_valid(api, out)
        assert report.after == count(out, shape=api).total


def test_earlier_turns_thinking_counts_nothing_and_this_turns_counts() -> None:
    """Anthropic removes earlier turns' thinking from the context window (input - previous
    thinking + this turn); the thinking of the tool loop in progress counts."""
    thought = "let me think about which file to open " * 50
    turn = [
        {"role": "user", "content": "task one"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": thought, "signature": "s"},
                {"type": "tool_use", "id": "t1", "name": "read", "input": {}},
            ],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "x"}]},
    ]
    current = {"model": "claude", "max_tokens": 5, "messages": turn}
    later = {
        **current,
        "messages": [
            *turn,
            {"role": "assistant", "content": "done"},
            {"role": "user", "content": "task two"},
        ],
    }
    no_thinking = {
        **later,
        "messages": [
            {**m, "content": [b for b in m["content"] if b.get("type") != "thinking"]}
            if m["role"] == "assistant" and isinstance(m["content"], list)
            else m
            for m in later["messages"]  # type: ignore[attr-defined]
        ],
    }
    assert count(current, shape="anthropic").total > 400  # this turn's thinking counts
    assert count(later, shape="anthropic").total == count(no_thinking, shape="anthropic").total


def _cached(api: Shape, body: dict[str, Any], cache: Any, **kw: Any) -> Any:
    import re as _re

    from context_ceiling.core.counting import DEFAULT_CHUNK_PATTERN
    from context_ceiling.core.tokenizers import RequestMemo, TiktokenCounter
    from context_ceiling.formats import FORMATS

    counter = RequestMemo(cache.wrap(kw.pop("counter", TiktokenCounter("o200k_base"))))
    fn = FORMATS[api].count
    return fn(
        body if kw.pop("as_is", False) else orjson.loads(orjson.dumps(body)),
        counter,
        None,
        _re.compile(DEFAULT_CHUNK_PATTERN),
        memo=cache,
        **kw,
    )


@pytest.mark.parametrize("api", APIS)
def test_resent_history_is_counted_from_the_message_cache_with_the_same_result(
    api: Shape,
) -> None:
    """Every turn of a loop (instructions, thinking, parallel calls) counts exactly as a fresh
    count does, parts and components included, while only the turn's new messages (and the
    few whose component changed) are walked: the rest is taken from the cache."""
    from context_ceiling.core.tokenizers import CountCache

    cache = CountCache(64 * 2**20)
    loop = Loop(api, 40, (50, 400), parallel=2, seed=3, instruct_every=7, thinking=True)
    previous = seen = 0
    for body in loop.turns():
        fresh = count(body, shape=api)
        walked, got = _walked(api, body, cache)
        assert got.total == fresh.total and got.components == fresh.components
        assert [(p.message, p.block, p.component, p.tokens, p.span) for p in got.parts] == [
            (p.message, p.block, p.component, p.tokens, p.span) for p in fresh.parts
        ]
        messages = len(history_of(api, body))
        instructions = orjson.dumps(body).count(b"Now also")
        # a new instruction makes the earlier turns' thinking count nothing: counted again;
        # requests of fewer than four messages are not remembered (single-turn traffic)
        if previous >= 4 and instructions == seen:
            assert len(walked) <= messages - previous + 2, (messages, previous, walked)
        previous, seen = messages, instructions


def _walked(api: Shape, body: dict[str, Any], cache: Any) -> tuple[set[int], Any]:
    """The count with ``cache``, and the message indices it walked (those the cache did not
    give whole)."""
    from context_ceiling.core import counting

    seen: set[int] = set()
    original = counting._message

    def spy(tally: Any, memo: Any, ctx: Any, i: int, *rest: Any) -> None:
        seen.add(i)
        original(tally, memo, ctx, i, *rest)

    counting._message = spy  # type: ignore[assignment]
    try:
        return seen, _cached(api, body, cache)
    finally:
        counting._message = original


def test_the_message_cache_keys_on_what_a_count_depends_on() -> None:
    """The same message bytes under another counter, component or API are counted again; a
    message whose shape is wrong is refused with or without the cache, and never remembered."""
    from context_ceiling.core.shape_checks import RequestShapeError
    from context_ceiling.core.tokenizers import CountCache, TiktokenCounter

    cache = CountCache(64 * 2**20)
    body = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "erste Frage über Größenänderungen 東京 " * 50},
            {"role": "assistant", "content": "an answer " * 50},
            {"role": "user", "content": "second question " * 50},
        ],
    }
    a = _cached("openai", body, cache)
    held = len(cache)
    b = _cached("openai", body, cache, counter=TiktokenCounter("cl100k_base"))
    assert b.total == count(body, shape="openai", counter=TiktokenCounter("cl100k_base")).total
    assert b.total != a.total and len(cache) > held
    # the second question, the latest user turn before, is history now: counted as history
    longer = {**body, "messages": [*body["messages"], {"role": "user", "content": "third"}]}
    got = _cached("openai", longer, cache)
    assert got.components == count(longer, shape="openai").components
    # Anthropic reads the same bytes with its own framing
    anth = {k: v for k, v in body.items()}
    assert _cached("anthropic", anth, cache).total == count(anth, shape="anthropic").total
    # a bad message is refused every time, and a deep one too (past what JSON writers accept)
    deep: Any = "x"
    for _ in range(100):  # past the depth limit, within what JSON writers accept
        deep = [deep]
    deeper: Any = deep
    for _ in range(200):  # past both
        deeper = [deeper]
    for bad in (
        {"role": "user", "content": 5},
        {"role": "user", "content": [{"type": "text", "text": deep}]},
    ):
        broken = {**body, "messages": [*body["messages"], bad]}
        for _ in range(2):
            with pytest.raises(RequestShapeError):
                _cached("openai", broken, cache)
    too_deep = {"role": "user", "content": [{"type": "text", "text": deeper}]}
    with pytest.raises(RequestShapeError, match="levels deep"):
        _cached("openai", {**body, "messages": [too_deep]}, cache, as_is=True)


def test_the_message_cache_is_bounded_in_bytes() -> None:
    from context_ceiling.core.tokenizers import CountCache

    cache = CountCache(50_000)
    for body in Loop("anthropic", 60, (200, 400), seed=5).turns():
        _cached("anthropic", body, cache)
        assert cache.bytes <= cache.max_bytes
    assert len(cache) > 0
