"""Anthropic's context management as currently documented, against the hosted-provider double
that implements it: the on-demand ``compaction`` parameter shares no request with
``context_management`` (the native strategy leaves such a request alone); a threshold
compaction's summary step is billed in ``usage.iterations`` only (read into billed usage, and
no estimate error drawn from a compacted count); ``clear_thinking_20251015`` must come first
among the edits."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from context_ceiling.sidecar.observability.logs import REQUEST_LOGGER
from testkit.doubles.hosted_provider import COMPACTED_INPUT, COMPACTION_OUTPUT
from testkit.traffic.ceiling_docs import doc, entry
from tests.conftest import MODELS, Running

IN_PROCESS = True

HEADERS = {"anthropic-version": "2023-06-01", "x-api-key": "sk-ant-test"}
MSG = [{"role": "user", "content": "Summarise the incident log."}]


@pytest.fixture
def native(tmp_path: Path, make_sidecar: Callable[..., Running]) -> Running:
    ceilings = tmp_path / "ceilings.yaml"
    ceilings.write_text(
        yaml.safe_dump(doc(1, entry(model="claude", tokens=60_000, window=200_000)))
    )
    return make_sidecar(
        models=MODELS,
        ceilings_file=str(ceilings),
        enforcement={"mode": "enforce", "strategy": "native"},
    )


def _sent(sc: Running) -> dict[str, Any]:
    body: dict[str, Any] = orjson.loads(sc.double.received[-1].body)
    return body


def test_the_native_strategy_adds_context_editing(native: Running) -> None:
    r = native.http.post(
        "/v1/messages",
        json={"model": "claude-sonnet-4", "max_tokens": 50, "messages": MSG},
        headers=HEADERS,
    )
    assert r.status_code == 200
    [edit] = _sent(native)["context_management"]["edits"]
    assert edit["type"] == "clear_tool_uses_20250919"


def test_an_on_demand_compaction_request_is_left_alone(native: Running) -> None:
    """``compaction: {type: summarize}`` cannot share a request with ``context_management``:
    adding it would turn a valid request into a 400."""
    body = {
        "model": "claude-sonnet-4",
        "max_tokens": 50,
        "messages": MSG,
        "compaction": {"type": "summarize"},
    }
    r = native.http.post("/v1/messages", json=body, headers=HEADERS)
    assert r.status_code == 200, r.text
    assert "context_management" not in _sent(native)
    # the double refuses the combination, as the API does
    both = {**body, "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}}
    refused = native.http.post("/v1/messages", json=both, headers=HEADERS)
    assert refused.status_code == 400
    assert refused.json()["error"]["type"] == "invalid_request_error"


def test_clear_thinking_must_come_first(native: Running) -> None:
    """The client's own edits are passed as they are: in the documented order they work; out
    of order the provider's 400 comes back in Anthropic's shape."""
    thinking = {"type": "clear_thinking_20251015", "keep": "all"}
    tools = {"type": "clear_tool_uses_20250919"}
    base = {"model": "claude-sonnet-4", "max_tokens": 50, "messages": MSG}
    ok = {**base, "context_management": {"edits": [thinking, tools]}}
    assert native.http.post("/v1/messages", json=ok, headers=HEADERS).status_code == 200
    assert _sent(native)["context_management"] == ok["context_management"]
    wrong = {**base, "context_management": {"edits": [tools, thinking]}}
    r = native.http.post("/v1/messages", json=wrong, headers=HEADERS)
    assert r.status_code == 400 and "must be the first edit" in r.json()["error"]["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_threshold_compaction_is_billed_from_its_iterations(
    native: Running, stream: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=REQUEST_LOGGER)
    sc = native
    sc.double.prompt_tokens = 180_000  # over the client's trigger: the provider compacts
    body = {
        "model": "claude-sonnet-4",
        "max_tokens": 50,
        "messages": MSG,
        "stream": stream,
        "context_management": {
            "edits": [
                {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 150_000}}
            ]
        },
    }
    r = sc.http.post(
        "/v1/messages",
        json=body,
        headers={**HEADERS, "anthropic-beta": "compact-2026-01-12"},
    )
    assert r.status_code == 200
    reg = sc.state.metrics.registry
    labels = {
        "gen_ai_operation_name": "chat",
        "gen_ai_provider_name": "anthropic",
        "gen_ai_request_model": "claude-sonnet-4",
        "server_address": "upstream.test",
        "server_port": "80",
        "model": "claude",
    }
    # billed: the answer's own usage and the summary step's, which the top level leaves out
    assert reg.get_sample_value(
        "gen_ai_client_token_usage_sum", {**labels, "gen_ai_token_type": "input"}
    ) == (COMPACTED_INPUT + 180_000)
    assert reg.get_sample_value(
        "gen_ai_client_token_usage_sum", {**labels, "gen_ai_token_type": "output"}
    ) == (7 + COMPACTION_OUTPUT)
    # the provider counted a compacted context: no estimate error is drawn from it
    assert not reg.get_sample_value(
        "llm_context_token_estimate_error_ratio_count", {"model": "claude"}
    )
    assert (
        reg.get_sample_value(
            "llm_context_native_edits_total", {"model": "claude", "workload": "default"}
        )
        == 1
    )
    line = next(
        rec for rec in caplog.records if getattr(rec, "fields", {}).get("model_label") == "claude"
    )
    fields = line.fields  # type: ignore[attr-defined]
    assert fields["compactions"] == 1 and fields["compaction_input_tokens"] == 180_000
    assert fields["input_tokens_reported"] == COMPACTED_INPUT
