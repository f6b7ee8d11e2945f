"""Credentials reach only the provider they belong to: with only an OpenAI upstream, an Azure
client (deployment paths, api-key), a signed AWS Bedrock call and a Google API key are refused
in the client's own shape, naming the configuration to add, and nothing reaches the upstream."""

from __future__ import annotations

from collections.abc import Callable

import boto3
import botocore.exceptions
import openai
import pytest

from tests.conftest import Running

#: this module's sidecars run in process (see tests/conftest.py), but for tests marked e2e
IN_PROCESS = True


def _openai_only(make_sidecar: Callable[..., Running], durl: str) -> Running:
    return make_sidecar(upstreams={"openai": {"base_url": durl + "/v1"}})


@pytest.mark.e2e
def test_an_azure_client_is_never_sent_to_the_openai_upstream(
    make_sidecar: Callable[..., Running],
) -> None:
    sc = _openai_only(make_sidecar, make_sidecar().double_url)
    before = len(sc.double.received)
    az = openai.AzureOpenAI(
        azure_endpoint=sc.url, api_key="azure-key-123", api_version="2024-10-21", max_retries=0
    )
    with pytest.raises(openai.NotFoundError) as err:
        az.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}], max_tokens=5
        )
    assert "azure: true" in str(err.value)
    with pytest.raises(openai.NotFoundError):
        az.embeddings.create(model="text-embedding-3-small", input="hi")  # pass-through
    r = sc.http.post(
        "/v1/chat/completions",
        headers={"api-key": "azure-key-123"},
        json={"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status_code == 404 and r.json()["error"]["message"]
    assert len(sc.double.received) == before


@pytest.mark.e2e
def test_a_signed_bedrock_call_is_refused_in_botocore_s_shape(
    make_sidecar: Callable[..., Running],
) -> None:
    sc = _openai_only(make_sidecar, make_sidecar().double_url)
    before = len(sc.double.received)
    client = boto3.client(
        "bedrock-runtime",
        endpoint_url=sc.url,
        region_name="us-east-1",
        aws_access_key_id="AKIAEXAMPLE0000",
        aws_secret_access_key="secret/key/0000",
    )
    with pytest.raises(botocore.exceptions.ClientError) as err:
        client.converse(
            modelId="anthropic.claude-3-haiku",
            messages=[{"role": "user", "content": [{"text": "hi"}]}],
        )
    assert err.value.response["Error"]["Code"] == "ResourceNotFoundException"
    assert "not forwarded" in err.value.response["Error"]["Message"]
    assert "upstreams.bedrock" in err.value.response["Error"]["Message"]
    assert len(sc.double.received) == before


def test_a_google_key_goes_only_to_a_gemini_upstream(
    make_sidecar: Callable[..., Running],
) -> None:
    sc = _openai_only(make_sidecar, make_sidecar().double_url)
    before = len(sc.double.received)
    r = sc.http.post(
        "/v1/embeddings",
        headers={"x-goog-api-key": "AIzaExample"},
        json={"model": "text-embedding-3-small", "input": "hi"},
    )
    assert r.status_code == 404 and "upstreams.gemini" in r.text
    assert len(sc.double.received) == before
    chat = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    r = sc.http.post("/v1/chat/completions", headers={"x-goog-api-key": "AIza"}, json=chat)
    assert r.status_code == 404 and len(sc.double.received) == before
    ok = sc.http.post("/v1/chat/completions", headers={"authorization": "Bearer sk-1"}, json=chat)
    assert ok.status_code == 200 and len(sc.double.received) == before + 1


@pytest.mark.e2e
def test_a_websocket_client_is_told_in_words(make_sidecar: Callable[..., Running]) -> None:
    import websockets.exceptions
    import websockets.sync.client

    sc = make_sidecar()
    url = sc.url.replace("http://", "ws://") + "/v1/realtime?model=gpt-4o-realtime-preview"
    with pytest.raises(websockets.exceptions.InvalidStatus) as err:
        websockets.sync.client.connect(url, open_timeout=5)
    response = err.value.response
    assert response.status_code == 501
    assert b"Realtime" in response.body and b'"error"' in response.body


def test_a_credential_sent_as_the_model_name_is_refused_unrecorded(
    make_sidecar: Callable[..., Running], caplog: pytest.LogCaptureFixture
) -> None:
    sc = make_sidecar()
    key = "sk-proj-" + "abcdEFGH1234ijklMNOP5678qrstUVWX"
    before = len(sc.double.received)
    with caplog.at_level("DEBUG"):
        r = sc.http.post(
            "/v1/chat/completions",
            json={"model": key, "messages": [{"role": "user", "content": "hi"}]},
        )
    assert r.status_code == 400 and "looks like a credential" in r.json()["error"]["message"]
    assert key not in r.text and key not in caplog.text
    assert len(sc.double.received) == before
    metrics = sc.http.get("/metrics").text
    assert key not in metrics
    ok = sc.http.post(
        "/v1/chat/completions",
        json={"model": "gpt-4o-2024-08-06", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert ok.status_code == 200
