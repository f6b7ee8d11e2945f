"""Chaining with LiteLLM's real proxy (from PyPI, its own venv: ``scripts/litellm.sh``), both
ways: app -> sidecar -> LiteLLM -> provider, and app -> LiteLLM -> sidecar -> provider. Teams keep
their gateway for keys, rate limits and fallbacks and add the sidecar for context. The provider
is the loopback test double for the hosted OpenAI API."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from benchmarks import targets
from context_ceiling.sidecar.app import create_app
from context_ceiling.sidecar.config import Settings
from testkit import REPO, wait_for
from testkit.doubles.hosted_provider import HostedProviderDouble
from testkit.serving import serve

pytestmark = [pytest.mark.slow]

MSG: list[Any] = [{"role": "user", "content": "What is the answer?"}]
MODELS = [{"match": "gpt-4o", "window": 128000, "max_output_tokens": 16384}]


@contextlib.contextmanager
def litellm_proxy(up: str, workdir: Path) -> Iterator[str]:
    """LiteLLM's proxy (installed once, cached, by the project's own script, as ``make test``
    does) serving gpt-4o from the OpenAI-style API at ``up``; yields its base URL."""
    subprocess.run(["bash", str(REPO / "scripts" / "litellm.sh")], capture_output=True, check=True)
    target = targets.litellm(up, workdir, models=["gpt-4o"])
    assert target is not None
    try:
        yield target.url.removesuffix("/v1/chat/completions")
    finally:
        target.stop()


def ok_count(state: object) -> float:
    v = state.metrics.registry.get_sample_value(  # type: ignore[attr-defined]
        "llm_context_requests_total",
        {"model": "gpt-4o", "workload": "default", "api": "openai_chat", "outcome": "ok"},
    )
    return v or 0.0


def test_app_to_sidecar_to_litellm_to_provider(tmp_path: Path) -> None:
    provider = HostedProviderDouble()
    with serve(provider.app()) as purl, litellm_proxy(purl, tmp_path) as lite:
        app = create_app(Settings(upstreams={"openai": {"base_url": lite + "/v1"}}, models=MODELS))
        with serve(app) as url:
            client = openai.OpenAI(base_url=url + "/v1", api_key="sk-litellm-key", max_retries=0)
            r = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=MSG)
            assert r.parse().choices[0].message.content == "The answer is 42."
            assert int(r.headers["x-ceiling-input-tokens"]) > 0
            chunks = client.chat.completions.create(model="gpt-4o", messages=MSG, stream=True)
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            assert text
            # the SDK stops reading at [DONE]; the sidecar records the stream as the upstream
            # (here LiteLLM) closes it, a moment later
            assert wait_for(lambda: ok_count(app.state.sidecar) == 2)
    assert len(provider.received) >= 2, "the requests went through LiteLLM to the provider"


def test_app_to_litellm_to_sidecar_to_provider(tmp_path: Path) -> None:
    provider = HostedProviderDouble()
    with serve(provider.app()) as purl:
        app = create_app(Settings(upstreams={"openai": {"base_url": purl + "/v1"}}, models=MODELS))
        with serve(app) as url, litellm_proxy(url, tmp_path) as lite:
            client = openai.OpenAI(base_url=lite + "/v1", api_key="sk-anything", max_retries=0)
            reply = client.chat.completions.create(model="gpt-4o", messages=MSG)
            assert reply.choices[0].message.content == "The answer is 42."
            chunks = client.chat.completions.create(model="gpt-4o", messages=MSG, stream=True)
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            assert wait_for(lambda: ok_count(app.state.sidecar) == 2), "the sidecar measured both"
    chats = [r for r in provider.received if r.path.endswith("/chat/completions")]
    assert len(chats) == 2  # (LiteLLM also asks for /v1/models, passed through)
