"""Failure modes: no 5xx from bad input, stream failures the client can see, bounded memory and
time, hop-by-hop headers, crashes that are logged, counted and findable.

Real loopback servers: the sidecar (uvicorn) in front of a fault-injecting provider double, the
official ``openai`` and ``anthropic`` SDKs as clients (no retries, so each fault is seen once).
"""

from __future__ import annotations

import json
import logging
import socket
import time
import warnings
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from context_ceiling.sidecar.app import create_app
from context_ceiling.sidecar.config import Settings
from context_ceiling.sidecar.observability import logs
from context_ceiling.sidecar.observability.logs import (
    OURS,
    REQUEST_LOGGER,
    JsonFormatter,
    configure,
    log_request,
    one_write,
)
from context_ceiling.sidecar.server import uvicorn_options
from context_ceiling.sidecar.state import SidecarState
from testkit.doubles.fault_provider import FaultyProviderDouble
from testkit.serving import serve
from testkit.traffic.fuzz_bodies import (
    ANTHROPIC_TEMPLATE,
    OPENAI_TEMPLATE,
    ROUTES,
    TEMPLATES,
    mutate,
    non_object_parts,
    paths,
)
from tests.conftest import MODELS

MSG: list[Any] = [{"role": "user", "content": "hi"}]


class Sidecar:
    def __init__(self, url: str, state: SidecarState, double: FaultyProviderDouble) -> None:
        self.url, self.state, self.double = url, state, double

    def outcome(self, api: str, outcome: str, model: str = "gpt-4o") -> float:
        v = self.state.metrics.registry.get_sample_value(
            "llm_context_requests_total",
            {"model": model, "workload": "default", "api": api, "outcome": outcome},
        )
        return v or 0.0

    def oai(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="sk-test", max_retries=0)

    def ant(self) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.url, api_key="sk-ant-test", max_retries=0)


@pytest.fixture(scope="module")
def sidecar() -> Iterator[Sidecar]:
    double = FaultyProviderDouble(huge_bytes=2 * 1024 * 1024, stall_seconds=20)
    with serve(double) as durl:
        timeouts = {"connect": 2, "read": 1.5, "total": 6}
        cfg: dict[str, Any] = {
            "upstreams": {
                "openai": {"base_url": durl + "/v1", "timeouts": timeouts},
                "anthropic": {"base_url": durl, "timeouts": timeouts},
                "gemini": {"base_url": durl, "timeouts": timeouts},
            },
            "models": MODELS,
            "limits": {
                "max_response_bytes": 1024 * 1024,
                "max_event_bytes": 256 * 1024,
                "max_header_bytes": 16 * 1024,
                "body_read_timeout": 1.5,
                "header_read_timeout": 1.5,
            },
        }
        settings = Settings(**cfg)
        app = create_app(settings)
        with serve(app, **uvicorn_options(settings)) as url:
            yield Sidecar(url, app.state.sidecar, double)


STREAM_FAULTS = ["reset", "truncated_event", "no_end", "stall", "oversized_event", "garbage"]
OUTCOME = {
    "reset": "unreachable",
    "truncated_event": "upstream_truncated",
    "no_end": "upstream_truncated",
    "stall": "timeout",
    "oversized_event": "upstream_truncated",
    "garbage": "upstream_truncated",
}


@pytest.mark.e2e
@pytest.mark.parametrize("fault", STREAM_FAULTS)
def test_a_failed_openai_stream_raises_in_the_sdk(sidecar: Sidecar, fault: str) -> None:
    before = sidecar.outcome("openai_chat", OUTCOME[fault])
    client = sidecar.oai()
    stream = client.chat.completions.create(
        model="gpt-4o", messages=MSG, stream=True, extra_headers={"x-fault": fault}
    )
    with pytest.raises((openai.APIError, httpx.HTTPError)):
        list(stream)  # the SDK raises: a truncated answer is never taken for a whole one
    assert sidecar.outcome("openai_chat", OUTCOME[fault]) == before + 1
    # and the sidecar serves the next request
    ok = client.chat.completions.create(model="gpt-4o", messages=MSG, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in ok if c.choices) == "Hello world"


@pytest.mark.e2e
@pytest.mark.parametrize("fault", STREAM_FAULTS)
def test_a_failed_anthropic_stream_raises_in_the_sdk(sidecar: Sidecar, fault: str) -> None:
    before = sidecar.outcome("anthropic_messages", OUTCOME[fault], "claude")
    client = sidecar.ant()

    def consume() -> str:
        with client.messages.stream(
            model="claude-x", max_tokens=50, messages=MSG, extra_headers={"x-fault": fault}
        ) as stream:
            return "".join(stream.text_stream)

    with pytest.raises((anthropic.APIError, httpx.HTTPError)):
        consume()
    assert sidecar.outcome("anthropic_messages", OUTCOME[fault], "claude") == before + 1
    with client.messages.stream(model="claude-x", max_tokens=50, messages=MSG) as stream:
        assert "".join(stream.text_stream) == "Hello world"


@pytest.mark.e2e
def test_a_client_that_stops_at_done_completed_the_stream(sidecar: Sidecar) -> None:
    """SDKs stop reading at the last event and hang up; the upstream may close later. The
    exchange was complete: recorded ok, not cancelled."""
    before = sidecar.outcome("openai_chat", "ok")
    stream = sidecar.oai().chat.completions.create(
        model="gpt-4o", messages=MSG, stream=True, extra_headers={"x-fault": "linger"}
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "Hello world"
    stream.close()
    deadline = time.monotonic() + 5
    while sidecar.outcome("openai_chat", "ok") < before + 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sidecar.outcome("openai_chat", "ok") == before + 1


@pytest.mark.e2e
def test_the_anthropic_error_event_comes_before_the_abort(sidecar: Sidecar) -> None:
    body = {"model": "claude-x", "max_tokens": 50, "messages": MSG, "stream": True}
    seen: list[bytes] = []

    def consume() -> None:
        with httpx.stream(
            "POST",
            sidecar.url + "/v1/messages",
            json=body,
            headers={"x-fault": "no_end", "anthropic-version": "2023-06-01"},
        ) as r:
            assert r.status_code == 200
            seen.extend(r.iter_raw())

    with pytest.raises(httpx.HTTPError):
        consume()
    data = b"".join(seen)
    assert b"event: error" in data and b"message_stop" not in data


@pytest.mark.e2e
@pytest.mark.parametrize("fault", ["429", "500", "stall_headers"])
def test_failures_before_the_headers_keep_their_status(sidecar: Sidecar, fault: str) -> None:
    r = httpx.post(
        sidecar.url + "/v1/chat/completions",
        json={"model": "gpt-4o", "messages": MSG},
        headers={"x-fault": fault},
        timeout=30,
    )
    assert r.status_code == {"429": 429, "500": 500, "stall_headers": 504}[fault]
    assert "error" in r.json()


@pytest.mark.e2e
def test_a_huge_response_is_a_clear_502_not_memory(sidecar: Sidecar) -> None:
    r = httpx.post(
        sidecar.url + "/v1/chat/completions",
        json={"model": "gpt-4o", "messages": MSG},
        headers={"x-fault": "huge"},
        timeout=30,
    )
    assert r.status_code == 502
    assert "max_response_bytes" in r.json()["error"]["message"]
    assert r.headers["x-ceiling-request-id"]


# -- bad input: a 4xx in the client's own shape, never a 5xx --------------------------------

JSONV = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


@pytest.mark.e2e
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data(), api=st.sampled_from(["openai", "anthropic"]), stream=st.booleans())
def test_malformed_bodies_get_a_4xx_in_the_provider_shape(
    sidecar: Sidecar, data: st.DataObject, api: str, stream: bool
) -> None:
    template = OPENAI_TEMPLATE if api == "openai" else ANTHROPIC_TEMPLATE
    template = template | {"stream": stream}
    path = data.draw(st.sampled_from(paths(template)))
    body = mutate(template, path, data.draw(JSONV))
    url = sidecar.url + ("/v1/chat/completions" if api == "openai" else "/v1/messages")
    r = httpx.post(url, content=json.dumps(body), headers={"anthropic-version": "2023-06-01"})
    assert r.status_code < 500, (path, body, r.text)
    if r.status_code >= 400:
        err = r.json()
        if api == "anthropic":
            assert err["type"] == "error" and err["error"]["message"]
        else:
            assert err["error"]["message"]


@pytest.mark.e2e
@pytest.mark.parametrize("api", ["openai", "anthropic", "responses", "gemini"])
@pytest.mark.parametrize("stream", [False, True])
def test_non_object_parts_never_get_a_5xx(sidecar: Sidecar, api: str, stream: bool) -> None:
    """Every list slot of every measured API's body given a scalar or a list instead of an
    object, streamed and not: a 4xx in the client's shape or a forward, never a 5xx."""
    template = TEMPLATES[api] | ({"stream": stream} if api != "gemini" else {})
    for path, value in non_object_parts(template):
        body = mutate(template, path, value)
        r = httpx.post(
            sidecar.url + ROUTES[api],
            content=json.dumps(body),
            headers={"anthropic-version": "2023-06-01"} if api == "anthropic" else {},
            timeout=30,
        )
        assert r.status_code < 500, (api, path, value, r.status_code, r.text[:200])


@pytest.mark.e2e
@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_a_body_nested_too_deep_is_a_400(sidecar: Sidecar, api: str) -> None:
    deep: Any = "x"
    for _ in range(300):
        deep = [deep]
    template = OPENAI_TEMPLATE if api == "openai" else ANTHROPIC_TEMPLATE
    body = template | {"stream": True, "metadata": {"deep": deep}}
    url = sidecar.url + ("/v1/chat/completions" if api == "openai" else "/v1/messages")
    r = httpx.post(url, content=json.dumps(body))
    assert r.status_code == 400 and "nested" in r.text


# -- crashes are visible --------------------------------------------------------------------


@pytest.mark.e2e
def test_an_internal_error_is_logged_counted_and_findable(
    sidecar: Sidecar, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from context_ceiling.sidecar import schedule

    def boom(*a: Any, **k: Any) -> Any:
        raise KeyError("a bug")

    monkeypatch.setattr(schedule, "trim_to", boom)  # the ceiling's verdict, mid-request
    before = sidecar.outcome("openai_chat", "internal_error")
    with caplog.at_level(logging.ERROR, logger="context_ceiling.sidecar.proxy"):
        r = httpx.post(
            sidecar.url + "/v1/chat/completions", json={"model": "gpt-4o", "messages": MSG}
        )
    assert r.status_code == 500 and r.json()["error"]["message"]
    rid = r.headers["x-ceiling-request-id"]
    assert rid in r.json()["error"]["message"]
    assert sidecar.outcome("openai_chat", "internal_error") == before + 1
    [rec] = [x for x in caplog.records if x.name == "context_ceiling.sidecar.proxy" and x.exc_info]
    line = json.loads(JsonFormatter().format(rec))
    assert line["exc_type"] == "KeyError" and "boom" in line["traceback"]
    assert line["request_id"] == rid


# -- limits, headers, logs --------------------------------------------------------------------


@pytest.mark.e2e
def test_a_body_that_never_finishes_is_a_408(sidecar: Sidecar) -> None:
    host, port = sidecar.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 1000\r\n\r\n{"model": '
        )
        t0 = time.monotonic()
        reply = s.recv(65536)
    assert reply.startswith(b"HTTP/1.1 408") and time.monotonic() - t0 < 8


@pytest.mark.e2e
def test_headers_that_never_finish_close_the_connection(sidecar: Sidecar) -> None:
    host, port = sidecar.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        t0 = time.monotonic()
        assert s.recv(65536) == b"", "closed by the header deadline"
        assert time.monotonic() - t0 < 8
    with socket.create_connection((host, int(port)), timeout=10) as s:
        t0 = time.monotonic()  # a connection that never sends a byte
        assert s.recv(65536) == b"" and time.monotonic() - t0 < 8


@pytest.mark.e2e
def test_oversized_headers_are_a_431(sidecar: Sidecar) -> None:
    r = httpx.post(
        sidecar.url + "/v1/chat/completions",
        json={"model": "gpt-4o", "messages": MSG},
        headers={"x-big": "a" * 20000},
    )
    assert r.status_code == 431 and r.json()["error"]["message"]


def test_hop_by_hop_headers_do_not_cross() -> None:
    from context_ceiling.sidecar.upstream.client import request_headers, response_headers

    sent = dict(
        request_headers(
            [
                ("Connection", "keep-alive, X-Secret-Hop"),
                ("X-Secret-Hop", "1"),
                ("Expect", "100-continue"),
                ("Authorization", "Bearer k"),
            ]
        )
    )
    assert sent == {"Authorization": "Bearer k"}
    back = response_headers(
        httpx.Headers(
            {
                "Proxy-Authenticate": "Basic",
                "Connection": "X-Up-Hop",
                "X-Up-Hop": "1",
                "x-request-id": "r",
            }
        )
    )
    assert back == {"x-request-id": "r"}


def _restored_after(monkeypatch: pytest.MonkeyPatch) -> None:
    """What ``logs.configure`` sets (the logging module's lookup switches, our loggers' handlers
    and levels, the warnings hook), restored when the test ends."""
    for flag in ("_srcfile", "logThreads", "logProcesses", "logMultiprocessing"):
        monkeypatch.setattr(logging, flag, getattr(logging, flag))
    for name in ("", REQUEST_LOGGER, *OURS):
        logger = logging.getLogger(name)
        monkeypatch.setattr(logger, "handlers", list(logger.handlers))
        monkeypatch.setattr(logger, "level", logger.level)
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)


def test_request_lines_skip_the_lookups_the_format_never_prints(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``logs.configure`` turns off the caller, thread and process lookups (the logging HOWTO's
    optimization switches), and the request line it writes is still the whole JSON line."""
    _restored_after(monkeypatch)
    req = logging.getLogger(REQUEST_LOGGER)
    seen: list[logging.LogRecord] = []
    monkeypatch.setattr(req, "filters", [lambda r: seen.append(r) or True])  # type: ignore[func-returns-value]

    configure("info")
    log_request({"request_id": "r1", "input_tokens_estimated": 42})

    [rec] = seen
    assert (rec.funcName, rec.thread, rec.process) == ("(unknown function)", None, None)
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["logger"] == REQUEST_LOGGER and line["message"] == "request"
    assert (line["request_id"], line["input_tokens_estimated"], line["level"]) == ("r1", 42, "info")


def test_request_lines_written_directly_are_the_formatters_lines(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """With the JSON handler on stdout the only one on the way, a request line is written to
    it directly (no log record), the same line the formatter writes; a handler added anywhere
    (a test's capture, an embedding app's) gets the record through ``logging``."""
    _restored_after(monkeypatch)
    made: list[logging.LogRecord] = []
    factory = logging.getLogRecordFactory()

    def counted(*a: Any, **k: Any) -> logging.LogRecord:
        made.append(factory(*a, **k))
        return made[-1]

    monkeypatch.setattr(logging, "_logRecordFactory", counted)
    configure("info")
    fields = {"request_id": "r1", "model": "m", "components": {"system": 3}, "cost": None}
    log_request(fields)
    direct = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert made == [], "no log record for a request line"
    record = logging.makeLogRecord(
        {"name": REQUEST_LOGGER, "msg": "request", "levelname": "INFO", "fields": fields}
    )
    formatted = json.loads(JsonFormatter().format(record))
    assert list(direct) == list(formatted)
    assert {k: v for k, v in direct.items() if k != "ts"} == {
        k: v for k, v in formatted.items() if k != "ts"
    }
    seen: list[logging.LogRecord] = []

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    extra = Seen()
    logging.getLogger("ceiling").addHandler(extra)
    try:
        log_request(fields)
    finally:
        logging.getLogger("ceiling").removeHandler(extra)
    assert [r.name for r in seen] == [REQUEST_LOGGER]
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["request_id"] == "r1"


@pytest.mark.e2e
def test_client_strings_are_bounded_in_logs(
    sidecar: Sidecar, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="ceiling.requests"):
        httpx.post(
            sidecar.url + "/v1/chat/completions",
            json={"model": "m" * 100_000, "messages": MSG},
            headers={"x-request-id": "r" * 10_000},  # under the head cap (16 KiB here)
        )
    [rec] = [x for x in caplog.records if x.name == "ceiling.requests"]
    line = JsonFormatter().format(rec)
    assert len(line) < 4000
    assert len(json.loads(line)["request_id"]) <= 128


# -- graceful shutdown ------------------------------------------------------------------------


@pytest.mark.e2e
def test_sigterm_stops_accepting_and_lets_streams_finish(tmp_path: Any) -> None:
    """``ceiling serve`` as deployed: on SIGTERM a stream in flight runs to its end, new
    connections are refused, and the process exits within the grace period."""
    import signal
    import threading

    from testkit.doubles.hosted_provider import HostedProviderDouble
    from testkit.serving import ceiling_serve

    with serve(HostedProviderDouble().app()) as durl:
        cfg = {
            "upstreams": {"openai": {"base_url": durl + "/v1"}},
            "models": [{"match": "gpt-4o", "window": 128000}],
            "limits": {"shutdown_grace_seconds": 15},
            "log_level": "warning",
        }
        with ceiling_serve(cfg, tmp_path) as sp:
            url, proc = sp.url, sp.proc
            got: list[bytes] = []
            started = threading.Event()

            def stream() -> None:
                with httpx.stream(
                    "POST",
                    url + "/v1/chat/completions",
                    json={"model": "gpt-4o", "messages": MSG, "stream": True},
                    headers={"x-double-chunks": "40", "x-double-pace": "0.05"},
                    timeout=30,
                ) as r:
                    for chunk in r.iter_raw():
                        got.append(chunk)
                        started.set()

            t = threading.Thread(target=stream)
            t.start()
            assert started.wait(10)
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            with pytest.raises(httpx.ConnectError):
                httpx.get(url + "/healthz", timeout=2)
            t.join(20)
            assert b"data: [DONE]" in b"".join(got), "the stream in flight finished whole"
            # uvicorn finishes the shutdown, then re-raises the signal it caught (exit by SIGTERM)
            assert proc.wait(timeout=20) in (0, -signal.SIGTERM)


def _raw(url: str, head: bytes, then: bytes = b"") -> tuple[bytes, bool]:
    """Send ``head`` (and ``then``) on a raw connection; (what came back, closed by the peer)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        try:
            s.sendall(head)
            s.sendall(then)
        except (BrokenPipeError, ConnectionResetError):
            pass
        got = b""
        while True:
            try:
                chunk = s.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                return got, True
            got += chunk
        return got, False


@pytest.mark.e2e
def test_an_oversized_head_is_refused_while_it_is_read(sidecar: Sidecar) -> None:
    """A header far over ``max_header_bytes`` is answered 431 (JSON) as soon as the cap is
    passed and the connection closed: the rest of it is never read into memory."""
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (4 << 20)
    got, closed = _raw(sidecar.url, head)
    assert got.startswith(b"HTTP/1.1 431 "), got[:80]
    body = got.split(b"\r\n\r\n", 1)[1]
    assert b"16384 bytes" in body and b'"error"' in body
    assert closed
    # a request whose head is within the cap but whose body is large is not counted as head
    ok = httpx.post(
        sidecar.url + "/v1/embeddings", content=b"x" * 200_000, headers={"x-small": "1"}
    )
    assert ok.status_code != 431


@pytest.mark.e2e
def test_too_many_header_fields_are_refused_while_they_are_read(sidecar: Sidecar) -> None:
    """Hundreds of tiny headers, together under the byte cap: past ``max_header_count`` (100) the
    request is answered 431 and the connection closed; 100 headers are fine."""
    lines = b"".join(b"X-H%d: 1\r\n" % k for k in range(500))  # 5 KB: under the byte cap
    got, closed = _raw(sidecar.url, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + lines)
    assert got.startswith(b"HTTP/1.1 431 "), got[:80]
    assert b"more than 100 header fields" in got and closed
    ok = httpx.get(sidecar.url + "/healthz", headers={f"x-h{k}": "1" for k in range(95)})
    assert ok.status_code == 200


@pytest.mark.e2e
def test_a_malformed_request_is_answered_in_json(sidecar: Sidecar) -> None:
    got, closed = _raw(
        sidecar.url,
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"zz\r\nhello\r\n0\r\n\r\n",
    )
    assert got.startswith(b"HTTP/1.1 400 "), got[:80]
    assert b"application/json" in got and b'"error"' in got and closed


@pytest.mark.e2e
def test_past_the_connection_limit_the_503_is_in_the_clients_shape() -> None:
    settings = Settings(
        upstreams={"openai": {"base_url": "http://127.0.0.1:9/v1"}},
        limits={"max_connections": 2},
    )
    app = create_app(settings)
    with serve(app, **uvicorn_options(settings)) as url:
        host, port = url.removeprefix("http://").split(":")
        with (
            socket.create_connection((host, int(port))),
            socket.create_connection((host, int(port))),
        ):
            time.sleep(0.2)  # both held open: the next request is past the limit
            r = httpx.post(
                url + "/v1/messages",
                json={"model": "claude-x", "max_tokens": 5, "messages": MSG},
                headers={"anthropic-version": "2023-06-01"},
            )
    assert r.status_code == 503
    assert r.json()["type"] == "error" and r.json()["error"]["type"]  # Anthropic's shape


@pytest.mark.e2e
def test_an_untyped_responses_item_with_non_object_parts_is_a_400(sidecar: Sidecar) -> None:
    """Found by the fuzz: an input item with neither type nor role is a message to the count,
    so its parts are checked as a message's are."""
    body = {"model": "gpt-4o", "input": [{"content": ["data:,", None]}]}
    r = httpx.post(sidecar.url + "/v1/responses", json=body)
    assert r.status_code == 400 and "input[0].content[0]" in r.json()["error"]["message"]


@pytest.mark.e2e
def test_a_credential_in_the_url_is_never_echoed(sidecar: Sidecar) -> None:
    """Error messages never repeat a key the client sent (a Gemini client's ``?key=``)."""
    key = "AIzaSyD" + "x" * 32
    r = httpx.post(
        sidecar.url + f"/v1beta/models/gemini-x:generateContent?key={key}",
        json={"contents": "not an array", "note": f"key={key}"},
    )
    assert r.status_code == 400 and key not in r.text
    from context_ceiling.sidecar.errors import scrub

    assert key not in scrub(f"model {key!r} and ?key={key}&alt=sse")


@pytest.mark.e2e
def test_at_shutdown_a_request_still_arriving_is_answered_and_idle_connections_close() -> None:
    """uvicorn's shutdown closes every connection with no response under way: a request sent
    on a connection accepted a moment earlier, or half of whose head is in, would be dropped.
    Those are answered (and closed after); a connection idle between requests is closed at once,
    and one that never sends a byte does not hold the shutdown past a second."""
    import threading

    import uvicorn

    from testkit.doubles.hosted_provider import HostedProviderDouble

    body = json.dumps({"model": "gpt-4o", "messages": MSG}).encode()
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"authorization: Bearer sk-test\r\ncontent-length: %d\r\n\r\n" % len(body)
    )
    with serve(HostedProviderDouble().app()) as durl:
        settings = Settings(upstreams={"openai": {"base_url": durl + "/v1"}}, models=MODELS)
        config = uvicorn.Config(
            create_app(settings),
            host="127.0.0.1",
            port=0,
            lifespan="on",
            **uvicorn_options(settings),
        )
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive()
            time.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        fresh, half, idle, silent = (
            socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(4)
        )
        half.sendall(head[:20])
        idle.sendall(head + body)
        first = idle.recv(65536)
        assert first.startswith(b"HTTP/1.1 200 "), first[:80]
        time.sleep(0.2)  # every connection accepted and its bytes read

        began = time.monotonic()
        server.should_exit = True
        time.sleep(0.4)  # the shutdown has begun: the listener is closed
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=2)
        assert idle.recv(65536) == b"", "an idle keep-alive connection is closed at once"

        for conn, rest in ((fresh, head + body), (half, head[20:] + body)):
            conn.sendall(rest)
            got = b""
            while chunk := conn.recv(65536):
                got += chunk
            assert got.startswith(b"HTTP/1.1 200 "), got[:80]
            assert b"connection: close" in got.lower() and b'"choices"' in got
        thread.join(timeout=10)
        assert not thread.is_alive()
        assert silent.recv(65536) == b"", "a silent connection is closed"
        assert time.monotonic() - began < 3.0, "a silent connection does not hold the shutdown"
        for s in (fresh, half, idle, silent):
            s.close()


@pytest.mark.e2e
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
@pytest.mark.parametrize("server_class", ["sidecar", "uvicorn"])
def test_at_shutdown_connections_queued_in_the_kernel_are_answered(
    server_class: str, loop: str
) -> None:
    """Connections the kernel completed into the listener's accept queue before the event loop
    accepted them are taken at the shutdown and answered, not reset when the listener closes
    (uvicorn's own server resets them: the second case shows the test can fail), on asyncio's
    loop and on uvloop's (``ceiling serve`` runs on uvloop)."""
    import asyncio

    import uvicorn

    from context_ceiling.sidecar.server import SidecarServer

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        headers = [(b"content-length", b"8")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"answered"})

    settings = Settings(upstreams={"openai": {"base_url": "http://127.0.0.1:9/v1"}})
    request = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"

    def read_all(conn: socket.socket) -> bytes:
        conn.settimeout(10)
        out = b""
        try:
            while chunk := conn.recv(65536):
                out += chunk
        except ConnectionResetError:
            out += b"<reset>"
        return out

    async def run() -> list[bytes]:
        config = uvicorn.Config(
            app, host="127.0.0.1", port=0, lifespan="on", **uvicorn_options(settings)
        )
        config.load()
        kind = SidecarServer if server_class == "sidecar" else uvicorn.Server
        server = kind(config)
        server.lifespan = config.lifespan_class(config)
        await server.startup()
        port = server.servers[0].sockets[0].getsockname()[1]
        # the event loop does not run between these connects and the shutdown's first step:
        # the kernel completes every handshake and holds the connections in the accept queue
        clients = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(4)]
        for c in clients:
            c.sendall(request)
        loop = asyncio.get_running_loop()
        reads = [loop.run_in_executor(None, read_all, c) for c in clients]
        await server.shutdown()
        answers = list(await asyncio.gather(*reads))
        for c in clients:
            c.close()
        return answers

    if loop == "uvloop":
        import uvloop

        answers = uvloop.run(run())
    else:
        answers = asyncio.run(run())
    answered = [a.startswith(b"HTTP/1.1 200 ") and a.endswith(b"answered") for a in answers]
    if server_class == "sidecar":
        assert all(answered), answers
    else:
        assert not any(answered), answers


def test_a_batch_s_request_lines_leave_in_one_write(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Inside ``one_write`` (a batch of records) request lines are held and written together at
    its end, in order, in one write; a nested one leaves the writing to the outer; outside it
    each line is written at once."""
    _restored_after(monkeypatch)
    configure("info")
    writes: list[str] = []
    assert logs._handler is not None
    stream = logs._handler.stream

    class Counted:
        def write(self, text: str) -> int:
            writes.append(text)
            return int(stream.write(text))

        def flush(self) -> None:
            stream.flush()

    monkeypatch.setattr(logs._handler, "stream", Counted())
    with one_write():
        log_request({"request_id": "r1"})
        with one_write():
            log_request({"request_id": "r2"})
        assert writes == []
        log_request({"request_id": "r3"})
    assert len(writes) == 1
    assert [json.loads(x)["request_id"] for x in writes[0].splitlines()] == ["r1", "r2", "r3"]
    log_request({"request_id": "r4"})
    assert len(writes) == 2 and json.loads(writes[1])["request_id"] == "r4"
