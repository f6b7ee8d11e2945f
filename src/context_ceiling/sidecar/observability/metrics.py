"""Prometheus metrics on an app-owned registry.

The names are a contract: the dashboards, alert rules and Helm chart query them. Every label is
bounded: ``model`` is a registry label or ``other``, ``workload`` a configured name or
``default``, ``api`` and ``outcome`` fixed vocabularies.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, TypeVar

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.gc_collector import GCCollector
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from context_ceiling.ceilings.document import CeilingsDocument
from context_ceiling.core.tokenizers import CountCache
from context_ceiling.core.utilization import COMPONENTS, Component
from context_ceiling.sidecar.observability.semconv import GenAiNames

_M = TypeVar("_M", bound=MetricWrapperBase)

UTILIZATION_BUCKETS = (
    0.05,
    0.1,
    0.2,
    0.3,
    0.4,
    0.5,
    0.6,
    0.7,
    0.75,
    0.8,
    0.85,
    0.9,
    0.95,
    0.98,
    1.0,
)
TOKEN_BUCKETS = (
    0,
    64,
    256,
    1024,
    2048,
    4096,
    8192,
    16384,
    32768,
    65536,
    131072,
    262144,
    524288,
    1048576,
)
ERROR_BUCKETS = (-0.5, -0.25, -0.1, -0.05, -0.02, -0.01, 0.0, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5)
DURATION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320)

OTHER_ROUTE = "other"
GENAI_TOKEN_BUCKETS = (
    1,
    4,
    16,
    64,
    256,
    1024,
    4096,
    16384,
    65536,
    262144,
    1048576,
    4194304,
    16777216,
    67108864,
)

#: the current conventions' usage counters (``gen_ai.client.inference.usage.*``): the suffix of
#: each, and what it counts (cache reads and writes are among the input tokens, reasoning among
#: the output tokens)
INFERENCE_USAGE = {
    "input_tokens": "input tokens used.",
    "output_tokens": "output tokens used, reasoning included.",
    "cache_read_input_tokens": "input tokens read from the provider's prompt cache.",
    "cache_write_input_tokens": "input tokens written to the provider's prompt cache.",
    "reasoning_output_tokens": "output tokens spent on reasoning.",
}


def dotted(kind: str) -> str:
    """A usage counter's suffix as the conventions spell it (``cache_read.input_tokens``)."""
    return kind.replace("_input_", ".input_").replace("_output_", ".output_")


GENAI_DURATION_BUCKETS = (
    0.01,
    0.02,
    0.04,
    0.08,
    0.16,
    0.32,
    0.64,
    1.28,
    2.56,
    5.12,
    10.24,
    20.48,
    40.96,
    81.92,
)
#: the current conventions' boundaries for the streaming timings: the duration's own
CHUNK_BUCKETS = GENAI_DURATION_BUCKETS
CEILING_RATIO_BUCKETS = (
    0.1,
    0.25,
    0.5,
    0.6,
    0.7,
    0.75,
    0.8,
    0.85,
    0.9,
    0.95,
    1.0,
    1.05,
    1.1,
    1.25,
    1.5,
)


class _AnswerLabels(Protocol):
    """Where a checked answer counts (``answers.AnswerLabels``)."""

    @property
    def model(self) -> str: ...
    @property
    def workload(self) -> str: ...
    @property
    def fill(self) -> str: ...
    @property
    def side(self) -> str: ...


class _Staleness(Protocol):
    def states(
        self, doc: CeilingsDocument
    ) -> Iterable[tuple[tuple[str, str], dict[str, bool]]]: ...


#: the staleness states to expose: ((model, workload), {reason: active}) pairs
StaleStates = Callable[[], Iterable[tuple[tuple[str, str], dict[str, bool]]]]


class RunningCeilings(Protocol):
    """What the ceiling gauges read: the running document and its staleness states."""

    @property
    def current(self) -> CeilingsDocument: ...

    @property
    def staleness(self) -> _Staleness: ...


class Metrics:
    """All sidecar metric families, registered on one registry the app owns."""

    def __init__(
        self, registry: CollectorRegistry | None = None, genai: GenAiNames | None = None
    ) -> None:
        """Every family on ``registry`` (a new one by default); the GenAI families under the
        names ``genai`` selects (default: from ``OTEL_SEMCONV_STABILITY_OPT_IN``)."""
        self.registry = registry or CollectorRegistry(auto_describe=True)
        #: what /metrics serves: this registry, or the pod's (expose_group)
        self.exposed = self.registry
        self._children: dict[tuple[Any, ...], Any] = {}
        r = self.registry
        #: runs before a read of the registry (a scrape, a test's sample): the recorder records
        #: the requests that finished and wait for their batch, so no read misses them
        self.before_collect = _BeforeCollect()
        r.register(self.before_collect)
        # process_* (CPU, resident memory, open fds, start time), python_gc_*, python_info: the
        # standard runtime families, on the app's own registry like everything else
        ProcessCollector(registry=r)
        GCCollector(registry=r)
        PlatformCollector(registry=r)
        self._requests(r)
        self._enforcement(r)
        self._answer_signals(r)
        self._costs_and_upstreams(r)
        self.genai_names = genai or GenAiNames.from_env()
        self._genai(r, self.genai_names)
        self._operations(r)

    def _requests(self, r: CollectorRegistry) -> None:
        """Every proxied request: its outcome, its fill, its input and output."""
        self.requests = Counter(
            "llm_context_requests",
            "Proxied requests by outcome.",
            ["model", "workload", "api", "outcome"],
            registry=r,
        )
        self.utilization = Histogram(
            "llm_context_utilization_ratio",
            "Input tokens / model context window, per request, before forwarding.",
            ["model", "workload"],
            buckets=UTILIZATION_BUCKETS,
            registry=r,
        )
        self.input_tokens = Histogram(
            "llm_context_input_tokens",
            "Input tokens per request by component (estimated before forwarding).",
            ["model", "workload", "component"],
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.window = Gauge(
            "llm_context_window_tokens",
            "Context window of each registered model.",
            ["model"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.estimate_error = Histogram(
            "llm_context_token_estimate_error_ratio",
            "(estimated - upstream-reported input tokens) / reported.",
            ["model"],
            buckets=ERROR_BUCKETS,
            registry=r,
        )
        self.upstream_duration = Histogram(
            "llm_context_upstream_duration_seconds",
            "Time from forwarding to the last byte of the upstream response.",
            ["model", "api"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.output_tokens = Histogram(
            "llm_context_output_tokens",
            "Output tokens per request as reported by the upstream.",
            ["model", "workload"],
            buckets=TOKEN_BUCKETS,
            registry=r,
        )

    def _enforcement(self, r: CollectorRegistry) -> None:
        """The ceiling at work: trims, over-ceiling actions, routing, the prompt cache."""
        self.ceiling_utilization = Histogram(
            "llm_context_ceiling_utilization_ratio",
            "Input tokens / ceiling per request, before trimming: how close traffic runs to the ceiling.",
            ["model", "workload"],
            buckets=CEILING_RATIO_BUCKETS,
            registry=r,
        )
        self.trimmed_tokens = Counter(
            "llm_context_trimmed_tokens",
            "Tokens removed by trimming (enforce mode), by what was removed.",
            ["model", "workload", "kind"],
            registry=r,
        )
        self.would_trim_tokens = Counter(
            "llm_context_would_trim_tokens",
            "Tokens trimming would have removed (observe mode), by what would be removed.",
            ["model", "workload", "kind"],
            registry=r,
        )
        self.over_ceiling = Counter(
            "llm_context_over_ceiling",
            "Requests over their input budget, by what was done: trimmed, rejected, observed "
            "or routed (sent to a fallback model whose ceiling it fits).",
            ["model", "workload", "action"],
            registry=r,
        )
        self.routed = Counter(
            "llm_context_routed",
            "Requests over their model's ceiling sent to a fallback model whose measured "
            "ceiling they fit, by the model asked for and the model that answered.",
            ["from_model", "to_model", "workload"],
            registry=r,
        )
        self.cache_loss_tokens = Counter(
            "llm_context_cache_loss_tokens",
            "Tokens the previous turn already sent that a trimmed request changed, so the "
            "provider's prompt cache cannot serve them (every API; an Anthropic cache_control "
            "prefix cut inside included).",
            ["model", "workload"],
            registry=r,
        )
        self.clearing_events = Counter(
            "llm_context_clearing_events",
            "Trimmed requests that cleared or dropped more of an agent loop's history than its "
            "previous turn: the points where the forwarded prefix changes.",
            ["model", "workload"],
            registry=r,
        )
        self.native_edits = Counter(
            "llm_context_native_edits",
            "Context edits the provider reported applying under strategy native (Anthropic's "
            "tool-result clearing, the Responses API's compaction).",
            ["model", "workload"],
            registry=r,
        )
        self.native_cleared_tokens = Counter(
            "llm_context_native_cleared_tokens",
            "Input tokens the provider reported clearing under strategy native.",
            ["model", "workload"],
            registry=r,
        )

    def _answer_signals(self, r: CollectorRegistry) -> None:
        """What the answers say, by fill."""
        # answer signals by fill (sidecar/observability/answers.py): counted on the checker thread after the
        # answer was relayed; ``fill`` is one of core.utilization.FILL_BUCKETS or unknown,
        # ``side`` below/above the running ceiling or none
        answer_labels = ["model", "workload", "fill", "side"]
        self.answers = Counter(
            "llm_context_answers",
            "Answers checked for answer signals, by the request's fill bucket (input tokens / "
            "window) and its side of the running ceiling.",
            answer_labels,
            registry=r,
        )
        self.answer_signals = Counter(
            "llm_context_answer_signals",
            "Answer signals: why the answer stopped (stop, truncated, content_filter, refusal, "
            "tool_calls, other_stop: one per answer) and what was wrong with it (empty, "
            "invalid_json, schema_mismatch, unknown_tool, invalid_tool_arguments, "
            "tool_schema_mismatch, repetition).",
            [*answer_labels, "signal"],
            registry=r,
        )
        self.answer_tokens = Counter(
            "llm_context_answer_tokens",
            "Output tokens of checked answers as the provider reported them, and of those the "
            "reasoning tokens (kind), by fill bucket.",
            [*answer_labels, "kind"],
            registry=r,
        )
        self.answer_checks_skipped = Counter(
            "llm_context_answer_checks_skipped",
            "Answers not read whole: too_large (over answers.max_bytes), busy (over "
            "answers.max_held_mib held at once) and cpu (the checker's answers.cpu_share of a "
            "core spent): only the stop is counted; queue_full (the checker was behind: not "
            "counted), error.",
            ["reason"],
            registry=r,
        )

    def _costs_and_upstreams(self, r: CollectorRegistry) -> None:
        """What the context costs; pass-through traffic; upstream reachability."""
        # what the context costs (sidecar/observability/costs.py), in US dollars at list or configured prices
        self.input_cost = Counter(
            "llm_context_input_cost_usd",
            "Price of the input of priced requests: the part within the running ceiling and "
            "the part above it (no_ceiling: the model/workload has none), read from a prompt "
            "cache or not.",
            ["model", "workload", "part", "cache"],
            registry=r,
        )
        self.trim_savings = Counter(
            "llm_context_trim_savings_usd",
            "Price of the input trimming removed (action trimmed, enforce mode) or would have "
            "removed (would_trim, observe mode), at the uncached input price.",
            ["model", "workload", "action"],
            registry=r,
        )

        self.passthrough = Counter(
            "llm_context_passthrough_requests",
            "Requests on routes the sidecar does not measure, passed through, by the upstream that "
            "took them (a default one by its API's name, a named one by its name), "
            "known route (anything else: other) and outcome.",
            ["upstream", "route", "outcome"],
            registry=r,
        )
        self.upstream_up = Gauge(
            "llm_context_upstream_up",
            "1 when the upstream accepted a TCP connection at the last probe, else 0.",
            ["upstream"],
            registry=r,
            multiprocess_mode="livemax",  # up when any worker reaches it
        )

    def _genai(self, r: CollectorRegistry, names: GenAiNames) -> None:
        """OpenTelemetry GenAI semantic-convention metrics, with the spec's bucket boundaries,
        under the earlier names, the current ones, or both (``semconv.GenAiNames``).
        gen_ai_request_model is the model name the request asked for (bounded: the first
        GENAI_MODELS names the registry matches, then the registry label); ``model`` is the
        registry label the sidecar's own families and the dashboard use; server_address and
        server_port are the upstream's."""
        genai = [
            "gen_ai_operation_name",
            "gen_ai_provider_name",
            "gen_ai_request_model",
            "server_address",
            "server_port",
            "model",
        ]
        self.genai_tokens: Histogram | None = None
        self.genai_duration: Histogram | None = None
        self.genai_ttft: Histogram | None = None
        self.genai_tpot: Histogram | None = None
        if names.legacy:
            self.genai_tokens = Histogram(
                "gen_ai_client_token_usage",
                "gen_ai.client.token.usage: tokens used per operation, by token type "
                "(input/output).",
                [*genai, "gen_ai_token_type"],
                buckets=GENAI_TOKEN_BUCKETS,
                registry=r,
            )
            self.genai_duration = Histogram(
                "gen_ai_client_operation_duration_seconds",
                "gen_ai.client.operation.duration: seconds per GenAI operation.",
                genai,
                buckets=GENAI_DURATION_BUCKETS,
                registry=r,
            )
            self.genai_ttft = Histogram(
                "gen_ai_server_time_to_first_token_seconds",
                "gen_ai.server.time_to_first_token: seconds from the upstream call to the first "
                "streamed content, as the sidecar saw it (streams only).",
                genai,
                buckets=(0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48),
                registry=r,
            )
            self.genai_tpot = Histogram(
                "gen_ai_server_time_per_output_token_seconds",
                "gen_ai.server.time_per_output_token: seconds per output token after the first "
                "(streams only).",
                genai,
                buckets=(0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0),
                registry=r,
            )
        #: the current names: counters by modality, per-operation histograms, inference timings
        self.inference_usage: dict[str, Counter] = {}
        self.inference_operation: dict[str, Histogram] = {}
        self.inference_duration: Histogram | None = None
        self.inference_ttfc: Histogram | None = None
        self.inference_tpoc: Histogram | None = None
        if not names.latest:
            return
        modality = [*genai, "gen_ai_token_modality"]
        for kind, what in INFERENCE_USAGE.items():
            self.inference_usage[kind] = Counter(
                f"gen_ai_client_inference_usage_{kind}",
                f"gen_ai.client.inference.usage.{dotted(kind)}: {what}",
                modality,
                registry=r,
            )
        for kind in ("input_tokens", "output_tokens"):
            self.inference_operation[kind] = Histogram(
                f"gen_ai_client_inference_operation_{kind}",
                f"gen_ai.client.inference.operation.{kind}: {kind.split('_')[0]} tokens per "
                "inference operation.",
                genai,
                buckets=GENAI_TOKEN_BUCKETS,
                registry=r,
            )
        self.inference_duration = Histogram(
            "gen_ai_client_inference_duration_seconds",
            "gen_ai.client.inference.duration: seconds per inference operation.",
            genai,
            buckets=GENAI_DURATION_BUCKETS,
            registry=r,
        )
        self.inference_ttfc = Histogram(
            "gen_ai_client_inference_time_to_first_chunk_seconds",
            "gen_ai.client.inference.time_to_first_chunk: seconds from the upstream call to the "
            "first chunk of a stream (streams only).",
            genai,
            buckets=CHUNK_BUCKETS,
            registry=r,
        )
        self.inference_tpoc = Histogram(
            "gen_ai_client_inference_time_per_output_chunk_seconds",
            "gen_ai.client.inference.time_per_output_chunk: seconds between chunks after the "
            "first, one observation per stream at its mean gap (streams only).",
            genai,
            buckets=CHUNK_BUCKETS,
            registry=r,
        )

    def _operations(self, r: CollectorRegistry) -> None:
        """The sidecar itself: background tasks, the ceilings document, traffic capture."""
        # background tasks (ceilings watch, upstream probe, the worker group's follower): a
        # failure is logged, counted and the task restarted, never the end of the server
        self.background_failures = Counter(
            "llm_context_background_failures",
            "Background tasks that failed and were restarted, by task.",
            ["task"],
            registry=r,
        )

        # the ceilings document: reloads and the running version (set by the ceilings store)
        self.ceilings_unused = Gauge(
            "llm_context_ceilings_unused_entries",
            "Entries of the running ceilings document that enforce nothing here: their model is "
            "no label of the registry, or their workload is not declared.",
            registry=r,
            multiprocess_mode="livemax",
        )
        self.config_reloads = Counter(
            "llm_context_config_reloads",
            "Ceilings reload attempts by source and result.",
            ["source", "result"],
            registry=r,
        )
        self.config_last_success = Gauge(
            "llm_context_config_last_reload_success_timestamp_seconds",
            "When the ceilings were last applied successfully.",
            registry=r,
            multiprocess_mode="livemin",  # the worker that is furthest behind
        )
        self.config_version = Gauge(
            "llm_context_config_version",
            "Version of the running ceilings document.",
            registry=r,
            multiprocess_mode="livemin",  # a worker still on an older document shows
        )

        # traffic capture (capture.enabled): what was written, what was not and why, what the
        # redaction rules replaced (rule: ruleset, builtin, pattern, field)
        self.captured = Counter(
            "llm_context_captured",
            "Requests written to the capture store.",
            ["workload"],
            registry=r,
        )
        self.capture_dropped = Counter(
            "llm_context_capture_dropped",
            "Sampled requests not written (too_large, queue_full, store_error) or records "
            "rotated out of the store (rotated).",
            ["reason"],
            registry=r,
        )
        self.capture_redactions = Counter(
            "llm_context_capture_redactions",
            "Values the redaction rules replaced before writing, by rule kind.",
            ["rule"],
            registry=r,
        )

    def watch_ceilings(self, store: RunningCeilings) -> None:
        """Expose the running ceilings (tokens, age, staleness), read at scrape time."""
        self._ceilings = store
        self.registry.register(_CeilingCollector(store))

    def expose_group(self, directory: Path, group: Collector, stale: StaleStates) -> None:
        """Serve the pod's metrics rather than this worker's (``workers`` > 1): the families
        with values summed over every worker's files in ``directory`` (Prometheus multiprocess
        mode), plus the scrape-time families from ``group`` and the running ceilings with the
        staleness ``stale`` merges over the workers."""
        from prometheus_client.multiprocess import MultiProcessCollector

        reg = CollectorRegistry(auto_describe=True)
        MultiProcessCollector(reg, path=str(directory))  # type: ignore[no-untyped-call]
        PlatformCollector(registry=reg)
        reg.register(group)
        reg.register(_CeilingCollector(self._ceilings, stale))
        self.exposed = reg

    def watch_count_cache(self, cache: CountCache) -> None:
        """Expose the count cache's hit/miss counts, read at scrape time (nothing on the hot path)."""
        self.registry.register(_CountCacheCollector(cache))

    def declare_model(self, label: str, window: int) -> None:
        self.window.labels(model=label).set(window)

    def child(self, family: _M, **labels: str) -> _M:
        """``family.labels(**labels)``, cached per label set: prometheus_client checks the
        names and takes a lock on each call, a dozen calls per request. Label values
        are bounded (docs/observability.md), so the cache is too; no family here ever
        removes a child."""
        key = (id(family), *labels.values())
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = family.labels(**labels)
        return found

    def answer(
        self,
        where: _AnswerLabels,
        signals: list[str],
        output: int | None,
        reasoning: int | None,
        n: int = 1,
    ) -> None:
        """Count ``n`` checked answers of one label set and their signals (the answer checker's
        sink); ``output`` and ``reasoning``: their tokens, summed."""
        labels = {
            "model": where.model,
            "workload": where.workload,
            "fill": where.fill,
            "side": where.side,
        }
        self.child(self.answers, **labels).inc(n)
        for s in signals:
            self.child(self.answer_signals, **labels, signal=s).inc(n)
        if output:
            self.child(self.answer_tokens, **labels, kind="output").inc(output)
        if reasoning:
            self.child(self.answer_tokens, **labels, kind="reasoning").inc(reasoning)

    def answer_skipped(self, reason: str, n: int = 1) -> None:
        self.child(self.answer_checks_skipped, reason=reason).inc(n)

    def observe_input(
        self,
        model: str,
        workload: str,
        utilization: float | None,
        components: Mapping[Component, int],
    ) -> None:
        if utilization is not None:
            self.child(self.utilization, model=model, workload=workload).observe(utilization)
        for comp in COMPONENTS:
            self.child(
                self.input_tokens, model=model, workload=workload, component=comp.value
            ).observe(components.get(comp, 0))


def count_cache_families(hits: int, misses: int, held: int) -> Iterator[Metric]:
    """The count cache's families (one worker's, or a pod's summed over its workers)."""
    lookups = CounterMetricFamily(
        "llm_context_count_cache_lookups",
        "Lookups in the token-count cache (long texts and whole messages), by result.",
        labels=["result"],
    )
    lookups.add_metric(["hit"], hits)
    lookups.add_metric(["miss"], misses)
    yield lookups
    yield GaugeMetricFamily(
        "llm_context_count_cache_bytes",
        "Bytes held by the token-count cache (texts and messages).",
        value=held,
    )


class _CountCacheCollector(Collector):
    def __init__(self, cache: CountCache) -> None:
        self.cache = cache

    def collect(self) -> Iterator[Metric]:
        c = self.cache
        return count_cache_families(c.hits, c.misses, c.bytes)


class _BeforeCollect(Collector):
    """A collector of no families, first on the registry: its ``hook`` runs before the
    families are read."""

    def __init__(self) -> None:
        self.hook: Callable[[], None] | None = None

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        if self.hook is not None:
            self.hook()
        return []


class _CeilingCollector(Collector):
    """Gauges computed at scrape time from the running document, so they are always current."""

    def __init__(self, store: RunningCeilings, stale: StaleStates | None = None) -> None:
        self.store = store
        self.stale = stale

    def collect(self) -> Iterable[GaugeMetricFamily]:
        doc = self.store.current
        tokens = GaugeMetricFamily(
            "llm_context_ceiling_tokens", "The running input ceiling.", labels=["model", "workload"]
        )
        age = GaugeMetricFamily(
            "llm_context_ceiling_age_seconds",
            "Seconds since the running ceiling was derived.",
            labels=["model", "workload"],
        )
        now = datetime.now(UTC)
        for e in doc.entries:
            tokens.add_metric([e.model, e.workload], e.ceiling_tokens)
            if e.created_at is None:
                continue  # a hand-written entry: no derivation time, no age
            created = e.created_at if e.created_at.tzinfo else e.created_at.replace(tzinfo=UTC)
            age.add_metric([e.model, e.workload], (now - created).total_seconds())
        stale = GaugeMetricFamily(
            "llm_context_ceiling_stale",
            "1 while live traffic no longer looks like what the ceiling was measured on, by reason.",
            labels=["model", "workload", "reason"],
        )
        states = self.stale() if self.stale else self.store.staleness.states(doc)
        for (model, workload), reasons in states:
            for reason, active in reasons.items():
                stale.add_metric([model, workload, reason], 1.0 if active else 0.0)
        return [tokens, age, stale]

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return []
