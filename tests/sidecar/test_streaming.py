"""Streams are relayed event by event, and a client that leaves cancels the upstream request."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.conftest import Running

BODY = {
    "model": "gpt-4o",
    "messages": [{"role": "user", "content": "stream please"}],
    "stream": True,
}


def test_events_arrive_before_the_upstream_finishes(sidecar: Running) -> None:
    # 20 chunks, 0.1 s apart: the whole stream takes ~2 s; the first event must not wait for it
    with (
        httpx.Client(timeout=10) as h,
        h.stream(
            "POST",
            sidecar.url + "/v1/chat/completions",
            json=BODY,
            headers={"x-double-chunks": "20", "x-double-pace": "0.1"},
        ) as r,
    ):
        t0 = time.monotonic()
        it = r.iter_raw()
        first = next(it)
        t_first = time.monotonic() - t0
        rest = b"".join(it)
        t_all = time.monotonic() - t0
    assert first.startswith(b"data: ")
    assert t_first < t_all / 4, (t_first, t_all)
    assert rest.endswith(b"data: [DONE]\n\n")


def test_client_disconnect_cancels_the_upstream(sidecar: Running) -> None:
    with (
        httpx.Client(timeout=10) as h,
        h.stream(
            "POST",
            sidecar.url + "/v1/chat/completions",
            json=BODY,
            headers={"x-double-chunks": "1000", "x-double-pace": "0.05"},
        ) as r,
    ):
        it = r.iter_raw()
        next(it)
        next(it)
    # the upstream's generator sees the cancellation well before its 50 s would be up
    assert sidecar.double.stream_cancelled.wait(5)
    deadline = time.monotonic() + 5
    labels = dict(model="gpt-4o", workload="default", api="openai_chat", outcome="cancelled")
    while (
        sidecar.sample("llm_context_requests_total", **labels) != 1 and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    assert sidecar.sample("llm_context_requests_total", **labels) == 1


def test_stream_total_timeout_ends_the_stream(make_sidecar, double) -> None:  # type: ignore[no-untyped-def]
    _, durl = double
    sc = make_sidecar(
        upstreams={
            "openai": {
                "base_url": durl + "/v1",
                "timeouts": {"connect": 1, "read": 5, "total": 0.5},
            }
        }
    )
    got: list[bytes] = []

    def consume() -> None:
        with (
            httpx.Client(timeout=10) as h,
            h.stream(
                "POST",
                sc.url + "/v1/chat/completions",
                json=BODY,
                headers={"x-double-chunks": "100", "x-double-pace": "0.05"},
            ) as r,
        ):
            assert r.status_code == 200  # headers were already sent; the stream is cut short
            got.extend(r.iter_raw())

    # the cut is visible: an error event, then the body is aborted (never a clean end)
    with pytest.raises(httpx.RemoteProtocolError):
        consume()
    data = b"".join(got)
    assert b"[DONE]" not in data and b'"error"' in data and b"timed out" in data
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
