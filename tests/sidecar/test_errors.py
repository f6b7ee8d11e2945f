"""Bad input and upstream failures reach the client in its own API's error format."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.conftest import Running

#: this module's sidecars run in process (see tests/conftest.py), but for tests marked e2e
IN_PROCESS = True


MSG: list[Any] = [{"role": "user", "content": "hi"}]


def oa(sc: Running, **kw: Any) -> openai.OpenAI:
    return sc.openai(api_key="k", max_retries=0, **kw)


def an(sc: Running) -> anthropic.Anthropic:
    return sc.anthropic(api_key="k", max_retries=0)


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b'{"messages": []}', "'model' is required"),
        (b'{"model": "gpt-4o"}', "'messages' is required"),
        (b'{"model": "gpt-4o", "messages": [{"content": "x"}]}', "messages[0].role is required"),
        (
            b'{"model": "gpt-4o", "messages": [{"role": "user", "content": 5}]}',
            "messages[0].content",
        ),
    ],
)
def test_openai_bad_request(sidecar: Running, body: bytes, needle: str) -> None:
    r = sidecar.http.post(
        "/v1/chat/completions",
        content=body,
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400
    err = r.json()["error"]
    assert needle in err["message"] and err["type"] == "invalid_request_error"
    assert sidecar.double.received == []  # nothing forwarded
    label = "gpt-4o" if b'"gpt-4o"' in body else "other"
    assert (
        sidecar.sample(
            "llm_context_requests_total",
            model=label,
            workload="default",
            api="openai_chat",
            outcome="invalid",
        )
        == 1
    )


def test_openai_sdk_raises_its_own_error_class(sidecar: Running) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        oa(sidecar).chat.completions.create(
            model="gpt-4o",
            messages=[{"role": "user", "content": 5}],  # type: ignore[list-item, misc]
        )
    assert "messages[0].content" in str(info.value)


def test_anthropic_bad_request(sidecar: Running) -> None:
    r = sidecar.http.post(
        "/v1/messages",
        content=b'{"model": "claude-x", "messages": [{"role": "system", "content": "x"}]}',
    )
    assert r.status_code == 400
    assert r.json() == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "messages[0].role must be 'user' or 'assistant'",
        },
    }
    with pytest.raises(anthropic.BadRequestError):
        an(sidecar).messages.create(
            model="claude-x",
            max_tokens=5,
            messages=[{"role": "user", "content": 7}],  # type: ignore[list-item, misc]
        )


def test_body_limit_is_413(make_sidecar: Callable[..., Running]) -> None:
    sc = make_sidecar(limits={"max_body_bytes": 2048})
    big = "x " * 4000
    with pytest.raises(openai.APIStatusError) as info:
        oa(sc).chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": big}])
    assert info.value.status_code == 413
    with pytest.raises(anthropic.APIStatusError) as ainfo:
        an(sc).messages.create(
            model="claude-x", max_tokens=5, messages=[{"role": "user", "content": big}]
        )
    assert ainfo.value.status_code == 413
    assert ainfo.value.body["error"]["type"] == "request_too_large"  # type: ignore[index]
    assert sc.double.received == []


def test_upstream_errors_pass_through_as_they_came(sidecar: Running) -> None:
    r = sidecar.http.post(
        "/v1/chat/completions",
        json={"model": "gpt-4o", "messages": MSG},
        headers={"x-double-status": "429"},
    )
    assert r.status_code == 429
    assert r.json() == {
        "error": {"message": "double says 429", "type": "requests", "param": None, "code": None}
    }
    assert r.headers["retry-after"] == "1" and r.headers["x-double"] == "error"
    with pytest.raises(anthropic.InternalServerError):
        an(sidecar).messages.create(
            model="claude-x", max_tokens=5, messages=MSG, extra_headers={"x-double-status": "529"}
        )
    r = sidecar.http.post(
        "/v1/chat/completions",
        json={"model": "gpt-4o", "messages": MSG, "stream": True},
        headers={"x-double-status": "500"},
    )
    assert r.status_code == 500 and r.json()["error"]["message"] == "double says 500"
    s = sidecar.sample
    assert (
        s(
            "llm_context_requests_total",
            model="gpt-4o",
            workload="default",
            api="openai_chat",
            outcome="upstream_4xx",
        )
        == 1
    )
    assert (
        s(
            "llm_context_requests_total",
            model="gpt-4o",
            workload="default",
            api="openai_chat",
            outcome="upstream_5xx",
        )
        == 1
    )


def test_upstream_timeout_is_504(make_sidecar: Callable[..., Running], double: Any) -> None:
    _, durl = double
    sc = make_sidecar(
        upstreams={
            "openai": {
                "base_url": durl + "/v1",
                "timeouts": {"connect": 1, "read": 0.3, "total": 5},
            },
            "anthropic": {"base_url": durl, "timeouts": {"connect": 1, "read": 5, "total": 0.3}},
        }
    )
    with pytest.raises(openai.APIStatusError) as info:
        oa(sc).chat.completions.create(
            model="gpt-4o", messages=MSG, extra_headers={"x-double-delay": "1"}
        )
    assert info.value.status_code == 504
    r = sc.http.post(
        "/v1/messages",
        json={"model": "claude-x", "max_tokens": 5, "messages": MSG},
        headers={"x-double-delay": "1"},
    )
    assert r.status_code == 504 and r.json()["error"]["type"] == "timeout_error"
    assert (
        sc.sample(
            "llm_context_requests_total",
            model="gpt-4o",
            workload="default",
            api="openai_chat",
            outcome="timeout",
        )
        == 1
    )


@pytest.mark.e2e
def test_upstream_unreachable_is_502(make_sidecar: Callable[..., Running]) -> None:
    from testkit.serving import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    sc = make_sidecar(
        upstreams={"openai": {"base_url": dead + "/v1"}, "anthropic": {"base_url": dead}}
    )
    r = sc.http.post("/v1/chat/completions", json={"model": "gpt-4o", "messages": MSG})
    assert r.status_code == 502 and r.json()["error"]["type"] == "api_error"
    r = sc.http.post("/v1/messages", json={"model": "claude-x", "max_tokens": 5, "messages": MSG})
    assert r.status_code == 502 and r.json()["type"] == "error"
    # readiness is the sidecar's own state: a provider outage must not empty the Service
    assert sc.http.get("/readyz").status_code == 200
    status = sc.http.get("/status")
    assert status.status_code == 200 and status.json()["upstreams"]["openai"].startswith(
        "unreachable"
    )
    assert sc.sample("llm_context_upstream_up", upstream="openai") == 0
    assert sc.http.get("/healthz").status_code == 200


@pytest.mark.e2e
def test_readyz_and_status_with_reachable_upstreams(sidecar: Running) -> None:
    r = sidecar.http.get("/readyz")
    assert r.status_code == 200 and r.json() == {"status": "ok", "ceilings_version": 0}
    s = sidecar.http.get("/status")
    assert s.json()["upstreams"] == {"openai": "ok", "anthropic": "ok"}
    assert sidecar.sample("llm_context_upstream_up", upstream="anthropic") == 1


def test_an_unexpected_error_in_the_proxy_path_is_a_500_in_the_clients_format(
    double: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from context_ceiling.sidecar.app import create_app
    from context_ceiling.sidecar.config import Settings
    from testkit.serving import serve

    _, durl = double
    app = create_app(
        Settings(
            upstreams={"openai": {"base_url": durl + "/v1"}, "anthropic": {"base_url": durl}},
            models=[{"match": "gpt-4o", "window": 128000}],
        )
    )

    async def broken(*_: Any) -> Any:
        raise RuntimeError("boom: a bug, not the client's fault")

    monkeypatch.setattr(app.proxy, "handle", broken)
    with serve(app) as url:
        r = httpx.post(url + "/v1/chat/completions", json={"model": "gpt-4o", "messages": []})
        assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
        r = httpx.post(url + "/v1/messages", json={"model": "gpt-4o", "messages": []})
        assert r.status_code == 500 and r.json()["type"] == "error"
        assert httpx.get(url + "/healthz").status_code == 200  # the rest still routes
    assert "unexpected error in the proxy path" in caplog.text
    assert "boom" in caplog.text  # the traceback is logged; no request content is
