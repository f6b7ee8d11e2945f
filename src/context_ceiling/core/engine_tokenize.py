"""Exact prompt token counts from the serving engine itself.

llama.cpp renders the chat template with ``POST /apply-template`` and counts with
``POST /tokenize``; vLLM takes the messages directly on ``POST /tokenize``. Used by the sidecar
for models configured with an ``upstream`` tokenizer and by the sweep to fill levels exactly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from context_ceiling.core.errors import CeilingError
from context_ceiling.core.models import UpstreamSpec


class EngineCountError(CeilingError, RuntimeError):
    """The engine did not answer a tokenize call usefully."""


async def count_text(client: httpx.AsyncClient, spec: UpstreamSpec, text: str) -> int:
    """Tokens of raw text (special-token text parsed as special, as the template produces it)."""
    base = spec.url.rstrip("/")
    if spec.style == "vllm":
        resp = await client.post(
            f"{base}/tokenize", json={"prompt": text, "add_special_tokens": False}
        )
    else:
        resp = await client.post(
            f"{base}/tokenize", json={"content": text, "add_special": False, "parse_special": True}
        )
    if resp.status_code != 200:
        raise EngineCountError(f"{base}/tokenize answered HTTP {resp.status_code}")
    data = resp.json()
    if "count" in data:
        return int(data["count"])
    return len(data["tokens"])


async def count_chat(
    client: httpx.AsyncClient,
    spec: UpstreamSpec,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Any] | None = None,
    model: str | None = None,
) -> int:
    """Tokens of the full prompt the engine will build from OpenAI-shaped ``messages``."""
    base = spec.url.rstrip("/")
    payload: dict[str, Any] = {"messages": list(messages)}
    if tools:
        payload["tools"] = list(tools)
    try:
        if spec.style == "vllm":
            payload |= {"model": model, "add_generation_prompt": True}
            resp = await client.post(f"{base}/tokenize", json=payload, timeout=spec.timeout_s)
            if resp.status_code != 200:
                raise EngineCountError(f"{base}/tokenize answered HTTP {resp.status_code}")
            return int(resp.json()["count"])
        resp = await client.post(f"{base}/apply-template", json=payload, timeout=spec.timeout_s)
        if resp.status_code != 200:
            raise EngineCountError(f"{base}/apply-template answered HTTP {resp.status_code}")
        return await count_text(client, spec, str(resp.json()["prompt"]))
    except (httpx.HTTPError, KeyError, ValueError) as exc:
        raise EngineCountError(f"{base}: tokenize failed: {type(exc).__name__}") from exc


class SyncEngine:
    """The same counts, blocking: for the sweep's context builder, which fills levels by count."""

    def __init__(self, spec: UpstreamSpec) -> None:
        self.spec = spec
        self.base = spec.url.rstrip("/")
        self._client = httpx.Client(timeout=spec.timeout_s, trust_env=False)
        self.name = f"upstream:{spec.style}"

    def _post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        try:
            resp = self._client.post(self.base + path, json=payload)
        except httpx.HTTPError as exc:
            raise EngineCountError(f"{self.base}{path}: {type(exc).__name__}") from exc
        if resp.status_code != 200:
            raise EngineCountError(f"{self.base}{path} answered HTTP {resp.status_code}")
        data: dict[str, Any] = resp.json()
        return data

    def count(self, text: str) -> int:
        if not text:
            return 0
        if self.spec.style == "vllm":
            return int(
                self._post("/tokenize", {"prompt": text, "add_special_tokens": False})["count"]
            )
        return len(
            self._post("/tokenize", {"content": text, "add_special": False, "parse_special": True})[
                "tokens"
            ]
        )

    def count_chat(self, messages: Sequence[Mapping[str, Any]], model: str | None = None) -> int:
        if self.spec.style == "vllm":
            payload = {"model": model, "messages": list(messages), "add_generation_prompt": True}
            return int(self._post("/tokenize", payload)["count"])
        prompt = self._post("/apply-template", {"messages": list(messages)})["prompt"]
        return self.count(str(prompt))

    def close(self) -> None:
        self._client.close()
