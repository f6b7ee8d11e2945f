"""The sidecar's live state: configuration, registry, metrics and upstream connections.

Built once at startup; the ceilings (reload issue) are swapped atomically on top of it.
"""

from __future__ import annotations

import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx

from context_ceiling.core.counting import DEFAULT_CHUNK_PATTERN
from context_ceiling.core.models import ModelSpec, Registry
from context_ceiling.core.tokenizers import CountCache, TextCounter, TiktokenCounter
from context_ceiling.core.vocabulary import Api, Shape
from context_ceiling.formats import format_of
from context_ceiling.formats.base import Format
from context_ceiling.sidecar.bounded_count import Calibration, Sampler
from context_ceiling.sidecar.capture.writer import Capturer
from context_ceiling.sidecar.ceilings.store import CeilingStore
from context_ceiling.sidecar.config import Settings, Upstream, admin_token, budget_token
from context_ceiling.sidecar.drain import Drain
from context_ceiling.sidecar.observability.answers import AnswerChecker, HeldBytes
from context_ceiling.sidecar.observability.costs import Pricing
from context_ceiling.sidecar.observability.metrics import Metrics
from context_ceiling.sidecar.observability.staleness import StalenessTracker
from context_ceiling.sidecar.observability.tracing import Tracing
from context_ceiling.sidecar.upstream.client import UpstreamClient
from context_ceiling.sidecar.workers.group import WorkerGroup

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


@dataclass
class SidecarState:
    settings: Settings
    registry: Registry
    metrics: Metrics
    clients: dict[Api, UpstreamClient]
    engine_client: httpx.AsyncClient
    chunk_pattern: re.Pattern[str] | None
    workloads: frozenset[str]
    ceilings: CeilingStore
    staleness: StalenessTracker
    admin_token: str | None
    tracing: Tracing = field(default_factory=Tracing)
    default_counter: TextCounter = field(default_factory=lambda: TiktokenCounter("o200k_base"))
    #: named upstreams: name -> (its API, its client, its settings)
    named: dict[str, tuple[Api, UpstreamClient, Upstream]] = field(default_factory=dict)
    #: traffic capture (None: capture.enabled is false)
    capture: Capturer | None = None
    #: the answer checker (None: answers.enabled is false)
    answers: AnswerChecker | None = None
    #: the price of each requested model (list prices, or the registry's own)
    pricing: Pricing = field(default_factory=lambda: Pricing(()))
    #: bytes per reported token, per model (counting.strategy: bounded)
    calibration: Calibration = field(default_factory=lambda: Calibration(32))
    #: which requests a bound let through are counted anyway (counting.strategy: bounded)
    sampler: Sampler = field(default_factory=lambda: Sampler(16, 0.02))
    #: the count cache (None: counting.cache_mib is 0)
    count_cache: CountCache | None = None
    #: this worker's siblings (None: one process; see sidecar/workers/group.py)
    group: WorkerGroup | None = None
    #: the request model names the GenAI metrics keep (bounded)
    request_models: RequestModels = field(default_factory=lambda: RequestModels(GENAI_MODELS))
    #: the read token of GET /budget (None: open to every client)
    budget_token: str | None = None
    #: shutdown: readiness off, streams ended with an error event before the grace runs out
    drain: Drain = field(default_factory=lambda: Drain(30.0))
    #: the threads that count requests beside their upstream call (None: counting.overlap_bytes
    #: is 0)
    count_pool: ThreadPoolExecutor | None = None

    @classmethod
    def build(
        cls,
        settings: Settings,
        transport: httpx.AsyncBaseTransport | None = None,
        metrics: Metrics | None = None,
        tracing: Tracing | None = None,
    ) -> SidecarState:
        cache = (
            CountCache(int(settings.counting.cache_mib * 2**20))
            if settings.counting.cache_mib
            else None
        )
        registry = Registry(settings.models, cache, settings.counting.bpe)
        metrics = metrics or Metrics()
        if cache is not None:
            metrics.watch_count_cache(cache)
        for spec in settings.models:
            metrics.declare_model(spec.metric_label, spec.window)
        clients: dict[Api, UpstreamClient] = {
            api: UpstreamClient(up, transport) for api, up in settings.upstreams.defaults().items()
        }
        named: dict[str, tuple[Api, UpstreamClient, Upstream]] = {
            name: (up.api, UpstreamClient(up, transport), up)
            for name, up in settings.upstreams.named.items()
        }
        fallback = TiktokenCounter("o200k_base", settings.counting.bpe)
        pattern = settings.retrieval.chunk_pattern
        st = settings.staleness
        staleness = StalenessTracker(st.tolerance, st.window, st.min_requests)
        store = CeilingStore(
            registry, metrics, staleness, settings.ceilings_file, settings.ceilings_persist
        )
        store.workloads = list(settings.workloads)
        chunk_pattern = re.compile(pattern) if pattern else None
        threads = _count_threads(settings)
        pool = ThreadPoolExecutor(threads, thread_name_prefix="ceiling-count") if threads else None
        capture = (
            Capturer(settings.capture, metrics, chunk_pattern or re.compile(DEFAULT_CHUNK_PATTERN))
            if settings.capture.enabled
            else None
        )
        answers = (
            AnswerChecker(
                metrics,
                settings.answers.queue_size,
                held=HeldBytes(int(settings.answers.max_held_mib * 2**20)),
            )
            if settings.answers.enabled
            else None
        )
        return cls(
            settings=settings,
            registry=registry,
            answers=answers,
            pricing=Pricing(settings.models),
            metrics=metrics,
            clients=clients,
            named=named,
            engine_client=httpx.AsyncClient(transport=transport, trust_env=False),
            chunk_pattern=chunk_pattern,
            capture=capture,
            calibration=Calibration(settings.counting.calibration),
            sampler=Sampler(
                settings.counting.sample_every,
                settings.counting.sample_cpu,
                max_inflight=2 * threads or None,  # samples counting at once
            ),
            count_cache=cache,
            workloads=frozenset(settings.workloads),
            ceilings=store,
            staleness=staleness,
            admin_token=admin_token(settings),
            budget_token=budget_token(settings),
            tracing=tracing or Tracing(),
            default_counter=(cache.wrap(fallback) if cache is not None else fallback),
            count_pool=pool,
        )

    def route(self, api: Api, upstream: str | None) -> tuple[str, UpstreamClient, Upstream] | None:
        """Where a request of this API for a model served by ``upstream`` (None: the API's
        default) goes: (name, client, settings), or None when this sidecar has no such upstream
        (or the named one speaks the other API)."""
        if upstream is None or upstream == api:
            client = self.clients.get(api)
            return (api, client, self.upstream_settings(api)) if client is not None else None
        found = self.named.get(upstream)
        if found is None or found[0] != api:
            return None
        return upstream, found[1], found[2]

    def native_ok(self, shape: Shape | Format, spec: ModelSpec | None) -> bool:
        """Whether the upstream this request goes to is the provider's own API, whose context
        management ``strategy: auto`` may use (Anthropic's for messages, OpenAI's or Azure
        OpenAI's for the Responses API)."""
        fmt = format_of(shape)
        if fmt.native is None:
            return False
        found = self.route(fmt.api, spec.upstream if spec is not None else None)
        if found is None:
            return False
        return fmt.native.served_by(urlsplit(found[2].base_url).hostname or "")

    def azure_upstream(self) -> str | None:
        """The first named upstream that is an Azure OpenAI resource."""
        return next(
            (n for n, (_, _, up) in self.named.items() if getattr(up, "azure", False)), None
        )

    def all_clients(self) -> dict[str, httpx.AsyncClient]:
        """Every upstream by name (the defaults under their API's name)."""
        out: dict[str, httpx.AsyncClient] = {str(k): c for k, c in self.clients.items()}
        out.update({name: c for name, (_, c, _) in self.named.items()})
        return out

    def upstream_settings(self, api: Api) -> Upstream:
        up = self.settings.upstreams.of(api)
        assert up is not None  # only called for configured upstreams
        return up

    async def aclose(self) -> None:
        for client in self.all_clients().values():
            await client.aclose()
        await self.engine_client.aclose()
        if self.count_pool is not None:
            self.count_pool.shutdown(wait=False, cancel_futures=True)
        self.tracing.shutdown()


def _count_threads(settings: Settings) -> int:
    """The counting threads (0: none, counting.overlap_bytes is 0)."""
    c = settings.counting
    if not c.overlap_bytes:
        return 0
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 2
    return c.count_threads or cpus
