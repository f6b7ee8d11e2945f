"""Chaining with LiteLLM's real proxy (from PyPI, its own venv: ``scripts/litellm.sh``), both
ways: app -> sidecar -> LiteLLM -> provider, and app -> LiteLLM -> sidecar -> provider. Teams keep
their gateway for keys, rate limits and fallbacks and add the sidecar for context. The provider
is the loopback test double for the hosted OpenAI API."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from ceiling.llamacpp import free_port
from sidecar.app import create_app
from sidecar.config import Settings
from tests.hosted_provider_double import HostedProviderDouble, serve

pytestmark = [pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
MSG = [{"role": "user", "content": "What is the answer?"}]
MODELS = [{"match": "gpt-4o", "window": 128000, "max_output_tokens": 16384}]


def litellm_binary() -> Path:
    """Installed once (cached) by the project's own script, as ``make test`` does."""
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "litellm.sh")], capture_output=True, text=True, check=True
    )
    return Path(out.stdout.strip())


@contextlib.contextmanager
def litellm_proxy(api_base: str, workdir: Path) -> Iterator[str]:
    port = free_port()
    cfg = {
        "model_list": [
            {
                "model_name": "gpt-4o",
                "litellm_params": {
                    "model": "openai/gpt-4o",
                    "api_base": api_base,
                    "api_key": "sk-up",
                },
            }
        ],
        "litellm_settings": {"drop_params": True, "telemetry": False},
    }
    (workdir / "litellm.yaml").write_text(yaml.safe_dump(cfg))
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/root"),
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",
        "LITELLM_LOG": "ERROR",
    }
    proc = subprocess.Popen(
        [
            str(litellm_binary()),
            "--config",
            str(workdir / "litellm.yaml"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--num_workers",
            "1",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health/liveliness", timeout=2).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("LiteLLM's proxy did not start")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def ok_count(state: object) -> float:
    v = state.metrics.registry.get_sample_value(  # type: ignore[attr-defined]
        "llm_context_requests_total",
        {"model": "gpt-4o", "workload": "default", "api": "openai_chat", "outcome": "ok"},
    )
    return v or 0.0


def test_app_to_sidecar_to_litellm_to_provider(tmp_path: Path) -> None:
    provider = HostedProviderDouble()
    with serve(provider.app()) as purl, litellm_proxy(purl + "/v1", tmp_path) as lite:
        app = create_app(Settings(upstreams={"openai": {"base_url": lite + "/v1"}}, models=MODELS))
        with serve(app) as url:
            client = openai.OpenAI(base_url=url + "/v1", api_key="sk-litellm-key", max_retries=0)
            r = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=MSG)
            assert r.parse().choices[0].message.content == "The answer is 42."
            assert int(r.headers["x-ceiling-input-tokens"]) > 0
            chunks = client.chat.completions.create(model="gpt-4o", messages=MSG, stream=True)
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            assert text
            assert ok_count(app.state.sidecar) == 2
    assert len(provider.received) >= 2, "the requests went through LiteLLM to the provider"


def test_app_to_litellm_to_sidecar_to_provider(tmp_path: Path) -> None:
    provider = HostedProviderDouble()
    with serve(provider.app()) as purl:
        app = create_app(Settings(upstreams={"openai": {"base_url": purl + "/v1"}}, models=MODELS))
        with serve(app) as url, litellm_proxy(url + "/v1", tmp_path) as lite:
            client = openai.OpenAI(base_url=lite + "/v1", api_key="sk-anything", max_retries=0)
            reply = client.chat.completions.create(model="gpt-4o", messages=MSG)
            assert reply.choices[0].message.content == "The answer is 42."
            chunks = client.chat.completions.create(model="gpt-4o", messages=MSG, stream=True)
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            assert ok_count(app.state.sidecar) == 2, "the sidecar measured both"
    chats = [r for r in provider.received if r.path.endswith("/chat/completions")]
    assert len(chats) == 2  # (LiteLLM also asks for /v1/models, passed through)
