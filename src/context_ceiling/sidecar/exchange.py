"""The wire-format table (one :class:`Route` per measured endpoint: what differs between the
APIs) and one :class:`Exchange`, everything known about a proxied request, which
:mod:`context_ceiling.sidecar.record` turns into headers, a log line, metrics, staleness and a
span."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.trace import Span

from context_ceiling.core.ceilings import EMPTY, CeilingsDocument
from context_ceiling.core.counting import (
    RequestCount,
    count_anthropic,
    count_gemini,
    count_openai,
    count_responses,
)
from context_ceiling.core.models import OTHER, ModelSpec
from context_ceiling.core.wire import Api, Shape
from context_ceiling.sidecar.answers import Expect
from context_ceiling.sidecar.enforce import Decision
from context_ceiling.sidecar.outcomes import Outcome
from context_ceiling.sidecar.relay import Tap
from context_ceiling.sidecar.usage import (
    AnthropicStreamTap,
    GeminiStreamTap,
    OpenAIStreamTap,
    ResponsesStreamTap,
    Usage,
    anthropic_body_usage,
    gemini_body_usage,
    openai_body_usage,
    responses_body_usage,
    responses_count_usage,
)


@dataclass(frozen=True, slots=True)
class Route:
    """What differs between the two wire formats."""

    api: Api  # whose client and error shape
    metric_api: str
    path: str
    count: Callable[..., RequestCount]
    body_usage: Callable[[bytes], Usage]
    tap: Callable[[bool], Tap]
    shape: Shape  # the request body's shape, for the trimmer
    #: a token-counting endpoint: measured and compared with the provider's count, never
    #: trimmed, traced or streamed
    count_only: bool = False
    #: an Azure OpenAI route: path and query go upstream as the client sent them, to the Azure
    #: resource the model (or deployment) belongs to
    azure: bool = False


OPENAI_CHAT = Route(
    "openai",
    "openai_chat",
    "/chat/completions",
    count_openai,
    openai_body_usage,
    OpenAIStreamTap,
    "openai",
)
GEMINI_GENERATE = Route(
    "gemini",
    "gemini_generate",
    "/{version}/models/{model}:generateContent",
    count_gemini,
    gemini_body_usage,
    lambda _injected: GeminiStreamTap(),
    "gemini",
)
GEMINI_COUNT = Route(
    "gemini",
    "gemini_count_tokens",
    "/{version}/models/{model}:countTokens",
    count_gemini,
    gemini_body_usage,
    lambda _injected: GeminiStreamTap(),
    "gemini",
    count_only=True,
)
AZURE_CHAT = Route(
    "openai",
    "azure_chat",
    "/openai/deployments/{deployment}/chat/completions",
    count_openai,
    openai_body_usage,
    OpenAIStreamTap,
    "openai",
    azure=True,
)
#: Azure OpenAI's v1 API (``/openai/v1/chat/completions``): the model in the body
AZURE_V1_CHAT = Route(
    "openai",
    "azure_chat",
    "/openai/v1/chat/completions",
    count_openai,
    openai_body_usage,
    OpenAIStreamTap,
    "openai",
    azure=True,
)
#: the Responses API on Azure OpenAI (``/openai/v1/responses`` and ``/openai/responses``)
AZURE_RESPONSES = Route(
    "openai",
    "azure_responses",
    "/openai/v1/responses",
    count_responses,
    responses_body_usage,
    lambda _injected: ResponsesStreamTap(),
    "responses",
    azure=True,
)
OPENAI_RESPONSES = Route(
    "openai",
    "openai_responses",
    "/responses",
    count_responses,
    responses_body_usage,
    lambda _injected: ResponsesStreamTap(),
    "responses",
)
ANTHROPIC_MESSAGES = Route(
    "anthropic",
    "anthropic_messages",
    "/v1/messages",
    count_anthropic,
    anthropic_body_usage,
    lambda _injected: AnthropicStreamTap(),
    "anthropic",
)
ANTHROPIC_COUNT = Route(
    "anthropic",
    "anthropic_count_tokens",
    "/v1/messages/count_tokens",
    count_anthropic,
    anthropic_body_usage,
    lambda _injected: AnthropicStreamTap(),
    "anthropic",
    count_only=True,
)
RESPONSES_COUNT = Route(
    "openai",
    "openai_responses_input_tokens",
    "/responses/input_tokens",
    count_responses,
    responses_count_usage,
    lambda _injected: ResponsesStreamTap(),
    "responses",
    count_only=True,
)


#: every measured route
ROUTES: tuple[Route, ...] = (
    OPENAI_CHAT,
    AZURE_CHAT,
    AZURE_V1_CHAT,
    AZURE_RESPONSES,
    OPENAI_RESPONSES,
    RESPONSES_COUNT,
    ANTHROPIC_MESSAGES,
    ANTHROPIC_COUNT,
    GEMINI_GENERATE,
    GEMINI_COUNT,
)
#: the ``api`` label values of requests that generate (a model call, not a token count): the
#: denominator of every per-request share on the dashboard and in the rules
GENERATION_APIS: tuple[str, ...] = tuple(r.metric_api for r in ROUTES if not r.count_only)


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
    #: gen_ai.provider.name and gen_ai.operation.name of this request
    provider: str = ""
    operation: str = "chat"
    #: when the first streamed content arrived (time to first token)
    first_chunk_at: float | None = None
    #: the client takes a gzip-encoded answer
    accepts_gzip: bool = False
    #: sampled for the capture store: the client's parsed body (before trimming) and, once it
    #: arrived, the response (a body, or a stream's events)
    capture_body: dict[str, Any] | None = None
    capture_response: bytes | None = None
    #: checked for answer signals: what the request asked the answer to be, and the answer as
    #: relayed (a body, or a stream's events; None past answers.max_bytes)
    answer_expect: Expect | None = None
    answer_raw: bytes | list[bytes] | None = None
    #: why ``answer_raw`` is None: too_large or busy (answers.max_held_mib)
    answer_unread: str = "too_large"
    #: the request body's size, and whether counting was skipped because a bound proved the
    #: request within its budget (counting.strategy: bounded)
    body_bytes: int = 0
    bounded: bool = False
    #: a bound let it through, and it is counted anyway (counting.sample_every): its count's CPU
    #: seconds are spent from the sampler's credit
    sampled: bool = False
    #: counted on a worker thread while the upstream call runs (counting.overlap_bytes): the
    #: count and the decision on it, settled into ``count`` and ``decision``
    beside: bool = False
    pending: asyncio.Future[tuple[RequestCount, Decision, float]] | None = None
    #: a long body that must be counted before it is forwarded, counted (and trimmed) on a
    #: counting thread while the event loop serves other requests (``_decide`` awaits it)
    off_loop: bool = False

    @property
    def forwarded_tokens(self) -> int:
        """Input tokens sent upstream: after trimming when the sidecar trimmed."""
        d = self.decision
        if d is not None and d.body is not None and d.report is not None:
            return d.report.after
        return self.count.total if self.count else 0


def provider_name(route: Route, path: str) -> str:
    """The GenAI semantic conventions' ``gen_ai.provider.name`` of a measured route."""
    if route.azure:
        return "azure.ai.openai"
    if route.api == "gemini":
        return "gcp.vertex_ai" if "/projects/" in path else "gcp.gemini"
    return route.api


def operation_name(route: Route) -> str:
    """``gen_ai.operation.name``: Gemini's generateContent is ``generate_content``; chat
    completions, the Responses API and Anthropic messages are ``chat``."""
    return "generate_content" if route.api == "gemini" else "chat"


_REQUEST_ID = re.compile(r"[A-Za-z0-9._:@/+=-]{1,128}")


def gemini_model(path: str) -> str:
    """``/v1beta/models/gemini-2.5-flash:generateContent`` (or a Vertex AI
    ``.../publishers/google/models/{model}:...`` path) -> the model name."""
    tail = path.rsplit("/models/", 1)[-1]
    return tail.split(":", 1)[0] if "/models/" in path else ""


def azure_deployment(path: str) -> str:
    """``/openai/deployments/{deployment}/chat/completions`` -> the deployment name."""
    parts = path.split("/")
    return parts[3] if len(parts) > 4 and parts[1:3] == ["openai", "deployments"] else ""


def request_id(header: str | None) -> str:
    """The client's ``x-request-id`` when it is a plausible id, else a new one (it is logged and
    echoed: an unbounded or control-character header must not become a 100 kB log line)."""
    if header and _REQUEST_ID.fullmatch(header):
        return header
    return uuid.uuid4().hex
