"""Which OpenTelemetry GenAI semantic-convention names the sidecar speaks, and the provider name
it reports for an upstream.

The GenAI conventions moved to their own repository (open-telemetry/semantic-conventions-genai)
and renamed the client metrics: ``gen_ai.client.token.usage`` (a histogram by
``gen_ai.token.type``) became the ``gen_ai.client.inference.usage.*`` counters (by
``gen_ai.token.modality``; cache reads, cache writes and reasoning as their own counters) and the
``gen_ai.client.inference.operation.{input,output}_tokens`` histograms; the inference duration
became ``gen_ai.client.inference.duration``; the streaming timings
``gen_ai.client.inference.time_to_first_chunk`` and ``.time_per_output_chunk``; the span's
``gen_ai.usage.cache_creation.input_tokens`` became ``gen_ai.usage.cache_write.input_tokens``.
As OpenTelemetry's own instrumentations do, the names are chosen with
``OTEL_SEMCONV_STABILITY_OPT_IN``: unset, the earlier names (what existing dashboards read);
``gen_ai_latest_experimental``, the current ones; ``gen_ai_latest_experimental/dup``, both, for a
migration (as ``http/dup`` does for HTTP).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

from context_ceiling.core.models import ModelSpec

__all__ = [
    "GENAI_MODELS",
    "LATEST",
    "OPT_IN_ENV",
    "GenAiNames",
    "RequestModels",
    "known_provider",
    "provider_name",
]

#: the variable OpenTelemetry's instrumentations read for convention opt-ins
OPT_IN_ENV = "OTEL_SEMCONV_STABILITY_OPT_IN"
#: the opt-in that selects the current GenAI names
LATEST = "gen_ai_latest_experimental"


@dataclass(frozen=True)
class GenAiNames:
    """Which names are emitted: the earlier ones (``legacy``), the current ones (``latest``),
    or both."""

    legacy: bool = True
    latest: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> GenAiNames:
        """From ``OTEL_SEMCONV_STABILITY_OPT_IN`` (a comma-separated list; other opt-ins in it,
        ``http`` and the like, are left to their own instrumentations)."""
        value = (os.environ if env is None else env).get(OPT_IN_ENV, "")
        tokens = {t.strip() for t in value.split(",")}
        if f"{LATEST}/dup" in tokens:
            return cls(legacy=True, latest=True)
        if LATEST in tokens:
            return cls(legacy=False, latest=True)
        return cls()

    @property
    def mode(self) -> str:
        """``legacy``, ``latest`` or ``both`` (the sidecar's startup line and ``/status``)."""
        return "both" if self.legacy and self.latest else "latest" if self.latest else "legacy"


#: hosts whose provider the conventions name (their well-known ``gen_ai.provider.name``
#: values), matched on the upstream's host name
_KNOWN_HOSTS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), name)
    for pattern, name in (
        (r"(.+\.)?openai\.azure\.com", "azure.ai.openai"),
        (
            r"(.+\.)?(services\.ai|inference\.ai|cognitiveservices)\.azure\.com",
            "azure.ai.inference",
        ),
        (r"api\.openai\.com", "openai"),
        (r"api\.anthropic\.com", "anthropic"),
        (r"generativelanguage\.googleapis\.com", "gcp.gemini"),
        (r"(.+-)?aiplatform\.googleapis\.com", "gcp.vertex_ai"),
        (r"bedrock-runtime(-fips)?\.[a-z0-9-]+\.amazonaws\.com(\.cn)?", "aws.bedrock"),
        (r"api\.groq\.com", "groq"),
        (r"api\.mistral\.ai", "mistral_ai"),
        (r"api\.deepseek\.com", "deepseek"),
        (r"api\.x\.ai", "x_ai"),
        (r"api\.perplexity\.ai", "perplexity"),
        (r"api\.cohere\.(com|ai)", "cohere"),
        (r"api\.moonshot\.(ai|cn)", "moonshot_ai"),
        (r"([a-z0-9-]+\.)?ml\.cloud\.ibm\.com", "ibm.watsonx.ai"),
    )
)


@lru_cache(maxsize=256)  # hosts come from the configuration: asked on every request, few
def known_provider(host: str) -> str | None:
    """The conventions' provider name for an upstream host they name, else None."""
    host = host.lower().rstrip(".")
    return next((name for pattern, name in _KNOWN_HOSTS if pattern.fullmatch(host)), None)


def provider_name(
    configured: str | None,
    host: str,
    route_provider: str,
    named: str | None = None,
    compatible: bool = False,
) -> str:
    """``gen_ai.provider.name`` of a request: the upstream's configured ``provider``, else the
    conventions' name for its host, else, for a named upstream speaking a widely imitated API
    (``compatible``: the OpenAI API, served by vLLM, llama.cpp, Ollama and the like) on a host
    they do not know, the upstream's name (a local server is not ``openai``), else the route's
    own (Azure, Vertex and Bedrock routes name their provider by their path)."""
    if configured:
        return configured
    known = known_provider(host)
    if known is not None:
        return known
    if named is not None and compatible:
        return named
    return route_provider


#: how many distinct request model names the GenAI metrics label by before they fall back to
#: the registry label (clients choose the names: a glob entry matches any of them)
GENAI_MODELS = 64


class RequestModels:
    """The ``gen_ai.request.model`` label value of a request: the model name it asked for, as
    the semantic conventions say, while there are at most ``limit`` distinct ones (only names
    the registry matches); then the registry label. Labels stay bounded."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.seen: set[str] = set()

    def name(self, model: str, label: str, spec: ModelSpec | None) -> str:
        if spec is None or not model or len(model) > 128:
            return label
        if model in self.seen:
            return model
        if len(self.seen) < self.limit:
            self.seen.add(model)
            return model
        return label
