"""Traffic capture: sample live requests into the capture store (``capture.enabled``).

The request path only decides whether a request is sampled and keeps references to what it
already holds (the parsed body, the response bytes or a stream's reads); extraction, redaction
and the SQLite write happen on one writer thread behind a bounded queue, so a slow disk never
slows a request (a full queue drops the capture and counts it). What is written: the request's
shape (system prompt, retrieved chunks in rank order, tool definitions, the latest user question)
and the response text, usage, model and finish reason, after redaction: built-in patterns for
API keys and bearer tokens, your patterns, and your JSON fields. Headers are never read.
"""

from __future__ import annotations

import logging
import os
import queue
import random
import re
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from context_ceiling.core.capture import CaptureRecord, CaptureStore, CaptureStoreError, Chunk
from context_ceiling.formats.base import Format, Usage
from context_ceiling.sidecar.capture.extract import extract, response_text
from context_ceiling.sidecar.capture.redact import Redactor
from context_ceiling.sidecar.config import Capture
from context_ceiling.sidecar.observability.answers import HeldBytes
from context_ceiling.sidecar.observability.metrics import Metrics

log = logging.getLogger(__name__)

QUEUE_SIZE = 1000
ROTATE_EVERY_S = 60.0


def hostname_path(path: Path) -> Path:
    return Path(str(path).replace("{hostname}", socket.gethostname()))


class Collector:
    """Keeps the upstream reads (up to ``limit`` bytes) of a stream that is captured or checked
    for answer signals: references to the relayed bytes, no copies, one per read (joined, they
    are the stream as the upstream sent it). ``overflow``: the stream was longer than ``limit``.
    Every other stream keeps nothing."""

    def __init__(self, limit: int, held: HeldBytes | None = None) -> None:
        self.limit = limit
        #: the bytes every stream keeps at once, bounded (answers.max_held_mib); what this one
        #: kept is given back by its owner when the stream ends
        self.held = held
        self.reads: list[bytes] = []
        self._size = 0
        self.overflow = False

    def keep(self, raw: bytes) -> None:
        """Keep one upstream read, while the stream stays within ``limit`` and the held bytes
        within theirs."""
        if self.overflow:
            return
        if self._size < self.limit and (self.held is None or self.held.take(len(raw))):
            self.reads.append(raw)
            self._size += len(raw)
        else:
            self.overflow = True

    @property
    def size(self) -> int:
        return self._size


# -- the capturer -------------------------------------------------------------------------------


@dataclass
class Pending:
    """A sampled exchange, as the request path hands it over (references, no copies)."""

    ts: float
    workload: str
    model: str
    request_model: str
    api: str
    #: the route's format
    shape: Format
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
        self._written = 0  # records the writer put in the store file it has open
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

    def _identity(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_dev, st.st_ino

    def _reopen_if_gone(self, store: CaptureStore, identity: tuple[int, int] | None) -> Any:
        """The store, opened again when its file was deleted or replaced under the writer
        (writes would go on into an unlinked file, lost silently); what the lost file held
        from this writer is counted as dropped (``store_lost``)."""
        now = self._identity()
        if now is not None and now == identity:
            return store, identity
        lost = self._written
        store.close()
        try:
            store = CaptureStore.open(self.path, create=True)
        except CaptureStoreError as exc:
            log.error("capture store unusable", extra={"fields": {"error": str(exc)}})
            return None, None
        if lost:
            self.metrics.capture_dropped.labels(reason="store_lost").inc(lost)
        log.warning(
            "capture store file was removed or replaced; reopened",
            extra={"fields": {"path": str(self.path), "lost_records": lost}},
        )
        self._written = 0
        return store, self._identity()

    def _run(self) -> None:
        try:
            store = CaptureStore.open(self.path, create=True)
        except CaptureStoreError as exc:
            log.error("capture store unusable", extra={"fields": {"error": str(exc)}})
            return
        identity = self._identity()
        self._written = 0
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
                store, identity = self._reopen_if_gone(store, identity)
                if store is None:
                    self.metrics.capture_dropped.labels(reason="store_error").inc(len(batch))
                    return
                try:
                    records = [self.record(x) for x in batch]
                    store.add(records)
                    self._written += len(records)
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
            if store is not None:
                store.close()

    def rotate(self, store: CaptureStore) -> None:
        dropped = store.rotate(int(self.cfg.max_store_mib * 2**20), self.cfg.max_age_hours * 3600.0)
        if dropped:
            self.metrics.capture_dropped.labels(reason="rotated").inc(dropped)
