"""Traffic capture: the sidecar samples live requests into the capture store, per workload,
capped, redacted before writing; the store rotates, and a store that is corrupt or another
version is refused with one line. The upstream is the hosted-provider test double; the clients
are the official SDKs."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import anthropic
import openai
import pytest
import yaml

from context_ceiling.core.capture import (
    APPLICATION_ID,
    CaptureRecord,
    CaptureStore,
    CaptureStoreError,
)
from tests.conftest import Running

KEY = "sk-proj-CAPTURETESTKEY0123456789abcdef"
IN_BODY_SECRET = "sk-live-INBODYSECRET0123456789"
DOCS = (
    '<document id="kb-17">The refund window is 30 days from delivery.</document>\n'
    '<document id="kb-4">Refunds are paid to the original payment method.</document>\n'
)


#: this module's sidecars run in process (see tests/conftest.py), but for tests marked e2e
IN_PROCESS = True


def _store(tmp_path: Path) -> Path:
    return tmp_path / "capture-{hostname}.sqlite"


def _records(tmp_path: Path, n: int, timeout: float = 10.0) -> list[CaptureRecord]:
    [path] = list(tmp_path.glob("capture-*.sqlite"))
    deadline = time.monotonic() + timeout
    while True:
        try:
            store = CaptureStore.open(path)
        except CaptureStoreError:  # the writer is creating it (again) right now
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
            continue
        try:
            recs = list(store.records())
        finally:
            store.close()
        if len(recs) >= n or time.monotonic() > deadline:
            return recs
        time.sleep(0.05)


@pytest.fixture
def capturing(make_sidecar: Callable[..., Running], tmp_path: Path) -> Running:
    return make_sidecar(
        capture={
            "enabled": True,
            "store": str(_store(tmp_path)),
            "sample_rate": 0.0,  # default workload: never
            "workloads": {"rag": {"sample_rate": 1.0}},
            "redact": {
                "patterns": [r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+"],
                "fields": ["user", "metadata"],
            },
        }
    )


@pytest.mark.e2e
def test_captures_the_shape_and_the_answer_per_workload_redacted(
    capturing: Running, tmp_path: Path
) -> None:
    sc = capturing
    oa = openai.OpenAI(
        base_url=sc.url + "/v1",
        api_key=KEY,
        max_retries=0,
        default_headers={"x-ceiling-workload": "rag"},
    )
    messages = [
        {
            "role": "system",
            "content": "You answer from the knowledge base. Contact ops@example.com.",
        },
        {"role": "user", "content": "earlier question"},
        {"role": "assistant", "content": "earlier answer"},
        {
            "role": "user",
            "content": DOCS + f"How long is the refund window? token {IN_BODY_SECRET}",
        },
    ]
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    oa.chat.completions.create(
        model="gpt-4o",
        messages=messages,  # type: ignore[arg-type]
        tools=tools,  # type: ignore[arg-type]
        user="alice@example.com",
    )
    stream = oa.chat.completions.create(model="gpt-4o", messages=messages, stream=True)  # type: ignore[arg-type]
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)  # type: ignore[union-attr]
    an = anthropic.Anthropic(
        base_url=sc.url, api_key=KEY, max_retries=0, default_headers={"x-ceiling-workload": "rag"}
    )
    an.messages.create(
        model="claude-3-5-sonnet-latest",
        max_tokens=50,
        system="Answer briefly.",
        messages=[
            {
                "role": "user",
                "content": [
                    {
                        "type": "document",
                        "source": {
                            "type": "text",
                            "media_type": "text/plain",
                            "data": "Shipping takes 3 days.",
                        },
                        "title": "kb-9",
                    },
                    {"type": "text", "text": "How long does shipping take?"},
                ],
            }
        ],
    )
    # the default workload samples nothing
    sc.openai(api_key=KEY, max_retries=0).chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "not captured"}]
    )
    recs = _records(tmp_path, 3)
    assert len(recs) == 3 and {r.workload for r in recs} == {"rag"}
    first, second, third = recs
    assert first.api == "openai_chat" and first.model == "gpt-4o" and not first.stream
    assert first.system == "You answer from the knowledge base. Contact [REDACTED]."
    assert [(c.rank, c.source_id) for c in first.chunks] == [(0, "kb-17"), (1, "kb-4")]
    assert first.chunks[0].text == "The refund window is 30 days from delivery."
    assert first.question == "How long is the refund window? token [REDACTED]"
    assert '"lookup"' in first.tools
    assert first.response and first.finish_reason and first.input_tokens and first.output_tokens
    assert first.redactions >= 3  # the e-mail, the in-body token, the `user` field
    assert second.stream and second.response == streamed and second.finish_reason == "stop"
    assert third.api == "anthropic_messages" and third.system == "Answer briefly."
    assert [(c.text, c.source_id) for c in third.chunks] == [("Shipping takes 3 days.", "kb-9")]
    assert third.question == "How long does shipping take?" and third.response
    assert sc.sample("llm_context_captured_total", workload="rag") == 3
    assert (sc.sample("llm_context_capture_redactions_total", rule="builtin") or 0) >= 2
    assert (sc.sample("llm_context_capture_redactions_total", rule="pattern") or 0) >= 2
    assert (sc.sample("llm_context_capture_redactions_total", rule="field") or 0) >= 1
    # nothing captured ever contains a key: neither the one in the header nor the one in a message
    files = list(tmp_path.glob("capture-*"))
    raw = b"".join(p.read_bytes() for p in files)
    assert raw and KEY.encode() not in raw and IN_BODY_SECRET.encode() not in raw
    assert b"alice@example.com" not in raw and b"ops@example.com" not in raw


def test_too_large_and_bypass_are_not_captured(
    make_sidecar: Callable[..., Running], tmp_path: Path
) -> None:
    sc = make_sidecar(
        capture={
            "enabled": True,
            "store": str(_store(tmp_path)),
            "sample_rate": 1.0,
            "max_request_bytes": 2048,
        }
    )
    oa = sc.openai(api_key=KEY, max_retries=0)
    oa.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x" * 5000}])
    oa.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "small"}])
    recs = _records(tmp_path, 1)
    assert [r.question for r in recs] == ["small"]
    assert sc.sample("llm_context_capture_dropped_total", reason="too_large") == 1


def test_rotation_by_age_and_size(tmp_path: Path) -> None:
    store = CaptureStore.open(tmp_path / "s.sqlite", create=True)
    now = time.time()
    old = [
        CaptureRecord(
            ts=now - 7200, workload="w", model="m", request_model="m", api="a", question="old"
        )
    ]
    new = [
        CaptureRecord(
            ts=now - i,
            workload="w",
            model="m",
            request_model="m",
            api="a",
            question=f"q{i}" + "x" * 1000,
        )
        for i in range(20, 0, -1)
    ]
    store.add(old + new)
    assert store.rotate(max_bytes=10**9, max_age_s=3600, now=now) == 1
    assert len(store) == 20
    dropped = store.rotate(max_bytes=5 * 1100, max_age_s=3600, now=now)
    assert dropped >= 15 and len(store) <= 5
    kept = [r.question.rstrip("x") for r in store.records()]
    assert kept[-1] == "q1"  # the newest stay
    store.close()


def _check(tmp_path: Path, store: Path) -> subprocess.CompletedProcess[str]:
    cfg = tmp_path / "sidecar.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "upstreams": {"openai": {"base_url": "http://127.0.0.1:9/v1"}},
                "capture": {"enabled": True, "store": str(store), "sample_rate": 0.1},
            }
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("CEILING_")}
    return subprocess.run(
        [sys.executable, "-m", "context_ceiling.cli", "serve", "--config", str(cfg), "--check"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (
            lambda p: p.write_bytes(b"this is not sqlite at all" * 100),
            "not a readable capture store",
        ),
        (
            lambda p: sqlite3.connect(p).execute("CREATE TABLE other (x)").connection.commit(),
            "not a context-ceiling capture store",
        ),
        (
            lambda p: sqlite3.connect(p).executescript(
                f"PRAGMA application_id = {APPLICATION_ID}; PRAGMA user_version = 2;"
                "CREATE TABLE captures (x);"
            ),
            "capture store format version 2",
        ),
    ],
)
@pytest.mark.e2e
def test_a_corrupt_or_foreign_store_is_refused_in_one_line(
    tmp_path: Path, make: Callable[[Path], object], needle: str
) -> None:
    path = tmp_path / "capture.sqlite"
    make(path)
    with pytest.raises(CaptureStoreError, match=needle):
        CaptureStore.open(path)
    r = _check(tmp_path, path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and needle in r.stderr, (
        r.stderr
    )
    r = _check(tmp_path, tmp_path / "fresh.sqlite")
    assert r.returncode == 0 and "capture on" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize(
    ("shape", "body", "system", "question", "chunks"),
    [
        (
            "responses",
            {
                "instructions": "Be brief.",
                "input": [
                    {"role": "user", "content": [{"type": "input_text", "text": DOCS + "Refunds?"}]}
                ],
            },
            "Be brief.",
            "Refunds?",
            ["kb-17", "kb-4"],
        ),
        (
            "gemini",
            {
                "systemInstruction": {"parts": [{"text": "Be brief."}]},
                "contents": [{"role": "user", "parts": [{"text": DOCS + "Refunds?"}]}],
            },
            "Be brief.",
            "Refunds?",
            ["kb-17", "kb-4"],
        ),
        (
            "anthropic",
            {
                "system": [{"type": "text", "text": "Be brief."}],
                "messages": [{"role": "user", "content": "Refunds?"}],
            },
            "Be brief.",
            "Refunds?",
            [],
        ),
    ],
)
def test_extract_every_wire_format(
    shape: str, body: dict[str, object], system: str, question: str, chunks: list[str]
) -> None:
    import re as _re

    from context_ceiling.core.counting import DEFAULT_CHUNK_PATTERN
    from context_ceiling.sidecar.capture.extract import extract

    ex = extract(shape, body, _re.compile(DEFAULT_CHUNK_PATTERN))
    assert (ex.system, ex.question) == (system, question)
    assert [src for _, src in ex.chunks or []] == chunks


@pytest.mark.parametrize(
    ("shape", "raw", "stream", "text", "finish"),
    [
        (
            "anthropic",
            b'event: content_block_delta\ndata: {"type":"content_block_delta","delta":{"type":"text_delta","text":"30 "}}\n\n'
            b'event: content_block_delta\ndata: {"type":"content_block_delta","delta":{"type":"text_delta","text":"days"}}\n\n'
            b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"}}\n\n',
            True,
            "30 days",
            "end_turn",
        ),
        (
            "responses",
            b'data: {"type":"response.output_text.delta","delta":"30 days"}\n\n'
            b'data: {"type":"response.completed","response":{}}\n\n',
            True,
            "30 days",
            "completed",
        ),
        (
            "responses",
            b'{"status":"completed","output":[{"type":"message","content":[{"type":"output_text","text":"30 days"}]}]}',
            False,
            "30 days",
            "completed",
        ),
        (
            "gemini",
            b'data: {"candidates":[{"content":{"parts":[{"text":"30 "}]}}]}\n\n'
            b'data: {"candidates":[{"content":{"parts":[{"text":"days"}]},"finishReason":"STOP"}]}\n\n',
            True,
            "30 days",
            "STOP",
        ),
    ],
)
def test_response_text_every_wire_format(
    shape: str, raw: bytes, stream: bool, text: str, finish: str
) -> None:
    from context_ceiling.sidecar.capture.extract import response_text

    assert response_text(shape, raw, stream) == (text, finish)


@pytest.mark.e2e
def test_a_store_deleted_under_the_writer_is_reopened_and_the_loss_counted(
    capturing: Running, tmp_path: Path
) -> None:
    sc = capturing
    oa = openai.OpenAI(
        base_url=sc.url + "/v1",
        api_key=KEY,
        max_retries=0,
        default_headers={"x-ceiling-workload": "rag"},
    )
    ask = [{"role": "user", "content": DOCS + "How long is the refund window?"}]
    oa.chat.completions.create(model="gpt-4o", messages=ask)  # type: ignore[arg-type]
    assert len(_records(tmp_path, 1)) == 1
    [path] = list(tmp_path.glob("capture-*.sqlite"))
    for extra in tmp_path.glob("capture-*.sqlite*"):
        extra.unlink()  # an operator (or a full-disk cleanup) removes the store
    oa.chat.completions.create(model="gpt-4o", messages=ask)  # type: ignore[arg-type]
    deadline = time.monotonic() + 10
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    recs = _records(tmp_path, 1)
    assert len(recs) == 1  # the new file holds what came after
    assert sc.sample("llm_context_capture_dropped_total", reason="store_lost") == 1
