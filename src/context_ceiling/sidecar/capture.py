"""Traffic capture: sample live requests into the capture store (``capture.enabled``).

The request path only decides whether a request is sampled and keeps references to what it
already holds (the parsed body, the response bytes or a stream's events); extraction, redaction
and the SQLite write happen on one writer thread behind a bounded queue, so a slow disk never
slows a request (a full queue drops the capture and counts it). What is written: the request's
shape (system prompt, retrieved chunks in rank order, tool definitions, the latest user question)
and the response text, usage, model and finish reason, after redaction: built-in patterns for
API keys and bearer tokens, your patterns, and your JSON fields. Headers are never read.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import random
import re
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from context_ceiling.core.capture import CaptureRecord, CaptureStore, CaptureStoreError, Chunk
from context_ceiling.core.wire import Shape
from context_ceiling.sidecar.config import Capture
from context_ceiling.sidecar.metrics import Metrics
from context_ceiling.sidecar.relay import Tap
from context_ceiling.sidecar.usage import Usage

log = logging.getLogger("context_ceiling.sidecar.capture")

REDACTED = "[REDACTED]"
#: secrets that must never be stored, whatever the configuration says
BUILTIN_PATTERNS = (
    r"sk-(?:ant-|proj-|svcacct-)?[A-Za-z0-9_\-]{16,}",  # OpenAI / Anthropic keys
    r"AIza[0-9A-Za-z_\-]{30,}",  # Google API keys
    r"AKIA[0-9A-Z]{16}",  # AWS access key ids
    r"[Bb][Ee][Aa][Rr][Ee][Rr]\s+[A-Za-z0-9._~+/=\-]{12,}",
    r"eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}",  # JWTs
    r"gh[pousr]_[A-Za-z0-9]{30,}",  # GitHub tokens
    r"xox[abposr]-[A-Za-z0-9\-]{10,}",  # Slack tokens
)
_DOC_ID = re.compile(r"""<document\b[^>]*\bid=["']([^"']+)["']""")
_DOC_BODY = re.compile(r"^<document\b[^>]*>(.*)</document>$", re.S)
QUEUE_SIZE = 1000
ROTATE_EVERY_S = 60.0


def hostname_path(path: Path) -> Path:
    return Path(str(path).replace("{hostname}", socket.gethostname()))


# -- extraction: the request's shape, per wire format -------------------------------------------


@dataclass
class Extract:
    system: str = ""
    tools: str = ""
    question: str = ""
    chunks: list[tuple[str, str | None]] | None = None


def _text(content: Any) -> str:
    """The text of a message content: a string, or the text parts of a list of blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for b in content:
            if isinstance(b, str):
                out.append(b)
            elif isinstance(b, Mapping):
                t = b.get("text")
                if isinstance(t, str) and b.get("type") in (None, "text", "input_text"):
                    out.append(t)
        return "\n".join(out)
    return ""


def _documents(content: Any) -> list[tuple[str, str | None]]:
    """Anthropic ``document`` blocks with plain text sources: retrieved chunks as blocks."""
    out: list[tuple[str, str | None]] = []
    if isinstance(content, list):
        for b in content:
            if isinstance(b, Mapping) and b.get("type") == "document":
                src = b.get("source")
                if isinstance(src, Mapping) and isinstance(src.get("data"), str):
                    title = b.get("title")
                    out.append((src["data"], title if isinstance(title, str) else None))
    return out


def _last(messages: Any, roles: tuple[str, ...]) -> Any:
    if isinstance(messages, list):
        for m in reversed(messages):
            if isinstance(m, Mapping) and m.get("role") in roles:
                return m.get("content") if "content" in m else m.get("parts")
    return None


def extract(
    shape: Shape, body: Mapping[str, Any], chunk_pattern: re.Pattern[str] | None
) -> Extract:
    """System prompt, tool definitions, latest user question and retrieved chunks (rank order:
    as they appear) of one request body."""
    ex = Extract()
    chunks: list[tuple[str, str | None]] = []
    if shape == "openai":
        msgs = body.get("messages")
        if isinstance(msgs, list):
            ex.system = "\n".join(
                _text(m.get("content"))
                for m in msgs
                if isinstance(m, Mapping) and m.get("role") in ("system", "developer")
            )
        user = _text(_last(msgs, ("user",)))
        tools = body.get("tools")
    elif shape == "anthropic":
        sys_ = body.get("system")
        ex.system = sys_ if isinstance(sys_, str) else _text(sys_)
        content = _last(body.get("messages"), ("user",))
        user = _text(content)
        chunks += _documents(content)
        tools = body.get("tools")
    elif shape == "responses":
        ins = body.get("instructions")
        ex.system = ins if isinstance(ins, str) else ""
        inp = body.get("input")
        user = inp if isinstance(inp, str) else _text(_last(inp, ("user",)))
        tools = body.get("tools")
    else:  # gemini
        si = body.get("systemInstruction") or body.get("system_instruction")
        ex.system = _text(si.get("parts")) if isinstance(si, Mapping) else ""
        user = _text(_last(body.get("contents"), ("user",)))
        tools = body.get("tools")
    if chunk_pattern is not None and user:
        found = [(m.start(), m.end(), m.group(0)) for m in chunk_pattern.finditer(user)]
        for _, _, raw in found:
            idm = _DOC_ID.search(raw)
            inner = _DOC_BODY.match(raw)
            chunks.append(
                ((inner.group(1) if inner else raw).strip(), idm.group(1) if idm else None)
            )
        for start, end, _ in reversed(found):
            user = user[:start] + user[end:]
    ex.question = re.sub(r"\n{3,}", "\n\n", user).strip()
    ex.tools = json.dumps(tools, sort_keys=True) if tools else ""
    ex.chunks = chunks
    return ex


# -- the response text, whole or streamed -------------------------------------------------------


def _events(raw: bytes) -> list[Any]:
    out = []
    for line in raw.split(b"\n"):
        if line.startswith(b"data:"):
            data = line[5:].strip()
            if data and data != b"[DONE]":
                with contextlib.suppress(ValueError):
                    out.append(json.loads(data))
    return out


def response_text(shape: Shape, raw: bytes, stream: bool) -> tuple[str, str | None]:
    """(the answer's text, its finish reason) from a response body or a stream's events."""
    parts: list[str] = []
    finish: str | None = None
    objs = _events(raw) if stream else [json.loads(raw)] if raw else []
    for o in objs:
        if not isinstance(o, Mapping):
            continue
        if shape == "openai":
            for c in o.get("choices") or []:
                if isinstance(c, Mapping):
                    msg = c.get("delta") if stream else c.get("message")
                    if isinstance(msg, Mapping) and isinstance(msg.get("content"), str):
                        parts.append(msg["content"])
                    finish = c.get("finish_reason") or finish
        elif shape == "anthropic":
            if stream:
                d = o.get("delta")
                if isinstance(d, Mapping):
                    if d.get("type") == "text_delta" and isinstance(d.get("text"), str):
                        parts.append(d["text"])
                    finish = d.get("stop_reason") or finish
            else:
                parts.append(_text(o.get("content")))
                finish = o.get("stop_reason")
        elif shape == "responses":
            if stream:
                if o.get("type") == "response.output_text.delta" and isinstance(
                    o.get("delta"), str
                ):
                    parts.append(o["delta"])
                if o.get("type") == "response.completed":
                    finish = "completed"
            else:
                for item in o.get("output") or []:
                    if isinstance(item, Mapping) and item.get("type") == "message":
                        parts.append(
                            "".join(
                                c.get("text", "")
                                for c in item.get("content") or []
                                if isinstance(c, Mapping) and c.get("type") == "output_text"
                            )
                        )
                finish = o.get("status")
        else:
            for c in o.get("candidates") or []:
                if isinstance(c, Mapping):
                    content = c.get("content")
                    if isinstance(content, Mapping):
                        parts.append(_text(content.get("parts")))
                    finish = c.get("finishReason") or finish
    return "".join(parts), finish


class CollectingTap:
    """A stream tap that also keeps the events (up to ``limit`` bytes) of a sampled stream; every
    other stream gets the bare tap."""

    def __init__(self, inner: Tap, limit: int) -> None:
        self.inner = inner
        self.limit = limit
        self.events: list[bytes] = []
        self._size = 0

    @property
    def usage(self) -> Usage:
        return self.inner.usage

    @property
    def complete(self) -> bool:
        return self.inner.complete

    @property
    def upstream_error(self) -> bool:
        return self.inner.upstream_error

    def on_event(self, event: bytes) -> bytes | None:
        if self._size < self.limit:
            self.events.append(event)
            self._size += len(event)
        return self.inner.on_event(event)

    def error_event(self, message: str) -> bytes:
        return self.inner.error_event(message)


# -- redaction ----------------------------------------------------------------------------------


class Redactor:
    def __init__(
        self, patterns: list[str], fields: list[str], count: Callable[[str, int], None]
    ) -> None:
        self.builtin = re.compile("|".join(f"(?:{p})" for p in BUILTIN_PATTERNS))
        self.custom = re.compile("|".join(f"(?:{p})" for p in patterns)) if patterns else None
        self.fields = frozenset(fields)
        self._count = count

    def text(self, s: str) -> tuple[str, int]:
        s, a = self.builtin.subn(REDACTED, s)
        b = 0
        if self.custom is not None:
            s, b = self.custom.subn(REDACTED, s)
        if a:
            self._count("builtin", a)
        if b:
            self._count("pattern", b)
        return s, a + b

    def body(self, obj: Any) -> tuple[Any, int]:
        """``obj`` with the values of the configured fields replaced, at any depth."""
        out, n = self._body(obj)
        if n:
            self._count("field", n)
        return out, n

    def _body(self, obj: Any) -> tuple[Any, int]:
        n = 0
        if isinstance(obj, Mapping):
            out: dict[str, Any] = {}
            for k, v in obj.items():
                if k in self.fields:
                    out[k] = REDACTED
                    n += 1
                else:
                    out[k], m = self._body(v)
                    n += m
            return out, n
        if isinstance(obj, list):
            items = []
            for v in obj:
                r, m = self._body(v)
                items.append(r)
                n += m
            return items, n
        return obj, 0


# -- the capturer -------------------------------------------------------------------------------


@dataclass
class Pending:
    """A sampled exchange, as the request path hands it over (references, no copies)."""

    ts: float
    workload: str
    model: str
    request_model: str
    api: str
    shape: Shape
    body: Mapping[str, Any]
    response: bytes
    stream: bool
    usage: Usage


class Capturer:
    def __init__(
        self, cfg: Capture, metrics: Metrics, chunk_pattern: re.Pattern[str] | None
    ) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self.chunk_pattern = chunk_pattern
        self.path = hostname_path(cfg.store)
        # opened (and checked) now: a store that is corrupt or another version stops startup
        # with one line, instead of failing every write later
        CaptureStore.open(self.path, create=True).close()
        self.redactor = Redactor(
            cfg.redact.patterns,
            cfg.redact.fields,
            lambda rule, n: metrics.capture_redactions.labels(rule=rule).inc(n),
        )
        self._queue: queue.Queue[Pending | None] = queue.Queue(QUEUE_SIZE)
        self._thread: threading.Thread | None = None

    def sample(self, workload: str, request_bytes: int) -> bool:
        rate = self.cfg.rate(workload)
        if rate <= 0 or random.random() >= rate:
            return False
        if request_bytes > self.cfg.max_request_bytes:
            self.metrics.capture_dropped.labels(reason="too_large").inc()
            return False
        return True

    def submit(self, p: Pending) -> None:
        try:
            self._queue.put_nowait(p)
        except queue.Full:
            self.metrics.capture_dropped.labels(reason="queue_full").inc()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="capture-writer", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout)
            self._thread = None

    def record(self, p: Pending) -> CaptureRecord:
        body, n = self.redactor.body(p.body)
        ext = extract(p.shape, body, self.chunk_pattern)
        system, a = self.redactor.text(ext.system)
        tools, b = self.redactor.text(ext.tools)
        question, c = self.redactor.text(ext.question)
        n += a + b + c
        chunks = []
        for rank, (text, source) in enumerate(ext.chunks or []):
            t, m = self.redactor.text(text)
            n += m
            chunks.append(Chunk(rank=rank, text=t, source_id=source))
        answer: str | None = None
        finish: str | None = None
        try:
            answer, finish = response_text(p.shape, p.response, p.stream)
        except ValueError:
            answer = None
        if answer is not None:
            answer, m = self.redactor.text(answer[: self.cfg.max_response_chars])
            n += m
        return CaptureRecord(
            ts=p.ts,
            workload=p.workload,
            model=p.model,
            request_model=p.request_model,
            api=p.api,
            system=system,
            tools=tools,
            question=question,
            chunks=chunks,
            response=answer,
            response_model=p.usage.response_model,
            finish_reason=finish,
            input_tokens=p.usage.input_tokens,
            output_tokens=p.usage.output_tokens,
            stream=p.stream,
            redactions=n,
        )

    def _run(self) -> None:
        try:
            store = CaptureStore.open(self.path, create=True)
        except CaptureStoreError as exc:
            log.error("capture store unusable", extra={"fields": {"error": str(exc)}})
            return
        last_rotate = 0.0
        try:
            while True:
                p = self._queue.get()
                if p is None:
                    return
                batch = [p]
                while len(batch) < 100:  # what queued meanwhile: one transaction
                    try:
                        nxt = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if nxt is None:
                        self._queue.put(None)
                        break
                    batch.append(nxt)
                try:
                    records = [self.record(x) for x in batch]
                    store.add(records)
                    for r in records:
                        self.metrics.captured.labels(workload=r.workload).inc()
                    now = time.monotonic()
                    if now - last_rotate > ROTATE_EVERY_S:
                        last_rotate = now
                        self.rotate(store)
                except Exception:  # a capture must never take the writer down
                    self.metrics.capture_dropped.labels(reason="store_error").inc(len(batch))
                    log.exception("capture write failed")
        finally:
            store.close()

    def rotate(self, store: CaptureStore) -> None:
        dropped = store.rotate(int(self.cfg.max_store_mib * 2**20), self.cfg.max_age_hours * 3600.0)
        if dropped:
            self.metrics.capture_dropped.labels(reason="rotated").inc(dropped)
