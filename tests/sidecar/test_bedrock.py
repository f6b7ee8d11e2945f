"""AWS Bedrock end to end: boto3's ``bedrock-runtime`` client -> the sidecar -> a loopback
Bedrock double that checks every request's SigV4 signature as AWS does.

The client signs with keys the double does not know; only the sidecar's own credentials (read
from the standard AWS chain: the environment here) are the double's. So a call that succeeds
through the sidecar was signed again by it, over the body it sent."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import botocore.exceptions
import httpx
import httpx2
import pytest

from context_ceiling.formats import bedrock
from context_ceiling.sidecar.app import create_app
from context_ceiling.sidecar.config import Settings
from testkit.doubles.bedrock_provider import BedrockProviderDouble
from testkit.serving import serve
from testkit.traffic.ceiling_docs import doc, entry
from tests.conftest import Running


@dataclass
class Bedrock(Running):
    """A sidecar in front of the Bedrock double."""

    double: BedrockProviderDouble  # type: ignore[assignment]


TOKEN = "admin-tok"
CLAUDE = "anthropic.claude-3-5-haiku-20241022-v1:0"
PROFILE = (
    "arn:aws:bedrock:us-east-1:123456789012:inference-profile/"
    "us.anthropic.claude-3-5-haiku-20241022-v1:0"
)
MODELS = [
    {
        "match": "*anthropic.claude*",
        "label": "claude",
        "window": 200000,
        "max_output_tokens": 8192,
        "tokenizer": {"kind": "calibrated", "encoding": "cl100k_base", "factor": 1.1},
    },
    {"match": "*small-claude*", "label": "small", "window": 3000, "max_output_tokens": 1000},
]


@pytest.fixture
def aws_chain(
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Callable[[BedrockProviderDouble | None], None]]:
    """Sets the sidecar's AWS credential chain: the double's keys in the environment, or no
    credentials anywhere (no files, no instance metadata)."""
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/config")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_BEARER_TOKEN_BEDROCK", raising=False)

    def use(d: BedrockProviderDouble | None) -> None:
        if d is None:
            for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
                monkeypatch.delenv(k, raising=False)
        else:
            monkeypatch.setenv("AWS_ACCESS_KEY_ID", d.access_key)
            monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", d.secret_key)
        monkeypatch.setenv("AWS_REGION", "us-east-1")
        bedrock.SIGNER.reset()

    yield use
    bedrock.SIGNER.reset()


@pytest.fixture
def bedrock_double() -> Iterator[tuple[BedrockProviderDouble, str]]:
    d = BedrockProviderDouble()
    with serve(d.app()) as url:
        yield d, url


@pytest.fixture
def make_bedrock(
    bedrock_double: tuple[BedrockProviderDouble, str],
    aws_chain: Callable[[BedrockProviderDouble | None], None],
) -> Iterator[Callable[..., Bedrock]]:
    d, durl = bedrock_double
    with ExitStack() as stack:

        def make(credentials: bool = True, **overrides: Any) -> Bedrock:
            aws_chain(d if credentials else None)
            cfg: dict[str, Any] = {
                "upstreams": {"bedrock": {"base_url": durl}},
                "models": MODELS,
                "admin_token": TOKEN,
                "workloads": ["default", "agent"],
            }
            cfg.update(overrides)
            app = create_app(Settings(**cfg))
            url = stack.enter_context(serve(app))
            http = stack.enter_context(httpx2.Client(base_url=url, timeout=30))
            return Bedrock(url, app.state.sidecar, d, durl, http)

        yield make


def client(url: str, **kw: Any) -> Any:
    """A boto3 client with keys of its own (not the double's)."""
    args: dict[str, Any] = {
        "endpoint_url": url,
        "region_name": "us-east-1",
        "aws_access_key_id": "AKIDCLIENTONLY000001",
        "aws_secret_access_key": "client/only/secret",
    }
    args.update(kw)
    return boto3.client("bedrock-runtime", **args)


def keyed_converse(url: str, api_key: str, body: dict[str, Any]) -> httpx.Response:
    """A Converse call with a Bedrock API key (``Authorization: Bearer``), sent with httpx:
    botocore sends bearer keys over HTTPS only, and the loopback sidecar here is plain HTTP."""
    return httpx.post(
        url + f"/model/{CLAUDE}/converse",
        headers={"authorization": "Bearer " + api_key, "content-type": "application/json"},
        content=json.dumps(body).encode(),
    )


def direct(d: BedrockProviderDouble, url: str) -> Any:
    return client(url, aws_access_key_id=d.access_key, aws_secret_access_key=d.secret_key)


def _plain(r: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in r.items() if k != "ResponseMetadata"}


ASK = [{"role": "user", "content": [{"text": "What is the answer?"}]}]
ASK_ANTHROPIC = [{"role": "user", "content": "What is the answer?"}]
INVOKE = {
    "anthropic_version": "bedrock-2023-05-31",
    "max_tokens": 50,
    "messages": [{"role": "user", "content": "What is the answer?"}],
}


def test_converse_through_the_sidecar_is_direct_and_measured(
    make_bedrock: Callable[..., Bedrock],
) -> None:
    sc = make_bedrock()
    d = sc.double
    via = client(sc.url).converse(modelId=CLAUDE, messages=ASK, inferenceConfig={"maxTokens": 50})
    assert d.received[-1].auth == "sigv4"  # the client's keys are not the double's
    with pytest.raises(botocore.exceptions.ClientError) as err:
        client(sc.double_url).converse(modelId=CLAUDE, messages=ASK)
    assert err.value.response["Error"]["Code"] == "InvalidSignatureException"
    straight = direct(d, sc.double_url).converse(
        modelId=CLAUDE, messages=ASK, inferenceConfig={"maxTokens": 50}
    )
    assert _plain(via) == _plain(straight)
    labels = {"model": "claude", "workload": "default", "api": "bedrock_converse"}
    assert sc.sample("llm_context_requests_total", **labels, outcome="ok") == 1
    assert sc.sample("llm_context_output_tokens_sum", model="claude", workload="default") == 7
    assert (
        sc.sample(
            "llm_context_input_tokens_count",
            model="claude",
            workload="default",
            component="latest_user",
        )
        or 0
    ) >= 1


def test_converse_stream_through_the_sidecar_is_direct_frame_for_frame(
    make_bedrock: Callable[..., Bedrock],
) -> None:
    sc = make_bedrock()
    d = sc.double
    via = client(sc.url).converse_stream(modelId=PROFILE, messages=ASK)
    events = list(via["stream"])
    assert d.received[-1].auth == "sigv4"
    assert d.received[-1].path.endswith("/converse-stream") and PROFILE in d.received[-1].path
    straight = list(
        direct(d, sc.double_url).converse_stream(modelId=PROFILE, messages=ASK)["stream"]
    )
    assert events == straight
    text = "".join(
        e["contentBlockDelta"]["delta"]["text"] for e in events if "contentBlockDelta" in e
    )
    assert text == d.text
    labels = {"model": "claude", "workload": "default", "api": "bedrock_converse"}
    assert sc.sample("llm_context_requests_total", **labels, outcome="ok") == 1
    # the usage in the last frame (metadata) was read
    assert sc.sample("llm_context_output_tokens_sum", model="claude", workload="default") == 7


def test_invoke_model_on_claude_through_the_sidecar(make_bedrock: Callable[..., Bedrock]) -> None:
    sc = make_bedrock()
    d = sc.double
    body = json.dumps(INVOKE)
    via = client(sc.url).invoke_model(modelId=CLAUDE, body=body)
    straight = direct(d, sc.double_url).invoke_model(modelId=CLAUDE, body=body)
    assert json.loads(via["body"].read()) == json.loads(straight["body"].read())
    assert d.received[-2].auth == "sigv4"
    stream = client(sc.url).invoke_model_with_response_stream(modelId=CLAUDE, body=body)
    chunks = [json.loads(e["chunk"]["bytes"]) for e in stream["body"]]
    assert chunks[0]["type"] == "message_start" and chunks[-1]["type"] == "message_stop"
    labels = {"model": "claude", "workload": "default", "api": "bedrock_invoke"}
    assert sc.sample("llm_context_requests_total", **labels, outcome="ok") == 2
    assert sc.sample("llm_context_output_tokens_sum", model="claude", workload="default") == 14


def _agent_loop(rounds: int, result_words: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"text": "Fix the failing test in the repository."}]}
    ]
    for k in range(rounds):
        tid = f"tooluse_{k:03d}"
        messages.append(
            {
                "role": "assistant",
                "content": [
                    {"text": f"Step {k}: reading a file."},
                    {
                        "toolUse": {
                            "toolUseId": tid,
                            "name": "read_file",
                            "input": {"path": f"f{k}.py"},
                        }
                    },
                ],
            }
        )
        out = " ".join(f"line{k}_{w}" for w in range(result_words))
        messages.append(
            {
                "role": "user",
                "content": [{"toolResult": {"toolUseId": tid, "content": [{"text": out}]}}],
            }
        )
    return messages


def _enforcing(make_bedrock: Callable[..., Bedrock], tokens: int, **kw: Any) -> Bedrock:
    sc = make_bedrock(enforcement={"mode": "enforce", "default_output_reservation": 256}, **kw)
    d = doc(1, entry(model="claude", window=200000, tokens=tokens))
    r = httpx.put(sc.url + "/admin/ceilings", json=d, headers={"authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200, r.text
    return sc


TOOLS = {
    "tools": [
        {
            "toolSpec": {
                "name": "read_file",
                "description": "Read a file",
                "inputSchema": {
                    "json": {"type": "object", "properties": {"path": {"type": "string"}}}
                },
            }
        }
    ]
}


def test_enforce_trims_a_converse_agent_loop_and_signs_the_trimmed_body(
    make_bedrock: Callable[..., Bedrock],
) -> None:
    sc = _enforcing(make_bedrock, tokens=3000)
    d = sc.double
    messages = _agent_loop(rounds=12, result_words=200)
    r = client(sc.url).converse(
        modelId=CLAUDE, messages=messages, toolConfig=TOOLS, inferenceConfig={"maxTokens": 100}
    )
    assert r["output"]["message"]["content"][0]["text"] == d.text
    sent = d.received[-1]
    assert sent.auth == "sigv4"  # the trimmed body, signed by the sidecar
    body = sent.json
    assert body["messages"][0] == messages[0]  # the task stays
    assert body["messages"][-1] == messages[-1]  # the newest result stays whole
    results = [b["toolResult"] for m in body["messages"] for b in m["content"] if "toolResult" in b]
    assert any("cleared" in json.dumps(tr["content"]) for tr in results) or len(
        body["messages"]
    ) < len(messages)
    # every result kept still answers a call that was kept (the API requires the pairs)
    calls = {
        b["toolUse"]["toolUseId"] for m in body["messages"] for b in m["content"] if "toolUse" in b
    }
    assert {tr["toolUseId"] for tr in results} <= calls
    trimmed = sum(
        sc.sample("llm_context_trimmed_tokens_total", model="claude", workload="default", kind=k)
        or 0
        for k in ("clear", "tool_results", "history", "retrieved")
    )
    assert trimmed > 0
    assert (
        sc.state.metrics.registry.get_sample_value(
            "llm_context_requests_total",
            {"model": "claude", "workload": "default", "api": "bedrock_converse", "outcome": "ok"},
        )
        == 1
    )


def test_a_request_that_cannot_fit_is_botocore_s_validation_exception(
    make_bedrock: Callable[..., Bedrock],
) -> None:
    sc = _enforcing(make_bedrock, tokens=3000)
    before = len(sc.double.received)
    huge = [{"role": "user", "content": [{"text": "word " * 5000}]}]
    with pytest.raises(botocore.exceptions.ClientError) as err:
        client(sc.url).converse(modelId=CLAUDE, messages=huge, inferenceConfig={"maxTokens": 50})
    assert err.value.response["Error"]["Code"] == "ValidationException"
    assert "Input is too long" in err.value.response["Error"]["Message"]
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert len(sc.double.received) == before


def test_without_credentials_a_changed_body_is_refused_and_observe_still_works(
    make_bedrock: Callable[..., Bedrock],
) -> None:
    sc = _enforcing(make_bedrock, tokens=3000, credentials=False)
    d = sc.double
    before = len(d.received)
    with pytest.raises(botocore.exceptions.ClientError) as err:
        client(sc.url).converse(
            modelId=CLAUDE, messages=_agent_loop(12, 200), inferenceConfig={"maxTokens": 100}
        )
    assert err.value.response["Error"]["Code"] == "ValidationException"
    assert "no AWS credentials" in err.value.response["Error"]["Message"]
    assert len(d.received) == before  # nothing was forwarded
    # a Bedrock API key does not cover the body: the trimmed request goes with it
    r = keyed_converse(
        sc.url, d.api_key, {"messages": _agent_loop(12, 200), "inferenceConfig": {"maxTokens": 100}}
    )
    assert r.json()["stopReason"] == "end_turn" and d.received[-1].auth == "api_key"
    assert d.received[-1].headers["authorization"] == "Bearer " + d.api_key
    assert len(d.received[-1].json["messages"]) < 25  # trimmed


def test_observe_without_credentials_forwards_the_client_s_request_as_sent(
    make_bedrock: Callable[..., Bedrock],
) -> None:
    sc = make_bedrock(credentials=False)
    d = sc.double
    body = {"messages": ASK, "inferenceConfig": {"maxTokens": 50}}
    r = keyed_converse(sc.url, d.api_key, body)
    assert r.json()["stopReason"] == "end_turn"
    assert d.received[-1].body == json.dumps(body).encode() and d.received[-1].auth == "api_key"
    labels = {"model": "claude", "workload": "default", "api": "bedrock_converse"}
    assert sc.sample("llm_context_requests_total", **labels, outcome="ok") == 1


def test_a_stream_cut_short_ends_with_an_exception_botocore_raises(
    make_bedrock: Callable[..., Bedrock],
) -> None:
    sc = make_bedrock()
    c = client(sc.url)
    c.meta.events.register(
        "before-sign.bedrock-runtime.ConverseStream",
        lambda request, **_: request.headers.__setitem__("x-double-cut-after", "3"),
    )
    stream = c.converse_stream(modelId=CLAUDE, messages=ASK)["stream"]
    with pytest.raises(botocore.exceptions.EventStreamError) as err:
        list(stream)
    assert "incomplete" in str(err.value)
    labels = {"model": "claude", "workload": "default", "api": "bedrock_converse"}
    assert sc.sample("llm_context_requests_total", **labels, outcome="upstream_truncated") == 1


def test_count_tokens_is_a_count_only_route(make_bedrock: Callable[..., Bedrock]) -> None:
    """CountTokens is counted by the sidecar and answered by the provider as it is: the two
    counts side by side are the estimate error, per model; nothing is trimmed or priced. Both
    of its inputs: a Converse request, and an InvokeModel body (base64 in the JSON)."""
    sc = make_bedrock()
    d = sc.double
    c = client(sc.url)
    counted = c.count_tokens(modelId=CLAUDE, input={"converse": {"messages": ASK}})
    assert counted["inputTokens"] == d.input_tokens and d.received[-1].auth == "sigv4"
    body = {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 10, "messages": ASK_ANTHROPIC}
    invoked = c.count_tokens(
        modelId=CLAUDE, input={"invokeModel": {"body": json.dumps(body).encode()}}
    )
    assert invoked["inputTokens"] == d.input_tokens
    labels = {"model": "claude", "workload": "default", "api": "bedrock_count_tokens"}
    assert sc.sample("llm_context_requests_total", **labels, outcome="ok") == 2
    assert sc.sample("llm_context_token_estimate_error_ratio_count", model="claude") == 2
    # a CountTokens input that is neither is the client's error, in Bedrock's shape
    with pytest.raises(botocore.exceptions.ClientError) as err:
        c.count_tokens(modelId=CLAUDE, input={"invokeModel": {"body": b"not json"}})
    assert err.value.response["Error"]["Code"] == "ValidationException"
    assert "invokeModel.body" in err.value.response["Error"]["Message"]


def test_other_bedrock_routes_pass_through_signed(make_bedrock: Callable[..., Bedrock]) -> None:
    sc = make_bedrock()
    d = sc.double
    c = client(sc.url)
    # InvokeModel on another family's model is not measured: passed through, signed
    with pytest.raises(botocore.exceptions.ClientError) as err:
        c.invoke_model(modelId="meta.llama3-8b-instruct-v1:0", body=json.dumps({"prompt": "hi"}))
    assert err.value.response["Error"]["Code"] == "ValidationException"  # the double's answer
    assert d.received[-1].auth == "sigv4"

    def passed(outcome: str) -> float | None:
        return sc.sample(
            "llm_context_passthrough_requests_total",
            upstream="bedrock",
            route="model",
            outcome=outcome,
        )

    assert passed("upstream_4xx") == 1 and not passed("ok")  # CountTokens is measured now
    # a GET is signed as a GET (the signature covers the method)
    listed = c.list_async_invokes()
    assert listed["asyncInvokeSummaries"] == [] and d.received[-1].auth == "sigv4"


def test_the_sweep_measures_a_bedrock_model_through_converse(
    bedrock_double: tuple[BedrockProviderDouble, str],
    aws_chain: Callable[[BedrockProviderDouble | None], None],
    tmp_path: Path,
) -> None:
    """``ceiling sweep run --api bedrock``: every call a Converse request written by the
    provider layer, signed with the AWS chain's credentials, its answer and usage read back."""
    from context_ceiling.cli import main as cli_main
    from context_ceiling.sweep.calllog import CallLog

    d, durl = bedrock_double
    aws_chain(d)
    out = tmp_path / "run"
    args = ["sweep", "run", "--api", "bedrock", "--base-url", durl, "--model", CLAUDE]
    args += ["--taskset", "records", "--items", "6", "--levels", "0.2,0.5", "--repeats", "1"]
    args += ["--window", "4000", "--tokenizer", "cl100k_base", "--max-tokens", "16"]
    args += ["--shared-haystack", "--low-fill", "0", "--no-refine", "--no-adaptive"]
    args += ["--price", "0", "--out", str(out), "--no-progress"]
    assert cli_main(args) == 0
    calls = list(CallLog(out / "calls.jsonl").records().values())
    assert calls and all(c.status == "ok" for c in calls)
    assert all(c.usage_prompt == d.input_tokens and c.text == d.text for c in calls)
    assert {r.auth for r in d.received} == {"sigv4"}
    sent = [r.json for r in d.received]
    assert all(b["inferenceConfig"]["maxTokens"] == 16 for b in sent)
    # a question on a shared haystack marks the haystack as a prompt-cache breakpoint
    assert any("cachePoint" in blk for b in sent for m in b["messages"] for blk in m["content"])
