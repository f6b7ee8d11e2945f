"""Token counts against a real model server: llama.cpp serving Qwen2.5-Coder-0.5B (2k window).

The sidecar's exact mode (the engine's own tokenizer) must match the server's reported usage;
a mismatched encoding must show up in the estimate-error metric.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from ceiling.llamacpp import RunningServer, llama_server
from sidecar.app import create_app
from sidecar.config import Settings
from tests.hosted_provider_double import serve

WORDS = [
    "contract",
    "renewal",
    "fee",
    "notice",
    "period",
    "clause",
    "Northwind",
    "2027",
    "EUR",
    "90",
    "days",
    "Kündigung",
    "—",
    "服务",
    "合同",
    "🚀",
    "<tag",
    "attr='x'>value</tag>",
    "def",
    "f(x):",
    "return",
    "x**2\n",
]


@pytest.fixture(scope="module")
def llm() -> Iterator[RunningServer]:
    with llama_server(2048) as server:
        yield server


@pytest.fixture(scope="module")
def sidecar_url(llm: RunningServer) -> Iterator[tuple[str, Any]]:
    settings = Settings(
        upstreams={
            "openai": {"base_url": llm.openai_base_url, "timeouts": {"read": 120, "total": 300}}
        },
        models=[
            {
                "match": "qwen-exact",
                "window": llm.window,
                "max_output_tokens": 64,
                "tokenizer": {"kind": "upstream", "url": llm.url, "style": "llamacpp"},
            },
            {
                "match": "qwen-o200k",
                "window": llm.window,
                "max_output_tokens": 64,
                "tokenizer": {"kind": "tiktoken", "encoding": "o200k_base"},
            },
        ],
    )
    app = create_app(settings)
    with serve(app) as url:
        yield url, app.state.sidecar


def conversation(i: int) -> list[dict[str, str]]:
    text = " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(40 + 90 * i))
    msgs = [
        {"role": "user", "content": text},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": f"Question {i}: which clause?"},
    ]
    return ([{"role": "system", "content": "Answer from the text."}] if i % 2 else []) + msgs


def test_exact_counts_match_the_server_and_mismatch_shows(sidecar_url: tuple[str, Any]) -> None:
    url, state = sidecar_url
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300)
    errors: list[float] = []
    for i in range(5):
        msgs = conversation(i)
        exact = client.chat.completions.with_raw_response.create(
            model="qwen-exact", messages=msgs, max_tokens=1
        )  # type: ignore[arg-type]
        reported = exact.parse().usage
        assert reported is not None
        assert int(exact.headers["x-ceiling-input-tokens"]) == reported.prompt_tokens
        est = client.chat.completions.with_raw_response.create(
            model="qwen-o200k", messages=msgs, max_tokens=1
        )  # type: ignore[arg-type]
        usage = est.parse().usage
        assert usage is not None
        errors.append(
            (int(est.headers["x-ceiling-input-tokens"]) - usage.prompt_tokens) / usage.prompt_tokens
        )
    reg = state.metrics.registry
    assert (
        reg.get_sample_value(
            "llm_context_token_estimate_error_ratio_count", {"model": "qwen-exact"}
        )
        == 5
    )
    # the exact counter's error is 0 on every request: all in the le=0.0 bucket and none below
    assert (
        reg.get_sample_value(
            "llm_context_token_estimate_error_ratio_bucket", {"model": "qwen-exact", "le": "0.0"}
        )
        == 5
    )
    assert (
        reg.get_sample_value(
            "llm_context_token_estimate_error_ratio_bucket", {"model": "qwen-exact", "le": "-0.01"}
        )
        == 0
    )
    # the mismatched encoding is off, and the metric shows it (outside the +-1% band)
    inside = (
        reg.get_sample_value(
            "llm_context_token_estimate_error_ratio_bucket", {"model": "qwen-o200k", "le": "0.01"}
        )
        or 0
    ) - (
        reg.get_sample_value(
            "llm_context_token_estimate_error_ratio_bucket", {"model": "qwen-o200k", "le": "-0.01"}
        )
        or 0
    )
    assert inside < 5
    assert max(abs(e) for e in errors) > 0.01
    print(
        "o200k_base vs Qwen tokenizer, relative error per request:", [round(e, 3) for e in errors]
    )
