"""When a request is counted, decided once (:func:`plan`), and the object that carries that
decision out (:class:`CountPlan`): the counts, on the event loop or the counting threads, and
what a count turns into, the ceiling's verdict and the observed utilization. The plan alone
writes the exchange's count and decision, from before forwarding (:meth:`CountPlan.verdict`)
to the answer (:meth:`CountPlan.settle`, :meth:`CountPlan.after`) or the end
(:meth:`CountPlan.cancel`).

The schedules (:class:`Schedule`): counted first on the event loop (a short body: a thread's
GIL hand-offs cost more than its count); counted first on a counting thread (a long body whose
forwarding depends on its count); counted beside the upstream call (a long body whose forwarding
cannot depend on its count); not counted (``counting.strategy: bounded``: a bound proves it
within its budget), or counted anyway as a sample, first when short, beside the call and
recorded after its answer when long. The input budget is computed once, when the schedule is
chosen; the verdict on a count starts from it.

A long request whose forwarding cannot depend on its count (``observe`` and ``off`` never trim;
in ``enforce`` the strict bound must prove it within its budget) is forwarded at once. Its count,
and the decision on it, run on a worker thread while the upstream works (tiktoken and riptoken
release the GIL while they encode; gigatoken holds it, so its count overlaps the upstream's
wait, not other requests' work), and are settled before the answer goes back: the response
headers, the log line and the metrics carry what they carry when the request is counted first.

A long request a bound let through and the sampler picked (``counting.strategy: bounded``) is
counted beside its upstream call too, but its answer never waits for that count: it is a sample
for the metrics, not something the request needs, so it is recorded once it lands
(:meth:`CountPlan.after`), off the request's latency. (A short sample is counted first, on the event loop,
like any short request.)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import re
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import httpx

from context_ceiling.core.counting import RequestCount
from context_ceiling.core.engine_tokenize import EngineCountError, count_chat
from context_ceiling.core.models import UpstreamSpec
from context_ceiling.core.shape_checks import RequestShapeError
from context_ceiling.core.tokenizers import CountCache, RequestMemo, TextCounter
from context_ceiling.core.utilization import utilization
from context_ceiling.formats.base import Route
from context_ceiling.sidecar.bounded_count import Calibration, Sampler, provably_within
from context_ceiling.sidecar.config import Settings
from context_ceiling.sidecar.enforce import Decision, planned_decision, trim_to
from context_ceiling.sidecar.exchange import Exchange, Schedule
from context_ceiling.sidecar.observability.metrics import Metrics
from context_ceiling.sidecar.observability.record import Recorder
from context_ceiling.sidecar.upstream.pool import UpstreamPool

log = logging.getLogger(__name__)


class _ShapeOnly:
    """A counter that encodes nothing: a count's walk run for its shape checks alone."""

    name = "shape-only"

    def count(self, text: str) -> int:
        del text
        return 0


SHAPE_ONLY = _ShapeOnly()


class PlanDeps(Protocol):
    """What a count plan uses of the sidecar: the settings, the counting machinery (cache,
    threads, sampler, calibration, the engine's tokenizer endpoint), the metrics, and the
    upstreams (whether a request's upstream is the provider's own API)."""

    settings: Settings
    metrics: Metrics
    chunk_pattern: re.Pattern[str] | None
    count_cache: CountCache | None
    count_pool: ThreadPoolExecutor | None
    sampler: Sampler
    calibration: Calibration
    engine_client: httpx.AsyncClient
    upstreams: UpstreamPool


def _budget(st: PlanDeps, route: Route, ex: Exchange, obj: dict[str, Any]) -> Decision:
    """The exchange's mode and input budget before it is counted (:func:`planned_decision` for its
    model, workload, ceilings and upstream)."""
    return planned_decision(
        obj,
        route.format,
        ex.spec,
        ex.label,
        ex.workload,
        ex.ceilings,
        st.settings.enforcement,
        native_ok=st.upstreams.native_ok(route.format, ex.spec),
    )


def on_threads(st: PlanDeps, route: Route, ex: Exchange, raw: bytes) -> bool:
    """Whether the request is counted on the counting threads: a long body counted by a local
    tokenizer. Below ``counting.overlap_bytes`` a count costs less than the GIL hand-offs."""
    least = st.settings.counting.overlap_bytes
    if not least or len(raw) < least or route.count_only or st.count_pool is None:
        return False
    return ex.spec is None or not isinstance(ex.spec.tokenizer, UpstreamSpec)


def _schedule(
    st: PlanDeps, route: Route, ex: Exchange, obj: dict[str, Any], raw: bytes, busy: bool
) -> Schedule:
    """When this request is counted, from its size, its budget and the counting strategy; sets
    the decision it is forwarded under until a count says otherwise (its mode and budget: "as
    it is"). ``busy``: other requests are in flight (a sample then spends at most the sampler's
    busy burst)."""
    if route.count_only:
        return Schedule.FIRST
    d = ex.decision = _budget(st, route, ex, obj)
    threads = on_threads(st, route, ex, raw)
    bounded = st.settings.counting.strategy == "bounded"
    if bounded and provably_within(raw, route.shape, ex.spec, d, st.calibration, ex.label):
        if not st.sampler.due(busy):
            return Schedule.UNCOUNTED
        # a sampled long body is counted beside the call and recorded after its answer: its
        # count costs the request no latency. A short one is counted first, on the event loop:
        # below counting.overlap_bytes a thread's GIL hand-offs cost more than the count
        # (measured: c=16 throughput 0.79-0.90x of counting it on the loop at 1k and 8k
        # tokens, and no better p50 at c=1)
        return Schedule.SAMPLE_BESIDE if threads else Schedule.SAMPLE_FIRST
    if not threads:
        return Schedule.FIRST
    # a long body: beside the upstream call when its forwarding cannot depend on the count
    # (observe and off never trim; enforce only when the strict bound proves it within)
    if d.mode != "enforce" or provably_within(raw, route.shape, ex.spec, d, None, ex.label):
        return Schedule.BESIDE
    return Schedule.ON_THREAD


def plan(
    st: PlanDeps,
    rec: Recorder,
    route: Route,
    ex: Exchange,
    obj: dict[str, Any],
    raw: bytes,
    counter: TextCounter,
) -> CountPlan:
    """The request's count plan, decided once from its size, its budget and the counting
    strategy (the exchange's ``schedule``, and the decision it is forwarded under until a count
    says otherwise)."""
    ex.schedule = _schedule(st, route, ex, obj, raw, rec.busy)
    if ex.schedule is not Schedule.UNCOUNTED:
        # the trimmer's recount then encodes only what it rewrote (enforce within ~1.1x observe)
        counter = RequestMemo(counter)
    return CountPlan(st, rec, route, ex, obj, counter)


class CountPlan:
    """One request's count plan, carried out: the only writer of the exchange's count and
    decision. Before forwarding: :meth:`count_first` (a short body, on the event loop), then
    :meth:`verdict` (counted on a thread, or started beside the upstream call, or taken from
    the first count); :meth:`decide`, :meth:`bypass` and :meth:`reroute` set what it is
    forwarded under. After: :meth:`settle` (the answer goes back with its count),
    :meth:`after` (the exchange is recorded, a sample once its count lands) or :meth:`cancel`
    (the request ended before it was forwarded)."""

    __slots__ = ("counter", "ex", "obj", "rec", "route", "st")

    def __init__(
        self,
        st: PlanDeps,
        rec: Recorder,
        route: Route,
        ex: Exchange,
        obj: dict[str, Any],
        counter: TextCounter,
    ) -> None:
        self.st, self.rec, self.route, self.ex, self.obj = st, rec, route, ex, obj
        #: what the trimmer recounts with
        self.counter = counter

    @property
    def first(self) -> bool:
        """Counted before forwarding, on the event loop (a short body)."""
        return self.ex.schedule in (Schedule.FIRST, Schedule.SAMPLE_FIRST)

    # -- before forwarding ---------------------------------------------------------------------

    async def count_first(self) -> None:
        """Count a short body on the event loop (the forwarding waits on it, and its count costs
        less than a worker thread's GIL hand-offs: :func:`on_threads`), exactly from the engine
        where the model's tokenizer is the upstream's. ``RequestShapeError`` names the field."""
        st, ex = self.st, self.ex
        spec = ex.spec
        cpu = time.thread_time() if ex.sampled else 0.0  # a sample's CPU is paid from a credit
        ex.count = self.route.count(
            self.obj,
            self.counter,
            spec.chat_format if spec else None,
            st.chunk_pattern,
            memo=st.count_cache,
        )
        if ex.sampled:
            st.sampler.spend(time.thread_time() - cpu)
        if spec is not None and isinstance(spec.tokenizer, UpstreamSpec):
            ex.count = await self._exact(spec.tokenizer, ex.count)

    async def _exact(self, spec: UpstreamSpec, est: RequestCount) -> RequestCount:
        """The engine's own count of a chat request (its template applied), the estimate
        scaled to it; the estimate when the engine cannot say."""
        obj = self.obj
        if not self.route.format.chat_template:  # the engine's template counts chat only
            return est
        try:
            total = await count_chat(
                self.st.engine_client, spec, obj["messages"], obj.get("tools"), obj.get("model")
            )
        except EngineCountError as exc:
            log.warning(
                "engine tokenize failed; using the estimate", extra={"fields": {"reason": str(exc)}}
            )
            return est
        return est.scaled_to(total, exact=True, counter=f"upstream:{spec.style}")

    def bypass(self) -> None:
        """A bypassing request is forwarded as it is, whatever its mode."""
        ex = self.ex
        ex.bypass = True
        if ex.decision is not None:
            ex.decision = dataclasses.replace(ex.decision, mode="off", budget=None)

    async def verdict(self) -> Decision | None:
        """The ceiling's verdict before forwarding (forward, trim or reject), counting a long
        body on a counting thread first where it must be; None when the request is forwarded
        before (or without) a count, which then runs beside the upstream call."""
        ex = self.ex
        if ex.schedule in (Schedule.UNCOUNTED, Schedule.SAMPLE_BESIDE, Schedule.BESIDE):
            self._check_shape()
            if ex.schedule is not Schedule.UNCOUNTED:
                ex.pending = self._work()
                if ex.schedule is Schedule.SAMPLE_BESIDE:
                    self.st.sampler.counting(ex.pending)
            return None
        if ex.schedule is Schedule.ON_THREAD:
            # the event loop serves other requests meanwhile, so under load the count runs on
            # another core (tiktoken and riptoken release the GIL; gigatoken holds it)
            ex.count, d, cpu = await self._work()
            if ex.sampled:
                self.st.sampler.spend(cpu)
            return d
        assert ex.count is not None
        if not ex.sampled:
            return self._verdict_on(self.obj, ex.count)
        cpu = time.thread_time()  # a counted request's verdict: a sample's cost too
        d = self._verdict_on(self.obj, ex.count)
        self.st.sampler.spend(time.thread_time() - cpu)
        return d

    def _check_shape(self) -> None:
        """A body forwarded before (or without) its count is refused as a counted one would be
        (a 400 naming the field, ``RequestShapeError``): the count's walk with a counter that
        encodes nothing, so the shape checks cost no tokenization."""
        spec = self.ex.spec
        self.route.count(self.obj, SHAPE_ONLY, spec.chat_format if spec else None, None)

    def _verdict_on(self, obj: dict[str, Any], count: RequestCount) -> Decision:
        """The verdict on a count, from the budget :func:`plan` computed (a new decision: the
        planned one is never changed)."""
        ex = self.ex
        assert ex.decision is not None
        return trim_to(
            ex.decision,
            obj,
            self.route.format,
            count,
            ex.spec,
            self.counter,
            self.st.chunk_pattern,
        )

    def _work(self) -> asyncio.Future[tuple[RequestCount, Decision, float]]:
        """The count and the verdict on it, on a counting thread, with the thread's CPU seconds.
        The thread gets its own top-level dict: forwarding may add ``stream_options`` to this
        one meanwhile; nothing else is changed (the trimmer never mutates its input)."""
        st, spec, body = self.st, self.ex.spec, dict(self.obj)

        def work() -> tuple[RequestCount, Decision, float]:
            cpu = time.thread_time()
            fmt = spec.chat_format if spec else None
            count = self.route.count(body, self.counter, fmt, st.chunk_pattern, memo=st.count_cache)
            return count, self._verdict_on(body, count), time.thread_time() - cpu

        return asyncio.get_running_loop().run_in_executor(st.count_pool, work)

    def decide(self, d: Decision) -> None:
        """The request goes upstream under ``d`` (recorded: trims, over-ceiling actions); a
        rejection ends here, anything else is observed as forwarded."""
        ex = self.ex
        cpu = time.thread_time() if ex.sampled else 0.0
        ex.decision = d
        self.rec.record_decision(ex, d)
        if not d.reject:
            self.observe()
        if ex.sampled:  # what only a counted request records: a sample's cost too
            self.st.sampler.spend(time.thread_time() - cpu)

    def reroute(self, count: RequestCount, d: Decision) -> None:
        """The exchange became a fallback's: its count and decision are the fallback's."""
        self.ex.count, self.ex.decision = count, d
        self.observe()

    def observe(self) -> None:
        """A counted request's utilization and input components, as forwarded (a partial count
        is observed from the reported usage at the end instead)."""
        ex = self.ex
        assert ex.count is not None
        if ex.spec is not None:
            ex.util = utilization(ex.forwarded_tokens, ex.spec.window)
        if not ex.count.partial:
            self.st.metrics.observe_input(
                ex.label, ex.workload, ex.util, self.rec.forwarded_components(ex)
            )

    # -- after forwarding ----------------------------------------------------------------------

    async def settle(self) -> None:
        """The count that ran beside the upstream call, recorded as a count taken first is. Its
        decision cannot have trimmed (the request was forwarded as it is: ``enforce`` was proved
        within budget); in ``observe`` it reports what trimming would have removed."""
        ex = self.ex
        pending, ex.pending = ex.pending, None
        if pending is None:
            return
        try:
            result = await pending
        except RequestShapeError:
            return  # forwarded already: the upstream judges the body; recorded uncounted
        self._take(result)

    def _take(self, result: tuple[RequestCount, Decision, float]) -> None:
        ex = self.ex
        ex.count, d, cpu = result
        start = time.thread_time() if ex.sampled else 0.0
        d.body, d.reject = None, False
        ex.decision = d
        self.rec.record_decision(ex, d)
        self.observe()
        if ex.sampled:  # the count and verdict on their thread, their record on this one
            self.st.sampler.spend(cpu + time.thread_time() - start)

    def after(self) -> None:
        """Record the exchange once its answer went back: at once, or, for a sample a bound let
        through, once its count lands (its answer went back without its count in the headers,
        ``x-ceiling-count: bound``; the log line, ``"counted": "sampled"``, the metrics, the
        staleness check and the span carry the count)."""
        ex, rec = self.ex, self.rec
        pending, ex.pending = ex.pending, None
        if pending is None:
            rec.finish(ex)
            return
        ended = time.perf_counter()  # the durations and latency are the answer's, not the count's

        def land(fut: asyncio.Future[tuple[RequestCount, Decision, float]]) -> None:
            try:
                if not fut.cancelled():
                    with contextlib.suppress(RequestShapeError):  # recorded uncounted
                        self._take(fut.result())
                rec.finish(ex, ended)
            except Exception:  # a callback's exception would only reach asyncio's handler
                log.exception(
                    "recording a sampled exchange failed",
                    extra={"fields": {"request_id": ex.request_id}},
                )

        if pending.done():
            land(pending)
        else:
            pending.add_done_callback(land)

    def cancel(self) -> None:
        """A count beside an upstream call that will not be recorded (the request ended before
        it was forwarded): not waited for."""
        ex = self.ex
        if ex.pending is not None:
            ex.pending.cancel()
            ex.pending = None
