"""Drop-in for every route: pass-through routed by the model the body names (or the upstream a
header names), bodies re-sent with the client's framing, Azure's v1 and Responses paths measured
and enforced, several Azure resources routed by deployment, and a re-pushed ceilings file that
is a no-op. The upstreams are loopback test doubles standing in for hosted APIs and a local
vLLM."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from context_ceiling.sidecar.app import create_app
from context_ceiling.sidecar.config import Settings
from testkit.cli import ceiling
from testkit.serving import serve
from testkit.traffic.ceiling_docs import doc, entry

pytestmark = pytest.mark.e2e  # sockets, processes or served servers


class RecordingUpstreamDouble:
    """A test double for any OpenAI-style or Azure upstream: answers every path with a valid
    body for its route and records method, path, query, headers and body."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.got: list[dict[str, Any]] = []

    async def any(self, request: Request) -> JSONResponse:
        body = await request.body()
        self.got.append(
            {
                "method": request.method,
                "path": request.url.path,
                "query": dict(request.query_params),
                "headers": dict(request.headers),
                "body": json.loads(body) if body else None,
            }
        )
        path = request.url.path
        if path.endswith("/models"):
            return JSONResponse(
                {
                    "object": "list",
                    "data": [
                        {"id": f"{self.name}-model", "object": "model", "owned_by": self.name},
                        {"id": "shared-model", "object": "model", "owned_by": self.name},
                    ],
                }
            )
        if path.endswith("/responses"):
            return JSONResponse(
                {
                    "id": "resp_1",
                    "object": "response",
                    "created_at": 1,
                    "status": "completed",
                    "model": "gpt-4o",
                    "output": [],
                    "usage": {"input_tokens": 5, "output_tokens": 1, "total_tokens": 6},
                }
            )
        if path.endswith("/chat/completions"):
            return JSONResponse(
                {
                    "id": "c",
                    "object": "chat.completion",
                    "created": 1,
                    "model": "gpt-4o",
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": "ok"},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
                }
            )
        return JSONResponse(
            {
                "object": "list",
                "data": [{"object": "embedding", "index": 0, "embedding": [0.1]}],
                "model": "m",
                "usage": {"prompt_tokens": 1, "total_tokens": 1},
                "upstream": self.name,
            }
        )

    def app(self) -> Starlette:
        return Starlette(
            routes=[Route("/{path:path}", self.any, methods=["GET", "POST", "DELETE"])]
        )


def test_pass_through_goes_to_the_upstream_of_the_model_it_names() -> None:
    hosted, vllm = RecordingUpstreamDouble("hosted"), RecordingUpstreamDouble("vllm")
    with serve(hosted.app()) as h, serve(vllm.app()) as v:
        settings = Settings(
            upstreams={
                "openai": {"base_url": h + "/v1"},
                "named": {"vllm": {"api": "openai", "base_url": v + "/v1"}},
            },
            models=[
                {"match": "gpt-4o", "window": 128000},
                {"match": "my-llama", "window": 32768, "upstream": "vllm"},
            ],
        )
        with serve(create_app(settings)) as url:
            client = openai.OpenAI(base_url=url + "/v1", api_key="sk-local", max_retries=0)
            client.embeddings.create(model="my-llama", input="hello")
            client.completions.create(model="my-llama", prompt="hi", max_tokens=1)
            client.embeddings.create(model="text-embedding-3-small", input="hello")
            # files and batches name no model: a header names the upstream
            httpx.get(url + "/v1/files", headers={"x-ceiling-upstream": "vllm"}).raise_for_status()
            missing = httpx.get(url + "/v1/files", headers={"x-ceiling-upstream": "nowhere"})
    assert [g["path"] for g in vllm.got] == ["/v1/embeddings", "/v1/completions", "/v1/files"]
    assert [g["path"] for g in hosted.got] == ["/v1/embeddings"]
    assert vllm.got[0]["headers"]["authorization"] == "Bearer sk-local"
    assert "x-ceiling-upstream" not in vllm.got[2]["headers"]
    assert missing.status_code == 404 and "error" in missing.json()


def test_pass_through_keeps_the_clients_framing() -> None:
    up = RecordingUpstreamDouble("up")
    with serve(up.app()) as u:
        settings = Settings(upstreams={"openai": {"base_url": u + "/v1"}})
        with serve(create_app(settings)) as url:
            big = {"model": "x", "input": "y" * (2 << 20)}  # too big to peek at: streamed
            for body in ({"model": "x", "input": "hello"}, big):
                raw = json.dumps(body).encode()
                httpx.post(
                    url + "/v1/embeddings",
                    content=raw,
                    headers={"content-type": "application/json"},
                    timeout=30,
                ).raise_for_status()
    for g, body in zip(up.got, ({"model": "x", "input": "hello"}, big), strict=True):
        assert g["headers"].get("content-length") == str(len(json.dumps(body).encode()))
        assert "transfer-encoding" not in g["headers"]


def _azure(tmp_path: Path, eu: str, us: str) -> Settings:
    ceilings = tmp_path / "c.yaml"
    ceilings.write_text(yaml.safe_dump(doc(1, entry(model="gpt-4o", tokens=2000, window=128000))))
    return Settings(
        upstreams={
            "named": {
                "azure-eu": {"api": "openai", "azure": True, "base_url": eu},
                "azure-us": {"api": "openai", "azure": True, "base_url": us},
            }
        },
        models=[
            {"match": "gpt-4o", "window": 128000, "upstream": "azure-eu"},
            {"match": "gpt-4o-us", "label": "gpt-4o-us", "window": 128000, "upstream": "azure-us"},
        ],
        ceilings_file=ceilings,
        enforcement={"mode": "enforce"},
    )


def test_azure_v1_and_responses_are_measured_and_enforced(tmp_path: Path) -> None:
    eu, us = RecordingUpstreamDouble("eu"), RecordingUpstreamDouble("us")
    long = "<document>" + "fact " * 3000 + "</document><document>short</document> question?"
    with serve(eu.app()) as e, serve(us.app()) as u:
        app = create_app(_azure(tmp_path, e, u))
        with serve(app) as url:
            v1 = openai.OpenAI(base_url=url + "/openai/v1", api_key="az", max_retries=0)
            r = v1.chat.completions.with_raw_response.create(
                model="gpt-4o", messages=[{"role": "user", "content": long}]
            )
            assert int(r.headers["x-ceiling-input-tokens"]) <= 2000
            v1.responses.create(model="gpt-4o", input=long)
            az = openai.AzureOpenAI(
                azure_endpoint=url, api_key="az", api_version="2025-04-01-preview", max_retries=0
            )
            az.responses.create(model="gpt-4o", input="hi")
            az.chat.completions.create(
                model="gpt-4o-us", messages=[{"role": "user", "content": "hi"}]
            )
            reg = app.state.sidecar.metrics.registry
    paths = [g["path"] for g in eu.got]
    assert paths == ["/openai/v1/chat/completions", "/openai/v1/responses", "/openai/responses"]
    assert eu.got[2]["query"] == {"api-version": "2025-04-01-preview"}
    assert "fact fact" not in json.dumps(eu.got[0]["body"])  # trimmed to the ceiling
    assert "fact fact" not in json.dumps(eu.got[1]["body"])
    assert [g["path"] for g in us.got] == ["/openai/deployments/gpt-4o-us/chat/completions"]
    for api in ("azure_chat", "azure_responses"):
        assert reg.get_sample_value(
            "llm_context_requests_total",
            {"model": "gpt-4o", "workload": "default", "api": api, "outcome": "ok"},
        )


def test_non_chat_azure_paths_go_to_the_deployments_resource(tmp_path: Path) -> None:
    eu, us = RecordingUpstreamDouble("eu"), RecordingUpstreamDouble("us")
    with (
        serve(eu.app()) as e,
        serve(us.app()) as u,
        serve(create_app(_azure(tmp_path, e, u))) as url,
    ):
        az = openai.AzureOpenAI(
            azure_endpoint=url, api_key="az", api_version="2024-10-21", max_retries=0
        )
        az.embeddings.create(model="gpt-4o-us", input="x")
        az.embeddings.create(model="gpt-4o", input="x")
    assert [g["path"] for g in us.got] == ["/openai/deployments/gpt-4o-us/embeddings"]
    assert [g["path"] for g in eu.got] == ["/openai/deployments/gpt-4o/embeddings"]


def test_re_pushing_a_file_without_created_at_is_unchanged(tmp_path: Path) -> None:
    e = entry()
    e.pop("created_at")
    src = tmp_path / "ceilings.yaml"
    src.write_text(yaml.safe_dump(doc(5, e)))
    target = tmp_path / "live.yaml"

    def push(*extra: str) -> subprocess.CompletedProcess[str]:
        return ceiling("push", str(src), "--file", str(target), *extra)

    assert push().returncode == 0
    again = push()
    assert again.returncode == 0 and "unchanged (version 5)" in again.stdout
    dry = push("--dry-run")
    assert (
        dry.returncode == 0
        and "unchanged" in dry.stdout
        and "changed" not in dry.stdout.replace("unchanged", "")
    )


def test_re_pushing_to_a_running_sidecar_is_unchanged(tmp_path: Path) -> None:
    e = entry()
    e.pop("created_at")
    src = tmp_path / "ceilings.yaml"
    src.write_text(yaml.safe_dump(doc(5, e)))
    live = tmp_path / "live.yaml"
    live.write_text(src.read_text())
    settings = Settings(
        upstreams={"openai": {"base_url": "http://127.0.0.1:9/v1"}},
        models=[{"match": "gpt-4o", "window": 128000}],
        ceilings_file=live,
        admin_token="t0ken",
    )
    with serve(create_app(settings)) as url:
        r = ceiling("push", str(src), "--to", url, token="t0ken")
    assert r.returncode == 0, r.stderr
    assert "unchanged (version 5)" in r.stdout


def test_request_builders_ask_for_their_budget(tmp_path: Path) -> None:
    """``GET /budget`` is read-only with its own token (never the admin one); the in-process
    budget fits ranked chunks, history and a tool result with the sidecar's own counter."""
    from context_ceiling import Budget, count

    ceilings = tmp_path / "c.yaml"
    ceilings.write_text(yaml.safe_dump(doc(7, entry(model="gpt-4o", workload="rag", tokens=3000))))
    settings = Settings(
        upstreams={"openai": {"base_url": "http://127.0.0.1:9/v1"}},
        models=[{"match": "gpt-4o", "window": 128000}],
        workloads=["rag"],
        ceilings_file=ceilings,
        admin_token="admin-secret",
        budget_token="read-only",
    )
    with serve(create_app(settings)) as url:
        assert httpx.get(url + "/budget", params={"model": "gpt-4o"}).status_code == 401
        admin = httpx.get(
            url + "/budget",
            params={"model": "gpt-4o"},
            headers={"authorization": "Bearer admin-secret"},
        )
        assert admin.status_code == 401  # the admin token is not the read token
        auth = {"authorization": "Bearer read-only"}
        got = httpx.get(
            url + "/budget",
            params={"model": "gpt-4o", "workload": "rag", "reservation": 500},
            headers=auth,
        ).json()
        assert got["input_budget"] == 3000 and got["ceiling_tokens"] == 3000
        assert (
            got["provenance"]["ceilings_version"] == 7
            and got["tokenizer"]["encoding"] == "o200k_base"
        )
        other = httpx.get(url + "/budget", params={"model": "gpt-4o"}, headers=auth).json()
        assert other["ceiling_tokens"] is None and other["input_budget"] == 128000 - 4096
        assert httpx.get(url + "/budget", params={"model": "nope"}, headers=auth).status_code == 404
        bad = httpx.get(
            url + "/budget", params={"model": "gpt-4o", "reservation": "x"}, headers=auth
        )
        assert bad.status_code == 400 and bad.json()["error"]["message"]
        budget = Budget.from_sidecar(url, "gpt-4o", "rag", 500, token="read-only")
    assert budget.tokens == 3000
    chunks = [f"<document>fact {k} " + "word " * 300 + "</document>" for k in range(20)]
    fixed = budget.count("Answer from the documents. What is fact 3?")
    n = budget.chunks_that_fit(chunks, used=fixed)
    body = {
        "model": "gpt-4o",
        "messages": [{"role": "user", "content": "".join(chunks[:n]) + "What is fact 3?"}],
    }
    assert 0 < n < 20 and count(body, shape="openai").total <= 3000
    over = {**body, "messages": [{"role": "user", "content": "".join(chunks[: n + 2])}]}
    assert count(over, shape="openai").total > 3000
    history = [
        {"role": "user", "content": "word " * 200},
        {"role": "assistant", "content": "ok " * 200},
    ] * 20
    start = budget.history_that_fits(history, used=fixed)
    kept = {"model": "gpt-4o", "messages": history[start:]}
    assert 0 < start < len(history) and count(kept, shape="openai").total <= 3000
    fitted = budget.fit_text("line of output " * 2000, used=fixed)
    assert budget.count(fitted) <= 3000 - fixed and "tokens removed by context-ceiling" in fitted


def test_push_with_a_config_refuses_what_the_pods_would(tmp_path: Path) -> None:
    cfg = tmp_path / "sidecar.yaml"
    cfg.write_text(
        "upstreams: {openai: {base_url: 'http://x/v1'}}\n"
        "models: [{match: 'gpt-4o*', label: gpt-4o, window: 128000}]\n"
    )
    src = tmp_path / "ceilings.yaml"
    src.write_text(yaml.safe_dump(doc(3, entry(tokens=30000, window=64000))))
    target = tmp_path / "live.yaml"
    r = ceiling("push", str(src), "--file", str(target), "--config", str(cfg))
    assert r.returncode == 2 and "window 64000 differs from the registry's 128000" in r.stderr
    assert not target.exists()  # nothing half-applied


def test_models_are_merged_across_upstreams_and_status_says_degraded() -> None:
    hosted, vllm = RecordingUpstreamDouble("hosted"), RecordingUpstreamDouble("vllm")
    with serve(hosted.app()) as h, serve(vllm.app()) as v:
        settings = Settings(
            upstreams={
                "openai": {"base_url": h + "/v1"},
                "named": {
                    "vllm": {"api": "openai", "base_url": v + "/v1"},
                    "gone": {"api": "openai", "base_url": "http://127.0.0.1:9/v1"},
                },
            },
        )
        with serve(create_app(settings)) as url:
            models = openai.OpenAI(base_url=url + "/v1", api_key="sk", max_retries=0).models.list()
            status = httpx.get(url + "/status").json()
    ids = [m.id for m in models.data]
    assert ids == ["hosted-model", "shared-model", "vllm-model"]  # merged, once each
    assert status["status"] == "degraded" and status["upstreams"]["gone"].startswith("unreachable")


def test_genai_metrics_follow_the_semantic_conventions(tmp_path: Path) -> None:
    """Provider names as the conventions define them (Azure: azure.ai.openai), the request's
    own model name (bounded), the upstream's host, and time to first token / per output token
    for streams."""
    from testkit.doubles.hosted_provider import HostedProviderDouble

    hosted = HostedProviderDouble()
    eu, us = RecordingUpstreamDouble("eu"), RecordingUpstreamDouble("us")
    with serve(hosted.app()) as h, serve(eu.app()) as e, serve(us.app()) as u:
        settings = _azure(tmp_path, e, u)
        settings.upstreams.openai = type(settings.upstreams.named["azure-eu"])(  # type: ignore[attr-defined]
            api="openai", base_url=h + "/v1"
        )
        settings.models.append(
            type(settings.models[0])(match="gpt-4o-mini*", label="mini", window=128000)
        )
        app = create_app(settings)
        with serve(app) as url:
            client = openai.OpenAI(base_url=url + "/v1", api_key="sk", max_retries=0)
            stream = client.chat.completions.create(
                model="gpt-4o-mini-2024-07-18",
                messages=[{"role": "user", "content": "hi"}],
                stream=True,
                stream_options={"include_usage": True},
            )
            list(stream)
            az = openai.OpenAI(base_url=url + "/openai/v1", api_key="az", max_retries=0)
            az.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
            reg = app.state.sidecar.metrics.registry
    mini = {
        "gen_ai_operation_name": "chat",
        "gen_ai_provider_name": "openai",
        "gen_ai_request_model": "gpt-4o-mini-2024-07-18",  # the name asked for, not the label
        "server_address": "127.0.0.1",
        "server_port": h.rsplit(":", 1)[1],  # required with server.address
        "model": "mini",
    }
    assert reg.get_sample_value("gen_ai_server_time_to_first_token_seconds_count", mini) == 1
    assert reg.get_sample_value("gen_ai_server_time_per_output_token_seconds_count", mini) == 1
    assert reg.get_sample_value("gen_ai_client_operation_duration_seconds_count", mini) == 1
    azure = {
        **mini,
        "gen_ai_provider_name": "azure.ai.openai",
        "gen_ai_request_model": "gpt-4o",
        "server_port": e.rsplit(":", 1)[1],  # the Azure resource's
        "model": "gpt-4o",
    }
    assert reg.get_sample_value("gen_ai_client_operation_duration_seconds_count", azure) == 1


def test_compressed_answers_are_relayed_compressed() -> None:
    """A client that accepts gzip gets the upstream's gzip bytes (measured routes inflate a
    copy to read the usage; the pass-through never reads them); a stream is asked for plain."""
    import gzip

    from starlette.responses import Response as Raw

    seen: list[str | None] = []
    usage = {"prompt_tokens": 11, "completion_tokens": 2, "total_tokens": 13}
    chat = {
        "id": "c",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-4o",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        ],
        "usage": usage,
    }

    async def answer(request: Request) -> Raw:
        seen.append(request.headers.get("accept-encoding"))
        body = json.dumps(
            chat if request.url.path.endswith("completions") else {"data": [1] * 500}
        ).encode()
        if "gzip" in (request.headers.get("accept-encoding") or ""):
            return Raw(
                gzip.compress(body),
                media_type="application/json",
                headers={"content-encoding": "gzip"},
            )
        return Raw(body, media_type="application/json")

    up = Starlette(routes=[Route("/{path:path}", answer, methods=["POST"])])
    with serve(up) as u:
        settings = Settings(
            upstreams={"openai": {"base_url": u + "/v1"}},
            models=[{"match": "gpt-4o", "window": 128000}],
        )
        app = create_app(settings)
        with serve(app) as url, httpx.Client() as client:
            req = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
            raw = client.post(
                url + "/v1/chat/completions", json=req, headers={"accept-encoding": "gzip"}
            )
            emb = client.post(
                url + "/v1/embeddings",
                json={"model": "x", "input": "y"},
                headers={"accept-encoding": "gzip"},
            )
            plain = client.post(
                url + "/v1/chat/completions", json=req, headers={"accept-encoding": "identity"}
            )
            reg = app.state.sidecar.metrics.registry
    assert (
        raw.headers["content-encoding"] == "gzip" and raw.json()["usage"] == usage
    )  # httpx inflates
    assert emb.headers["content-encoding"] == "gzip" and len(emb.json()["data"]) == 500
    assert "content-encoding" not in plain.headers and plain.json()["usage"] == usage
    assert seen == ["gzip", "gzip", None]
    assert (
        reg.get_sample_value(
            "llm_context_output_tokens_sum", {"model": "gpt-4o", "workload": "default"}
        )
        == 4
    )  # the usage of both chat answers was read, the compressed one's too


def test_a_gemini_only_or_azure_only_sidecar_starts(tmp_path: Path) -> None:
    from context_ceiling.sidecar.config import load_settings

    for upstreams in (
        "{gemini: {base_url: 'https://generativelanguage.googleapis.com'}}",
        "{named: {eu: {api: openai, azure: true, base_url: 'https://x.openai.azure.com'}}}",
    ):
        cfg = tmp_path / "sidecar.yaml"
        cfg.write_text(f"upstreams: {upstreams}\n")
        r = ceiling("serve", "-c", str(cfg), "--check")
        assert r.returncode == 0, r.stderr
        load_settings(cfg)
