"""One :class:`Exchange`: everything known about a proxied request (its route, from
:mod:`context_ceiling.formats`), which :mod:`context_ceiling.sidecar.observability.record` turns into headers,
a log line, metrics, staleness and a span."""

from __future__ import annotations

import asyncio
import enum
import os
import random
import re
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.trace import Span

from context_ceiling.ceilings.document import EMPTY, CeilingsDocument
from context_ceiling.core.counting import RequestCount
from context_ceiling.core.models import OTHER, ModelSpec
from context_ceiling.formats.base import Expect, Route, Usage
from context_ceiling.sidecar.enforce import Decision
from context_ceiling.sidecar.outcomes import Outcome


class Schedule(enum.Enum):
    """When a request is counted: one decision per request, taken before anything is counted."""

    #: before forwarding, on the event loop (a short body)
    FIRST = "first"
    #: before forwarding, on a counting thread (a long body its forwarding depends on)
    ON_THREAD = "on_thread"
    #: on a counting thread beside the upstream call, settled before the answer goes back (a
    #: long body its forwarding cannot depend on)
    BESIDE = "beside"
    #: not counted: a bound proved it within its budget (``counting.strategy: bounded``)
    UNCOUNTED = "uncounted"
    #: a bound let it through, counted anyway as a sample, first (a short body)
    SAMPLE_FIRST = "sample_first"
    #: a bound let it through, counted anyway as a sample beside the upstream call, recorded
    #: after its answer (a long body)
    SAMPLE_BESIDE = "sample_beside"


@dataclass(slots=True)
class Exchange:
    """Everything known about one request; becomes the log line and the metrics."""

    route: Route
    request_id: str
    workload: str
    started: float
    model: str = ""
    label: str = OTHER
    spec: ModelSpec | None = None
    count: RequestCount | None = None
    util: float | None = None
    stream: bool = False
    status: int = 0
    outcome: Outcome = "ok"
    usage: Usage = field(default_factory=Usage)
    upstream_started: float | None = None
    extra_headers: dict[str, str] = field(default_factory=dict)
    #: the ceilings this request started with; a reload mid-flight does not change them
    ceilings: CeilingsDocument = EMPTY
    decision: Decision | None = None
    bypass: bool = False
    max_tokens: int | None = None
    span: Span | None = None
    upstream: str = ""  # the upstream's name (the API's default: its API's name)
    #: the upstream's host (the semantic conventions' server.address)
    server_address: str = ""
    #: the upstream's port (server.port, required with server.address)
    server_port: int = 0
    #: gen_ai.provider.name and gen_ai.operation.name of this request
    provider: str = ""
    operation: str = "chat"
    #: when the first streamed content arrived (time to first token)
    first_chunk_at: float | None = None
    #: a stream's reads relayed with content
    chunks: int = 0
    #: the client takes a gzip-encoded answer
    accepts_gzip: bool = False
    #: sampled for the capture store: the client's parsed body (before trimming) and, once it
    #: arrived, the response (a body, or a stream's events)
    capture_body: dict[str, Any] | None = None
    capture_response: bytes | None = None
    #: checked for answer signals: what the request asked the answer to be, and the answer as
    #: relayed (a body, or a stream's upstream reads; None past answers.max_bytes)
    answer_expect: Expect | None = None
    answer_raw: bytes | list[bytes] | None = None
    #: why ``answer_raw`` is None: ``too_large`` (over answers.max_bytes), ``busy`` (over
    #: answers.max_held_mib) or ``cpu`` (the checker's share of a core spent: answers.cpu_share)
    answer_unread: str = "too_large"
    #: the bytes of ``answer_raw`` held against answers.max_held_mib from the moment the
    #: exchange finished (while it waits for its batch, then in the checker's queue)
    answer_held: int = 0
    #: the request body's size
    body_bytes: int = 0
    #: sent to a fallback model over its own ceiling: the model the client asked for, and
    #: where that model sat in the path (the segment as sent, the fallback's in its place)
    routed_from: str | None = None
    routed_from_label: str | None = None
    routed_path: tuple[str, str] | None = None
    #: the fallback was judged by its measured ceiling (False: by its window, none measured)
    routed_measured: bool = True
    #: when it is counted (:func:`context_ceiling.sidecar.schedule.plan`)
    schedule: Schedule = Schedule.FIRST
    #: a count running on a counting thread: the count and the decision on it, settled into
    #: ``count`` and ``decision``
    pending: asyncio.Future[tuple[RequestCount, Decision, float]] | None = None

    @property
    def bounded(self) -> bool:
        """A bound proved it within its budget: forwarded before (or without) a count."""
        return self.schedule in (Schedule.UNCOUNTED, Schedule.SAMPLE_BESIDE)

    @property
    def sampled(self) -> bool:
        """A bound let it through and it is counted anyway (``counting.sample_every``): its
        count's CPU seconds are spent from the sampler's credit."""
        return self.schedule in (Schedule.SAMPLE_FIRST, Schedule.SAMPLE_BESIDE)

    @property
    def forwarded_tokens(self) -> int:
        """Input tokens sent upstream: after trimming when the sidecar trimmed."""
        d = self.decision
        if d is not None and d.body is not None and d.report is not None:
            return d.report.after
        return self.count.total if self.count else 0


_REQUEST_ID = re.compile(r"[A-Za-z0-9._:@/+=-]{1,128}")


#: new request ids: 128 random bits from a generator seeded from the OS once per process (and
#: again in a forked worker), not ``uuid4``: it reads the OS's random source on every call, and
#: that system call hands the interpreter lock to any other thread (the answer checker, a
#: sampled count) and waits to get it back, on every request. An id must be unique, not secret.
_ids = random.Random()
os.register_at_fork(after_in_child=_ids.seed)


def request_id(header: str | None) -> str:
    """The client's ``x-request-id`` when it is a plausible id, else a new one, 32 hex digits
    (it is logged and echoed: an unbounded or control-character header must not become a 100 kB
    log line)."""
    if header and _REQUEST_ID.fullmatch(header):
        return header
    return f"{_ids.getrandbits(128):032x}"
