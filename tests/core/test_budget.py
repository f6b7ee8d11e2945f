"""Property tests of the trimming policy over generated conversations in both API shapes."""

from __future__ import annotations

import itertools
import re
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from context_ceiling.core.counting import DEFAULT_CHUNK_PATTERN
from context_ceiling.core.tokenizers import TiktokenCounter
from context_ceiling.core.trim import MARKER, Policy, input_budget
from context_ceiling.formats import fit
from context_ceiling.formats.anthropic import count as count_anthropic
from context_ceiling.formats.openai_chat import count as count_openai
from testkit.traffic.agent_traffic import WORDS

ENC = TiktokenCounter("o200k_base")
CHUNKS = re.compile(DEFAULT_CHUNK_PATTERN)


text = st.lists(st.sampled_from(WORDS), min_size=1, max_size=40).map(" ".join)
big_text = st.lists(st.sampled_from(WORDS), min_size=20, max_size=400).map(" ".join)


@st.composite
def chunks(draw: st.DrawFn) -> str:
    n = draw(st.integers(0, 4))
    return "\n".join(f'<document id="d{k}">{draw(big_text)}</document>' for k in range(n))


@st.composite
def openai_conversation(draw: st.DrawFn) -> dict[str, Any]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": draw(text), "x_id": "sys"}]
    n_turns = draw(st.integers(1, 5))
    call = 0
    for t in range(n_turns):
        last = t == n_turns - 1
        msgs.append(
            {
                "role": "user",
                "content": draw(chunks()) + "\nQ" + str(t) + " " + draw(text),
                "x_id": f"u{t}",
            }
        )
        for _ in range(draw(st.integers(0, 2))):
            ids = [f"call_{call + k}" for k in range(draw(st.integers(1, 2)))]
            call += len(ids)
            msgs.append(
                {
                    "role": "assistant",
                    "content": None,
                    "x_id": f"a{t}-{ids[0]}",
                    "tool_calls": [
                        {
                            "id": i,
                            "type": "function",
                            "function": {"name": "lookup", "arguments": '{"q": 1}'},
                        }
                        for i in ids
                    ],
                }
            )
            for i in ids:
                msgs.append(
                    {"role": "tool", "tool_call_id": i, "content": draw(big_text), "x_id": f"t-{i}"}
                )
        if not last or draw(st.booleans()):
            msgs.append({"role": "assistant", "content": draw(text), "x_id": f"r{t}"})
    return {"model": "gpt-4o", "messages": msgs}


@st.composite
def anthropic_conversation(draw: st.DrawFn) -> dict[str, Any]:
    msgs: list[dict[str, Any]] = []
    n_turns = draw(st.integers(1, 5))
    call = 0
    cache_at = draw(st.integers(-1, n_turns - 1))
    for t in range(n_turns):
        blocks: list[dict[str, Any]] = [
            {
                "type": "document",
                "source": {"type": "text", "media_type": "text/plain", "data": draw(big_text)},
                "title": f"doc{t}-{k}",
            }
            for k in range(draw(st.integers(0, 3)))
        ]
        blocks.append({"type": "text", "text": draw(chunks()) + f"\nQ{t} " + draw(text)})
        if t == cache_at:
            blocks[-1]["cache_control"] = {"type": "ephemeral"}
        msgs.append({"role": "user", "content": blocks, "x_id": f"u{t}"})
        for _ in range(draw(st.integers(0, 2))):
            ids = [f"toolu_{call + k}" for k in range(draw(st.integers(1, 2)))]
            call += len(ids)
            msgs.append(
                {
                    "role": "assistant",
                    "x_id": f"a-{ids[0]}",
                    "content": [
                        {"type": "tool_use", "id": i, "name": "lookup", "input": {"q": 1}}
                        for i in ids
                    ],
                }
            )
            msgs.append(
                {
                    "role": "user",
                    "x_id": f"tr-{ids[0]}",
                    "content": [
                        {"type": "tool_result", "tool_use_id": i, "content": draw(big_text)}
                        for i in ids
                    ],
                }
            )
        if t < n_turns - 1 or draw(st.booleans()):
            msgs.append(
                {
                    "role": "assistant",
                    "content": [{"type": "text", "text": draw(text)}],
                    "x_id": f"r{t}",
                }
            )
    return {"model": "claude-x", "max_tokens": 100, "system": draw(text), "messages": msgs}


def recount(body: dict[str, Any], api: str) -> int:
    fn = count_openai if api == "openai" else count_anthropic
    return fn(body, ENC, None, CHUNKS).total


def ids(body: dict[str, Any]) -> list[str]:
    return [m["x_id"] for m in body["messages"]]


def check_invariants(orig: dict[str, Any], out: dict[str, Any], api: str) -> None:
    got = ids(out)
    order = ids(orig)
    assert got == [i for i in order if i in set(got)], "order preserved"
    assert order[-1] in got or any(i.startswith("u") for i in got)
    last_user = [m["x_id"] for m in orig["messages"] if m["x_id"].startswith("u")][-1]
    at = order.index(last_user)
    uses_after = sum(
        1
        for m in orig["messages"][at:]
        for b in (
            [m] if m.get("role") == "tool" else m["content"] if m["x_id"].startswith("tr-") else []
        )
        if b.get("role") == "tool" or b.get("type") == "tool_result"
    )
    # inside an agent task rounds are the unit: a user message with `keep` (3) tool uses or
    # more after it may go like any older round
    assert last_user in got or uses_after >= 3, "latest user message kept"
    if api == "openai":
        assert got[0] == "sys", "system kept"
        calls = [
            c["id"]
            for m in out["messages"]
            if m["role"] == "assistant"
            for c in m.get("tool_calls") or []
        ]
        results = [m["tool_call_id"] for m in out["messages"] if m["role"] == "tool"]
        assert sorted(calls) == sorted(results), "no orphaned tool call or result"
        for k, m in enumerate(out["messages"]):
            if m["role"] == "tool":
                prior = [
                    c["id"]
                    for p in out["messages"][:k]
                    if p["role"] == "assistant"
                    for c in p.get("tool_calls") or []
                ]
                assert m["tool_call_id"] in prior
    else:
        uses = [
            b["id"]
            for m in out["messages"]
            for b in m["content"]
            if isinstance(b, dict) and b.get("type") == "tool_use"
        ]
        results = [
            b["tool_use_id"]
            for m in out["messages"]
            for b in m["content"]
            if isinstance(b, dict) and b.get("type") == "tool_result"
        ]
        assert sorted(uses) == sorted(results), "no orphaned tool_use or tool_result"
        assert out["messages"][0]["role"] == "user"
        roles = [m["role"] for m in out["messages"]]
        assert all(a != b for a, b in itertools.pairwise(roles)), "roles still alternate"
        assert all(m["content"] for m in out["messages"]), "no empty message"


SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(
    body=openai_conversation(),
    frac=st.floats(0.05, 1.3),
    keep_first=st.booleans(),
    cap=st.integers(16, 200),
)
def test_openai_fit_properties(
    body: dict[str, Any], frac: float, keep_first: bool, cap: int
) -> None:
    total = recount(body, "openai")
    budget = int(total * frac)
    out, report = fit(
        body,
        shape="openai",
        budget=budget,
        policy=Policy(keep_first_user=keep_first, tool_result_max_tokens=cap),
    )
    assert report.before == total
    if budget >= total:
        assert out == body and report.trimmed == 0 and report.after == total
        return
    actual = recount(out, "openai")
    assert actual <= report.after, "the report never under-states what is sent"
    if report.fits:
        assert actual <= budget
    check_invariants(body, out, "openai")
    assert report.trimmed == report.before - report.after


@SETTINGS
@given(body=anthropic_conversation(), frac=st.floats(0.05, 1.3), protect=st.booleans())
def test_anthropic_fit_properties(body: dict[str, Any], frac: float, protect: bool) -> None:
    total = recount(body, "anthropic")
    budget = int(total * frac)
    out, report = fit(
        body, shape="anthropic", budget=budget, policy=Policy(protect_cache_prefix=protect)
    )
    if budget >= total:
        assert out == body and report.trimmed == 0
        return
    actual = recount(out, "anthropic")
    assert actual <= report.after
    if report.fits:
        assert actual <= budget
    check_invariants(body, out, "anthropic")


def test_stages_in_order_and_markers() -> None:
    long = " ".join(["fee 120 EUR notice 90 days"] * 300)
    body = {
        "model": "gpt-4o",
        "messages": [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "first question"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": long},
            {"role": "assistant", "content": "ok"},
            {
                "role": "user",
                "content": '<document id="1">'
                + long
                + '</document>\n<document id="2">'
                + long
                + "</document>\nQ?",
            },
        ],
    }
    total = recount(body, "openai")
    # without the clear stage (which would drop the old round whole): a budget that capping the
    # tool result alone satisfies
    policy = Policy(tool_result_max_tokens=100, stages=["tool_results", "retrieved", "history"])
    out, rep = fit(body, shape="openai", budget=total - 1500, policy=policy)
    assert rep.fits and rep.removed["retrieved"] == 0 and rep.removed["history"] == 0
    tool = out["messages"][3]["content"]
    assert re.search(r"\[\.\.\. \d+ tokens removed by context-ceiling \.\.\.\]", tool)
    assert tool.startswith("fee 120") and tool.endswith("90 days")
    assert MARKER.split("{n}")[1].strip() in tool
    # tighter: the last chunk goes next, whole
    out, rep = fit(body, shape="openai", budget=total - 3000, policy=policy)
    assert rep.removed["retrieved"] > 0 and '<document id="1">' in out["messages"][-1]["content"]
    assert '<document id="2">' not in out["messages"][-1]["content"]
    assert body["messages"][3]["content"] == long  # type: ignore[index] # the input is never mutated


def test_cache_prefix_is_cut_last_and_the_loss_counted() -> None:
    long = " ".join(["clause text"] * 400)
    body = {
        "model": "claude-x",
        "max_tokens": 10,
        "messages": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "document",
                        "source": {"type": "text", "media_type": "text/plain", "data": long},
                    },
                    {"type": "text", "text": "old q", "cache_control": {"type": "ephemeral"}},
                ],
            },
            {"role": "assistant", "content": "a"},
            {
                "role": "user",
                "content": [
                    {
                        "type": "document",
                        "source": {"type": "text", "media_type": "text/plain", "data": long},
                    },
                    {"type": "text", "text": "new q"},
                ],
            },
        ],
    }
    total = recount(body, "anthropic")
    out, rep = fit(body, shape="anthropic", budget=total - 100)
    assert rep.fits and rep.cache_loss_tokens == 0
    assert out["messages"][0] == body["messages"][0]  # type: ignore[index] # the cached prefix is untouched
    out, rep = fit(body, shape="anthropic", budget=total - 1000)
    assert rep.fits and rep.cache_loss_tokens > 0


def test_budget_arithmetic() -> None:
    assert input_budget(128000, 4096) == 123904
    assert input_budget(128000, 4096, 64000) == 64000
    assert input_budget(8192, 8192) == 0
