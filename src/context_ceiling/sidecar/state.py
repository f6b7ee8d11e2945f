"""The sidecar's live state: configuration, registry, metrics and upstream connections.

Built once at startup (the ceilings are swapped atomically on top of it). It is the composition
root, not a service locator: each handler declares the few collaborators it uses as a protocol
in its own module (:class:`~context_ceiling.sidecar.schedule.PlanDeps`,
:class:`~context_ceiling.sidecar.observability.record.RecordDeps`, ...), which this object
satisfies, so no handler imports this module.
"""

from __future__ import annotations

import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx

from context_ceiling.core.counting import DEFAULT_CHUNK_PATTERN
from context_ceiling.core.models import Registry
from context_ceiling.core.tokenizers import CountCache, TextCounter, TiktokenCounter
from context_ceiling.sidecar.bounded_count import Calibration, Sampler
from context_ceiling.sidecar.capture.writer import Capturer
from context_ceiling.sidecar.ceilings.store import CeilingStore
from context_ceiling.sidecar.config import Settings, admin_token, budget_token
from context_ceiling.sidecar.cpu_credit import CpuCredit
from context_ceiling.sidecar.drain import Drain
from context_ceiling.sidecar.observability.answers import AnswerChecker, HeldBytes
from context_ceiling.sidecar.observability.costs import Pricing
from context_ceiling.sidecar.observability.metrics import Metrics
from context_ceiling.sidecar.observability.semconv import GENAI_MODELS, RequestModels
from context_ceiling.sidecar.observability.staleness import StalenessTracker
from context_ceiling.sidecar.observability.tracing import Tracing
from context_ceiling.sidecar.upstream.pool import UpstreamPool
from context_ceiling.sidecar.workers.group import WorkerGroup


@dataclass
class SidecarState:
    settings: Settings
    registry: Registry
    metrics: Metrics
    upstreams: UpstreamPool
    engine_client: httpx.AsyncClient
    chunk_pattern: re.Pattern[str] | None
    workloads: frozenset[str]
    ceilings: CeilingStore
    staleness: StalenessTracker
    admin_token: str | None
    tracing: Tracing = field(default_factory=Tracing)
    default_counter: TextCounter = field(default_factory=lambda: TiktokenCounter("o200k_base"))
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
                credit=CpuCredit(
                    settings.answers.cpu_share, busy_burst=settings.answers.cpu_burst_seconds
                )
                if settings.answers.cpu_share < 1
                else None,
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
            upstreams=UpstreamPool(settings.upstreams, transport),
            engine_client=httpx.AsyncClient(transport=transport, trust_env=False),
            chunk_pattern=chunk_pattern,
            capture=capture,
            calibration=Calibration(settings.counting.calibration),
            sampler=Sampler(
                settings.counting.sample_every,
                settings.counting.sample_cpu,
                max_inflight=2 * threads or None,  # samples counting at once
                busy_burst=settings.counting.sample_cpu_burst_seconds,
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

    async def aclose(self) -> None:
        await self.upstreams.aclose()
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
