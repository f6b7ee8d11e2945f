"""Stale-ceiling detection fires for each reason when traffic drifts and clears when it returns."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

import pytest

from context_ceiling.ceilings.document import traffic_shape as shape
from context_ceiling.core.counting import DEFAULT_CHUNK_PATTERN
from context_ceiling.core.tokenizers import TiktokenCounter
from context_ceiling.formats.openai_chat import count as count_openai
from testkit.traffic.ceiling_docs import doc, entry
from tests.conftest import Running

#: this module's sidecars run in process (see tests/conftest.py), but for tests marked e2e
IN_PROCESS = True


TOKEN = "tok"
AUTH = {"authorization": f"Bearer {TOKEN}"}
CLAUSE = "Contract {i} renews yearly; fee 120 EUR; notice 90 days. "


def body(
    system_words: int = 30, chunks: int = 2, chunk_repeat: int = 5, tools: int = 0
) -> dict[str, Any]:
    docs = "\n".join(
        f"<document id='{i}'>" + CLAUSE.format(i=i) * chunk_repeat + "</document>"
        for i in range(chunks)
    )
    b: dict[str, Any] = {
        "model": "gpt-4o",
        "messages": [
            {"role": "system", "content": " ".join(["policy"] * system_words)},
            {"role": "user", "content": docs + "\nWhich contract is cheapest?"},
        ],
    }
    if tools:
        b["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": f"tool_{i}",
                    "description": "look up a contract " * 20,
                    "parameters": {"type": "object"},
                },
            }
            for i in range(tools)
        ]
    return b


# the fingerprint of the measured traffic, computed the way the sweep computes it
FINGERPRINT = shape(
    count_openai(body(), TiktokenCounter("o200k_base"), chunks=re.compile(DEFAULT_CHUNK_PATTERN))
)


def stale(sc: Running, reason: str) -> float | None:
    return sc.sample("llm_context_ceiling_stale", model="gpt-4o", workload="default", reason=reason)


@pytest.fixture
def sc(make_sidecar: Callable[..., Running]) -> Running:
    s = make_sidecar(
        admin_token=TOKEN, staleness={"tolerance": 0.25, "window": 2, "min_requests": 2}
    )
    r = s.http.put("/admin/ceilings", headers=AUTH, json=doc(1, entry(fingerprint=FINGERPRINT)))
    assert r.status_code == 200
    return s


def send(sc: Running, n: int = 4, headers: dict[str, str] | None = None, **shape: Any) -> None:
    for _ in range(n):
        r = sc.http.post("/v1/chat/completions", json=body(**shape), headers=headers or {})
        assert r.status_code == 200


def test_matching_traffic_is_not_stale(sc: Running) -> None:
    send(sc)
    for reason in (
        "model_version",
        "system_prompt",
        "tool_definitions",
        "retrieved_chunks",
        "retrieved_chunk_size",
        "no_ceiling",
    ):
        assert stale(sc, reason) == 0, reason


@pytest.mark.parametrize(
    ("reason", "drift"),
    [
        ("system_prompt", {"system_words": 400}),
        ("tool_definitions", {"tools": 3}),
        ("retrieved_chunks", {"chunks": 8}),
        ("retrieved_chunk_size", {"chunk_repeat": 20}),
    ],
)
def test_shape_drift_fires_and_clears(
    sc: Running, reason: str, drift: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="context_ceiling.sidecar.observability.staleness")
    send(sc)
    assert stale(sc, reason) == 0
    send(sc, **drift)
    assert stale(sc, reason) == 1
    changes = [r for r in caplog.records if r.getMessage() == "ceiling staleness changed"]
    assert len(changes) == 1  # logged once per change, not per request
    send(sc, n=6)  # traffic returns to the measured shape
    assert stale(sc, reason) == 0
    assert len([r for r in caplog.records if r.getMessage() == "ceiling staleness changed"]) == 2


def test_model_version_change(sc: Running) -> None:
    send(sc, n=1)
    assert stale(sc, "model_version") == 0
    send(sc, n=1, headers={"x-double-model": "gpt-4o-2025-01-31"})
    assert stale(sc, "model_version") == 1
    send(sc, n=1)
    assert stale(sc, "model_version") == 0


def test_no_ceiling_for_traffic(sc: Running) -> None:
    r = sc.http.post(
        "/v1/chat/completions",
        json=body() | {"model": "gpt-4o"},
        headers={"x-ceiling-workload": "rag"},
    )
    assert r.status_code == 200
    # rag has no entry of its own but falls back to the model's default entry
    assert (
        sc.sample("llm_context_ceiling_stale", model="gpt-4o", workload="rag", reason="no_ceiling")
        == 0
    )
    sc.http.post("/v1/chat/completions", json=body() | {"model": "gpt-4o-mini"})
    assert (
        sc.sample(
            "llm_context_ceiling_stale",
            model="gpt-4o-mini",
            workload="default",
            reason="no_ceiling",
        )
        == 1
    )
    r = sc.http.put(
        "/admin/ceilings",
        headers=AUTH,
        json=doc(
            2, entry(fingerprint=FINGERPRINT), entry(model="gpt-4o-mini", fingerprint=FINGERPRINT)
        ),
    )
    assert r.status_code == 200
    assert (
        sc.sample(
            "llm_context_ceiling_stale",
            model="gpt-4o-mini",
            workload="default",
            reason="no_ceiling",
        )
        == 0
    )
