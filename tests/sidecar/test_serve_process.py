"""`ceiling serve` as a process, as deployed: one JSON log format on stdout for everything it
writes (its startup line, request lines, uvicorn's own lines), nothing on stderr, no secret in
any line; one Date and at most one Server header on every response, forwarded or its own; the
standard process metrics."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from context_ceiling import __version__
from testkit.doubles.hosted_provider import HostedProviderDouble
from testkit.serving import ServeProcess, ceiling_serve, free_port, serve

pytestmark = pytest.mark.e2e  # sockets, processes or served servers

KEY = "sk-test-SECRET-4f9a1c"


def observing(port: int, upstream: str, **more: object) -> dict[str, object]:
    """The config of a sidecar on ``port`` observing gpt-4o traffic to an OpenAI-style upstream."""
    return {
        "listen": {"host": "127.0.0.1", "port": port},
        "upstreams": {"openai": {"base_url": upstream + "/v1"}},
        "models": [{"match": "gpt-4o", "window": 128000}],
        "enforcement": {"mode": "observe"},
        **more,
    }


@pytest.fixture
def process(tmp_path: Path) -> Iterator[ServeProcess]:
    double = HostedProviderDouble()
    # the double is uvicorn: it sends its own Date and `server: uvicorn`
    with serve(double.app()) as durl, ceiling_serve(observing(free_port(), durl), tmp_path) as sp:
        yield sp


def test_one_json_log_format_startup_line_and_no_secrets(
    process: ServeProcess,
) -> None:
    url = process.url
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
    client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    httpx.get(url + "/v1/models", headers={"authorization": f"Bearer {KEY}"})
    rc = process.stop(30)
    out, err = process.output(), process.errors()
    # uvicorn shuts down gracefully, then re-raises the signal (exit by SIGTERM, as supervisors expect)
    assert rc in (0, -signal.SIGTERM)
    assert err == "", err  # nothing in another format on another stream
    lines = [json.loads(line) for line in out.splitlines()]  # every line is JSON
    assert all({"ts", "level", "logger", "message"} <= set(x) for x in lines), lines
    [started] = [x for x in lines if x["message"] == "sidecar started"]
    assert started["version"] == __version__ and started["mode"] == "observe"
    assert started["upstreams"] == ["openai"] and started["models"] == ["gpt-4o"]
    assert started["bpe"] == "gigatoken"  # the gigatoken extra is in the dev install (auto)
    loggers = {x["logger"] for x in lines}
    assert "uvicorn.error" in loggers and "ceiling.requests" in loggers
    assert KEY not in out and "hi" not in [x.get("message") for x in lines]


def test_one_date_and_one_server_header(process: ServeProcess) -> None:
    url = process.url
    for r in (
        httpx.get(url + "/v1/models"),  # passed through
        httpx.post(
            url + "/v1/chat/completions",
            json={"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]},
        ),  # measured and forwarded
        httpx.get(url + "/healthz"),  # the sidecar's own
        httpx.post(url + "/v1/chat/completions", content=b"{"),  # the sidecar's own error
    ):
        assert len(r.headers.get_list("date")) == 1, (r.request.url, r.headers)
        assert len(r.headers.get_list("server")) <= 1, (r.request.url, r.headers)
    # a forwarded response keeps the upstream's Server
    assert httpx.get(url + "/v1/models").headers["server"] == "uvicorn"


def test_process_metrics(process: ServeProcess) -> None:
    url = process.url
    text = httpx.get(url + "/metrics").text
    samples = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line and not line.startswith("#") and "{" not in line.split(" ")[0]
    }
    assert samples["process_resident_memory_bytes"] > 10e6
    assert samples["process_open_fds"] > 0 and samples["process_start_time_seconds"] > 1e9
    assert "python_info{" in text and "python_gc_objects_collected_total" in text


def test_streams_cut_at_any_moment_give_every_upstream_connection_back(tmp_path: Path) -> None:
    """Clients dropping their connections at any moment, many at once (a load tool's end, a
    fleet of impatient users), under the deployed event loop (uvloop) in front of a fast upstream:
    every upstream connection comes back to the pool. With a pool of 4, a leaked slot shows as a
    504 once the pool wait runs out. (Cancelling the relay with a bare task.cancel() instead of
    an anyio cancel scope leaked slots here, inside httpcore's shielded clean-up.)"""
    import asyncio
    import contextlib
    import random

    from benchmarks import targets as tg

    up = tg.upstream(tmp_path)  # the benchmarks' raw-ASGI upstream double, its own process
    base = up.url.rsplit("/v1/", 1)[0]
    cfg = observing(free_port(), base)
    cfg["models"] = [{"match": "bench-1000", "window": 128000}]
    cfg["upstreams"] = {
        "openai": {"base_url": base + "/v1", "pool_size": 4, "timeouts": {"connect": 2}}
    }
    try:
        with ceiling_serve(cfg, tmp_path) as sp:
            url = sp.url
            rng = random.Random(3)
            text = "Record 7: the fee is 300 EUR. " * 200
            body = {"model": "bench-1000", "messages": [{"role": "user", "content": text}]}
            streamed = {**body, "stream": True}

            async def cut(c: httpx.AsyncClient) -> None:
                with contextlib.suppress(TimeoutError, httpx.HTTPError):
                    async with asyncio.timeout(rng.uniform(0.0, 0.05)):
                        async with c.stream(
                            "POST",
                            url + "/v1/chat/completions",
                            json=streamed,
                            headers={"connection": "close"},
                        ) as r:
                            async for _ in r.aiter_raw():
                                pass

            async def waves() -> None:
                limits = httpx.Limits(max_connections=100)
                async with httpx.AsyncClient(timeout=10, limits=limits) as c:
                    for _ in range(20):
                        await asyncio.gather(*(cut(c) for _ in range(64)))

            asyncio.run(waves())
            with httpx.Client(timeout=10) as h:
                for _ in range(8):
                    r = h.post(url + "/v1/chat/completions", json=body)
                    assert r.status_code == 200, r.text
    finally:
        up.stop()


def test_streams_longer_than_the_grace_end_with_an_error_event(tmp_path: Path) -> None:
    """SIGTERM with streams that outlast the grace: each one gets the provider-shaped error
    event before its connection is aborted (not a silently cut body), and is counted as
    ``shutdown``."""
    import threading
    import time

    double = HostedProviderDouble()
    cfg = observing(free_port(), "", limits={"shutdown_grace_seconds": 3})
    with (
        serve(double.app()) as durl,
        ceiling_serve({**cfg, "upstreams": {"openai": {"base_url": durl + "/v1"}}}, tmp_path) as sp,
    ):
        url, proc = sp.url, sp.proc
        bodies: list[bytes] = []

        def stream() -> None:
            got = b""
            try:
                with httpx.stream(
                    "POST",
                    url + "/v1/chat/completions",
                    json={
                        "model": "gpt-4o",
                        "messages": [{"role": "user", "content": "hi"}],
                        "stream": True,
                    },
                    headers={"x-double-chunks": "200", "x-double-pace": "0.05"},
                    timeout=30,
                ) as r:
                    for chunk in r.iter_raw():
                        got += chunk
            except httpx.HTTPError:
                pass
            bodies.append(got)

        threads = [threading.Thread(target=stream) for _ in range(5)]
        for t in threads:
            t.start()
        time.sleep(1.0)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(timeout=20)
        proc.wait(timeout=30)
        out = sp.output()
    assert len(bodies) == 5
    assert time.monotonic() - started < 8
    for body in bodies:
        assert b"data: " in body  # it was streaming
        assert b"shutting down" in body, body[-300:]
        assert b"[DONE]" not in body
    assert '"outcome": "shutdown"' in out or '"outcome":"shutdown"' in out


def test_readiness_turns_unready_when_the_drain_begins() -> None:
    import asyncio

    from context_ceiling.sidecar.app import create_app
    from context_ceiling.sidecar.config import Settings

    app = create_app(Settings(upstreams={"openai": {"base_url": "http://127.0.0.1:9/v1"}}))
    with serve(app) as url:
        assert httpx.get(url + "/readyz").status_code == 200
        state = app.state.sidecar
        loop = asyncio.new_event_loop()
        try:
            state.drain.begin(loop)  # what SIGTERM does
        finally:
            loop.close()
        r = httpx.get(url + "/readyz")
        assert r.status_code == 503 and r.json()["status"] == "shutting down"
        assert httpx.get(url + "/healthz").status_code == 200  # alive, just leaving


def test_metrics_and_admin_on_their_own_port(tmp_path: Path) -> None:
    """``listen.admin_port``: /metrics and /admin/* answer only there, traffic only on the
    traffic port; the probes on both. A NetworkPolicy can then admit Prometheus alone."""
    double = HostedProviderDouble()
    port, admin = free_port(), free_port()
    with serve(double.app()) as durl:
        cfg = observing(port, durl, admin_token="t0k")
        cfg["listen"] = {"host": "127.0.0.1", "port": port, "admin_port": admin}
        with ceiling_serve(cfg, tmp_path) as sp:
            traffic, ops = sp.url, f"http://127.0.0.1:{admin}"
            auth = {"authorization": "Bearer t0k"}
            assert httpx.get(traffic + "/metrics").status_code == 404
            assert httpx.get(traffic + "/admin/ceilings", headers=auth).status_code == 404
            assert httpx.get(ops + "/metrics").status_code == 200
            assert httpx.get(ops + "/admin/ceilings", headers=auth).status_code == 200
            body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
            assert httpx.post(traffic + "/v1/chat/completions", json=body).status_code == 200
            assert httpx.post(ops + "/v1/chat/completions", json=body).status_code == 404
            for base in (traffic, ops):
                assert httpx.get(base + "/readyz").status_code == 200
