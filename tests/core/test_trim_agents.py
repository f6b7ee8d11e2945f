"""Trimming agent traffic without breaking it: generated conversations of both APIs, judged by
validators of the providers' published rules (``testkit/traffic/agent_traffic.py``)."""

from __future__ import annotations

import copy
import random
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from context_ceiling.core.counting import DEFAULT_CHUNK_PATTERN, prior_of
from context_ceiling.core.tokenizers import RequestMemo, TiktokenCounter
from context_ceiling.core.trim import Policy
from context_ceiling.core.trim_rules import PLACEHOLDER
from context_ceiling.formats import fit
from context_ceiling.formats.anthropic import count as count_anthropic
from context_ceiling.formats.openai_chat import count as count_openai
from testkit.traffic.agent_traffic import generate, violations

ENC = TiktokenCounter("o200k_base")
CHUNKS = re.compile(DEFAULT_CHUNK_PATTERN)
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def recount(body: dict[str, Any], api: str) -> int:
    fn = count_openai if api == "openai" else count_anthropic
    return fn(body, ENC, None, CHUNKS).total


def xids(body: dict[str, Any]) -> list[str]:
    return [m["x_id"] for m in body["messages"]]


def thinking_blocks(body: dict[str, Any]) -> list[Any]:
    return [
        b
        for m in body["messages"]
        if isinstance(m.get("content"), list)
        for b in m["content"]
        if b.get("type") in ("thinking", "redacted_thinking")
    ]


@SETTINGS
@given(
    seed=st.integers(0, 2**32),
    api=st.sampled_from(["openai", "anthropic"]),
    frac=st.floats(0.02, 1.1),
    keep_first=st.booleans(),
    cap=st.integers(16, 400),
    protect=st.booleans(),
)
def test_trimmed_agent_traffic_stays_valid_and_honest(
    seed: int, api: str, frac: float, keep_first: bool, cap: int, protect: bool
) -> None:
    body = generate(api, random.Random(seed))
    assert violations(api, body) == [], "the generator makes valid requests"
    original = copy.deepcopy(body)
    total = recount(body, api)
    budget = int(total * frac)
    policy = Policy(
        keep_first_user=keep_first, tool_result_max_tokens=cap, protect_cache_prefix=protect
    )
    out, report = fit(body, shape=api, budget=budget, policy=policy)
    assert body == original, "the input is never mutated"
    assert violations(api, out) == [], "the output follows the provider's rules"
    assert report.after == recount(out, api), "after is a recount of what is sent"
    assert report.fits == (report.after <= budget)
    assert report.trimmed == report.before - report.after
    fn = count_openai if api == "openai" else count_anthropic
    prior = prior_of(body["messages"], fn(body, ENC, None, CHUNKS))
    assert fn(out, ENC, None, CHUNKS, prior) == fn(out, ENC, None, CHUNKS), (
        "the shared messages' parts, taken over, are what a fresh count gives"
    )
    got, order = xids(out), xids(body)
    assert got == [i for i in order if i in set(got)], "nothing reordered"
    assert order[-1] in got, "the latest message is kept"
    if api == "anthropic":
        assert out["system"] == body["system"], "system untouched"
        kept = thinking_blocks(out)
        assert all(b in thinking_blocks(body) for b in kept), "thinking blocks unmodified"
    else:
        assert out["messages"][0] == body["messages"][0], "system untouched"
    for m in out["messages"]:
        if m["role"] == "assistant":
            assert m in body["messages"], "assistant messages are never edited"
    again, _ = fit(body, shape=api, budget=budget, policy=policy)
    assert again == out, "deterministic"
    memo = RequestMemo(TiktokenCounter("o200k_base"), min_chars=8)
    fast, fast_report = fit(body, shape=api, budget=budget, policy=policy, counter=memo)
    assert (fast, fast_report) == (out, report), "the per-request memo changes nothing but time"


def test_a_tool_result_that_shares_its_message_with_text_stays_with_its_call() -> None:
    """The pattern that broke Anthropic agent conversations: results plus a reminder."""
    big = "word " * 3000
    msgs: list[dict[str, Any]] = [
        {"role": "user", "content": "fix the bug", "x_id": "u0"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "read", "input": {}}],
            "x_id": "a0",
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": big},
                {"type": "text", "text": "<system-reminder>tests are slow</system-reminder>"},
            ],
            "x_id": "tr0",
        },
        {"role": "assistant", "content": "found it", "x_id": "r0"},
        {"role": "user", "content": "now the docs " + big, "x_id": "u1"},
        {"role": "assistant", "content": "ok", "x_id": "r1"},
        {"role": "user", "content": "and the changelog", "x_id": "u2"},
    ]
    body = {"model": "claude-x", "max_tokens": 100, "messages": msgs}
    policy = Policy(stages=["history"], keep_first_user=False)
    out, report = fit(body, shape="anthropic", budget=200, policy=policy)
    assert anthropic_ok(out) and report.after == recount(out, "anthropic")
    assert "tr0" not in xids(out) or "a0" in xids(out)


def anthropic_ok(body: dict[str, Any]) -> bool:
    return violations("anthropic", body) == []


def test_the_placeholder_is_counted_and_nothing_is_left_blank() -> None:
    doc = "<document id='x'>" + "alpha beta " * 200 + "</document>"
    msgs = [
        {"role": "user", "content": doc + "\n", "x_id": f"u{k}"}
        if k % 2 == 0
        else {"role": "assistant", "content": "ok", "x_id": f"r{k}"}
        for k in range(19)
    ]
    body = {"model": "claude-x", "max_tokens": 100, "messages": msgs}
    policy = Policy(stages=["retrieved"])
    out, report = fit(body, shape="anthropic", budget=254, policy=policy)
    assert report.after == recount(out, "anthropic")
    assert report.fits == (report.after <= 254)
    for m in out["messages"]:
        assert isinstance(m["content"], str) and m["content"].strip()
    assert any(m["content"] == PLACEHOLDER for m in out["messages"])


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_one_token_over_removes_about_one_token_of_tool_output(api: str) -> None:
    rng = random.Random(7)
    body = generate(api, rng)
    while not any(m.get("role") == "tool" or "tr" in m["x_id"] for m in body["messages"]):
        body = generate(api, rng)
    total = recount(body, api)
    _out, report = fit(
        body,
        shape=api,
        budget=total - 1,
        policy=Policy(stages=["tool_results"], tool_result_max_tokens=16),
    )
    assert report.fits
    # the marker costs ~15 tokens; a whole tool result would be hundreds
    assert report.before - report.after < 60, report.before - report.after
