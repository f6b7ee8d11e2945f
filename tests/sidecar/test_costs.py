"""What the context costs: each request's input priced (the registry's own price, or the list
price from genai-prices), split at the running ceiling and by prompt cache, and what trimming
saved or would have saved; through the official SDKs against the answer double."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from context_ceiling.core.prices import lookup
from context_ceiling.sidecar.app import create_app
from context_ceiling.sidecar.config import Settings
from context_ceiling.sidecar.observability.logs import REQUEST_LOGGER
from context_ceiling.sidecar.state import SidecarState
from testkit.doubles.answer_provider import AnswerProviderDouble
from testkit.serving import serve
from testkit.traffic.ceiling_docs import doc, entry
from tests.conftest import request_log_line

pytestmark = pytest.mark.e2e  # sockets, processes or served servers

TOKEN = "admin-tok"
WINDOW = 10_000
CEILING = 800
M = 1_000_000


@pytest.fixture
def priced() -> Iterator[tuple[str, SidecarState, AnswerProviderDouble]]:
    d = AnswerProviderDouble()
    with serve(d.app()) as durl:
        settings = Settings(
            upstreams={
                "openai": {"base_url": durl + "/v1"},
                "anthropic": {"base_url": durl},
            },
            models=[
                {
                    "match": "gpt-4o",
                    "window": WINDOW,
                    "max_output_tokens": 1000,
                    "price": {"input": 2.0, "output": 8.0, "cached_input": 0.5},
                },
                {
                    "match": "claude-*",
                    "label": "claude",
                    "window": WINDOW,
                    "max_output_tokens": 1000,
                },
                {
                    "match": "private-*",
                    "label": "private",
                    "window": WINDOW,
                    "max_output_tokens": 1000,
                },
            ],
            workloads=["default", "rag"],
            admin_token=TOKEN,
            enforcement={
                "mode": "observe",
                "default_output_reservation": 100,
                "workloads": {"rag": {"mode": "enforce"}},
            },
        )
        app = create_app(settings)
        with serve(app) as url:
            entries = [
                entry(model=m, workload=w, window=WINDOW, tokens=CEILING)
                for m in ("gpt-4o", "claude", "private")
                for w in ("default", "rag")
            ]
            r = httpx.put(
                url + "/admin/ceilings",
                json=doc(1, *entries),
                headers={"authorization": f"Bearer {TOKEN}"},
            )
            assert r.status_code == 200, r.text
            yield url, app.state.sidecar, d


def cost(state: SidecarState, model: str, workload: str, part: str, cache: str) -> float:
    labels = {"model": model, "workload": workload, "part": part, "cache": cache}
    return (
        state.metrics.registry.get_sample_value("llm_context_input_cost_usd_total", labels) or 0.0
    )


def test_input_is_priced_within_and_above_the_ceiling_cached_first(
    priced: tuple[str, SidecarState, AnswerProviderDouble], caplog: pytest.LogCaptureFixture
) -> None:
    url, state, d = priced
    d.prompt_tokens, d.cached_tokens = 1000, 900  # the first 900 tokens from the prompt cache
    c = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
    with caplog.at_level(logging.INFO, logger=REQUEST_LOGGER):
        raw = c.chat.completions.with_raw_response.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}]
        )
        line = request_log_line(caplog, raw.headers["x-ceiling-request-id"])
    # 800 within the ceiling, all cached; 100 above it cached, 100 above it not
    assert cost(state, "gpt-4o", "default", "within", "cached") == pytest.approx(800 * 0.5 / M)
    assert cost(state, "gpt-4o", "default", "within", "uncached") == 0
    assert cost(state, "gpt-4o", "default", "above", "cached") == pytest.approx(100 * 0.5 / M)
    assert cost(state, "gpt-4o", "default", "above", "uncached") == pytest.approx(100 * 2.0 / M)
    assert line["input_cost_usd"] == pytest.approx((900 * 0.5 + 100 * 2.0) / M)
    assert line["input_cost_above_ceiling_usd"] == pytest.approx((100 * 0.5 + 100 * 2.0) / M)
    assert line["trim_savings_usd"] is None


def test_the_list_price_comes_from_genai_prices(
    priced: tuple[str, SidecarState, AnswerProviderDouble],
) -> None:
    url, state, d = priced
    d.prompt_tokens, d.cached_tokens = 1000, 0
    a = anthropic.Anthropic(base_url=url, api_key="k", max_retries=0)
    a.messages.create(
        model="claude-sonnet-4-5", max_tokens=50, messages=[{"role": "user", "content": "hi"}]
    )
    price = lookup("claude-sonnet-4-5", "anthropic")
    assert price is not None and price.input > 0
    assert cost(state, "claude", "default", "within", "uncached") == pytest.approx(
        800 * price.input / M
    )
    assert cost(state, "claude", "default", "above", "uncached") == pytest.approx(
        200 * price.input / M
    )


def test_a_model_without_a_price_is_not_priced(
    priced: tuple[str, SidecarState, AnswerProviderDouble], caplog: pytest.LogCaptureFixture
) -> None:
    url, state, _ = priced
    c = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
    with caplog.at_level(logging.INFO, logger=REQUEST_LOGGER):
        raw = c.chat.completions.with_raw_response.create(
            model="private-llm-7b", messages=[{"role": "user", "content": "hi"}]
        )
        line = request_log_line(caplog, raw.headers["x-ceiling-request-id"])
    assert line["input_cost_usd"] is None
    assert all(
        cost(state, "private", "default", part, cache) == 0
        for part in ("within", "above")
        for cache in ("cached", "uncached")
    )


def _rag(n: int) -> list[dict[str, Any]]:
    docs = "\n".join(
        f'<document id="{i}">'
        + f"Clause {i}: the renewal fee of contract K-{i} is {100 + i} EUR. " * 6
        + "</document>"
        for i in range(n)
    )
    return [{"role": "user", "content": docs + "\nWhat is the renewal fee of contract K-3?"}]


@pytest.mark.parametrize(("workload", "action"), [("default", "would_trim"), ("rag", "trimmed")])
def test_what_trimming_saved_or_would_have_saved(
    priced: tuple[str, SidecarState, AnswerProviderDouble], workload: str, action: str
) -> None:
    url, state, d = priced
    d.prompt_tokens, d.cached_tokens = 700, 0
    c = openai.OpenAI(
        base_url=url + "/v1",
        api_key="k",
        max_retries=0,
        default_headers={"x-ceiling-workload": workload},
    )
    c.chat.completions.create(model="gpt-4o", messages=_rag(40), max_tokens=50)  # type: ignore[arg-type]
    reg = state.metrics.registry
    family = (
        "llm_context_trimmed_tokens_total"
        if action == "trimmed"
        else "llm_context_would_trim_tokens_total"
    )
    removed = sum(
        s.value
        for m in reg.collect()
        for s in m.samples
        if s.name == family and s.labels["workload"] == workload
    )
    assert removed > 0
    saved = reg.get_sample_value(
        "llm_context_trim_savings_usd_total",
        {"model": "gpt-4o", "workload": workload, "action": action},
    )
    assert saved == pytest.approx(removed * 2.0 / M)
